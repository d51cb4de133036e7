// SPDX-License-Identifier: Apache-2.0
/*
 * Extended attributes of the merged view. The overlay's own markers
 * (trusted.overlay.*, or user.overlay.* with userxattr) are private: they
 * never show, and nobody sets them through the mount. A name in that
 * namespace given through the mount is the user's own, kept escaped as
 * PREFIX"overlay."NAME in the layers and listed back unescaped, as the
 * kernel's overlayfs does since Linux 6.7: so an overlay's upper can hold
 * the markers of an overlay stacked on it.
 *
 * An xattr is reached by path. For anything but a symlink that is the
 * node's /proc/self/fd link, followed. A symlink cannot be reached that
 * way (l*xattr would act on the /proc link itself), so it is reached by
 * a real name: a temporary hard link in the workdir for an upper
 * symlink (valid whatever names it has left), its name in the parent's
 * lower directory for a lower one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_XATTR_VALUE_MAX (64 * 1024)

#define SFS_XATTR_ESCAPE "overlay."

static bool sfs_xattr_is_own(const char *name)
{
	return strncmp(name, sfs->xattr_prefix, strlen(sfs->xattr_prefix)) == 0;
}

/* A user's name in the overlay's namespace, as the layers keep it. */
static bool sfs_xattr_is_escaped(const char *name)
{
	return sfs_xattr_is_own(name) &&
	       strncmp(name + strlen(sfs->xattr_prefix), SFS_XATTR_ESCAPE,
		       strlen(SFS_XATTR_ESCAPE)) == 0;
}

bool sfs_xattr_is_private(const char *name)
{
	return sfs_xattr_is_own(name) && !sfs_xattr_is_escaped(name);
}

/*
 * The name a user's xattr has in the layers: itself, or escaped when it
 * is in the overlay's namespace. Points into buf or at name.
 */
static int sfs_xattr_layer_name(const char *name, char *buf, size_t size,
				const char **out)
{
	size_t plen = strlen(sfs->xattr_prefix);
	int n;

	*out = name;
	if (!sfs_xattr_is_own(name))
		return 0;
	n = snprintf(buf, size, "%s" SFS_XATTR_ESCAPE "%s", sfs->xattr_prefix,
		     name + plen);
	if (n < 0 || (size_t)n >= size || n > XATTR_NAME_MAX)
		return -ERANGE;
	*out = buf;
	return 0;
}

int sfs_xpath_entry(struct sfs_xpath *x, int dirfd, const char *name)
{
	int n = snprintf(x->path, sizeof(x->path), "/proc/self/fd/%d/%s",
			 dirfd, name);

	x->follow = false;
	x->tmp[0] = '\0';
	x->parent = NULL;
	return (n < 0 || (size_t)n >= sizeof(x->path)) ? -ENAMETOOLONG : 0;
}

/* A lower entry by its name; caller holds n->lock and pins parent. */
int sfs_xpath_lower_name(struct sfs_xpath *x, struct sfs_node *parent,
			 struct sfs_node *n)
{
	for (int i = 0; i < parent->nlower; i++)
		if (sfs_node_lower(parent)[i].layer == sfs_node_lower(n)[0].layer)
			return sfs_xpath_entry(x, sfs_node_lower(parent)[i].fd, n->name);
	return -ESTALE;
}

static int sfs_xpath_lower_symlink(struct sfs_xpath *x, struct sfs_node *n)
{
	struct sfs_node *parent;
	int ret;

	parent = sfs_node_get_parent(n, &ret);
	if (!parent)	/* a symlink is never the root */
		return ret < 0 ? ret : -ESTALE;
	sfs_lock(&n->lock);
	ret = n->parent == parent ? sfs_xpath_lower_name(x, parent, n) : -ESTALE;
	sfs_unlock(&n->lock);
	if (ret < 0) {
		sfs_node_release(parent);
		return ret;
	}
	x->parent = parent;
	return 0;
}

/* The inode FD holds, anything but a symlink. */
int sfs_xpath_fd(struct sfs_xpath *x, int fd)
{
	x->follow = true;
	x->tmp[0] = '\0';
	x->parent = NULL;
	return sfs_proc_path(fd, x->path, sizeof(x->path));
}

