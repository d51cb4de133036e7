// SPDX-License-Identifier: Apache-2.0
/*
 * lock.c: the 4-byte node lock. Mutual exclusion under contention, the
 * futex slow path taken and left (waiters woken, the word back to 0),
 * and trylock's answers.
 */
#include <pthread.h>

#include "stratafs.h"
#include "unit.h"

#define THREADS 4
#define ROUNDS 200000

static struct sfs_lock lock;
static long counter;	/* guarded by lock, deliberately not atomic */
static atomic_int inside;

static void *worker(void *arg)
{
	for (int i = 0; i < ROUNDS; i++) {
		sfs_lock(&lock);
		/* nobody else may be in here now */
		if (atomic_fetch_add(&inside, 1) != 0)
			abort();
		counter++;
		atomic_fetch_sub(&inside, 1);
		sfs_unlock(&lock);
	}
	return NULL;
}

static void test_contention(void)
{
	pthread_t t[THREADS];

	for (int i = 0; i < THREADS; i++)
		CHECK_EQ_INT(pthread_create(&t[i], NULL, worker, NULL), 0);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	CHECK_EQ_INT(counter, (long)THREADS * ROUNDS);
	/* every sleeper was woken and the lock is free again */
	CHECK_EQ_INT(atomic_load(&lock.v), 0);
}

static void *holder(void *arg)
{
	struct sfs_lock *l = arg;

	sfs_lock(l);	/* waits: the test holds it */
	sfs_unlock(l);
	return NULL;
}

static void test_sleeper_woken(void)
{
	struct sfs_lock l = { 0 };
	pthread_t t;

	sfs_lock(&l);
	CHECK_EQ_INT(atomic_load(&l.v), 1);
	CHECK(!sfs_trylock(&l));
	CHECK_EQ_INT(pthread_create(&t, NULL, holder, &l), 0);
	/* the waiter marks the lock contended before it sleeps */
	while (atomic_load(&l.v) != 2)
		usleep(100);
	sfs_unlock(&l);
	pthread_join(t, NULL);
	CHECK_EQ_INT(atomic_load(&l.v), 0);
	CHECK(sfs_trylock(&l));
	CHECK_EQ_INT(atomic_load(&l.v), 1);
	sfs_unlock(&l);
	CHECK_EQ_INT(atomic_load(&l.v), 0);
}

int main(void)
{
	test_sleeper_woken();
	test_contention();
	return unit_done("test_lock");
}
