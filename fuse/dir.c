// SPDX-License-Identifier: Apache-2.0
/*
 * Changes to directories: create, mkdir, mknod, symlink, link, unlink,
 * rmdir and rename. Each leaves the upper layer in the kernel's format:
 * a removed lower name becomes a whiteout, a directory created over a
 * whiteout is opaque, a moved directory with lower content carries a
 * redirect. Every marker lands in one rename from the workdir.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "stratafs.h"

struct sfs_newent {
	mode_t mode;		/* type and permission bits */
	mode_t umask;		/* the caller's, for a parent without ACLs */
	dev_t rdev;
	const char *link;	/* symlink target */
	uid_t uid;
	gid_t gid;
	struct sfs_acl acl;	/* inherited from the parent (acl.c) */
};

/* Creates one entry with its owner and ACLs; on failure nothing is left. */
static int sfs_make_at(int dirfd, const char *name, const struct sfs_newent *ne)
{
	struct sfs_xpath x;
	int fd, ret;

	switch (ne->mode & S_IFMT) {
	case S_IFREG:
		fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
			    ne->mode & 07777);
		if (fd < 0)
			return -errno;
		close(fd);
		break;
	case S_IFDIR:
		if (mkdirat(dirfd, name, ne->mode & 07777) < 0)
			return -errno;
		break;
	case S_IFLNK:
		if (symlinkat(ne->link, dirfd, name) < 0)
			return -errno;
		break;
	default:
		if (mknodat(dirfd, name, ne->mode, ne->rdev) < 0)
			return -errno;
		break;
	}
	ret = 0;
	if (fchownat(dirfd, name, ne->uid, ne->gid, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	/* chown cleared setuid/setgid; the caller asked for them */
	else if (!S_ISLNK(ne->mode) && (ne->mode & (S_ISUID | S_ISGID)) &&
		 fchmodat(dirfd, name, ne->mode & 07777, 0) < 0)
		ret = -errno;
	/*
	 * Set whether the upper filesystem gave it already or not (built
	 * in the workdir); by root, which keeps setgid.
	 */
	if (ret == 0 && ne->acl.def) {
		ret = sfs_xpath_entry(&x, dirfd, name);
		if (ret == 0)
			ret = sfs_acl_set_new(&x, ne->mode, &ne->acl);
	}
	if (ret < 0)
		sfs_unlinkat(dirfd, name, S_ISDIR(ne->mode) ? AT_REMOVEDIR : 0);
	return ret;
}

/* 1 when the upper directory holds a whiteout at NAME, 0 when nothing. */
static int sfs_upper_state(int dirfd, const char *name, struct stat *st)
{
	if (fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	return sfs_is_whiteout(st) || sfs_is_xwhiteout(dirfd, name, st) > 0 ?
		       1 : 2;
}

static int sfs_check_absent(struct sfs_node *dir, const char *name)
{
	struct sfs_found f;
	int ret = sfs_lookup_name(dir, name, &f);

	if (ret == 0) {
		sfs_found_release(&f);
		return -EEXIST;
	}
	return ret == -ENOENT ? 0 : ret;
}

/*
 * A request the kernel sent again after its worker died (transport.c)
 * may find its work done. The kernel holds the directory locked from the
 * first sending to the answer, and looked the name up as absent before
 * it sent: an entry at NAME is the one the dead worker made. Its node,
 * if it is of the TYPE asked for.
 */
static int sfs_resent_made(struct sfs_node *dir, const char *name,
			   mode_t type, struct sfs_node **out)
{
	int ret = sfs_lookup_node(dir, name, out);

	if (ret == 0 && (*out)->type != type) {
		sfs_node_release(*out);
		*out = NULL;
		return -EEXIST;
	}
	return ret;
}

static int sfs_create(struct sfs_node *dir, const char *name,
		      struct sfs_newent *ne, struct sfs_node **out)
{
	struct stat st;
	char tmp[64];
	int dirfd, ret;

	if (!sfs_has_upper())
		return -EROFS;
	ret = sfs_check_absent(dir, name);
	if (ret == -EEXIST && sfs_req_resent())
		return sfs_resent_made(dir, name, ne->mode & S_IFMT, out);
	if (ret == 0)
		ret = sfs_copy_up(dir);
	if (ret == 0)
		ret = sfs_acl_inherit(dir, &ne->mode, ne->umask, &ne->acl);
	if (ret < 0)
		return ret;
	dirfd = sfs_upper(dir);
	ret = sfs_upper_state(dirfd, name, &st);
	if (ret < 0)
		return ret;
	/* a full volume takes no new entry: it may need a block */
	if (sfs_usage_room(1) < 0)
		return -ENOSPC;
	/* the directory grows a block now and then as entries are added */
	sfs_usage_seed(dir, dirfd);
	if (ret == 0) {
		ret = sfs_make_at(dirfd, name, ne);
		if (ret < 0)
			return ret;
	} else {
		/*
		 * Over a whiteout: build it in the workdir and swap it in.
		 * A directory there must not merge with what the whiteout
		 * hid, so it is opaque.
		 */
		ret = sfs_tmp_name(tmp, sizeof(tmp));
		if (ret == 0)
			ret = sfs_make_at(sfs->tmpfd, tmp, ne);
		if (ret == 0 && S_ISDIR(ne->mode)) {
			int fd = openat(sfs->tmpfd, tmp, O_RDONLY | O_DIRECTORY |
							   O_CLOEXEC);

			ret = fd < 0 ? -errno : sfs_set_opaque(fd);
			if (fd >= 0)
				close(fd);
		}
		/* rename(2) cannot put a directory over a device: swap them */
		if (ret == 0)
			ret = sfs_rename(sfs->tmpfd, tmp, dirfd, name,
					 S_ISDIR(ne->mode) ? RENAME_EXCHANGE : 0);
		if (ret < 0) {
			sfs_tmp_remove(tmp);
			return ret;
		}
		if (S_ISDIR(ne->mode))
			sfs_tmp_remove(tmp);
		/* the whiteout it replaced is gone */
		sfs_usage_charge(0, -1);
	}
	sfs_usage_entry(dirfd, name);
	sfs_usage_track(dir, dirfd);
	sfs_node_dir_changed(dir, S_ISDIR(ne->mode));
	return sfs_lookup_node(dir, name, out);
}

/* Creates NAME in the directory PARENT; *out comes pinned and referenced. */
static int sfs_create_entry(fuse_req_t req, fuse_ino_t parent,
			    const char *name, mode_t mode, dev_t rdev,
			    const char *link, struct sfs_node **out)
{
	struct sfs_newent ne = { .mode = mode, .rdev = rdev, .link = link };
	struct sfs_node *dir;
	int ret = sfs_node_get_pinned(parent, &dir);

	if (ret < 0)
		return ret;
	ne.uid = fuse_req_ctx(req)->uid;
	ne.gid = fuse_req_ctx(req)->gid;
	/* FUSE_DONT_MASK: the kernel leaves the umask to us (acl.c) */
	ne.umask = fuse_req_ctx(req)->umask;
	sfs_new_owner(dir, &ne.mode, &ne.uid, &ne.gid);
	ret = sfs_create(dir, name, &ne, out);
	sfs_acl_free(&ne.acl);
	sfs_node_release(dir);
	return ret;
}

static void sfs_reply_new(fuse_req_t req, int ret, struct sfs_node *n)
{
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	sfs_entry_reply(req, n);
	sfs_node_release(n);
}

void sfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		  mode_t mode, dev_t rdev)
{
	struct sfs_node *n = NULL;
	int ret = -EPERM;

	sfs_count(STRATA_ST_MKNOD, 1);
	/* a whiteout is the overlay's marker, never the user's file */
	if (!S_ISCHR(mode) || rdev != makedev(0, 0))
		ret = sfs_create_entry(req, parent, name, mode, rdev, NULL, &n);
	sfs_reply_new(req, ret, n);
}

void sfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		  mode_t mode)
{
	struct sfs_node *n = NULL;
	int ret = sfs_create_entry(req, parent, name,
				   S_IFDIR | (mode & 07777), 0, NULL, &n);

	sfs_count(STRATA_ST_MKDIR, 1);
	sfs_reply_new(req, ret, n);
}

void sfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		    const char *name)
{
	struct sfs_node *n = NULL;
	int ret = sfs_create_entry(req, parent, name,
				   S_IFLNK | 0777, 0, link, &n);

	sfs_count(STRATA_ST_SYMLINK, 1);
	sfs_reply_new(req, ret, n);
}

void sfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		   mode_t mode, struct fuse_file_info *fi)
{
	struct sfs_node *n = NULL;
	struct sfs_file *f;
	struct fuse_entry_param e;
	int ret;

	sfs_count(STRATA_ST_CREATE, 1);
	ret = sfs_create_entry(req, parent, name,
			       S_IFREG | (mode & 07777), 0, NULL, &n);
	if (ret < 0)
		goto out_err;
	ret = sfs_fill_entry(n, &e);
	if (ret == 0)
		ret = sfs_file_open(n, fi->flags & ~O_TRUNC, &f);
	if (ret < 0)
		goto out_err;
	sfs_node_lookup_inc(n);
	if (sfs_file_reply(req, f, fi, &e) != 0) {
		sfs_file_close(f);
		sfs_node_lookup_dec(n);
	}
	sfs_node_release(n);
	return;

out_err:
	if (n)
		sfs_node_release(n);
	sfs_reply_err(req, ret);
}

/* A LINK sent again finds its work done when NEWNAME is N (see above). */
static int sfs_resent_linked(struct sfs_node *n, struct sfs_node *dir,
			     const char *newname)
{
	struct sfs_node *got;
	int ret = sfs_lookup_node(dir, newname, &got);

	if (ret < 0)
		return ret;
	ret = got == n ? 0 : -EEXIST;
	sfs_node_release(got);
	return ret;
}