/* Where the node's xattrs are: its upper entry if it has one. Pinned. */
int sfs_xpath_node(struct sfs_xpath *x, struct sfs_node *n)
{
	int upper = sfs_upper(n), ret;
	char tmp[sizeof(x->tmp)];

	if (!S_ISLNK(n->type))
		return sfs_xpath_fd(x, sfs_node_datafd(n));
	x->parent = NULL;
	x->tmp[0] = '\0';
	if (upper < 0)
		return sfs_xpath_lower_symlink(x, n);
	ret = sfs_tmp_name(tmp, sizeof(tmp));
	if (ret == 0)
		ret = sfs_xpath_entry(x, sfs->tmpfd, tmp);
	if (ret < 0)
		return ret;
	if (linkat(upper, "", sfs->tmpfd, tmp, AT_EMPTY_PATH) < 0)
		return -errno;
	memcpy(x->tmp, tmp, sizeof(x->tmp));
	return 0;
}

void sfs_xpath_done(struct sfs_xpath *x)
{
	if (x->tmp[0])
		sfs_unlinkat(sfs->tmpfd, x->tmp, 0);
	if (x->parent)
		sfs_node_release(x->parent);
	x->tmp[0] = '\0';
	x->parent = NULL;
}

int sfs_xattr_get(const struct sfs_xpath *x, const char *name, void *buf,
		  size_t size)
{
	ssize_t n = x->follow ? getxattr(x->path, name, buf, size) :
				lgetxattr(x->path, name, buf, size);

	return n < 0 ? -errno : (int)n;
}

int sfs_xattr_set(const struct sfs_xpath *x, const char *name,
		  const void *val, size_t size, int flags)
{
	int ret = x->follow ? setxattr(x->path, name, val, size, flags) :
			      lsetxattr(x->path, name, val, size, flags);

	return ret < 0 ? -errno : 0;
}

static int sfs_xattr_remove(const struct sfs_xpath *x, const char *name)
{
	int ret = x->follow ? removexattr(x->path, name) :
			      lremovexattr(x->path, name);

	return ret < 0 ? -errno : 0;
}

static ssize_t sfs_xattr_list(const struct sfs_xpath *x, char **out)
{
	ssize_t (*list)(const char *, char *, size_t) =
		x->follow ? listxattr : llistxattr;
	ssize_t n;
	char *buf;

	*out = NULL;
	n = list(x->path, NULL, 0);
	if (n <= 0)
		return n < 0 ? -errno : 0;
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	n = list(x->path, buf, n);
	if (n < 0) {
		n = -errno;
		free(buf);
		return n;
	}
	*out = buf;
	return n;
}

/*
 * Our own xattr beside the kernel's origin: the inode number a copied-up
 * entry had below, so st_ino survives copy-up without decoding the
 * origin. Reached by parent and name, which covers symlinks too.
 */
int sfs_ino_xattr_get(int dirfd, const char *name, uint64_t *ino)
{
	struct sfs_xpath x;
	uint64_t val;

	if (sfs_xpath_entry(&x, dirfd, name) < 0 ||
	    sfs_xattr_get(&x, sfs->xattr_ino, &val, sizeof(val)) !=
		    sizeof(val))
		return 0;
	*ino = val;
	return 1;
}

int sfs_ino_xattr_set(int dirfd, const char *name, uint64_t ino)
{
	struct sfs_xpath x;
	int ret = sfs_xpath_entry(&x, dirfd, name);

	return ret < 0 ? ret : sfs_xattr_set(&x, sfs->xattr_ino, &ino,
					     sizeof(ino), 0);
}

