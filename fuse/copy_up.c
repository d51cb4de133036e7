// SPDX-License-Identifier: Apache-2.0
/*
 * Copy-up: a lower entry gets an upper copy before anything changes it.
 * The copy is built complete in the workdir and renamed into place, so
 * no reader ever sees a partial file, and a crash or ENOSPC leaves only
 * a temp entry in the workdir (cleared at the next mount).
 *
 * Order matters: data first, then owner, then xattrs, then mode. Writing
 * data after security.capability would drop it; chown after chmod would
 * drop the setuid bits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

/* progress is told between pieces of this size */
#define SFS_COPY_PIECE (32 << 20)

/* Copies a data range in pieces, telling P how far it got. */
static int sfs_copy_range(int in, int out, off_t off, off_t len,
			  struct sfs_progress *p)
{
	while (len > 0) {
		off_t piece = len < SFS_COPY_PIECE ? len : SFS_COPY_PIECE;
		int ret = sfs_io_copy_range(in, out, off, piece);

		if (ret < 0)
			return ret;
		off += piece;
		len -= piece;
		sfs_progress_set(p, off);
	}
	return 0;
}

/* Copies the data ranges only, so holes stay holes. */
static int sfs_copy_data(int in, int out, off_t size, struct sfs_progress *p)
{
	off_t off = 0;
	int ret;

	if (ioctl(out, FICLONE, in) == 0)
		return 0;
	while (off < size) {
		off_t data = lseek(in, off, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break;	/* only a hole is left */
		if (data < 0)
			return sfs_copy_range(in, out, off, size - off, p);
		hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = size;
		if (hole > size)
			hole = size;
		ret = sfs_copy_range(in, out, data, hole - data, p);
		if (ret < 0)
			return ret;
		off = hole;
	}
	return ftruncate(out, size) < 0 ? -errno : 0;
}

/* Builds the regular file's copy at work/tmp. */
static int sfs_copy_up_reg(struct sfs_node *n, const char *tmp,
			   const struct stat *st, bool data)
{
	struct sfs_progress *prog;
	int in = -1, out, ret = 0;

	out = openat(sfs->tmpfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
		     0600);
	if (out < 0)
		return -errno;
	if (data && st->st_size > 0) {
		in = sfs_reopen(sfs_node_lower(n)[0].fd, O_RDONLY);
		if (in < 0) {
			ret = in;
			goto out;
		}
		prog = sfs_progress_begin(in, sfs_node_lower(n)[0].layer, st->st_size);
		ret = sfs_copy_data(in, out, st->st_size, prog);
		sfs_progress_end(prog);
		if (ret < 0)
			goto out;
	}
	if (fsync(out) < 0)
		ret = -errno;
out:
	if (in >= 0)
		close(in);
	close(out);
	return ret;
}

static int sfs_copy_up_other(struct sfs_node *n, const char *tmp,
			     const struct stat *st)
{
	char target[PATH_MAX + 1];
	ssize_t len;

	switch (st->st_mode & S_IFMT) {
	case S_IFDIR:
		if (mkdirat(sfs->tmpfd, tmp, 0700) < 0)
			return -errno;
		break;
	case S_IFLNK:
		len = readlinkat(sfs_node_lower(n)[0].fd, "", target, sizeof(target));
		if (len < 0)
			return -errno;
		if ((size_t)len >= sizeof(target))
			return -ENAMETOOLONG;
		target[len] = '\0';
		if (symlinkat(target, sfs->tmpfd, tmp) < 0)
			return -errno;
		break;
	default:
		if (mknodat(sfs->tmpfd, tmp, st->st_mode & S_IFMT,
			    st->st_rdev) < 0)
			return -errno;
		break;
	}
	return 0;
}

/* Caller holds n->lock and a pin on its parent. */
static int sfs_copy_up_xattrs(struct sfs_node *n, const char *tmp,
			      const struct stat *st)
{
	struct sfs_xpath from, to;
	int ret;

	if (S_ISLNK(st->st_mode))
		ret = sfs_xpath_lower_name(&from, n->parent, n);
	else
		ret = sfs_xpath_fd(&from, sfs_node_lower(n)[0].fd);
	if (ret == 0)
		ret = sfs_xpath_entry(&to, sfs->tmpfd, tmp);
	return ret < 0 ? ret : sfs_xattr_copy(&from, &to);
}

/*
 * Owner, xattrs, origins (the kernel's, where the lower filesystem gives
 * handles, and our inode number), mode and times, on the finished
 * work/tmp.
 */
static int sfs_copy_up_attrs(struct sfs_node *n, const char *tmp,
			     const struct stat *st, const struct sfs_fh *fh)
{
	struct timespec tv[2] = { st->st_atim, st->st_mtim };
	int ret;

	if (fchownat(sfs->tmpfd, tmp, st->st_uid, st->st_gid,
		     AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	ret = sfs_copy_up_xattrs(n, tmp, st);
	if (ret < 0)
		return ret;
	/* Symlinks and devices refuse user.* xattrs: no origin for them then. */
	ret = sfs_ino_xattr_set(sfs->tmpfd, tmp, n->ino);
	if (ret == 0 && fh->len)
		ret = sfs_origin_fh_set(sfs->tmpfd, tmp, fh);
	if (ret < 0 && (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)))
		return ret;
	if (!S_ISLNK(st->st_mode) &&
	    fchmodat(sfs->tmpfd, tmp, st->st_mode & 07777, 0) < 0)
		return -errno;
	if (utimensat(sfs->tmpfd, tmp, tv, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	return 0;
}

/*
 * A lower file with several names is copied once, into the index (see
 * index.c), and no name of it yet: each finds the copy by its origin,
 * and a write through one is seen through all, across remounts too.
 * Every lower name is in view until one is removed: that is the count.
 */
static int sfs_copy_up_index(struct sfs_node *n, const char *tmp,
			     const struct stat *st, const struct sfs_fh *fh)
{
	struct sfs_xpath x;
	struct stat ist;
	char val[16];
	int len, ret, fd;

	len = sfs_nlink_format(val, sizeof(val), st->st_nlink, 1);
	ret = sfs_xpath_entry(&x, sfs->tmpfd, tmp);
	if (ret == 0)
		ret = sfs_xattr_set(&x, sfs->xattr_nlink, val, len, 0);
	if (ret == 0)
		ret = sfs_index_install(tmp, fh);
	if (ret < 0)
		return ret;
	fd = sfs_index_open(fh, st->st_mode, &ist);
	if (fd < 0)
		return fd;
	n->indexed = true;
	n->index_nlink = st->st_nlink;
	n->has_origin = true;
	sfs_node_set_upper(n, fd);
	return 0;
}

/* The copy-up itself; CST: the copy's attributes, as counted. */
static int sfs_copy_up_build(struct sfs_node *n, int dirfd, bool data,
			     const struct stat *lst, struct stat *cst)
{
	struct sfs_entry *low = sfs_node_lower(n);
	struct sfs_fh fh = { 0 };
	struct stat st = *lst, pst;
	char tmp[64];
	int ret;

	ret = sfs_tmp_name(tmp, sizeof(tmp));
	if (ret < 0)
		return ret;
	/* a lower filesystem without handles gets no origin, as in the kernel */
	if (sfs_fh_encode(low->fd, &sfs->lower[low->layer - 1], &fh) < 0)
		fh.len = 0;
	if (dirfd < 0 && !fh.len)
		return -EIO;	/* sfs_copy_up_mode checked it can */
	if (S_ISREG(st.st_mode))
		ret = sfs_copy_up_reg(n, tmp, &st, data);
	else
		ret = sfs_copy_up_other(n, tmp, &st);
	if (ret == 0)
		ret = sfs_copy_up_attrs(n, tmp, &st, &fh);
	if (ret == 0 && fstatat(sfs->tmpfd, tmp, cst, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	if (ret < 0)
		goto out_clean;
	if (dirfd < 0) {
		ret = sfs_copy_up_index(n, tmp, &st, &fh);
		if (ret < 0)
			goto out_clean;
		strata_debug("copied up ino %llx into the index",
			     (unsigned long long)n->ino);
		return 0;
	}
	ret = sfs_mark_impure(n->parent);
	if (ret == 0)
		ret = sfs_fstat(dirfd, &pst);
	if (ret == 0)
		ret = sfs_rename(sfs->tmpfd, tmp, dirfd, n->name,
				 RENAME_NOREPLACE);
	if (ret < 0)
		goto out_clean;
	/* The parent's times are the lower's, not those of our copy-up. */
	futimens(dirfd, (struct timespec[2]){ pst.st_atim, pst.st_mtim });

	ret = sfs_open_entry(dirfd, n->name, st.st_mode);
	if (ret < 0)
		return ret;
	n->has_origin = true;
	sfs_node_set_upper(n, ret);
	strata_debug("copied up %s (ino %llx)", n->name,
		     (unsigned long long)n->ino);
	return 0;

out_clean:
	sfs_tmp_remove(tmp);
	return ret;
}

/*
 * The copy goes to DIRFD under the node's name, or into the index
 * (DIRFD -1) for a lower file with several names.
 */
static int sfs_copy_up_locked(struct sfs_node *n, int dirfd, bool data)
{
	struct stat st, cst;
	int64_t claimed;
	int ret;

	ret = sfs_fstat(sfs_node_lower(n)[0].fd, &st);
	if (ret < 0)
		return ret;
	/*
	 * The copy takes what the lower file allocates (holes stay holes),
	 * and a block for the entry: refused whole when it does not fit.
	 */
	ret = sfs_usage_reserve((S_ISREG(st.st_mode) && data ?
				 (int64_t)st.st_blocks * 512 : 0) + 4096,
				&claimed);
	if (ret < 0)
		return ret;
	ret = sfs_copy_up_build(n, dirfd, data, &st, &cst);
	sfs_usage_unreserve(claimed);
	if (ret == 0) {
		sfs_usage_charge((int64_t)cst.st_blocks * 512, 1);
		atomic_store(&n->ublocks, (int64_t)cst.st_blocks);
	}
	return ret;
}

/*
 * Whether the node's copy goes to the index: a non-directory with
 * several lower names, on a lower filesystem that gives handles.
 */
static bool sfs_copy_up_indexed(struct sfs_node *n)
{
	struct sfs_fh fh;
	struct stat st;

	return !S_ISDIR(n->type) && sfs->indexfd >= 0 && n->nlower &&
	       sfs_fstat(sfs_node_lower(n)[0].fd, &st) == 0 && st.st_nlink > 1 &&
	       sfs_fh_encode(sfs_node_lower(n)[0].fd,
			     &sfs->lower[sfs_node_lower(n)[0].layer - 1], &fh) == 0;
}

static int sfs_copy_up_mode(struct sfs_node *n, bool data)
{
	struct sfs_node *parent;
	bool index;
	int ret;

	if (!sfs_has_upper())
		return -EROFS;
	for (;;) {
		if (atomic_load(&n->has_upper))
			return 0;
		parent = sfs_node_get_parent(n, &ret);
		if (!parent)	/* only the root has none, and it is up */
			return ret < 0 ? ret : -EIO;

		/* Parents first, without holding the child's lock. */
		index = sfs_copy_up_indexed(n);
		ret = index ? 0 : sfs_copy_up_mode(parent, true);
		if (ret < 0) {
			sfs_node_release(parent);
			return ret;
		}
		sfs_lock(&n->lock);
		if (n->parent != parent) {
			/* renamed meanwhile: copy up the new parents */
			sfs_unlock(&n->lock);
			sfs_node_release(parent);
			continue;
		}
		ret = 0;
		if (!atomic_load(&n->has_upper))
			ret = sfs_copy_up_locked(n, index ? -1 :
							    sfs_upper(parent),
						 data);
		sfs_unlock(&n->lock);
		sfs_node_release(parent);
		return ret;
	}
}

int sfs_copy_up(struct sfs_node *n)
{
	return sfs_copy_up_mode(n, true);
}

int sfs_copy_up_meta(struct sfs_node *n)
{
	return sfs_copy_up_mode(n, false);
}

/* Gives NAME in DIR an upper entry for N, whose data is already up. */
int sfs_copy_up_name(struct sfs_node *dir, const char *name,
		     struct sfs_node *n)
{
	char path[64];
	struct stat st, ust;
	int dirfd, ret;

	ret = sfs_copy_up(dir);
	if (ret == 0)
		ret = sfs_copy_up(n);
	if (ret < 0)
		return ret;
	dirfd = sfs_upper(dir);
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	if (n->has_origin) {
		ret = sfs_mark_impure(dir);
		if (ret < 0)
			return ret;
	}
	sfs_proc_path(sfs_upper(n), path, sizeof(path));
	if (linkat(AT_FDCWD, path, dirfd, name, AT_SYMLINK_FOLLOW) < 0) {
		ret = -errno;
		/* a freeze linking names up may have come first (linkup.c) */
		if (ret != -EEXIST || sfs_fstat(sfs_upper(n), &ust) < 0 ||
		    fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    st.st_ino != ust.st_ino || st.st_dev != ust.st_dev)
			return ret;
	}
	/* one more real link, no more names in view: the count moves */
	if (n->indexed)
		return sfs_index_nlink_add(n, 0) < 0 ? -EIO : 0;
	return 0;
}