static int sfs_link(struct sfs_node *n, struct sfs_node *dir,
		    const char *newname)
{
	struct stat st;
	char path[64], tmp[64];
	int dirfd, ret;

	sfs_lock(&n->lock);
	ret = n->unlinked && !n->linkable ? -ENOENT : 0;
	sfs_unlock(&n->lock);
	if (ret == 0)
		ret = sfs_check_absent(dir, newname);
	if (ret == -EEXIST && sfs_req_resent())
		return sfs_resent_linked(n, dir, newname);
	if (ret == 0)
		ret = sfs_copy_up(n);
	if (ret == 0)
		ret = sfs_copy_up(dir);
	if (ret == 0 && n->has_origin)
		ret = sfs_mark_impure(dir);
	if (ret < 0)
		return ret;
	dirfd = sfs_upper(dir);
	sfs_proc_path(sfs_upper(n), path, sizeof(path));
	ret = sfs_upper_state(dirfd, newname, &st);
	if (ret < 0)
		return ret;
	if (ret == 0) {
		if (linkat(AT_FDCWD, path, dirfd, newname, AT_SYMLINK_FOLLOW) < 0)
			ret = -errno;
	} else {
		ret = sfs_tmp_name(tmp, sizeof(tmp));
		if (ret == 0 && linkat(AT_FDCWD, path, sfs->tmpfd, tmp,
				       AT_SYMLINK_FOLLOW) < 0)
			ret = -errno;
		if (ret == 0) {
			ret = sfs_rename(sfs->tmpfd, tmp, dirfd, newname, 0);
			if (ret < 0)
				sfs_unlinkat(sfs->tmpfd, tmp, 0);
		}
	}
	if (ret == 0)
		sfs_node_dir_changed(dir, 0);
	if (ret == 0 && n->linkable) {
		/* an O_TMPFILE file gets its first name */
		sfs_lock(&n->lock);
		n->linkable = false;
		ret = sfs_node_set_name(n, dir, newname);
		sfs_unlock(&n->lock);
	}
	if (ret == 0 && n->indexed)
		ret = sfs_index_nlink_add(n, 1) < 0 ? -EIO : 0;
	return ret;
}

void sfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		 const char *newname)
{
	sfs_count(STRATA_ST_LINK, 1);
	struct sfs_node *n, *dir;
	int ret;

	if (!sfs_has_upper()) {
		fuse_reply_err(req, EROFS);
		return;
	}
	ret = sfs_node_get_pinned(ino, &n);
	if (ret < 0)
		goto out_err;
	ret = sfs_node_get_pinned(newparent, &dir);
	if (ret == 0) {
		ret = sfs_link(n, dir, newname);
		if (ret == 0)
			sfs_entry_reply(req, n);
		sfs_node_release(dir);
	}
	sfs_node_release(n);
	if (ret == 0)
		return;
out_err:
	sfs_reply_err(req, ret);
}

/*
 * A lower file with several names goes to the index before one of its
 * names goes away, so the others keep an exact link count.
 */
static int sfs_prepare_nlink_change(struct sfs_node *n)
{
	struct stat st;
	int ret;

	if (S_ISDIR(n->type) || atomic_load(&n->has_upper))
		return 0;
	ret = sfs_fstat(sfs_node_lower(n)[0].fd, &st);
	if (ret == 0 && st.st_nlink > 1)
		ret = sfs_copy_up(n);
	return ret;
}

/* After a name went away: is the node gone from the view entirely? */
static void sfs_node_removed(struct sfs_node *n)
{
	struct stat st;
	bool gone = true;
	int upper = sfs_upper(n);

	if (n->indexed)
		gone = sfs_index_nlink_add(n, -1) == 0;
	else if (S_ISDIR(n->type))
		gone = true;
	else if (upper >= 0)
		gone = sfs_fstat(upper, &st) == 0 && st.st_nlink == 0;
	else
		gone = sfs_fstat(sfs_node_lower(n)[0].fd, &st) == 0 && st.st_nlink <= 1;
	if (gone)
		sfs_node_unhash(n);
	sfs_lock(&n->lock);
	if (gone)
		n->unlinked = true;
	/*
	 * An upper inode with no name left is freed, and what it took
	 * given back: now, or for an open file at its last close, which
	 * decides under this lock too (sfs_file_close_usage).
	 */
	if (gone && upper >= 0 && !n->indexed &&
	    (!S_ISREG(n->type) || atomic_load(&n->nopen) == 0) &&
	    sfs_fstat(upper, &st) == 0)
		sfs_usage_gone(&st);
	/*
	 * Nothing can reach a removed file without an open handle, but the
	 * kernel forgets it only later: release its blocks now, as kernel
	 * overlayfs does, so `rm big; df` shows the space. The descriptor
	 * number stays valid (on /dev/null) for any racing user.
	 */
	if (gone && S_ISREG(n->type) && upper >= 0 &&
	    atomic_load(&n->nopen) == 0) {
		n->stale = true;
		dup3(sfs->nullfd, upper, O_CLOEXEC);
	}
	sfs_unlock(&n->lock);
}

/*
 * Removes NAME from DIR's upper layer, leaving a whiteout when a lower
 * layer would show the name again. STATE is what the upper layer has at
 * NAME (as sfs_upper_state says), or -1 when the caller does not know:
 * the kernel holds DIR locked, so nothing changes it in between.
 */