/* Copies every xattr but the private ones; used by copy-up. */
int sfs_xattr_copy(const struct sfs_xpath *from, const struct sfs_xpath *to)
{
	char *list = NULL, *val = NULL;
	ssize_t len;
	int ret = 0;

	len = sfs_xattr_list(from, &list);
	if (len < 0)
		return (len == -EOPNOTSUPP) ? 0 : (int)len;
	val = malloc(SFS_XATTR_VALUE_MAX);
	if (!val) {
		free(list);
		return -ENOMEM;
	}
	for (char *name = list; name < list + len; name += strlen(name) + 1) {
		int n;

		if (sfs_xattr_is_private(name))
			continue;
		n = sfs_xattr_get(from, name, val, SFS_XATTR_VALUE_MAX);
		if (n == -ENODATA)
			continue;
		if (n < 0) {
			ret = n;
			break;
		}
		ret = sfs_xattr_set(to, name, val, n, 0);
		if (ret == -EOPNOTSUPP) {
			/* the upper fs lacks that namespace, as the kernel allows */
			strata_warn("copy-up: xattr %s not supported by upper",
				    name);
			ret = 0;
		}
		if (ret < 0)
			break;
	}
	free(val);
	free(list);
	return ret;
}

/* One xattr operation on a node, through its path. Pinned. */
static int sfs_node_xattr(struct sfs_node *n, int (*op)(const struct sfs_xpath *,
							 void *), void *arg)
{
	struct sfs_xpath x;
	int ret = sfs_xpath_node(&x, n);

	if (ret == 0)
		ret = op(&x, arg);
	sfs_xpath_done(&x);
	return ret;
}

struct sfs_xattr_arg {
	const char *name;
	const void *value;
	void *buf;
	size_t size;
	int flags;
	char *list;
	bool hide_trusted;	/* list: the caller is not root */
};

static int sfs_xattr_get_op(const struct sfs_xpath *x, void *arg)
{
	struct sfs_xattr_arg *a = arg;

	return sfs_xattr_get(x, a->name, a->buf, a->size);
}

static int sfs_xattr_set_op(const struct sfs_xpath *x, void *arg)
{
	struct sfs_xattr_arg *a = arg;

	return sfs_xattr_set(x, a->name, a->value, a->size, a->flags);
}

static int sfs_xattr_remove_op(const struct sfs_xpath *x, void *arg)
{
	struct sfs_xattr_arg *a = arg;

	return sfs_xattr_remove(x, a->name);
}

/* The names, private ones squeezed out; the length, or <0. */
static int sfs_xattr_list_op(const struct sfs_xpath *x, void *arg)
{
	struct sfs_xattr_arg *a = arg;
	ssize_t len = sfs_xattr_list(x, &a->list);
	char *w = a->list;

	if (len <= 0)
		return (int)len;
	for (char *name = a->list; name < a->list + len;) {
		size_t l = strlen(name) + 1;

		size_t plen = strlen(sfs->xattr_prefix);
		size_t esc = strlen(SFS_XATTR_ESCAPE);

		if (a->hide_trusted && !strncmp(name, "trusted.", 8)) {
			/* as the kernel's overlayfs: for CAP_SYS_ADMIN only */
		} else if (sfs_xattr_is_escaped(name)) {
			/* the user's own name, as it was set */
			memmove(w, name, plen);
			memmove(w + plen, name + plen + esc, l - plen - esc);
			w += l - esc;
		} else if (!sfs_xattr_is_private(name)) {
			memmove(w, name, l);
			w += l;
		}
		name += l;
	}
	return (int)(w - a->list);
}

int sfs_node_xattr_get(struct sfs_node *n, const char *name, void *buf,
		       size_t size)
{
	struct sfs_xattr_arg a = { .name = name, .buf = buf, .size = size };

	return sfs_node_xattr(n, sfs_xattr_get_op, &a);
}

int sfs_node_xattr_set(struct sfs_node *n, const char *name, const void *val,
		       size_t size, int flags)
{
	struct sfs_xattr_arg a = { .name = name, .value = val, .size = size,
				   .flags = flags };

	return sfs_node_xattr(n, sfs_xattr_set_op, &a);
}

/*
 * A SETXATTR with XATTR_CREATE sent again after its worker died (see
 * transport.c): EEXIST is its own work when the value is the one asked.
 */
static int sfs_xattr_resent_set(struct sfs_node *n, const char *name,
				const char *value, size_t size)
{
	char *have = malloc(size + 1);
	int ret;

	if (!have)
		return -ENOMEM;
	ret = sfs_node_xattr_get(n, name, have, size + 1);
	ret = ret == (int)size && !memcmp(have, value, size) ? 0 : -EEXIST;
	free(have);
	return ret;
}

void sfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     const char *value, size_t size, int flags)
{
	struct sfs_node *n;
	int ret;

	char esc[XATTR_NAME_MAX + 1];

	sfs_count(STRATA_ST_SETXATTR, 1);
	/* the overlay's markers are not the user's to forge: escaped */
	ret = sfs_xattr_layer_name(name, esc, sizeof(esc), &name);
	if (ret < 0)
		goto out;
	ret = sfs_node_get_pinned(ino, &n);
	if (ret < 0)
		goto out;
	ret = sfs_acl_kill_sgid(req, n, name);
	if (ret == 0)
		ret = sfs_copy_up(n);
	atomic_store(&n->nosec, false);	/* it may be a capability */
	if (ret == 0)
		ret = sfs_node_xattr_set(n, name, value, size, flags);
	if (ret == -EEXIST && sfs_req_resent())
		ret = sfs_xattr_resent_set(n, name, value, size);
	sfs_node_release(n);
out:
	sfs_reply_err(req, ret);
}

void sfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     size_t size)
{
	struct sfs_node *n;
	char *buf = NULL;
	int ret;

	char esc[XATTR_NAME_MAX + 1];

	sfs_count(STRATA_ST_GETXATTR, 1);
	/* to the user the markers do not exist, only escaped names */
	ret = sfs_xattr_layer_name(name, esc, sizeof(esc), &name);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = sfs_node_get_pinned(ino, &n);
	if (ret == 0) {
		ret = sfs_node_xattr_get(n, name, buf, size);
		sfs_node_release(n);
	}
	/*
	 * A layer without ACLs has none: any other error would be the
	 * kernel's answer to every permission check on the file.
	 */
	if (ret == -EOPNOTSUPP && sfs_acl_is_name(name))
		ret = -ENODATA;
	if (ret < 0)
		sfs_reply_err(req, ret);
	else if (size)
		fuse_reply_buf(req, buf, ret);
	else
		fuse_reply_xattr(req, ret);
	free(buf);
}

void sfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct sfs_xattr_arg a = { 0 };
	struct sfs_node *n;
	int len = sfs_node_get_pinned(ino, &n);

	sfs_count(STRATA_ST_LISTXATTR, 1);
	/*
	 * The daemon lists as root; the upper filesystem would have hidden
	 * trusted.* from anyone without CAP_SYS_ADMIN. Root stands for it.
	 */
	a.hide_trusted = fuse_req_ctx(req)->uid != 0;
	if (len == 0) {
		len = sfs_node_xattr(n, sfs_xattr_list_op, &a);
		sfs_node_release(n);
	}
	if (len < 0)
		sfs_reply_err(req, len);
	else if (!size)
		fuse_reply_xattr(req, len);
	else if ((size_t)len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, a.list, len);
	free(a.list);
}

void sfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	char esc[XATTR_NAME_MAX + 1];
	struct sfs_xattr_arg a = { 0 };
	struct sfs_node *n;
	int ret;

	sfs_count(STRATA_ST_REMOVEXATTR, 1);
	ret = sfs_xattr_layer_name(name, esc, sizeof(esc), &name);
	if (ret < 0)
		goto out;
	a.name = name;
	ret = sfs_node_get_pinned(ino, &n);
	if (ret < 0)
		goto out;
	/* as overlayfs: before it knows whether there is an ACL to remove */
	ret = sfs_acl_kill_sgid(req, n, name);
	/* Removing what is not there must not copy anything up. */
	if (ret == 0 && !atomic_load(&n->has_upper))
		ret = sfs_node_xattr_get(n, name, NULL, 0);
	if (ret >= 0)
		ret = sfs_copy_up(n);
	if (ret == 0)
		ret = sfs_node_xattr(n, sfs_xattr_remove_op, &a);
	/* sent again after its worker died: most likely its own work */
	if (ret == -ENODATA && sfs_req_resent())
		ret = 0;
	sfs_node_release(n);
out:
	sfs_reply_err(req, ret);
}
