/*
 * The kernel overlayfs on-disk markers: whiteouts (character devices
 * 0/0), opaque directories and redirects (xattrs), plus the OCI/AUFS
 * ".wh." names that image tools leave in lower layers. Also the workdir's
 * temporary names, through which every marker reaches the upper layer
 * atomically.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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
	if (!dir->di->impure) {
		if (fsetxattr(sfs_upper(dir), sfs->xattr_impure, "y",
			      1, 0) < 0)
			ret = -errno;
		else
			dir->di->impure = true;
	}
	sfs_unlock(&dir->lock);
	return ret;
}

/*
 * A redirect is an absolute path of plain names, or one plain name (the
 * kernel's relative form). Anything else ("..", ".", empty components,
 * NUL bytes) could lead a lookup out of the layers: it is ignored, as
 * the kernel ignores redirects it cannot verify.
 */
bool sfs_redirect_valid(const char *r, size_t len)
{
	const char *p = r, *end = r + len;

	if (len == 0 || strlen(r) != len)
		return false;
	if (*p != '/')
		return !strchr(r, '/') && strcmp(r, ".") && strcmp(r, "..");
	while (p < end) {
		const char *c = ++p, *slash = memchr(c, '/', end - c);
		size_t l = (slash ? slash : end) - c;

		if (l == 0 || (l == 1 && c[0] == '.') ||
		    (l == 2 && c[0] == '.' && c[1] == '.'))
			return false;
		p = c + l;
	}
	return true;
}

int sfs_get_redirect(int dirfd, char **out)
{
	char buf[PATH_MAX];	/* a redirect is a path */
	ssize_t n;

	*out = NULL;
	n = fgetxattr(dirfd, sfs->xattr_redirect, buf, sizeof(buf) - 1);
	if (n < 0 && errno == ERANGE) {
		/* longer than any path: as invalid as the ones below */
		strata_warn("ignoring a redirect of more than %zu bytes",
			    sizeof(buf) - 1);
		return 0;
	}
	if (n < 0)
		return (errno == ENODATA || errno == ENOTSUP) ? 0 : -errno;
	if (n == 0)
		return 0;
	buf[n] = '\0';
	if (!sfs_redirect_valid(buf, n)) {
		strata_warn("ignoring invalid redirect '%s'", buf);
		return 0;
	}
	*out = strdup(buf);
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
