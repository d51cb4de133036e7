// SPDX-License-Identifier: Apache-2.0
/*
 * Mounts on the node, through the new mount API only: a FUSE mount is
 * made detached (fsopen, fsmount) and attached with move_mount onto a
 * directory descriptor that csi/path.c opened; a bind mount is a clone
 * of the staging mount (open_tree). Nothing here takes a path, so no
 * symlink swapped into one can redirect a mount.
 *
 * A mount is known for certain by its unique id (STATX_MNT_ID_UNIQUE,
 * never reused until reboot) and its superblock's device: that is what
 * the node records keep, and an unmount acts only on the mount a
 * descriptor holds, after checking that it is the recorded one. The
 * questions never call into the filesystem (AT_STATX_DONT_SYNC), so a
 * dead FUSE mount answers them as well as a live one.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "csi.h"

/* Linux 6.8 (include/uapi/linux/stat.h): a mount id never reused. */
#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U
#endif
/* Linux 6.5 (include/uapi/linux/mount.h): mount beneath the top mount. */
#ifndef MOVE_MOUNT_BENEATH
#define MOVE_MOUNT_BENEATH 0x00000200
#endif
/*
 * statmount(2), Linux 6.8 (include/uapi/linux/mount.h): what a unique
 * mount id names, or ENOENT once it is gone. Only the fixed part of the
 * reply is read.
 */
#ifndef SYS_statmount
#define SYS_statmount 457
#endif
#define CSI_STATMOUNT_SB_BASIC 0x00000001U

struct csi_mnt_id_req {
	uint32_t size;
	uint32_t spare;
	uint64_t mnt_id;
	uint64_t param;
};

struct csi_statmount {
	uint32_t size;
	uint32_t mnt_opts;
	uint64_t mask;
	uint32_t sb_dev_major;
	uint32_t sb_dev_minor;
	uint64_t sb_magic;
	uint32_t sb_flags;
	uint32_t fs_type;
	uint64_t rest[60];	/* fields we do not read, and spare */
};

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

/* A statfs off the caller's thread, so that a hung daemon holds up nobody. */
struct csi_probe {
	int fd;			/* our own descriptor on the mount */
	int pipe[2];		/* a byte once the answer is in err */
	int err;
	atomic_int refs;	/* the caller and the thread */
};

static void csi_probe_put(struct csi_probe *pr)
{
	if (atomic_fetch_sub(&pr->refs, 1) != 1)
		return;
	close(pr->fd);
	close(pr->pipe[0]);
	close(pr->pipe[1]);
	free(pr);
}

static void *csi_probe_thread(void *arg)
{
	struct csi_probe *pr = arg;
	struct statfs st;

	if (fstatfs(pr->fd, &st) < 0)
		pr->err = -errno;
	else
		pr->err = st.f_type == FUSE_SUPER_MAGIC ? 0 : -EIO;
	/* the pipe orders the write of err before the caller's read */
	if (write(pr->pipe[1], "", 1) < 0)
		pr->err = -EIO;
	csi_probe_put(pr);
	return NULL;
}

/*
 * 0 when the FUSE mount fd is on answers within timeout_ms: a statfs
 * reaches the daemon only once it has taken the connection's INIT.
 * -ENOTCONN (or another errno) when its daemon is gone, -ETIMEDOUT when
 * it does not answer; the probe then waits on by itself, and ends when
 * the daemon answers or dies.
 */
