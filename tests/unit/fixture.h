/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A real stratafs instance without FUSE, for the unit programs of the
 * modules that work on nodes: layers in a temporary directory,
 * sfs_setup() on them, and small helpers to fill the layers.
 */
#ifndef FIXTURE_H
#define FIXTURE_H

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

struct fixture {
	char root[64];
	int fd;		/* the temporary directory */
	struct sfs_fs fs;
};

/* Layers l1 (top) .. lN, u (upper), w (work), m (mountpoint) in BASE. */
static inline int fixture_init_in(struct fixture *fx, const char *base,
				  int nlowers, bool upper)
{
	char buf[4096] = "";
	size_t len = 0;
	int n;

	memset(fx, 0, sizeof(*fx));
	n = snprintf(fx->root, sizeof(fx->root), "%s/strata-unit-XXXXXX",
		     base);
	if (n < 0 || (size_t)n >= sizeof(fx->root) || !mkdtemp(fx->root))
		return -1;
	fx->fd = open(fx->root, O_RDONLY | O_DIRECTORY);
	for (int i = 1; i <= nlowers; i++) {
		char name[16];

		snprintf(name, sizeof(name), "l%d", i);
		mkdirat(fx->fd, name, 0755);
		len += snprintf(buf + len, sizeof(buf) - len, "%s%s/%s",
				i > 1 ? ":" : "", fx->root, name);
	}
	mkdirat(fx->fd, "u", 0755);
	mkdirat(fx->fd, "w", 0755);
	mkdirat(fx->fd, "m", 0755);
	fx->fs.params.lowerdir = strdup(buf);
	if (upper) {
		snprintf(buf, sizeof(buf), "%s/u", fx->root);
		fx->fs.params.upperdir = strdup(buf);
		snprintf(buf, sizeof(buf), "%s/w", fx->root);
		fx->fs.params.workdir = strdup(buf);
	}
	snprintf(buf, sizeof(buf), "%s/m", fx->root);
	fx->fs.params.mountpoint = strdup(buf);
	return 0;
}

static inline int fixture_init(struct fixture *fx, int nlowers, bool upper)
{
	const char *tmp = getenv("TMPDIR");

	/* $TMPDIR lets the fuzz targets put their layers on a tmpfs */
	return fixture_init_in(fx, tmp && *tmp ? tmp : "/tmp", nlowers, upper);
}

static inline int fixture_setup(struct fixture *fx, int nlowers, bool upper)
{
	if (fixture_init(fx, nlowers, upper) < 0)
		return -1;
	return sfs_setup(&fx->fs);
}

static inline void fixture_done(struct fixture *fx)
{
	sfs_teardown(&fx->fs);
	sfs_params_free(&fx->fs.params);
	strata_rmtree_at(AT_FDCWD, fx->root);
	close(fx->fd);
}

static inline void fx_file(struct fixture *fx, const char *path, const char *data)
{
	int fd = openat(fx->fd, path, O_CREAT | O_WRONLY | O_TRUNC, 0644);

	if (fd >= 0) {
		if (write(fd, data, strlen(data)) < 0)
			perror(path);
		close(fd);
	}
}

static inline void fx_dir(struct fixture *fx, const char *path)
{
	mkdirat(fx->fd, path, 0755);
}

static inline void fx_whiteout(struct fixture *fx, const char *path)
{
	mknodat(fx->fd, path, S_IFCHR, makedev(0, 0));
}

static inline void fx_opaque(struct fixture *fx, const char *path)
{
	int fd = openat(fx->fd, path, O_RDONLY | O_DIRECTORY);

	fsetxattr(fd, "trusted.overlay.opaque", "y", 1, 0);
	close(fd);
}

static inline void fx_redirect(struct fixture *fx, const char *path,
			       const char *value)
{
	int fd = openat(fx->fd, path, O_RDONLY | O_DIRECTORY);

	fsetxattr(fd, "trusted.overlay.redirect", value, strlen(value), 0);
	close(fd);
}

static inline int fx_read(struct fixture *fx, const char *path, char *buf,
		   size_t size)
{
	int fd = openat(fx->fd, path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	buf[n < 0 ? 0 : n] = '\0';
	return (int)n;
}

static inline bool fx_exists(struct fixture *fx, const char *path)
{
	struct stat st;

	return fstatat(fx->fd, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Entries in a directory, "." and ".." aside. */
static inline int fx_count(struct fixture *fx, const char *path)
{
	int fd = openat(fx->fd, path, O_RDONLY | O_DIRECTORY);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	int n = 0;

	for (struct dirent *de; d && (de = readdir(d));)
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	if (d)
		closedir(d);
	return n;
}

/* Looks a slash-separated path up from the root, as the kernel would. */
static inline int fx_lookup(struct fixture *fx, const char *path,
		     struct sfs_node **out)
{
	char *dup = strdup(path), *save = NULL, *comp;
	struct sfs_node *dir = fx->fs.root, *n = NULL;
	int ret = 0;

	for (comp = strtok_r(dup, "/", &save); comp;
	     comp = strtok_r(NULL, "/", &save)) {
		ret = sfs_lookup_node(dir, comp, &n);
		if (dir != fx->fs.root)
			sfs_node_release(dir);
		if (ret < 0)
			break;
		dir = n;
	}
	free(dup);
	*out = ret < 0 ? NULL : n;
	return ret;
}

#endif
