// SPDX-License-Identifier: Apache-2.0
/*
 * Counters for the CSI plugin's metrics: with -o statsfile=FILE the daemon
 * maps FILE shared and each handler bumps its counter with one relaxed
 * atomic add. No lock, no syscall on the request path; the reader (the
 * plugin, at scrape time) just reads the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stratafs.h"

struct strata_stats *sfs_stats;

/* FRESH: a new daemon for the volume, which counts from zero. */
int sfs_stats_open(const char *path, bool fresh)
{
	struct strata_stats *st;
	int fd, ret = 0;

	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	if (fresh && ftruncate(fd, 0) < 0) {
		ret = -errno;
		goto out;
	}
	/*
	 * Blocks, not a hole: on a full filesystem the first counter bump
	 * into a hole of the mapping would kill the daemon with SIGBUS.
	 */
	ret = -posix_fallocate(fd, 0, sizeof(*st));
	if (ret)
		goto out;
	st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (st == MAP_FAILED) {
		ret = -errno;
		goto out;
	}
	st->count = STRATA_ST_COUNT;
	__atomic_store_n(&st->magic, STRATA_STATS_MAGIC, __ATOMIC_RELEASE);
	sfs_stats = st;
out:
	close(fd);
	return ret;
}

void sfs_stats_close(void)
{
	if (sfs_stats)
		munmap(sfs_stats, sizeof(*sfs_stats));
	sfs_stats = NULL;
}
