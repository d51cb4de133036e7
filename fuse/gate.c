// SPDX-License-Identifier: Apache-2.0
/*
 * gate.c: the requests in flight in this process, and a gate that stops
 * new ones until those are done, so that a freeze (freeze.c) changes
 * nodes, open files and layers while no handler can be looking at them.
 *
 * A request is in flight from the moment its thread has read it (from
 * /dev/fuse or a ring) until both of these are true:
 *  - its handler has returned: a handler may still touch its node after
 *    the reply went out (sfs_node_release comes last);
 *  - its reply has been sent: the I/O engine answers reads and writes
 *    from its completion thread, after the handler returned (io.c).
 * So a request holds the gate once for its thread (sfs_gate_enter, let
 * go by sfs_gate_leave once the handler returned) and once more for
 * each operation that replies from another thread (sfs_gate_hold, taken
 * while the thread's own hold is still there, and sfs_gate_put after
 * that reply).
 *
 * Device threads: libfuse's loop reads the next request on the same
 * thread right after a handler returns, so the read hook lets go of the
 * request before (transport.c); a thread idle in read(2) holds nothing.
 * Ring threads let go right after libfuse returns (uring.c).
 *
 * One count: bit SFS_GATE_CLOSED says the gate is closed, the rest
 * counts holds. The fast path is one atomic add each way; the mutex and
 * the condition variable are only for a closed gate.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "stratafs.h"

#define SFS_GATE_CLOSED (1L << 40)

static struct {
	atomic_long v;
	pthread_mutex_t lock;
	pthread_cond_t cond;	/* the gate opened, or the last hold went */
} sfs_gate = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

/* This thread holds the gate for the request it is handling. */
static __thread bool sfs_gate_held;

void sfs_gate_hold(void)
{
	atomic_fetch_add(&sfs_gate.v, 1);
}

void sfs_gate_put(void)
{
	long v = atomic_fetch_sub(&sfs_gate.v, 1);

	/* the last one out of a closed gate wakes the freeze waiting */
	if (v == (SFS_GATE_CLOSED | 1)) {
		pthread_mutex_lock(&sfs_gate.lock);
		pthread_cond_broadcast(&sfs_gate.cond);
		pthread_mutex_unlock(&sfs_gate.lock);
	}
}

/* A request was read: waits while the gate is closed, then holds it. */
void sfs_gate_enter(void)
{
	if (sfs_gate_held)
		return;
	while (atomic_fetch_add(&sfs_gate.v, 1) & SFS_GATE_CLOSED) {
		sfs_gate_put();
		pthread_mutex_lock(&sfs_gate.lock);
		while (atomic_load(&sfs_gate.v) & SFS_GATE_CLOSED)
			pthread_cond_wait(&sfs_gate.cond, &sfs_gate.lock);
		pthread_mutex_unlock(&sfs_gate.lock);
	}
	sfs_gate_held = true;
}

/* The handler of this thread's request has returned. */
void sfs_gate_leave(void)
{
	if (!sfs_gate_held)
		return;
	sfs_gate_held = false;
	sfs_gate_put();
}

/*
 * Closes the gate and waits until no request is in flight: 0, or -EBUSY
 * (the gate open again) when some were still in flight after TIMEOUT_MS,
 * a handler waiting on something that is not coming soon.
 */
int sfs_gate_close(int timeout_ms)
{
	struct timespec end;
	int ret = 0;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (end.tv_nsec >= 1000000000) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&sfs_gate.lock);
	atomic_fetch_or(&sfs_gate.v, SFS_GATE_CLOSED);
	while (ret == 0 && atomic_load(&sfs_gate.v) != SFS_GATE_CLOSED)
		ret = pthread_cond_clockwait(&sfs_gate.cond, &sfs_gate.lock,
					     CLOCK_MONOTONIC, &end);
	/* the last hold may have gone just as the time ran out */
	ret = atomic_load(&sfs_gate.v) == SFS_GATE_CLOSED ? 0 : -EBUSY;
	pthread_mutex_unlock(&sfs_gate.lock);
	if (ret < 0)
		sfs_gate_open();
	return ret;
}

void sfs_gate_open(void)
{
	pthread_mutex_lock(&sfs_gate.lock);
	atomic_fetch_and(&sfs_gate.v, ~SFS_GATE_CLOSED);
	pthread_cond_broadcast(&sfs_gate.cond);
	pthread_mutex_unlock(&sfs_gate.lock);
}
