// SPDX-License-Identifier: Apache-2.0
/*
 * Progress of a call that takes a while (a stage waiting for its daemon,
 * probe --wait, a layer import), shown to a person and to nobody else:
 * one line on stderr, rewritten in place once a second, only when stderr
 * is a terminal, and wiped when the call ends. Scripts and logs see
 * nothing. A call that can say how far it got refreshes the line's text
 * each second through its own function (a layer import asks the plugin).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"

/* Quiet for the first second: most calls are done long before. */
#define CTL_PROGRESS_DELAY_S 1

struct ctl_progress {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	bool shown;
	char what[256];
	struct timespec start;
	ctl_progress_fn fn;
	void *arg;
};

static void *ctl_progress_main(void *arg)
{
	struct ctl_progress *pg = arg;
	struct timespec at = pg->start;

	pthread_mutex_lock(&pg->lock);
	for (;;) {
		at.tv_sec += CTL_PROGRESS_DELAY_S;
		while (!pg->done &&
		       pthread_cond_timedwait(&pg->cond, &pg->lock, &at) == 0)
			;
		if (pg->done)
			break;
		if (pg->fn) {
			char what[sizeof(pg->what)];

			/* a call to the plugin: not under the lock stop waits on */
			pthread_mutex_unlock(&pg->lock);
			if (pg->fn(pg->arg, what, sizeof(what)) == 0)
				ctl_progress_set(pg, what);
			pthread_mutex_lock(&pg->lock);
			if (pg->done)
				break;
		}
		fprintf(stderr, "\r\033[K" CTL_PROG ": %s (%lds)", pg->what,
			(long)(at.tv_sec - pg->start.tv_sec));
		pg->shown = true;
	}
	if (pg->shown)
		fprintf(stderr, "\r\033[K");
	pthread_mutex_unlock(&pg->lock);
	return NULL;
}

struct ctl_progress *ctl_progress_start(const char *what, ctl_progress_fn fn,
					void *arg)
{
	struct ctl_progress *pg;
	pthread_condattr_t ca;

	if (!isatty(STDERR_FILENO))
		return NULL;
	pg = calloc(1, sizeof(*pg));
	if (!pg)
		ctl_oom();
	snprintf(pg->what, sizeof(pg->what), "%s", what);
	pg->fn = fn;
	pg->arg = arg;
	pthread_mutex_init(&pg->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&pg->cond, &ca);
	pthread_condattr_destroy(&ca);
	clock_gettime(CLOCK_MONOTONIC, &pg->start);
	if (pthread_create(&pg->thread, NULL, ctl_progress_main, pg)) {
		/* no progress line is no reason to fail the call */
		pthread_cond_destroy(&pg->cond);
		pthread_mutex_destroy(&pg->lock);
		free(pg);
		return NULL;
	}
	return pg;
}

/* What the line says from now on: probe --wait's last answer. */
void ctl_progress_set(struct ctl_progress *pg, const char *what)
{
	if (!pg)
		return;
	pthread_mutex_lock(&pg->lock);
	snprintf(pg->what, sizeof(pg->what), "%s", what);
	pthread_mutex_unlock(&pg->lock);
}

/* Wipes the line, if one was shown; NULL: nothing was started. */
void ctl_progress_stop(struct ctl_progress *pg)
{
	if (!pg)
		return;
	pthread_mutex_lock(&pg->lock);
	pg->done = true;
	pthread_cond_signal(&pg->cond);
	pthread_mutex_unlock(&pg->lock);
	pthread_join(pg->thread, NULL);
	pthread_cond_destroy(&pg->cond);
	pthread_mutex_destroy(&pg->lock);
	free(pg);
}
