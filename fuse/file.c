// SPDX-License-Identifier: Apache-2.0
/*
 * Open files. A write open copies the file up first; a read-only open
 * never does. A read-only handle opened on the lower file follows a
 * later copy-up: its next read reopens the upper copy, so it sees what
 * was written through other handles (the kernel's overlayfs does the
 * same since 4.19; fuse-overlayfs does not).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

static bool sfs_flags_write(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
}

int sfs_file_open(struct sfs_node *n, int flags, struct sfs_file **out)
{
	struct sfs_file *f;
	int fd, ret;

	if (n->stale)
		return -ESTALE;
	if (sfs_flags_write(flags)) {
		if (!sfs_has_upper())
			return -EROFS;
		ret = (flags & O_TRUNC) ? sfs_copy_up_meta(n) : sfs_copy_up(n);
		if (ret < 0)
			return ret;
	}
	/* the handle the kernel holds is its address: shared, as nodes are */
	f = sfs_shm_alloc(sizeof(*f));
	if (!f)
		return -ENOMEM;
	/*
	 * The kernel did the permission and creation checks already. It
	 * also turns O_APPEND into an offset (the end it knows) in every
	 * WRITE: on the real file, O_APPEND would make pwrite(2) ignore that
	 * offset, and a WRITE sent again after a worker died would append
	 * its bytes a second time.
	 */
	flags &= ~(O_CREAT | O_EXCL | O_NOCTTY | O_NOFOLLOW | O_APPEND);
	/*
	 * Counted open before it looks for an upper copy: a writer copying
	 * up meanwhile then sees this handle (sfs_pass_open).
	 */
	atomic_fetch_add(&n->nopen, 1);
	f->upper = sfs_upper(n) >= 0;
	fd = sfs_reopen(sfs_node_datafd(n), flags);
	if (fd < 0) {
		atomic_fetch_sub(&n->nopen, 1);
		sfs_shm_free(f);
		return fd;
	}
	pthread_mutex_init(&f->lock, NULL);
	f->fd = fd;
	f->oldfd = -1;
	f->flags = flags;
	f->gen = (uint16_t)atomic_fetch_add(&sfs->file_gen, 1);
	f->node = n;
	sfs_node_ref(n);
	sfs_handle_add(&sfs->files, &f->link);
	sfs_shm_tag(f, SFS_SHM_FILE);
	sfs_resend_opened(f);
	*out = f;
	return 0;
}

/*
 * The handle the kernel holds: the address, with a generation in the
 * bits above it (user addresses fit in 47 bits), so that a RELEASE sent
 * again after its worker died never closes a handle that took the freed
 * one's place.
 */
#define SFS_FILE_GEN_SHIFT 48

uint64_t sfs_file_handle(const struct sfs_file *f)
{
	return (uint64_t)(uintptr_t)f | (uint64_t)f->gen << SFS_FILE_GEN_SHIFT;
}

/* The open file FI names; NULL for none (a directory's, or setattr's). */
struct sfs_file *sfs_file_of(const struct fuse_file_info *fi)
{
	uint64_t mask = (1ULL << SFS_FILE_GEN_SHIFT) - 1;

	return fi ? (struct sfs_file *)(uintptr_t)(fi->fh & mask) : NULL;
}

/* Whether FI's handle is still the open file it was given for. */
static bool sfs_file_current(const struct fuse_file_info *fi)
{
	struct sfs_file *f = sfs_file_of(fi);

	return f && sfs_shm_tagged(f, SFS_SHM_FILE) &&
	       sfs_file_handle(f) == fi->fh;
}

/*
 * One handle fewer. The last close of an upper file counts what it
 * allocates now, and a file whose last name went while it was open
 * gives it all back. Decided under the node's lock, with the count, as
 * sfs_node_removed decides under it: a close and the unlink of the last
 * name at the same moment each find the other done or not yet, never
 * both not yet (then neither gave the blocks back).
 */
