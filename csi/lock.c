// SPDX-License-Identifier: Apache-2.0
/*
 * One operation at a time per volume. The spec asks a second concurrent
 * call on the same volume to fail with ABORTED rather than wait, so this
 * is a set of busy ids with try-enter, not a lock that blocks.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"

struct csi_busy {
	struct csi_busy *next;
	char id[CSI_NAME_MAX + 8];
};

int csi_busy_enter(struct csi_store *s, const char *id)
{
	struct csi_busy *b;
	int ret = 0;

	pthread_mutex_lock(&s->busy_lock);
	for (b = s->busy; b; b = b->next)
		if (!strcmp(b->id, id)) {
			ret = -EBUSY;
			goto out;
		}
	b = calloc(1, sizeof(*b));
	if (!b) {
		ret = -ENOMEM;
		goto out;
	}
	strncpy(b->id, id, sizeof(b->id) - 1);
	b->next = s->busy;
	s->busy = b;
out:
	pthread_mutex_unlock(&s->busy_lock);
	return ret;
}

void csi_busy_leave(struct csi_store *s, const char *id)
{
	struct csi_busy **pp;

	pthread_mutex_lock(&s->busy_lock);
	for (pp = &s->busy; *pp; pp = &(*pp)->next)
		if (!strcmp((*pp)->id, id)) {
			struct csi_busy *b = *pp;

			*pp = b->next;
			free(b);
			break;
		}
	pthread_mutex_unlock(&s->busy_lock);
}

void csi_busy_clear(struct csi_store *s)
{
	pthread_mutex_lock(&s->busy_lock);
	while (s->busy) {
		struct csi_busy *b = s->busy;

		s->busy = b->next;
		free(b);
	}
	pthread_mutex_unlock(&s->busy_lock);
}

/* csi_busy_enter, or ABORTED answered: kubelet retries such calls. */
int csi_busy_claim(struct csi_store *s, const char *id, struct csi_reply *r)
{
	if (csi_busy_enter(s, id) == 0)
		return 0;
	csi_reply_set(r, CSI_ABORTED,
		      "another operation on volume %s is in progress", id);
	return -EBUSY;
}