static int sfs_remove(struct sfs_node *dir, const char *name, bool isdir,
		      int state)
{
	struct stat st;
	char tmp[64];
	int dirfd, positive, ret;

	ret = sfs_copy_up(dir);
	if (ret < 0)
		return ret;
	dirfd = sfs_upper(dir);
	positive = sfs_lower_positive(dir, name);
	if (positive < 0)
		return positive;
	if (state < 0)
		state = sfs_upper_state(dirfd, name, &st);
	if (state < 0)
		return state;
	if (state == 0 && !positive)
		return -ENOENT;
	if (state == 0) {
		/* a new name in the directory, which may grow a block */
		sfs_usage_seed(dir, dirfd);
		ret = sfs_whiteout_create(dirfd, name);
		sfs_usage_track(dir, dirfd);
		/* a freeze may have linked the name up meanwhile (linkup.c) */
		if (ret != -EEXIST)
			return ret;
	}
	if (positive)
		return sfs_whiteout_replace(dirfd, name);
	if (!isdir)
		return sfs_unlinkat(dirfd, name, 0);
	/* The upper dir may still hold whiteouts: clear it out of sight. */
	ret = sfs_tmp_name(tmp, sizeof(tmp));
	if (ret == 0)
		ret = sfs_rename(dirfd, name, sfs->tmpfd, tmp, 0);
	if (ret == 0)
		ret = sfs_tmp_remove(tmp);
	return ret;
}

static int sfs_unlink(struct sfs_node *dir, const char *name, bool isdir)
{
	struct sfs_node *n;
	struct stat st;
	int state, ret;

	ret = sfs_lookup_held(dir, name, &st, &state, &n);
	if (ret == 0)
		ret = sfs_lookup_node(dir, name, &n);
	if (ret < 0)
		return ret;
	if (isdir)
		ret = S_ISDIR(n->type) ? sfs_dir_check_empty(n) : -ENOTDIR;
	else
		ret = S_ISDIR(n->type) ? -EISDIR : sfs_prepare_nlink_change(n);
	/* that copy-up may have put an entry where there was none */
	if (state == 0)
		state = -1;
	if (ret == 0)
		ret = sfs_remove(dir, name, isdir, state);
	if (ret == 0) {
		sfs_node_removed(n);
		sfs_node_dir_changed(dir, isdir ? -1 : 0);
	}
	sfs_node_release(n);
	return ret;
}

static void sfs_unlink_op(fuse_req_t req, fuse_ino_t parent, const char *name,
			  bool isdir)
{
	struct sfs_node *dir;
	int ret = -EROFS;

	if (sfs_has_upper())
		ret = sfs_node_get_pinned(parent, &dir);
	if (ret == 0) {
		ret = sfs_unlink(dir, name, isdir);
		sfs_node_release(dir);
	}
	/* sent again, and gone: the dead worker removed it (sfs_resent_made) */
	if (ret == -ENOENT && sfs_req_resent())
		ret = 0;
	sfs_reply_err(req, ret);
}

void sfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	sfs_count(STRATA_ST_UNLINK, 1);
	sfs_unlink_op(req, parent, name, false);
}

void sfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	sfs_count(STRATA_ST_RMDIR, 1);
	sfs_unlink_op(req, parent, name, true);
}

/*
 * The absolute path of a directory's lower part, as a redirect names
 * it: the nearest redirected ancestor's redirect plus the names below.
 */
static int sfs_lower_path(struct sfs_node *n, char *buf, size_t size)
{
	char *names[PATH_MAX / 2];
	struct sfs_node *p = n, *up;
	size_t count = 0, len = 0;
	const char *redirect;
	int ret = 0;

	/*
	 * Each step holds a reference on the node it reads: a rename
	 * elsewhere may move an ancestor and drop the reference that its
	 * old parent pointer held.
	 */
	sfs_node_ref(p);
	while (p != sfs->root) {
		sfs_lock(&p->lock);
		redirect = sfs_node_di(p)->redirect;
		if (redirect && redirect[0] == '/') {
			len = snprintf(buf, size, "%s", redirect);
			sfs_unlock(&p->lock);
			break;
		}
		if (count == sizeof(names) / sizeof(names[0])) {
			sfs_unlock(&p->lock);
			ret = -ENAMETOOLONG;
			goto out;
		}
		names[count] = strdup(redirect ? redirect : p->name);
		up = p->parent;
		sfs_node_ref(up);
		sfs_unlock(&p->lock);
		sfs_node_unref(p);
		p = up;
		if (!names[count]) {
			ret = -ENOMEM;
			goto out;
		}
		count++;
	}
	if (p == sfs->root)
		buf[0] = '\0';
	for (size_t i = count; i > 0 && len < size; i--)
		len += snprintf(buf + len, size - len, "/%s", names[i - 1]);
	if (len >= size)
		ret = -ENAMETOOLONG;
out:
	sfs_node_unref(p);
	for (size_t i = 0; i < count; i++)
		free(names[i]);
	return ret;
}