static void sfs_file_close_usage(struct sfs_file *f)
{
	struct sfs_node *n = f->node;
	struct stat st;

	sfs_lock(&n->lock);
	if (f->upper && atomic_load(&n->nopen) == 1) {
		sfs_usage_track(n, f->fd);
		if (atomic_load(&n->unlinked) && !n->indexed &&
		    fstat(f->fd, &st) == 0 && st.st_nlink == 0)
			sfs_usage_gone(&st);
	}
	atomic_fetch_sub(&n->nopen, 1);
	sfs_unlock(&n->lock);
}

void sfs_file_close(struct sfs_file *f)
{
	sfs_resend_closed(f);
	/* untagged first: a successor never takes over a handle half closed */
	sfs_shm_tag(f, SFS_SHM_OTHER);
	sfs_pass_release(f);
	sfs_handle_del(&f->link);
	sfs_file_close_usage(f);
	close(f->fd);
	if (f->oldfd >= 0)
		close(f->oldfd);
	sfs_node_unref(f->node);
	pthread_mutex_destroy(&f->lock);
	sfs_shm_free(f);
}

/*
 * A handle a dead worker left. Its lock died with the worker's threads;
 * a worker killed between the two stores of sfs_file_readfd left the
 * same descriptor in both fields, which must be closed once.
 */
static void sfs_file_fds(void *p, void *set)
{
	struct sfs_file *f = p;

	sfs_fdset_add(set, f->fd);
	if (f->oldfd >= 0 && f->oldfd != f->fd)
		sfs_fdset_add(set, f->oldfd);
}

/* Adds the descriptors every open file holds to SET, changing nothing. */
void sfs_files_fds(struct sfs_fdset *set)
{
	sfs_shm_walk(SFS_SHM_FILE, sfs_file_fds, set);
}

static void sfs_file_takeover(void *p, void *keep)
{
	struct sfs_file *f = p;

	pthread_mutex_init(&f->lock, NULL);
	if (f->oldfd == f->fd)
		f->oldfd = -1;
	sfs_file_fds(f, keep);
	sfs_node_ref(f->node);
	sfs_handle_add(&sfs->files, &f->link);
}

/*
 * The list of handles is made again from the handles themselves, and
 * each counts its reference on its node again (sfs_table_takeover).
 */
void sfs_files_takeover(struct sfs_fdset *keep)
{
	sfs_handles_init();
	sfs_shm_walk(SFS_SHM_FILE, sfs_file_takeover, keep);
}

/* Whether the file at fd has a file capability: 1, 0, or a negative errno. */
static int sfs_file_has_caps(int fd)
{
	if (fgetxattr(fd, "security.capability", NULL, 0) >= 0)
		return 1;
	return errno == ENODATA || errno == EOPNOTSUPP ? 0 : -errno;
}

/*
 * The setuid/setgid bits a write or truncate by this caller removes,
 * by the kernel's rules: setuid always, setgid when group-executable or
 * when the writer is not in the file's group. Root keeps both.
 */
mode_t sfs_killpriv_bits(fuse_req_t req, const struct stat *st)
{
	mode_t kill = 0;

	if (fuse_req_ctx(req)->uid == 0)
		return 0;
	if (st->st_mode & S_ISUID)
		kill |= S_ISUID;
	if ((st->st_mode & S_ISGID) &&
	    ((st->st_mode & S_IXGRP) || !sfs_req_in_group(req, st->st_gid)))
		kill |= S_ISGID;
	return kill;
}

/*
 * With HANDLE_KILLPRIV_V2 (see handshake.c) the kernel leaves this to
 * us on write and on a truncating open. Once a file has no privileges
 * left, writes skip the check until its attributes change.
 */
