// SPDX-License-Identifier: Apache-2.0
/*
 * The POSIX ACLs of whole directories, as the programs set directories
 * up. A fresh upper that stands for a frozen one (the daemon's live
 * freeze, fuse/freeze.c, and the plugin's snapshot of an unstaged
 * volume, csi/snapshot.c) is the merged root, so it must carry the old
 * root's ACLs: without its default ACL, new entries of the volume
 * inherit nothing. The daemon's workdir directories must carry none
 * (fuse/super.c). What the merged view does with ACLs is fuse/acl.c's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/xattr.h>

#include "strata.h"

/* XATTR_SIZE_MAX: no ACL is bigger */
#define STRATA_ACL_MAX (64 * 1024)

static const char *const strata_acl_names[] = {
	STRATA_ACL_DEFAULT, STRATA_ACL_ACCESS,
};
#define STRATA_ACL_NAMES (sizeof(strata_acl_names) / sizeof(strata_acl_names[0]))

/* A filesystem that keeps no ACLs has none to remove. */
static int strata_acl_remove(int fd, const char *name)
{
	if (fremovexattr(fd, name) < 0 && errno != ENODATA &&
	    errno != EOPNOTSUPP)
		return -errno;
	return 0;
}

/* The directory open at DIRFD loses both of its ACLs. */
int strata_acl_clear(int dirfd)
{
	int ret = 0;

	for (size_t i = 0; i < STRATA_ACL_NAMES && ret == 0; i++)
		ret = strata_acl_remove(dirfd, strata_acl_names[i]);
	return ret;
}

/*
 * Directory TO gets the ACLs of directory FROM and no others: where it
 * was made, it may have inherited its parent's default ACL. Both are
 * open for reading (an O_PATH descriptor takes no xattr calls).
 */
int strata_acl_copy(int from, int to)
{
	char *buf = malloc(STRATA_ACL_MAX);
	int ret = buf ? 0 : -ENOMEM;

	for (size_t i = 0; i < STRATA_ACL_NAMES && ret == 0; i++) {
		ssize_t n = fgetxattr(from, strata_acl_names[i], buf,
				      STRATA_ACL_MAX);

		if (n >= 0)
			ret = fsetxattr(to, strata_acl_names[i], buf, n, 0) < 0 ?
				      -errno : 0;
		else if (errno == ENODATA || errno == EOPNOTSUPP)
			ret = strata_acl_remove(to, strata_acl_names[i]);
		else
			ret = -errno;
	}
	free(buf);
	return ret;
}
