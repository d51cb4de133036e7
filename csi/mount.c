/*
 * Mounts on the node: bind mounts of a staged volume into pods (through
 * libmount, which also does the read-only remount a bind mount needs),
 * unmounts, and questions to /proc/self/mountinfo. Nothing here stats a
 * mount point it does not have to: a dead FUSE mount answers ENOTCONN,
 * and the mount table is where the truth about it is.
 */
#include <errno.h>
#include <libgen.h>
#include <libmount/libmount.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "csi.h"

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

int csi_mount_bind(const char *source, const char *target,
		   unsigned long flags)
{
	struct libmnt_context *cxt = mnt_new_context();
	int rc, ret = 0;

	if (!cxt)
		return -ENOMEM;
	/* no fstab, no /sbin/mount.* helpers: exactly this bind mount */
	mnt_context_disable_helpers(cxt, 1);
	mnt_context_set_optsmode(cxt, MNT_OMODE_IGNORE);
	if (mnt_context_set_source(cxt, source) ||
	    mnt_context_set_target(cxt, target) ||
	    mnt_context_set_mflags(cxt, MS_BIND | flags)) {
		ret = -ENOMEM;
		goto out;
	}
	rc = mnt_context_mount(cxt);
	if (mnt_context_syscall_called(cxt) &&
	    mnt_context_get_syscall_errno(cxt))
		ret = -mnt_context_get_syscall_errno(cxt);
	else if (rc < 0)
		ret = rc;
	else if (rc > 0 || mnt_context_get_status(cxt) != 1)
		ret = -EIO;
out:
	mnt_free_context(cxt);
	return ret;
}

/*
 * Unmounts whatever is on `target`. A busy mount is detached instead:
 * unpublish must not fail because a process in the pod still holds a
 * file, and the kernel frees the mount when the last user goes.
 */
int csi_mount_umount(const char *target)
{
	if (umount2(target, UMOUNT_NOFOLLOW) == 0)
		return 0;
	if (errno == EBUSY && umount2(target, UMOUNT_NOFOLLOW | MNT_DETACH) == 0)
		return 0;
	return -errno;
}

/*
 * The topmost mount at exactly `path`: its fstype, source and device
 * number. -ENOENT when nothing is mounted there.
 */
static int csi_mount_lookup(const char *path, char *fstype, size_t size,
			    char *source, size_t ssize, dev_t *devno)
{
	struct libmnt_table *tb = mnt_new_table();
	struct libmnt_iter *it = mnt_new_iter(MNT_ITER_BACKWARD);
	struct libmnt_fs *fs;
	int ret = -ENOENT;

	if (!tb || !it) {
		ret = -ENOMEM;
		goto out;
	}
	if (mnt_table_parse_file(tb, "/proc/self/mountinfo")) {
		ret = -EIO;
		goto out;
	}
	while (mnt_table_next_fs(tb, it, &fs) == 0) {
		const char *t = mnt_fs_get_target(fs);

		if (!t || strcmp(t, path))
			continue;
		if (fstype)
			snprintf(fstype, size, "%s", mnt_fs_get_fstype(fs) ?: "");
		if (source)
			snprintf(source, ssize, "%s", mnt_fs_get_source(fs) ?: "");
		if (devno)
			*devno = mnt_fs_get_devno(fs);
		ret = 0;
		break;
	}
out:
	mnt_free_iter(it);
	mnt_free_table(tb);
	return ret;
}

int csi_mount_find(const char *path, char *fstype, size_t size, char *source,
		   size_t ssize)
{
	return csi_mount_lookup(path, fstype, size, source, ssize, NULL);
}

/* 0 when both paths carry mounts of the same filesystem instance. */
int csi_mount_same(const char *a, const char *b)
{
	dev_t da, db;
	int ret;

	ret = csi_mount_lookup(a, NULL, 0, NULL, 0, &da);
	if (!ret)
		ret = csi_mount_lookup(b, NULL, 0, NULL, 0, &db);
	if (!ret && da != db)
		ret = -ESTALE;
	return ret;
}

/* 0 when the FUSE mount at `path` answers; -ENOTCONN when its daemon died. */
int csi_mount_alive(const char *path)
{
	struct statfs sfs;

	if (statfs(path, &sfs) < 0)
		return -errno;
	return sfs.f_type == FUSE_SUPER_MAGIC ? 0 : -ENOENT;
}

/*
 * Kubelet may reach its directories through a symlink; the mount table
 * has the resolved path. The parent is resolved, never the last
 * component, which may be a dead mount point or not exist yet.
 */
int csi_path_canon(const char *path, char *out, size_t size)
{
	char dir[PATH_MAX], base[PATH_MAX], real[PATH_MAX];
	size_t len = strlen(path);

	if (len >= sizeof(dir))
		return -ENAMETOOLONG;
	while (len > 1 && path[len - 1] == '/')
		len--;
	memcpy(dir, path, len);
	dir[len] = '\0';
	memcpy(base, dir, len + 1);
	if (!strcmp(dir, "/")) {
		snprintf(out, size, "/");
		return 0;
	}
	if (!realpath(dirname(dir), real))
		return -errno;
	if ((size_t)snprintf(out, size, "%s/%s", strcmp(real, "/") ? real : "",
			     basename(base)) >= size)
		return -ENAMETOOLONG;
	return 0;
}
