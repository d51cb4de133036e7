/*
 * Redirect xattrs (fuse/whiteout.c, fuse/namei.c): the input is the
 * value of the redirect on a moved upper directory.
 *
 * A real stratafs instance, without FUSE (the unit programs' fixture):
 * three lower layers holding directories, files, symlinks out of the
 * layer, whiteouts, opaque directories and OCI markers, and an upper
 * directory "moved" that no lower layer has. For each input:
 *  - the validator accepts exactly an absolute path of plain names, or
 *    one plain name (no "", ".", "..", NUL);
 *  - looking "moved" up keeps a redirect only when it is valid (and no
 *    longer than a path), and any other is ignored, not an error;
 *  - the lower directories the redirect leads to are the ones a plain
 *    lookup of that path, name by name, finds, and every one of them
 *    lies in a lower layer.
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

/* The rule, restated: "/" and plain names, or a single plain name. */
static bool fz_plain(const char *c, size_t len)
{
	return len && memchr(c, '/', len) == NULL &&
	       !(len == 1 && c[0] == '.') &&
	       !(len == 2 && c[0] == '.' && c[1] == '.');
}

static bool fz_expect_valid(const char *v, size_t len)
{
	size_t start = 1;

	if (memchr(v, '\0', len))
		return false;
	if (len == 0 || v[0] != '/')
		return fz_plain(v, len);
	for (size_t i = 1; i <= len; i++)
		if (i == len || v[i] == '/') {
			if (!fz_plain(v + start, i - start))
				return false;
			start = i + 1;
		}
	return true;
}

/* The layer (1..3) a descriptor lies in, from the path the kernel keeps. */
static int fz_layer_of(int fd)
{
	char link[64], path[PATH_MAX];
	size_t rootlen = strlen(fz_fx.root);
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n < 0)
		return -1;
	path[n] = '\0';
	if (strncmp(path, fz_fx.root, rootlen) || path[rootlen] != '/' ||
	    path[rootlen + 1] != 'l' || path[rootlen + 2] < '1' ||
	    path[rootlen + 2] > '3' ||
	    (path[rootlen + 3] != '/' && path[rootlen + 3] != '\0'))
		return -1;
	return path[rootlen + 2] - '0';
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
 * merge under a directory, so a path to anything else gives none.
 */
static void fz_expect_stack(const char *path, struct fz_stack *out)
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
		if (!dir && !strcmp(comp, "moved")) {
			ret = -ENOENT;
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
			fz_stack_add(out, &dir->lower[i]);
		sfs_node_release(dir);
	}
	free(dup);
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

static void fz_opaque(const char *path)
{
	int fd = openat(fz_fx.fd, path, O_RDONLY | O_DIRECTORY);

	FZ_CHECK(fd >= 0);
	FZ_CHECK(fsetxattr(fd, fz_fx.fs.xattr_opaque, "y", 1, 0) == 0);
	close(fd);
}

/* Every way a walk can end early, and symlinks that lead out of a layer. */
static void fz_build_layers(void)
{
	static const char *const dirs[] = {
		"l1/a", "l1/a/b", "l1/a/b/c", "l1/o", "l1/k",
		"l2/a", "l2/a/b", "l2/a/d", "l2/o", "l2/o/p", "l2/m",
		"l2/m/n", "l2/w", "l2/k", "l2/k/q", "l2/x", "l2/x/y",
		"l3/a", "l3/a/b", "l3/a/b/c", "l3/a/e", "l3/w", "l3/e",
		"u/moved",
	};

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		fz_mkdir(dirs[i]);
	fz_file("l1/x");		/* a file hides the directory below */
	fz_file("l1/.wh.m");		/* OCI whiteout: hides l2/m */
	fz_file("l1/k/.wh..wh..opq");	/* OCI opaque: hides l2/k/q */
	fz_opaque("l1/o");		/* hides l2/o/p */
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
	bool valid;
	int ret;

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
	FZ_CHECK(ret == 0);
	FZ_CHECK(S_ISDIR(f.type) && f.upper >= 0);
	/* a redirect is a path: one longer than PATH_MAX is ignored too */
	valid = valid && size < PATH_MAX;
	if (valid)
		FZ_CHECK(f.redirect && !strcmp(f.redirect, value));
	else
		FZ_CHECK(!f.redirect);
	for (int i = 0; i < f.nlower; i++) {
		FZ_CHECK(fz_layer_of(f.lower[i].fd) == f.lower[i].layer);
		fz_stack_add(&got, &f.lower[i]);
	}
	sfs_found_release(&f);

	/* no redirect: "moved" has no lower part at all */
	fz_expect_stack(valid ? value : "moved", &want);
	FZ_CHECK(got.n == want.n);
	for (int i = 0; i < got.n; i++)
		FZ_CHECK(got.layer[i] == want.layer[i] &&
			 got.ino[i] == want.ino[i]);
out:
	free(value);
	return 0;
}