static int sfs_file_killpriv(fuse_req_t req, struct sfs_file *f)
{
	struct sfs_node *n = f->node;
	struct stat st;
	mode_t kill;
	int ret;

	if (atomic_load(&n->nosec))
		return 0;
	if (fstat(f->fd, &st) < 0)
		return -errno;
	kill = sfs_killpriv_bits(req, &st);
	if (kill && fchmod(f->fd, st.st_mode & 07777 & ~kill) < 0)
		return -errno;
	/*
	 * File capabilities go on any write, as in the kernel. Removing one
	 * takes CAP_SETFCAP even when there is none, so look first: a daemon
	 * without it (a user's own mount) then still writes.
	 */
	ret = sfs_file_has_caps(f->fd);
	if (ret > 0 && fremovexattr(f->fd, "security.capability") < 0 &&
	    errno != ENODATA)
		return -errno;
	if (ret < 0)
		return ret;
	if (!(st.st_mode & ~kill & (S_ISUID | S_ISGID)))
		atomic_store(&n->nosec, true);
	return 0;
}

/*
 * Replies to an OPEN (e NULL) or a CREATE with the handle f. The page
 * cache stays valid across opens: every change reaches the layers
 * through this mount, so the kernel already knows of it.
 */
int sfs_file_reply(fuse_req_t req, struct sfs_file *f,
		   struct fuse_file_info *fi, const struct fuse_entry_param *e)
{
	int backing = sfs_pass_open(f, fi->flags);

	fi->fh = sfs_file_handle(f);
	if (backing)
		return sfs_pass_reply(req, e, fi->fh, backing, fi->flags);
	fi->keep_cache = sfs_pass_keep_cache(f->node);
	/* FLUSH does nothing here: spare the round trip on every close */
	fi->noflush = 1;
	return e ? fuse_reply_create(req, e, fi) : fuse_reply_open(req, fi);
}

void sfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct sfs_file *f;
	struct sfs_node *n;
	int ret = sfs_node_get_pinned(ino, &n);

	sfs_count(STRATA_ST_OPEN, 1);
	if (ret == 0) {
		ret = sfs_file_open(n, fi->flags, &f);
		sfs_node_release(n);
	}
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	/* a truncating open drops privileges as a truncate does */
	if (fi->flags & O_TRUNC) {
		ret = sfs_file_killpriv(req, f);
		if (ret < 0) {
			sfs_file_close(f);
			sfs_reply_err(req, ret);
			return;
		}
	}
	if (sfs_crash_after_name) {
		char point[NAME_MAX + sizeof("open.")];

		snprintf(point, sizeof(point), "open.%s", f->node->name);
		sfs_crash_after(point);
	}
	if (sfs_file_reply(req, f, fi, NULL) != 0)
		sfs_file_close(f);
}


static bool sfs_file_writable(const struct sfs_file *f)
{
	return (f->flags & O_ACCMODE) != O_RDONLY;
}

/*
 * Moves the handle to the node's upper copy: 0, or a negative errno with
 * the handle left where it was. A read-only handle opened on a lower
 * file gets there after a copy-up, a writable one after a freeze left
 * it on the frozen file (freeze.c); it reopens with its own flags, but
 * never truncates again. One move per handle between two freezes, so
 * oldfd is free (a freeze closes it).
 */
static int sfs_file_follow(struct sfs_file *f)
{
	int flags = sfs_file_writable(f) ? f->flags & ~O_TRUNC :
					   O_RDONLY | (f->flags & O_DIRECT);
	int fd, ret = 0;

	pthread_mutex_lock(&f->lock);
	if (f->upper)
		goto out;
	ret = sfs_node_pin(f->node);
	if (ret < 0)
		goto out;
	fd = sfs_reopen(sfs_upper(f->node), flags);
	sfs_node_unpin(f->node);
	if (fd < 0) {
		ret = fd;
		goto out;
	}
	/*
	 * Readers still on the old fd finish on the old data; it is closed
	 * with the handle, never under them.
	 */
	f->oldfd = f->fd;
	f->fd = fd;
	f->upper = true;
out:
	pthread_mutex_unlock(&f->lock);
	return ret;
}

