/* File system helpers shared by the programs. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
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
