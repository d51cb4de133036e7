// SPDX-License-Identifier: Apache-2.0
/*
 * The node lock: a 4-byte mutex on a futex, for the 130,000 nodes a big
 * tree puts in memory, where a pthread mutex would be 40 bytes of every
 * node. It is held across syscalls (a copy-up holds it for the whole
 * copy), so it sleeps rather than spins. The three states and the slow
 * path are those of Drepper's "Futexes Are Tricky", mutex 3.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "stratafs.h"

static void sfs_futex(atomic_int *v, int op, int val)
{
	syscall(SYS_futex, v, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

void sfs_lock_slow(struct sfs_lock *l)
{
	int c = atomic_exchange(&l->v, 2);

	while (c != 0) {
		sfs_futex(&l->v, FUTEX_WAIT, 2);
		c = atomic_exchange(&l->v, 2);
	}
}

void sfs_unlock_slow(struct sfs_lock *l)
{
	atomic_store(&l->v, 0);
	sfs_futex(&l->v, FUTEX_WAKE, 1);
}
