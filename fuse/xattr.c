/*
 * Extended attributes of the merged view. The overlay's own markers
 * (trusted.overlay.*, or user.overlay.* with userxattr) are private: they
 * never show, and nobody sets them through the mount, exactly as with
 * kernel overlayfs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "stratafs.h"

#define SFS_XATTR_LIST_MAX (64 * 1024)

bool sfs_xattr_is_private(const char *name)
{
	return strncmp(name, sfs->xattr_prefix, strlen(sfs->xattr_prefix)) == 0;
}

int sfs_xattr_get(int fd, const char *name, void *buf, size_t size)
{
	char path[64];
	ssize_t n;

	sfs_proc_path(fd, path, sizeof(path));
	n = getxattr(path, name, buf, size);
	return n < 0 ? -errno : (int)n;
}

int sfs_xattr_set(int fd, const char *name, const void *val, size_t size,
		  int flags)
{
	char path[64];

	sfs_proc_path(fd, path, sizeof(path));
	return setxattr(path, name, val, size, flags) < 0 ? -errno : 0;
}

static ssize_t sfs_xattr_list(int fd, char **out)
{
	char path[64];
	ssize_t n;
	char *buf;

	sfs_proc_path(fd, path, sizeof(path));
	n = listxattr(path, NULL, 0);
	if (n <= 0) {
		*out = NULL;
		return n < 0 ? -errno : 0;
	}
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	n = listxattr(path, buf, n);
	if (n < 0) {
		n = -errno;
		free(buf);
		return n;
	}
	*out = buf;
	return n;
}

/*
 * Our origin xattr: the inode number a copied-up entry had below, so
 * st_ino survives copy-up. Reached by parent and name so that symlinks
 * are covered too (l*xattr on a real name, not a /proc link).
 */
int sfs_origin_get(int dirfd, const char *name, uint64_t *ino)
{
	char path[PATH_MAX];
	uint64_t val;
	int n;

	n = snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dirfd, name);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	if (lgetxattr(path, sfs->xattr_origin, &val, sizeof(val)) !=
	    sizeof(val))
		return 0;
	*ino = val;
	return 1;
}

int sfs_origin_set(int dirfd, const char *name, uint64_t ino)
{
	char path[PATH_MAX];
	int n;

	n = snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dirfd, name);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	if (lsetxattr(path, sfs->xattr_origin, &ino, sizeof(ino), 0) < 0)
		return -errno;
	return 0;
}

/* Copies every xattr but the private ones; used by copy-up. */
int sfs_xattr_copy(int from, int to)
{
	char *list = NULL, *val = NULL;
	ssize_t len;
	int ret = 0;

	len = sfs_xattr_list(from, &list);
	if (len < 0)
		return (len == -EOPNOTSUPP) ? 0 : (int)len;
	val = malloc(SFS_XATTR_LIST_MAX);
	if (!val) {
		free(list);
		return -ENOMEM;
	}
	for (char *name = list; name < list + len; name += strlen(name) + 1) {
		int n;

		if (sfs_xattr_is_private(name))
			continue;
		n = sfs_xattr_get(from, name, val, SFS_XATTR_LIST_MAX);
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

static int sfs_setxattr(struct sfs_node *n, const char *name,
			const char *value, size_t size, int flags)
{
	int ret;

	if (sfs_xattr_is_private(name))
		return -EOPNOTSUPP;
	if (S_ISLNK(n->type))
		return -EPERM;
	ret = sfs_copy_up(n);
	atomic_store(&n->nosec, false);	/* it may be a capability */
	if (ret == 0)
		ret = sfs_xattr_set(sfs_upper(n), name, value, size, flags);
	return ret;
}

void sfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     const char *value, size_t size, int flags)
{
	struct sfs_node *n;
	int ret = sfs_node_get_pinned(ino, &n);

	if (ret == 0) {
		ret = sfs_setxattr(n, name, value, size, flags);
		sfs_node_unpin(n);
	}
	sfs_reply_err(req, ret);
}

/* Returns the value's length; with size 0 only the length is asked. */
static int sfs_getxattr(struct sfs_node *n, const char *name, char *buf,
			size_t size)
{
	if (sfs_xattr_is_private(name))
		return -EOPNOTSUPP;
	if (S_ISLNK(n->type))
		return -ENODATA;
	return sfs_xattr_get(sfs_node_datafd(n), name, buf, size);
}

void sfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     size_t size)
{
	struct sfs_node *n;
	char *buf = NULL;
	int ret;

	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	ret = sfs_node_get_pinned(ino, &n);
	if (ret == 0) {
		ret = sfs_getxattr(n, name, buf, size);
		sfs_node_unpin(n);
	}
	if (ret < 0)
		sfs_reply_err(req, ret);
	else if (size)
		fuse_reply_buf(req, buf, ret);
	else
		fuse_reply_xattr(req, ret);
	free(buf);
}

/* The names, private ones squeezed out; *out is NULL for none. */
static ssize_t sfs_listxattr(struct sfs_node *n, char **out)
{
	char *list = NULL, *w;
	ssize_t len;

	*out = NULL;
	if (S_ISLNK(n->type))
		return 0;
	len = sfs_xattr_list(sfs_node_datafd(n), &list);
	if (len <= 0)
		return len;
	w = list;
	for (char *name = list; name < list + len;) {
		size_t l = strlen(name) + 1;

		if (!sfs_xattr_is_private(name)) {
			memmove(w, name, l);
			w += l;
		}
		name += l;
	}
	*out = list;
	return w - list;
}

void sfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct sfs_node *n;
	char *list = NULL;
	ssize_t len = sfs_node_get_pinned(ino, &n);

	if (len == 0) {
		len = sfs_listxattr(n, &list);
		sfs_node_unpin(n);
	}
	if (len < 0)
		sfs_reply_err(req, (int)len);
	else if (!size)
		fuse_reply_xattr(req, len);
	else if ((size_t)len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, list, len);
	free(list);
}

static int sfs_removexattr(struct sfs_node *n, const char *name)
{
	char path[64];
	int ret = 0;

	if (sfs_xattr_is_private(name))
		return -EOPNOTSUPP;
	if (S_ISLNK(n->type))
		return -ENODATA;
	/* Removing what is not there must not copy anything up. */
	if (!atomic_load(&n->has_upper))
		ret = sfs_xattr_get(sfs_node_datafd(n), name, NULL, 0);
	if (ret >= 0)
		ret = sfs_copy_up(n);
	if (ret == 0) {
		sfs_proc_path(sfs_upper(n), path, sizeof(path));
		if (removexattr(path, name) < 0)
			ret = -errno;
	}
	return ret;
}

void sfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct sfs_node *n;
	int ret = sfs_node_get_pinned(ino, &n);

	if (ret == 0) {
		ret = sfs_removexattr(n, name);
		sfs_node_unpin(n);
	}
	sfs_reply_err(req, ret);
}