/*
 * A moved directory with lower content remembers where that content is:
 * by its old name when it stays in its directory, by an absolute path
 * when it leaves, as the kernel's overlayfs writes them.
 */
static int sfs_rename_redirect(struct sfs_node *n, bool samedir)
{
	char path[PATH_MAX];
	char *dup;
	int ret;

	if (!S_ISDIR(n->type) || n->nlower == 0)
		return 0;
	sfs_lock(&n->lock);
	ret = sfs_node_di(n)->redirect &&
	      (samedir || sfs_node_di(n)->redirect[0] == '/') ? 1 : 0;
	if (!ret && samedir)
		snprintf(path, sizeof(path), "%s", n->name);
	sfs_unlock(&n->lock);
	if (ret)
		return 0;
	if (!samedir)
		ret = sfs_lower_path(n, path, sizeof(path));
	if (ret < 0)
		return ret;
	dup = sfs_shm_strdup(path);
	if (!dup)
		return -ENOMEM;
	ret = sfs_set_redirect(sfs_upper(n), path);
	sfs_lock(&n->lock);
	if (ret == 0) {
		sfs_shm_free(sfs_node_di(n)->redirect);
		sfs_node_di(n)->redirect = dup;
	} else {
		sfs_shm_free(dup);
	}
	sfs_unlock(&n->lock);
	return ret;
}

/*
 * A directory arriving where a lower layer has the name must not merge
 * with it: its own lower part (if any) is reached by redirect, so the
 * only case to mark is a pure upper directory.
 */
static int sfs_rename_opaque(struct sfs_node *n, struct sfs_node *dir,
			     const char *name)
{
	bool opaque;
	int positive;

	if (!S_ISDIR(n->type) || n->nlower > 0)
		return 0;
	sfs_lock(&n->lock);
	opaque = sfs_node_di(n)->opaque;
	sfs_unlock(&n->lock);
	if (opaque)
		return 0;
	positive = sfs_lower_positive(dir, name);
	if (positive <= 0)
		return positive;
	positive = sfs_set_opaque(sfs_upper(n));
	if (positive == 0) {
		sfs_lock(&n->lock);
		sfs_node_di(n)->opaque = true;
		sfs_unlock(&n->lock);
	}
	return positive;
}

static int sfs_rename_check(struct sfs_node *src, struct sfs_node *dst,
			    unsigned int flags)
{
	if (!dst)
		return (flags & RENAME_EXCHANGE) ? -ENOENT : 0;
	if (flags & RENAME_NOREPLACE)
		return -EEXIST;
	if (flags & RENAME_EXCHANGE)
		return 0;
	if (S_ISDIR(src->type) && !S_ISDIR(dst->type))
		return -ENOTDIR;
	if (!S_ISDIR(src->type) && S_ISDIR(dst->type))
		return -EISDIR;
	if (S_ISDIR(dst->type))
		return sfs_dir_check_empty(dst);
	return 0;
}

/* Makes room for a plain rename onto a directory that is empty in view. */
static int sfs_rename_clear_dst(struct sfs_node *ndir, const char *newname,
				struct sfs_node *dst)
{
	if (!dst || !S_ISDIR(dst->type) || sfs_upper(dst) < 0)
		return 0;
	return sfs_remove(ndir, newname, true, -1);
}

