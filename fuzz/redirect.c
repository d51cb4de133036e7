// SPDX-License-Identifier: Apache-2.0
/*
 * Redirect xattrs (fuse/whiteout.c, fuse/namei.c): the input is the
 * value of the redirect on a moved upper directory.
 *
 * A real stratafs instance, without FUSE (the unit programs' fixture):
 * three lower layers holding directories, files, symlinks out of the
 * layer, whiteouts, opaque directories, OCI markers and redirects of
 * their own (an old upper's), and an upper directory "moved" that no
 * lower layer has. For each input, by the kernel's rules:
 *  - the validator accepts exactly an absolute path of non-empty names,
 *    or one name (no "", no NUL);
 *  - looking "moved" up fails with EINVAL when the redirect is not
 *    valid, with EACCES exactly when a plain lookup of the path meets
 *    "." or "..", and otherwise keeps the redirect as stored;
 *  - the lower directories the redirect leads to are the ones a plain
 *    lookup of that path, name by name, finds (none for a path longer
 *    than PATH_MAX), and every one of them lies in its lower layer.
 */
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include "fixture.h"
#include "fuzz.h"

static struct fixture fz_fx;
static int fz_moved = -1;	/* the upper directory carrying the redirect */

/* Lower entries as (layer, inode): what two lookups must agree on. */
struct fz_stack {
	int n;
	int layer[SFS_MAX_LOWERS];
	ino_t ino[SFS_MAX_LOWERS];
};

/*
 * The rule, restated: "/" and non-empty names, or one name; no NUL. The
 * names "." and ".." pass, and a walk that meets them is refused.
 */
static bool fz_expect_valid(const char *v, size_t len)
{
	if (len == 0 || memchr(v, '\0', len))
		return false;
	if (v[0] != '/')
		return !memchr(v, '/', len);
	for (size_t i = 0; i < len; i++)
		if (v[i] == '/' && (i + 1 == len || v[i + 1] == '/'))
			return false;
	return true;
}

/* The mount a descriptor is on, as /proc/self/fdinfo says. */
static int fz_mnt_id(int fd)
{
	char path[64], line[128];
	int id = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = fopen(path, "r");
	FZ_CHECK(f != NULL);
	while (id < 0 && fgets(line, sizeof(line), f))
		if (sscanf(line, "mnt_id: %d", &id) != 1)
			id = -1;
	fclose(f);
	return id;
}

/* A descriptor's path on its mount, as the kernel keeps it. */
static void fz_fd_path(int fd, char *buf, size_t size)
{
	char link[64];
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, buf, size - 1);
	FZ_CHECK(n > 0);
	buf[n] = '\0';
}

/*
 * The layer (1..3) a descriptor lies in: on the layer's mount (run by
 * root, stratafs holds each layer through a clone of its own, super.c)
 * and at or below the layer's root there.
 */
static int fz_layer_of(int fd)
{
	char path[PATH_MAX], root[PATH_MAX];
	int mnt = fz_mnt_id(fd);

	fz_fd_path(fd, path, sizeof(path));
	for (int l = 0; l < fz_fx.fs.nlower; l++) {
		int lfd = fz_fx.fs.lower[l].fd;
		size_t len;

		fz_fd_path(lfd, root, sizeof(root));
		len = strlen(root);
		if (fz_mnt_id(lfd) == mnt && !strncmp(path, root, len) &&
		    (len == 1 || path[len] == '/' || path[len] == '\0'))
			return l + 1;
	}
	return -1;
}

static void fz_stack_add(struct fz_stack *s, const struct sfs_entry *e)
{
	struct stat st;

	FZ_CHECK(fstat(e->fd, &st) == 0);
	s->layer[s->n] = e->layer;
	s->ino[s->n++] = st.st_ino;
}

/*
 * The lower directories at a path, looked up name by name as the kernel
 * would: the stack a redirect to that path must give. Only directories
 * merge under a directory, so a path to anything else gives none, and
 * a name that is not there (or too long to be) leads nowhere. Returns
 * the error that ends the walk: -EACCES at "." or "..", else 0.
 */
static int fz_expect_stack(const char *path, struct fz_stack *out)
{
	char *dup = strdup(path), *save = NULL, *comp;
	struct sfs_node *dir = NULL, *node;
	int ret = 0;

	if (!dup)
		abort();
	out->n = 0;
	for (comp = strtok_r(dup, "/", &save); comp;
	     comp = strtok_r(NULL, "/", &save)) {
		/* "moved" is only in the upper layer, which redirects skip */
		if (!dir && !strcmp(comp, "moved"))
			break;
		if (dir && !S_ISDIR(dir->type)) {
			sfs_node_release(dir);
			dir = NULL;
			break;
		}
		ret = sfs_lookup_node(dir ? dir : fz_fx.fs.root, comp, &node);
		if (dir)
			sfs_node_release(dir);
		dir = ret < 0 ? NULL : node;
		if (ret < 0)
			break;
	}
	if (dir) {
		for (int i = 0; S_ISDIR(dir->type) && i < dir->nlower; i++)
			fz_stack_add(out, &sfs_node_lower(dir)[i]);
		sfs_node_release(dir);
	}
	free(dup);
	return ret == -ENOENT || ret == -ENAMETOOLONG ? 0 : ret;
}

