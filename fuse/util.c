// SPDX-License-Identifier: Apache-2.0
/*
 * Small helpers, and the traced wrappers through which every change to a
 * real layer goes: one debug line per layer operation.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"

/* O_PATH descriptors reach the inode's own operations through /proc. */
int sfs_proc_path(int fd, char *buf, size_t size)
{
	int n = snprintf(buf, size, "/proc/self/fd/%d", fd);

	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

int sfs_reopen(int fd, int flags)
{
	char path[64];
	int ret;

	sfs_proc_path(fd, path, sizeof(path));
	ret = open(path, (flags & ~(O_CREAT | O_EXCL | O_NOCTTY)) |
				 O_CLOEXEC);
	return ret < 0 ? -errno : ret;
}

/* chmod(2) of the inode FD holds, whatever FD is: fchmod refuses O_PATH. */
int sfs_fd_chmod(int fd, mode_t mode)
{
	char path[64];

	sfs_proc_path(fd, path, sizeof(path));
	return chmod(path, mode) < 0 ? -errno : 0;
}

int sfs_fstat(int fd, struct stat *st)
{
	if (fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	return 0;
}

/* Directories get real descriptors (xattrs and getdents need them). */
int sfs_open_entry(int dirfd, const char *name, mode_t type)
{
	int flags = S_ISDIR(type) ? O_RDONLY | O_DIRECTORY : O_PATH;
	int fd = openat(dirfd, name, flags | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int sfs_rename(int olddir, const char *old, int newdir, const char *new,
	       unsigned int flags)
{
	strata_debug("rename %d/%s -> %d/%s flags %#x", olddir, old, newdir,
		     new, flags);
	if (renameat2(olddir, old, newdir, new, flags) < 0)
		return -errno;
	return 0;
}

int sfs_unlinkat(int dirfd, const char *name, int flags)
{
	strata_debug("unlink %d/%s flags %#x", dirfd, name, flags);
	if (unlinkat(dirfd, name, flags) < 0)
		return -errno;
	return 0;
}

int sfs_errno(int ret)
{
	return ret < 0 ? -ret : 0;
}

void sfs_reply_err(fuse_req_t req, int ret)
{
	fuse_reply_err(req, sfs_errno(ret));
}

/*
 * The owner a new entry gets: the caller's fsuid and fsgid (given in
 * *uid and *gid), and the directory's group when the directory is setgid
 * (which new subdirectories inherit).
 */
void sfs_new_owner(struct sfs_node *dir, mode_t *mode, uid_t *uid, gid_t *gid)
{
	struct stat st;

	if (sfs_node_stat(dir, &st) == 0 && (st.st_mode & S_ISGID)) {
		*gid = st.st_gid;
		if (S_ISDIR(*mode))
			*mode |= S_ISGID;
	}
}

void sfs_handles_init(void)
{
	pthread_mutex_init(&sfs->handles_lock, NULL);
	sfs->files.prev = sfs->files.next = &sfs->files;
}

void sfs_handle_add(struct sfs_hlink *head, struct sfs_hlink *h)
{
	pthread_mutex_lock(&sfs->handles_lock);
	h->next = head->next;
	h->prev = head;
	head->next->prev = h;
	head->next = h;
	pthread_mutex_unlock(&sfs->handles_lock);
}

void sfs_handle_del(struct sfs_hlink *h)
{
	pthread_mutex_lock(&sfs->handles_lock);
	h->prev->next = h->next;
	h->next->prev = h->prev;
	pthread_mutex_unlock(&sfs->handles_lock);
}

/* The first handle on a list, or NULL when it is empty. */
struct sfs_hlink *sfs_handle_first(struct sfs_hlink *head)
{
	struct sfs_hlink *h;

	pthread_mutex_lock(&sfs->handles_lock);
	h = head->next == head ? NULL : head->next;
	pthread_mutex_unlock(&sfs->handles_lock);
	return h;
}

/* Whether the caller's fsgid or one of its groups is GID. */
bool sfs_req_in_group(fuse_req_t req, gid_t gid)
{
	gid_t groups[64];
	int n;

	if (fuse_req_ctx(req)->gid == gid)
		return true;
	n = fuse_req_getgroups(req, 64, groups);
	for (int i = 0; i < n && i < 64; i++)
		if (groups[i] == gid)
			return true;
	return false;
}

/*
 * Whether the calling thread has capability CAP in effect, from its
 * /proc status; a caller gone already counts as root if it was root.
 */
bool sfs_req_capable(fuse_req_t req, int cap)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	bool ret = ctx->uid == 0;
	char path[64], line[256];
	uint64_t caps;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)ctx->pid);
	f = fopen(path, "re");
	if (!f)
		return ret;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "CapEff: %" SCNx64, &caps) == 1) {
			ret = (caps >> cap) & 1;
			break;
		}
	fclose(f);
	return ret;
}

/* CLOCK_MONOTONIC in nanoseconds, for deadlines and ages. */
long long sfs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/*
 * A file's handle: its BYTES (ROOM of them at most; MAX_HANDLE_SZ fits
 * any) and TYPE, for PATH under DIRFD with name_to_handle_at's AT_FLAGS.
 * Returns the length, or a negative errno. Plain bytes, so that what
 * keeps handles (nodes, origins) needs no struct file_handle.
 */
int sfs_fhandle_get(int dirfd, const char *path, int at_flags,
		    unsigned char *bytes, size_t room, int *type)
{
	union {
		struct file_handle h;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} u = { .h.handle_bytes = MAX_HANDLE_SZ };
	int mount_id;

	if (name_to_handle_at(dirfd, path, &u.h, &mount_id, at_flags) < 0)
		return -errno;
	if (u.h.handle_bytes > room)
		return -EOVERFLOW;
	memcpy(bytes, u.h.f_handle, u.h.handle_bytes);
	*type = u.h.handle_type;
	return (int)u.h.handle_bytes;
}

/* open_by_handle_at(2) of the handle sfs_fhandle_get gave, LEN bytes. */
int sfs_fhandle_open(int mountfd, const unsigned char *bytes, size_t len,
		     int type, int flags)
{
	union {
		struct file_handle h;
		char buf[sizeof(struct file_handle) + MAX_HANDLE_SZ];
	} u;
	int fd;

	if (len > MAX_HANDLE_SZ)
		return -EINVAL;
	u.h.handle_bytes = (unsigned int)len;
	u.h.handle_type = type;
	memcpy(u.h.f_handle, bytes, len);
	fd = open_by_handle_at(mountfd, &u.h, flags);
	return fd < 0 ? -errno : fd;
}
