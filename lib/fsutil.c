// SPDX-License-Identifier: Apache-2.0
/* File system helpers shared by the programs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "strata.h"

/*
 * Removes the tree `name` below `parent` without following symlinks.
 * Callers first move the tree somewhere invisible (the workdir, a hidden
 * name in the store), so that nothing in use is ever half-removed.
 */
int strata_rmtree_at(int parent, const char *name)
{
	struct dirent *de;
	DIR *d;
	int fd, ret;

	if (unlinkat(parent, name, 0) == 0)
		return 0;
	if (errno != EISDIR)
		return -errno;
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					 O_CLOEXEC);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		ret = -errno;
		close(fd);
		return ret;
	}
	ret = 0;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		ret = strata_rmtree_at(dirfd(d), de->d_name);
		if (ret < 0)
			break;
	}
	closedir(d);
	if (ret < 0)
		return ret;
	return unlinkat(parent, name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

/*
 * A lock file that exists only while its holder runs: `name` below
 * `dirfd`, created and flock()ed, or -EWOULDBLOCK when another process
 * holds it. Because the holder unlinks it on the way out
 * (strata_unlock_file), a process that opened the old file just before
 * the unlink can win a lock on a name that no longer exists: the lock
 * counts only when the name still leads to the file that was locked.
 */
int strata_lock_file(int dirfd, const char *name)
{
	struct stat held, now;
	int fd;

	for (;;) {
		fd = openat(dirfd, name, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			return -errno;
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int err = errno;

			close(fd);
			return -err;
		}
		if (fstat(fd, &held) == 0 &&
		    fstatat(dirfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
		    held.st_dev == now.st_dev && held.st_ino == now.st_ino)
			return fd;
		close(fd);	/* unlinked under us: the next holder's turn */
	}
}

/* Unlinks and releases a lock taken by strata_lock_file; fd < 0: none. */
void strata_unlock_file(int dirfd, const char *name, int fd)
{
	if (fd < 0)
		return;
	unlinkat(dirfd, name, 0);
	close(fd);
}

/* A directory below dirfd, never through a symlink, as a stream. */
DIR *strata_opendir_at(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				     O_CLOEXEC);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	int err = errno;

	if (!d && fd >= 0) {
		close(fd);
		errno = err;
	}
	return d;
}
