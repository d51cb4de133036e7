// SPDX-License-Identifier: Apache-2.0
/*
 * Abnormal conditions of staged volumes that no heal can mend, found by
 * the periodic check and logged once each (and once more when they end):
 * today, a lower layer removed, renamed away or replaced under the store
 * while a volume over it is staged. The daemon keeps the directory it was
 * given as a descriptor, so it does not crash; but files of a removed
 * layer are gone from the volume, and a heal or a new stage would fail or
 * serve another tree. CSI reports such a state as the volume's
 * VolumeCondition (NodeGetVolumeStats), which comes with issue 13; until
 * then the log is where an operator finds it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csi.h"

struct csi_cond {
	struct csi_cond *next;
	char id[CSI_VOLUME_ID_LEN + 1];
	char *msg;		/* what was last logged; "" when well */
	unsigned round;		/* the last check that saw the volume staged */
};

/*
 * The daemon's lower layers as it holds them: the descriptors its
 * lowerdir= names (/proc/self/fd/N), in order. Returns how many, or
 * -errno; 0 for a daemon that was not given descriptors.
 */
static int csi_daemon_layers(pid_t pid, int *fds, int max)
{
	char path[64], buf[16384], *o = NULL, *end;
	ssize_t len;
	int fd, n = 0;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	len = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (len <= 0)
		return -EIO;
	buf[len] = '\0';
	for (char *a = buf; a < buf + len; a += strlen(a) + 1)
		if (!strcmp(a, "-o") && a + 3 < buf + len)
			o = a + 3;
	if (!o || strncmp(o, "lowerdir=", 9))
		return 0;
	for (char *l = o + 9; n < max && !strncmp(l, "/proc/self/fd/", 14);) {
		fds[n++] = (int)strtol(l + 14, &end, 10);
		if (*end != ':')
			break;
		l = end + 1;
	}
	return n;
}

/*
 * What is wrong with a staged volume's layers, in `msg`; "" when nothing.
 * Reads only: the Admin service asks it from any thread.
 */
void csi_condition_layers(struct csi_plugin *p, const struct csi_volume *v,
			  const struct csi_node_vol *n, char *msg, size_t size)
{
	int fds[CSI_MAX_LAYERS], nfds, skip;

	msg[0] = '\0';
	nfds = csi_daemon_layers(n->pid, fds, CSI_MAX_LAYERS);
	/*
	 * A snapshot frozen live puts its layer on top of the chain without
	 * a restart: the daemon's own list is the bottom of the record's.
	 */
	skip = nfds > 0 && v->nlayers > nfds ? v->nlayers - nfds : 0;
	for (int i = skip; i < v->nlayers && !msg[0]; i++) {
		struct stat held, now;
		char path[64];
		int fd;

		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)n->pid,
			 i - skip < nfds ? fds[i - skip] : -1);
		if (i - skip >= nfds || stat(path, &held) < 0)
			continue;	/* the daemon is gone: a heal's business */
		fd = csi_chain_open(&p->store, v->layers[i]);
		if (fd >= 0 && fstat(fd, &now) < 0)
			now.st_ino = 0;
		if (fd >= 0)
			close(fd);
		if (held.st_nlink == 0)
			snprintf(msg, size, "its lower layer '%s' was removed while it is staged: the files of that layer are gone from the volume",
				 v->layers[i]);
		else if (fd < 0)
			snprintf(msg, size, "its lower layer '%s' is gone from %s/layers (renamed away or replaced by a symlink while the volume is staged): the daemon still serves the directory it was given, but the volume cannot be healed or staged again",
				 v->layers[i], p->store.root);
		else if (held.st_dev != now.st_dev || held.st_ino != now.st_ino)
			snprintf(msg, size, "its lower layer '%s' in %s/layers is not the directory its daemon serves (replaced while the volume is staged): a heal would serve the new one",
				 v->layers[i], p->store.root);
	}
}

static struct csi_cond *csi_cond_get(struct csi_plugin *p, const char *id)
{
	struct csi_cond *c;

	for (c = p->conds; c; c = c->next)
		if (!strcmp(c->id, id))
			return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	snprintf(c->id, sizeof(c->id), "%s", id);
	c->msg = strdup("");
	if (!c->msg) {
		free(c);
		return NULL;
	}
	c->next = p->conds;
	p->conds = c;
	return c;
}

/* Checks one staged volume; logs a condition when it starts and ends. */
void csi_condition_check(struct csi_plugin *p, const char *id, unsigned round)
{
	struct csi_node_vol n;
	struct csi_volume v;
	struct csi_cond *c;
	char msg[512];

	if (csi_state_load(&p->store, id, &n))
		return;
	if (!csi_daemon_alive(&n) || csi_volume_load(&p->store, id, &v))
		goto out_state;
	csi_condition_layers(p, &v, &n, msg, sizeof(msg));
	c = csi_cond_get(p, id);
	if (!c)
		goto out_volume;
	c->round = round;
	if (strcmp(c->msg, msg)) {
		char *copy = strdup(msg);

		if (msg[0])
			strata_warn("volume %s is abnormal: %s", id, msg);
		else
			strata_info("volume %s: its lower layers are as they were staged again",
				    id);
		if (copy) {
			free(c->msg);
			c->msg = copy;
		}
	}
out_volume:
	csi_volume_free(&v);
out_state:
	csi_state_free(&n);
}

/* Forgets volumes the check of `round` did not see staged. */
void csi_condition_prune(struct csi_plugin *p, unsigned round)
{
	struct csi_cond **pc = &p->conds;

	while (*pc) {
		struct csi_cond *c = *pc;

		if (c->round == round) {
			pc = &c->next;
			continue;
		}
		*pc = c->next;
		free(c->msg);
		free(c);
	}
}
