// SPDX-License-Identifier: Apache-2.0
/*
 * The kernel overlayfs on-disk markers: whiteouts (character devices
 * 0/0), opaque directories and redirects (xattrs), plus the OCI/AUFS
 * ".wh." names that image tools leave in lower layers. Also the workdir's
 * temporary names, through which every marker reaches the upper layer
 * atomically.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"

bool sfs_is_whiteout(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

bool sfs_is_wh_name(const char *name)
{
	return strncmp(name, WH_PREFIX, sizeof(WH_PREFIX) - 1) == 0;
}

int sfs_wh_name(const char *name, char *buf, size_t size)
{
	int n = snprintf(buf, size, WH_PREFIX "%s", name);

	/* ".wh." plus a 252+ byte name cannot exist on disk. */
	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

/*
 * 1 when the directory is opaque, 0 when not. Lower layers from image
 * tools mark opacity with a ".wh..wh..opq" entry instead of the xattr.
 */
int sfs_dir_is_opaque(int dirfd, bool lower)
{
	char val[2];
	struct stat st;
	ssize_t n;

	n = fgetxattr(dirfd, sfs->xattr_opaque, val, sizeof(val));
	if (n == 1 && val[0] == 'y')
		return 1;
	if (n < 0 && errno != ENODATA && errno != ENOTSUP && errno != ERANGE)
		return -errno;
	if (lower && fstatat(dirfd, WH_OPAQUE, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return 1;
	return 0;
}

/*
 * The kernel's other whiteout (Linux 6.7+, for layers that cannot hold
 * device nodes): an empty regular file with the "whiteout" xattr. A
 * lookup honours it in any layer, as the kernel's does; a listing hides
 * it only in a lower directory marked opaque "x" (readdir.c), where the
 * kernel's does. DIRFD/NAME is the entry, ST its stat: 1 when it is one.
 */
int sfs_is_xwhiteout(int dirfd, const char *name, const struct stat *st)
{
	char path[64 + NAME_MAX];

	if (!S_ISREG(st->st_mode) || st->st_size != 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dirfd, name);
	return lgetxattr(path, sfs->xattr_whiteout, NULL, 0) >= 0;
}

int sfs_set_opaque(int dirfd)
{
	strata_debug("set opaque on fd %d", dirfd);
	if (fsetxattr(dirfd, sfs->xattr_opaque, "y", 1, 0) < 0)
		return -errno;
	return 0;
}

/*
 * An impure directory holds entries that carry an origin, so a listing
 * must read their xattrs for d_ino; in any other it need not.
 */
int sfs_dir_is_impure(int dirfd)
{
	char val[2];
	ssize_t n = fgetxattr(dirfd, sfs->xattr_impure, val, sizeof(val));

	if (n >= 1)
		return val[0] == 'y';
	return (errno == ENODATA || errno == ENOTSUP) ? 0 : -errno;
}

int sfs_mark_impure(struct sfs_node *dir)
{
	int ret = 0;

	sfs_lock(&dir->lock);
	if (!sfs_node_di(dir)->impure) {
		if (fsetxattr(sfs_upper(dir), sfs->xattr_impure, "y",
			      1, 0) < 0)
			ret = -errno;
		else
			sfs_node_di(dir)->impure = true;
	}
	sfs_unlock(&dir->lock);
	return ret;
}

/*
 * A redirect is an absolute path of non-empty names, or one name (the
 * relative form), with no NUL byte: anything else, an empty value too,
 * is refused with EINVAL, as the kernel refuses it, never walked. "."
 * and ".." pass here and are refused where a walk meets them (EACCES,
 * namei.c), as the kernel does too.
 */
bool sfs_redirect_valid(const char *r, size_t len)
{
	const char *p = r, *end = r + len;

	if (len == 0 || strlen(r) != len)
		return false;
	if (*p != '/')
		return !strchr(r, '/');
	while (p < end) {
		const char *c = ++p, *slash = memchr(c, '/', end - c);
		size_t l = (slash ? slash : end) - c;

		if (l == 0)
			return false;
		p = c + l;
	}
	return true;
}

/* Refuses a malformed value (N bytes at BUF), as the kernel does. */
static int sfs_redirect_check(const char *buf, size_t n)
{
	if (sfs_redirect_valid(buf, n))
		return 0;
	strata_warn("invalid redirect '%.*s'", PATH_MAX, buf);
	return -EINVAL;
}

/*
 * A value longer than a path (tmpfs holds one, ext4 without ea_inode
 * does not) is read whole, as the kernel reads every redirect: refused
 * when malformed, like any other; when well formed, the lookup walks it
 * and finds nothing there (namei.c), and the directory stays reachable.
 */
static int sfs_get_long_redirect(int dirfd, char **out)
{
	ssize_t size, n;
	char *buf;
	int ret;

	size = fgetxattr(dirfd, sfs->xattr_redirect, NULL, 0);
	if (size < 0)
		return errno == ENODATA ? 0 : -errno;	/* removed meanwhile */
	/* it may end up in a node, which lives in the shared memory */
	buf = sfs_shm_alloc(size + 1);
	if (!buf)
		return -ENOMEM;
	n = fgetxattr(dirfd, sfs->xattr_redirect, buf, size);
	if (n < 0) {
		ret = -errno;	/* changed meanwhile: the kernel fails too */
		goto out;
	}
	buf[n] = '\0';
	ret = sfs_redirect_check(buf, n);
	if (ret == 0) {
		*out = buf;
		buf = NULL;
	}
out:
	sfs_shm_free(buf);
	return ret;
}

int sfs_get_redirect(int dirfd, char **out)
{
	char buf[PATH_MAX];
	ssize_t n;
	int ret;

	*out = NULL;
	n = fgetxattr(dirfd, sfs->xattr_redirect, buf, sizeof(buf) - 1);
	if (n < 0 && errno == ERANGE)
		return sfs_get_long_redirect(dirfd, out);
	if (n < 0)
		return (errno == ENODATA || errno == ENOTSUP) ? 0 : -errno;
	buf[n] = '\0';
	ret = sfs_redirect_check(buf, n);
	if (ret < 0)
		return ret;
	*out = sfs_shm_strdup(buf);
	return *out ? 0 : -ENOMEM;
}

int sfs_set_redirect(int dirfd, const char *path)
{
	strata_debug("set redirect %s on fd %d", path, dirfd);
	if (fsetxattr(dirfd, sfs->xattr_redirect, path, strlen(path), 0) < 0)
		return -errno;
	return 0;
}

int sfs_tmp_name(char *buf, size_t size)
{
	uint64_t seq = atomic_fetch_add(&sfs->tmp_seq, 1);
	int n = snprintf(buf, size, "#strata.%d.%llu", (int)getpid(),
			 (unsigned long long)seq);

	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

int sfs_tmp_remove(const char *name)
{
	return strata_rmtree_at(sfs->tmpfd, name);
}

/*
 * Empties workdir/work: what a worker that died left there half made. Its
 * successor calls this before serving, when nothing else uses the dir.
 */
int sfs_tmp_clear(void)
{
	struct dirent *de;
	DIR *d;
	int ret = 0;

	if (sfs->tmpfd < 0)
		return 0;
	d = strata_opendir_at(sfs->tmpfd, ".");
	if (!d)
		return -errno;
	while (ret == 0 && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			ret = strata_rmtree_at(sfs->tmpfd, de->d_name);
	closedir(d);
	return ret;
}

static int sfs_whiteout_tmp(char *tmp, size_t size)
{
	int ret = sfs_tmp_name(tmp, size);

	if (ret < 0)
		return ret;
	strata_debug("mknod whiteout work/%s", tmp);
	if (mknodat(sfs->tmpfd, tmp, S_IFCHR | 0, makedev(0, 0)) < 0)
		return -errno;
	return 0;
}

/* A new whiteout where nothing is in the upper directory yet. */
int sfs_whiteout_create(int dirfd, const char *name)
{
	char tmp[64];
	int ret;

	ret = sfs_whiteout_tmp(tmp, sizeof(tmp));
	if (ret < 0)
		return ret;
	ret = sfs_rename(sfs->tmpfd, tmp, dirfd, name, RENAME_NOREPLACE);
	if (ret < 0)
		sfs_unlinkat(sfs->tmpfd, tmp, 0);
	else
		sfs_usage_charge(0, 1);
	return ret;
}

/*
 * Replaces the upper entry dirfd/name with a whiteout in one step, then
 * removes the old entry (a directory with its whiteouts) from the
 * workdir, where nobody sees it.
 */
int sfs_whiteout_replace(int dirfd, const char *name)
{
	char tmp[64];
	int ret;

	ret = sfs_tmp_name(tmp, sizeof(tmp));
	if (ret < 0)
		return ret;
	if (sfs->rename_whiteout) {
		ret = sfs_rename(dirfd, name, sfs->tmpfd, tmp,
				 RENAME_WHITEOUT);
		if (ret < 0)
			return ret;
	} else {
		ret = sfs_whiteout_tmp(tmp, sizeof(tmp));
		if (ret < 0)
			return ret;
		ret = sfs_rename(sfs->tmpfd, tmp, dirfd, name,
				 RENAME_EXCHANGE);
		if (ret < 0) {
			sfs_unlinkat(sfs->tmpfd, tmp, 0);
			return ret;
		}
	}
	/* the old entry is given back by its node (sfs_node_removed) */
	sfs_usage_charge(0, 1);
	ret = sfs_tmp_remove(tmp);
	if (ret < 0)
		strata_warn("cannot clean work/%s: %s", tmp, strerror(-ret));
	return 0;
}

/* Some filesystems lack RENAME_WHITEOUT; then whiteouts are made by hand. */
int sfs_probe_rename_whiteout(int tmpfd)
{
	char a[64], b[64];
	int fd, ret;

	sfs_tmp_name(a, sizeof(a));
	sfs_tmp_name(b, sizeof(b));
	fd = openat(tmpfd, a, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	close(fd);
	ret = renameat2(tmpfd, a, tmpfd, b, RENAME_WHITEOUT) == 0;
	unlinkat(tmpfd, a, 0);
	unlinkat(tmpfd, ret ? b : a, 0);
	return ret;
}