/* The descriptor to read through: the upper copy once there is one. */
static int sfs_file_readfd(struct sfs_file *f)
{
	if (!f->upper && atomic_load(&f->node->has_upper))
		sfs_file_follow(f);
	return f->fd;
}

/*
 * The descriptor to change the file through, in *FD. After a freeze, a
 * handle is on the frozen file, which must never change again: the file
 * is copied up into the new upper first, as a write open does.
 */
static int sfs_file_writefd(struct sfs_file *f, int *fd)
{
	int ret = 0;

	if (!f->upper) {
		if (!sfs_file_writable(f))
			return -EBADF;
		ret = sfs_copy_up(f->node);
		if (ret == 0)
			ret = sfs_file_follow(f);
	}
	*fd = f->fd;
	return ret;
}

void sfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		 struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_READ, 1);
	sfs_count(STRATA_ST_READ_BYTES, size);
	struct sfs_file *f = sfs_file_of(fi);

	sfs_io_read(req, sfs_file_readfd(f), size, off, f->flags & O_DIRECT);
}

void sfs_op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *buf,
		      off_t off, struct fuse_file_info *fi)
{
	struct sfs_file *f = sfs_file_of(fi);
	int fd, ret = sfs_file_writefd(f, &fd);
	struct sfs_claim claim;
	ssize_t fits;

	sfs_count(STRATA_ST_WRITE, 1);
	sfs_count(STRATA_ST_WRITE_BYTES, fuse_buf_size(buf));
	if (ret == 0)
		ret = sfs_file_killpriv(req, f);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	/* sfs_file_writefd leaves the handle on the upper file */
	fits = sfs_usage_claim(f->node, fd, off, fuse_buf_size(buf), &claim);
	if (fits < 0) {
		sfs_reply_err(req, (int)fits);
		return;
	}
	atomic_fetch_add(&f->node->dirty, 1);
	sfs_io_write(req, fd, buf, off, f->flags & O_DIRECT, &claim);
}

void sfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_FLUSH, 1);
	/* Locks are the kernel's own and data is written through: nothing to do. */
	fuse_reply_err(req, 0);
}

void sfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_RELEASE, 1);
	/* sent again after its worker died, it may find the handle closed */
	if (sfs_file_current(fi))
		sfs_file_close(sfs_file_of(fi));
	fuse_reply_err(req, 0);
}

void sfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		  struct fuse_file_info *fi)
{
	struct sfs_file *f = sfs_file_of(fi);
	unsigned int dirty = atomic_load(&f->node->dirty);
	int ret = datasync ? fdatasync(f->fd) : fsync(f->fd);

	sfs_count(STRATA_ST_FSYNC, 1);
	/* a filesystem that allocates at writeback has now */
	if (ret == 0 && f->upper)
		sfs_usage_track(f->node, f->fd);
	/* allocated now, unless written meanwhile: attributes may be kept */
	if (ret == 0)
		atomic_compare_exchange_strong(&f->node->dirty, &dirty, 0);
	fuse_reply_err(req, ret < 0 ? errno : 0);
}

void sfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
		      off_t length, struct fuse_file_info *fi)
{
	struct sfs_file *f = sfs_file_of(fi);
	struct sfs_claim claim = { .node = f->node };
	int fd, ret;

	sfs_count(STRATA_ST_FALLOCATE, 1);
	ret = sfs_file_writefd(f, &fd);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	/* it modifies the file like a write: privileges go the same way */
	atomic_fetch_add(&f->node->dirty, 1);
	ret = sfs_file_killpriv(req, f);
	sfs_usage_seed(f->node, fd);
	/*
	 * Allocating modes may take all of the range: it must fit whole,
	 * as fallocate(2) allocates all of it or fails. Punching and
	 * zeroing without allocation only give back.
	 */
	if (ret == 0 && !(mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_COLLAPSE_RANGE)))
		ret = sfs_usage_reserve(length, &claim.bytes);
	if (ret == 0 && fallocate(fd, mode, offset, length) < 0)
		ret = -errno;
	sfs_usage_settle(&claim, fd);
	sfs_reply_err(req, ret);
}