int csi_mnt_answers(int fd, int timeout_ms)
{
	struct csi_probe *pr = calloc(1, sizeof(*pr));
	struct pollfd pfd;
	pthread_attr_t attr;
	pthread_t t;
	int ret;

	if (!pr)
		return -ENOMEM;
	atomic_init(&pr->refs, 2);
	pr->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (pr->fd < 0 || pipe2(pr->pipe, O_CLOEXEC) < 0) {
		ret = -errno;
		if (pr->fd >= 0)
			close(pr->fd);
		free(pr);
		return ret;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = -pthread_create(&t, &attr, csi_probe_thread, pr);
	pthread_attr_destroy(&attr);
	if (ret) {
		atomic_store(&pr->refs, 1);
		csi_probe_put(pr);
		return ret;
	}
	pfd = (struct pollfd){ .fd = pr->pipe[0], .events = POLLIN };
	ret = poll(&pfd, 1, timeout_ms) == 1 ? pr->err : -ETIMEDOUT;
	csi_probe_put(pr);
	return ret;
}

/* Why a mount call failed, in words an operator can act on. */
const char *csi_mnt_strerror(int err)
{
	if (err == -ENOSYS || err == -EOPNOTSUPP)
		return "the kernel's mount API is missing here: the Node service needs Linux 6.8 or later (fsopen, open_tree, unique mount ids), which a seccomp filter or a tool such as valgrind may also hide";
	return strerror(-err);
}

/* The mount the descriptor is on, and whether fd is that mount's root. */
int csi_mnt_of(int fd, struct csi_mnt *m, bool *root)
{
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
		  STATX_MNT_ID_UNIQUE, &sx) < 0)
		return -errno;
	if (!(sx.stx_mask & STATX_MNT_ID_UNIQUE))
		return -EOPNOTSUPP;	/* before Linux 6.8 */
	m->id = sx.stx_mnt_id;
	m->dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	if (root)
		*root = (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
			(sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
	return 0;
}

/* 0 while the recorded mount exists (anywhere), -ENOENT once it is gone. */
int csi_mnt_exists(const struct csi_mnt *m)
{
	struct csi_mnt_id_req req = { .size = sizeof(req), .mnt_id = m->id,
				      .param = CSI_STATMOUNT_SB_BASIC };
	struct csi_statmount sm;

	if (!m->id)
		return -ENOENT;
	if (syscall(SYS_statmount, &req, &sm, sizeof(sm), 0) < 0)
		return errno == ENOENT || errno == EINVAL ? -ENOENT : -errno;
	/* the same id with another superblock cannot be; say gone if so */
	return makedev(sm.sb_dev_major, sm.sb_dev_minor) == m->dev ? 0 : -ENOENT;
}

/*
 * A new FUSE mount, not attached anywhere yet, with the options stratafs
 * gives its own mounts: the kernel checks permissions, every user may
 * enter, and devices and setuid files work as on kernel overlayfs. The
 * source names the volume, so that mountinfo says which volume a mount
 * serves. *fusefd is the connection, for the daemon. RO: a read-only
 * mount (a reader-only stage), as /proc/mounts then says.
 */
int csi_mnt_fuse(const char *source, bool ro, int *fusefd, int *mntfd)
{
	static const char *const flags[] = { "default_permissions",
					     "allow_other" };
	const char *strs[][2] = {
		{ "fd", NULL },		{ "rootmode", "40000" },
		{ "user_id", "0" },	{ "group_id", "0" },
		{ "subtype", "stratafs" }, { "source", source },
	};
	char fdstr[16];
	int fs = -1, ret = 0;

	*mntfd = -1;
	*fusefd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (*fusefd < 0)
		return -errno;
	snprintf(fdstr, sizeof(fdstr), "%d", *fusefd);
	strs[0][1] = fdstr;
	fs = fsopen("fuse", FSOPEN_CLOEXEC);
	if (fs < 0) {
		ret = -errno;
		goto out_err;
	}
	for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
		if (fsconfig(fs, FSCONFIG_SET_STRING, strs[i][0], strs[i][1], 0) < 0)
			goto out_errno;
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
		if (fsconfig(fs, FSCONFIG_SET_FLAG, flags[i], NULL, 0) < 0)
			goto out_errno;
	if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
		goto out_errno;
	*mntfd = fsmount(fs, FSMOUNT_CLOEXEC, ro ? MOUNT_ATTR_RDONLY : 0);
	if (*mntfd < 0)
		goto out_errno;
	close(fs);
	return 0;

out_errno:
	ret = -errno;
out_err:
	if (fs >= 0)
		close(fs);
	close(*fusefd);
	*fusefd = -1;
	*mntfd = -1;
	return ret;
}

/*
 * A detached bind mount of the mount at fd (the staging mount), with the
 * capability's mount flags as mount attributes.
 */
int csi_mnt_clone(int fd, unsigned long msflags, int *treefd)
{
	static const struct {
		unsigned long ms;
		uint64_t attr;
	} map[] = {
		{ MS_RDONLY, MOUNT_ATTR_RDONLY },   { MS_NOSUID, MOUNT_ATTR_NOSUID },
		{ MS_NODEV, MOUNT_ATTR_NODEV },	    { MS_NOEXEC, MOUNT_ATTR_NOEXEC },
		{ MS_NODIRATIME, MOUNT_ATTR_NODIRATIME },
	};
	struct mount_attr attr = { 0 };

	*treefd = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC |
				    AT_EMPTY_PATH);
	if (*treefd < 0)
		return -errno;
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (msflags & map[i].ms)
			attr.attr_set |= map[i].attr;
	/* atime is one setting with three values, not independent bits */
	if (msflags & MS_NOATIME) {
		attr.attr_set |= MOUNT_ATTR_NOATIME;
		attr.attr_clr |= MOUNT_ATTR__ATIME;
	} else if (msflags & MS_RELATIME) {
		attr.attr_set |= MOUNT_ATTR_RELATIME;
		attr.attr_clr |= MOUNT_ATTR__ATIME;
	}
	if ((attr.attr_set || attr.attr_clr) &&
	    mount_setattr(*treefd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
		int ret = -errno;

		close(*treefd);
		*treefd = -1;
		return ret;
	}
	return 0;
}

/*
 * Attaches a detached mount onto the directory dirfd holds. Beneath:
 * under the mount that is on top there now, so that the path never shows
 * the directory below while one mount replaces another.
 */
int csi_mnt_attach(int mntfd, int dirfd, bool beneath)
{
	unsigned int flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH;

	if (beneath)
		flags |= MOVE_MOUNT_BENEATH;
	return move_mount(mntfd, "", dirfd, "", flags) < 0 ? -errno : 0;
}

/*
 * Detaches the very mount fd is on (fd at its root). Lazily: the fd
 * itself keeps the mount busy, and a pod that still holds a file must not
 * make the call fail; the kernel frees the mount once its last user goes.
 */
int csi_mnt_detach(int fd)
{
	char path[32];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return umount2(path, MNT_DETACH) < 0 ? -errno : 0;
}