static void fz_mkdir(const char *path)
{
	FZ_CHECK(mkdirat(fz_fx.fd, path, 0755) == 0);
}

static void fz_file(const char *path)
{
	int fd = openat(fz_fx.fd, path, O_CREAT | O_WRONLY | O_EXCL, 0644);

	FZ_CHECK(fd >= 0);
	close(fd);
}

static void fz_xattr(const char *path, const char *name, const char *value)
{
	int fd = openat(fz_fx.fd, path, O_RDONLY | O_DIRECTORY);

	FZ_CHECK(fd >= 0);
	FZ_CHECK(fsetxattr(fd, name, value, strlen(value), 0) == 0);
	close(fd);
}

/* Every way a walk can end early, and symlinks that lead out of a layer. */
static void fz_build_layers(void)
{
	static const char *const dirs[] = {
		"l1/a", "l1/a/b", "l1/a/b/c", "l1/o", "l1/k",
		"l2/a", "l2/a/b", "l2/a/d", "l2/o", "l2/o/p", "l2/m",
		"l2/m/n", "l2/w", "l2/k", "l2/k/q", "l2/x", "l2/x/y",
		"l2/r", "l2/r/f", "l2/rel",
		"l3/a", "l3/a/b", "l3/a/b/c", "l3/a/e", "l3/w", "l3/e",
		"u/moved",
	};

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		fz_mkdir(dirs[i]);
	fz_file("l1/x");		/* a file hides the directory below */
	fz_file("l1/.wh.m");		/* OCI whiteout: hides l2/m */
	fz_file("l1/k/.wh..wh..opq");	/* OCI opaque: hides l2/k/q */
	fz_xattr("l1/o", fz_fx.fs.xattr_opaque, "y");	/* hides l2/o/p */
	/* an old upper's moves: absolute, and relative (same parent) */
	fz_xattr("l2/r", fz_fx.fs.xattr_redirect, "/a/b");
	fz_xattr("l2/rel", fz_fx.fs.xattr_redirect, "e");
	FZ_CHECK(symlinkat("/", fz_fx.fd, "l1/s") == 0);
	FZ_CHECK(symlinkat("..", fz_fx.fd, "l1/up") == 0);
	FZ_CHECK(symlinkat("../../l3/e", fz_fx.fd, "l2/a/sym") == 0);
	/* a whiteout device needs CAP_MKNOD; without it the rest still runs */
	if (mknodat(fz_fx.fd, "l1/w", S_IFCHR, makedev(0, 0)) < 0)
		FZ_CHECK(errno == EPERM);
}

static void fz_done(void)
{
	if (fz_moved >= 0)
		close(fz_moved);
	fixture_done(&fz_fx);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_quiet();
	FZ_CHECK(fixture_init(&fz_fx, 3, true) == 0);
	/* user.overlay.*: the target needs no root for its markers */
	fz_fx.fs.params.userxattr = 1;
	FZ_CHECK(sfs_setup(&fz_fx.fs) == 0);
	atexit(fz_done);
	fz_build_layers();
	fz_moved = openat(fz_fx.fd, "u/moved", O_RDONLY | O_DIRECTORY);
	FZ_CHECK(fz_moved >= 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *value = malloc(size + 1);
	struct fz_stack want, got = { 0 };
	struct sfs_found f;
	int ret, want_ret = 0;
	bool valid;

	if (!value)
		abort();
	memcpy(value, data, size);
	value[size] = '\0';
	valid = sfs_redirect_valid(value, size);
	FZ_CHECK(valid == fz_expect_valid(value, size));

	/* a value the filesystem cannot hold is no redirect anyone wrote */
	if (fsetxattr(fz_moved, fz_fx.fs.xattr_redirect, data, size, 0) < 0) {
		FZ_CHECK(errno == E2BIG || errno == ENOSPC || errno == ERANGE);
		goto out;
	}
	ret = sfs_lookup_name(fz_fx.fs.root, "moved", &f);
	if (!valid) {
		FZ_CHECK(ret == -EINVAL);
		goto out;
	}
	/*
	 * One longer than a path leads nowhere (the kernel walks it, and
	 * could only find a tree deeper than PATH_MAX); any other leads
	 * where the name-by-name lookup goes.
	 */
	want.n = 0;
	if (size < PATH_MAX)
		want_ret = fz_expect_stack(value, &want);
	FZ_CHECK(ret == want_ret);
	if (ret < 0)
		goto out;
	FZ_CHECK(S_ISDIR(f.type) && f.upper >= 0);
	FZ_CHECK(f.redirect && !strcmp(f.redirect, value));
	for (int i = 0; i < f.nlower; i++) {
		FZ_CHECK(fz_layer_of(f.lower[i].fd) == f.lower[i].layer);
		fz_stack_add(&got, &f.lower[i]);
	}
	sfs_found_release(&f);
	FZ_CHECK(got.n == want.n);
	for (int i = 0; i < got.n; i++)
		FZ_CHECK(got.layer[i] == want.layer[i] &&
			 got.ino[i] == want.ino[i]);
out:
	free(value);
	return 0;
}