void sfs_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		  struct fuse_file_info *fi)
{
	off_t res = lseek(sfs_file_readfd(sfs_file_of(fi)), off, whence);

	sfs_count(STRATA_ST_LSEEK, 1);
	if (res < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_lseek(req, res);
}

void sfs_op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			    struct fuse_file_info *fi_in, fuse_ino_t ino_out,
			    off_t off_out, struct fuse_file_info *fi_out,
			    size_t len, int flags)
{
	struct sfs_file *out = sfs_file_of(fi_out);
	int fd, ret = sfs_file_writefd(out, &fd);
	struct sfs_claim claim = { 0 };
	ssize_t fits = len;

	sfs_count(STRATA_ST_COPY_FILE_RANGE, 1);
	if (ret == 0)
		ret = sfs_file_killpriv(req, out);
	/* sfs_file_writefd leaves the handle on the upper file */
	if (ret == 0)
		fits = sfs_usage_claim(out->node, fd, off_out, len, &claim);
	if (ret == 0 && fits < 0)
		ret = (int)fits;
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	atomic_fetch_add(&out->node->dirty, 1);
	sfs_io_copy_file(req, sfs_file_readfd(sfs_file_of(fi_in)), off_in, fd,
			 off_out, fits, flags);
	sfs_usage_settle(&claim, fd);
}

/*
 * lsattr and chattr: the kernel asks for a file's flags with
 * FS_IOC_GETFLAGS or FS_IOC_FSGETXATTR (and sets them with the SET
 * forms) on a handle it opens for the purpose. They are the real file's,
 * as on the kernel's overlayfs, and setting them copies the file up
 * first. Only regular files and directories get here.
 */
static int sfs_fileattr(struct sfs_node *n, unsigned int cmd,
			const void *in, void *out)
{
	bool set = cmd == FS_IOC_SETFLAGS || cmd == FS_IOC_FSSETXATTR;
	int fd, ret;

	if (set) {
		ret = sfs_copy_up(n);
		if (ret < 0)
			return ret;
		/* attributes change: the next write checks privileges again */
		atomic_store(&n->nosec, false);
	}
	fd = sfs_node_datafd(n);
	if (!S_ISDIR(n->type)) {
		fd = sfs_reopen(fd, O_RDONLY | O_NONBLOCK);
		if (fd < 0)
			return fd;
	}
	ret = ioctl(fd, cmd, set ? (void *)in : out) < 0 ? -errno : 0;
	if (!S_ISDIR(n->type))
		close(fd);
	return ret;
}

void sfs_op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		  struct fuse_file_info *fi, unsigned flags,
		  const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	union {
		unsigned int flags;
		struct fsxattr fsx;
	} out = { 0 };
	size_t size = cmd == FS_IOC_GETFLAGS || cmd == FS_IOC_SETFLAGS ?
			      sizeof(out.flags) : sizeof(out.fsx);
	bool set = cmd == FS_IOC_SETFLAGS || cmd == FS_IOC_FSSETXATTR;
	struct sfs_node *n;
	int ret;

	if (cmd != FS_IOC_GETFLAGS && cmd != FS_IOC_SETFLAGS &&
	    cmd != FS_IOC_FSGETXATTR && cmd != FS_IOC_FSSETXATTR) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	if (set ? in_bufsz < size : out_bufsz < size) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	ret = sfs_node_get_pinned(ino, &n);
	if (ret == 0) {
		ret = sfs_fileattr(n, cmd, in_buf, &out);
		sfs_node_release(n);
	}
	if (ret < 0)
		sfs_reply_err(req, ret);
	else
		fuse_reply_ioctl(req, 0, set ? NULL : &out, set ? 0 : size);
}