static void sfs_rename_update(struct sfs_node *pdir, const char *name,
			      struct sfs_node *ndir, const char *newname,
			      struct sfs_node *src, struct sfs_node *dst,
			      unsigned int flags)
{
	sfs_lock(&src->lock);
	sfs_node_set_name(src, ndir, newname);
	sfs_unlock(&src->lock);
	sfs_node_dir_changed(pdir, 0);
	sfs_node_dir_changed(ndir, 0);
	if (S_ISDIR(src->type) && pdir != ndir) {
		sfs_node_dir_changed(pdir, -1);
		sfs_node_dir_changed(ndir, 1);
	}
	if (!dst)
		return;
	if (flags & RENAME_EXCHANGE) {
		sfs_lock(&dst->lock);
		sfs_node_set_name(dst, pdir, name);
		sfs_unlock(&dst->lock);
		if (S_ISDIR(dst->type) && pdir != ndir) {
			sfs_node_dir_changed(ndir, -1);
			sfs_node_dir_changed(pdir, 1);
		}
		return;
	}
	sfs_node_removed(dst);
	if (S_ISDIR(dst->type))
		sfs_node_dir_changed(ndir, -1);
}

/*
 * The rename in the upper layer. NOREPLACE was checked in the merged
 * view (upper may hold a whiteout there). A directory cannot replace a
 * whiteout by rename(2), so it swaps with it instead, and the whiteout
 * lands where one is needed anyway, or is removed.
 */
static int sfs_rename_upper(struct sfs_node *pdir, const char *name,
			    struct sfs_node *ndir, const char *newname,
			    struct sfs_node *src, unsigned int flags,
			    bool whiteout)
{
	int odir = sfs_upper(pdir), ndirfd = sfs_upper(ndir);
	unsigned int rflags = flags & ~RENAME_NOREPLACE;
	struct stat st;
	int state, ret;

	if (!(flags & RENAME_EXCHANGE) && S_ISDIR(src->type)) {
		state = sfs_upper_state(ndirfd, newname, &st);
		if (state < 0)
			return state;
		if (state == 1) {
			ret = sfs_rename(odir, name, ndirfd, newname,
					 RENAME_EXCHANGE);
			if (ret == 0 && !whiteout) {
				ret = sfs_unlinkat(odir, name, 0);
				if (ret == 0)
					sfs_usage_charge(0, -1);
			}
			return ret;
		}
	}
	if (whiteout && sfs->rename_whiteout)
		rflags |= RENAME_WHITEOUT;
	ret = sfs_rename(odir, name, ndirfd, newname, rflags);
	if (ret == 0 && whiteout && sfs->rename_whiteout)
		sfs_usage_charge(0, 1);
	if (ret == 0 && whiteout && !sfs->rename_whiteout)
		ret = sfs_whiteout_create(odir, name);
	return ret;
}

/*
 * A RENAME sent again whose source is gone: the dead worker moved it
 * (see sfs_resent_made), and may have died before its node learnt the
 * new name.
 */
static int sfs_resent_renamed(struct sfs_node *pdir, struct sfs_node *ndir,
			      const char *newname)
{
	struct sfs_node *n;
	int ret = sfs_lookup_node(ndir, newname, &n);

	if (ret < 0)
		return ret;
	sfs_lock(&n->lock);
	if (n->parent != ndir || strcmp(n->name, newname))
		ret = sfs_node_set_name(n, ndir, newname);
	sfs_unlock(&n->lock);
	sfs_node_dir_changed(pdir, 0);
	sfs_node_dir_changed(ndir, 0);
	sfs_node_release(n);
	return ret;
}

static int sfs_rename_entry(struct sfs_node *pdir, const char *name,
		      struct sfs_node *ndir, const char *newname,
		      unsigned int flags)
{
	struct sfs_node *src = NULL, *dst = NULL;
	int ret, whiteout = 0;
	uint32_t step;

	ret = sfs_lookup_node(pdir, name, &src);
	if (ret == -ENOENT && sfs_req_resent() && !(flags & RENAME_EXCHANGE))
		return sfs_resent_renamed(pdir, ndir, newname);
	if (ret < 0)
		return ret;
	ret = sfs_lookup_node(ndir, newname, &dst);
	if (ret == -ENOENT)
		ret = 0;
	if (ret < 0)
		goto out;
	if (dst == src) {
		ret = 0;	/* two names of one file: rename(2) does nothing */
		goto out;
	}
	step = flags & RENAME_EXCHANGE && sfs_req_resent() ? sfs_req_step() : 0;
	if (step) {
		/*
		 * The dead worker exchanged them: a second time would swap
		 * them back. The lookups above found each node by the inode
		 * now at the name, so src is the one that was at newname:
		 * the nodes learn their names the other way round.
		 */
		if (step == SFS_STEP_DISK)
			sfs_rename_update(pdir, name, ndir, newname, dst, src,
					  flags);
		ret = 0;
		goto out;
	}
	ret = sfs_rename_check(src, dst, flags);
	if (ret == 0 && dst && !(flags & RENAME_EXCHANGE))
		ret = sfs_prepare_nlink_change(dst);
	if (ret == 0)
		ret = sfs_copy_up_name(pdir, name, src);
	if (ret == 0 && (flags & RENAME_EXCHANGE))
		ret = sfs_copy_up_name(ndir, newname, dst);
	if (ret == 0)
		ret = sfs_copy_up(ndir);
	if (ret == 0 && (pdir != ndir || strcmp(name, newname)))
		ret = sfs_rename_redirect(src, pdir == ndir);
	if (ret == 0 && (flags & RENAME_EXCHANGE))
		ret = sfs_rename_redirect(dst, pdir == ndir);
	if (ret == 0 && src->has_origin)
		ret = sfs_mark_impure(ndir);
	if (ret == 0 && dst && dst->has_origin && (flags & RENAME_EXCHANGE))
		ret = sfs_mark_impure(pdir);
	if (ret == 0)
		ret = sfs_rename_opaque(src, ndir, newname);
	if (ret == 0 && (flags & RENAME_EXCHANGE))
		ret = sfs_rename_opaque(dst, pdir, name);
	if (ret == 0 && !(flags & RENAME_EXCHANGE)) {
		ret = sfs_rename_clear_dst(ndir, newname, dst);
		whiteout = ret == 0 ? sfs_lower_positive(pdir, name) : 0;
		if (whiteout < 0)
			ret = whiteout;
	}
	if (ret < 0)
		goto out;
	ret = sfs_rename_upper(pdir, name, ndir, newname, src, flags,
			       whiteout);
	if (ret < 0)
		goto out;
	if (flags & RENAME_EXCHANGE) {
		sfs_resend_step(SFS_STEP_DISK);
		sfs_crash_after(newname);
	}
	sfs_rename_update(pdir, name, ndir, newname, src, dst, flags);
	if (flags & RENAME_EXCHANGE)
		sfs_resend_step(SFS_STEP_NODES);
out:
	if (dst)
		sfs_node_release(dst);
	sfs_node_release(src);
	return ret;
}

void sfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		   fuse_ino_t newparent, const char *newname,
		   unsigned int flags)
{
	sfs_count(STRATA_ST_RENAME, 1);
	struct sfs_node *pdir, *ndir;
	int ret;

	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		ret = -EINVAL;
		goto out;
	}
	ret = sfs_has_upper() ? sfs_node_get_pinned(parent, &pdir) : -EROFS;
	if (ret < 0)
		goto out;
	ret = sfs_node_get_pinned(newparent, &ndir);
	if (ret == 0) {
		ret = sfs_rename_entry(pdir, name, ndir, newname, flags);
		sfs_node_release(ndir);
	}
	sfs_node_release(pdir);
out:
	sfs_reply_err(req, ret);
}
