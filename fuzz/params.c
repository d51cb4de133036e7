// SPDX-License-Identifier: Apache-2.0
/*
 * stratafs's option parser (fuse/params.c), from a command line to the
 * list of layers.
 *
 * The first byte chooses how the rest is read:
 *  - 'L' and below: layers. The rest is paths (NUL-separated) that go
 *    through the kernel's escaping into a real command line, in one of
 *    the forms stratafs is started with (fstab, mount.fuse3, by hand).
 *    Parsing and splitting must give back exactly those paths, and the
 *    same upperdir and workdir.
 *  - above: a raw command line (NUL-separated arguments). Whatever the
 *    parser accepts must be usable: a mountpoint, a lowerdir that splits
 *    into non-empty layers, a split that round-trips through escaping.
 */
#include "fuzz.h"
#include "stratafs.h"

#define FZ_MAX_ARGS 16

/*
 * Paths as lowerdir= takes them: escaped in the kernel's syntax ("\:"
 * and "\\") and joined by ':'; in a -o list also "\," so that fuse_opt
 * does not split the list there.
 */
static char *fz_join(char **paths, int n, bool in_opts)
{
	size_t len = 1;
	char *out, *w;

	for (int i = 0; i < n; i++)
		len += strlen(paths[i]) * 2 + 1;
	out = w = malloc(len);
	if (!out)
		abort();
	for (int i = 0; i < n; i++) {
		if (i)
			*w++ = ':';
		for (const char *c = paths[i]; *c; c++) {
			if (*c == ':' || *c == '\\' || (in_opts && *c == ','))
				*w++ = '\\';
			*w++ = *c;
		}
	}
	*w = '\0';
	return out;
}

/* Appends ",KEY=PATHS" (no comma at the start) to a -o list. */
static void fz_append_opt(char **buf, const char *key, char **paths, int n)
{
	size_t len = *buf ? strlen(*buf) : 0;
	char *val = fz_join(paths, n, true);
	size_t add = strlen(key) + strlen(val) + 2;
	char *nb = realloc(*buf, len + add);

	if (!nb)
		abort();
	snprintf(nb + len, add, "%s%s%s", len ? "," : "", key, val);
	*buf = nb;
	free(val);
}

/* Parses argv as stratafs's main() does; *p is valid on return. */
static int fz_parse(int argc, char **argv, struct sfs_params *p,
		    struct fuse_args *args)
{
	int ret;

	memset(p, 0, sizeof(*p));
	ret = sfs_params_escape(argc, argv, args);
	return ret ? ret : sfs_params_parse(args, p);
}

/* A successful split gives the same layers again once re-escaped. */
static void fz_check_roundtrip(char **layers, int n)
{
	char *opt = fz_join(layers, n, false), **again;
	int count;

	FZ_CHECK(sfs_split_lowerdir(opt, &again, &count) == 0);
	FZ_CHECK(count == n);
	for (int i = 0; i < n; i++)
		FZ_CHECK(!strcmp(again[i], layers[i]));
	sfs_strv_free(again, count);
	free(opt);
}

/*
 * Layers mode. Flag bits in the first byte: 1 and 2 pick the form of
 * the command line, 4 adds upperdir and workdir (the last two paths),
 * 8 gives an earlier lowerdir that the later one must override.
 */
static void fz_layers(uint8_t flags, const uint8_t *data, size_t size)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct sfs_params p;
	char *argv[8], *opts = NULL, *more = NULL, **layers = NULL;
	char *paths[SFS_MAX_LOWERS + 3];
	int argc = 0, n, nlayers, count = 0, ret;
	bool upper;

	n = fz_split(data, size, paths, SFS_MAX_LOWERS + 3);
	for (int i = 0; i < n; i++)
		if (!*paths[i])
			goto out;	/* an empty path is no path */
	upper = (flags & 4) && n >= 3;
	nlayers = n - (upper ? 2 : 0);
	if (flags & 8)
		fz_append_opt(&opts, "lowerdir=", (char *[]){ "/stale" }, 1);
	fz_append_opt(&opts, "lowerdir=", paths, nlayers);
	if (upper) {
		/* form 3 gives them as a second -o */
		char **target = (flags & 3) == 3 ? &more : &opts;

		fz_append_opt(target, "upperdir=", paths + nlayers, 1);
		fz_append_opt(target, "workdir=", paths + nlayers + 1, 1);
	}
	argv[argc++] = "stratafs";
	switch (flags & 3) {
	case 0:
	case 3:
		argv[argc++] = "-o";
		argv[argc++] = opts;
		break;
	case 1: {
		char *joined = malloc(strlen(opts) + 3);

		if (!joined)
			abort();
		sprintf(joined, "-o%s", opts);
		free(opts);
		opts = joined;
		argv[argc++] = opts;
		break;
	}
	case 2:
		argv[argc++] = "stratafs-source";	/* mount.fuse3's form */
		break;
	}
	argv[argc++] = "/mnt";
	if ((flags & 3) == 2) {
		argv[argc++] = "-o";
		argv[argc++] = opts;
	}
	if (more) {
		argv[argc++] = "-o";
		argv[argc++] = more;
	}

	ret = fz_parse(argc, argv, &p, &args);
	FZ_CHECK(ret == 0);
	FZ_CHECK(p.mountpoint && !strcmp(p.mountpoint, "/mnt"));
	FZ_CHECK(!p.source == ((flags & 3) != 2));
	if (upper) {
		FZ_CHECK(p.upperdir && !strcmp(p.upperdir, paths[nlayers]));
		FZ_CHECK(p.workdir && !strcmp(p.workdir, paths[nlayers + 1]));
	} else {
		FZ_CHECK(!p.upperdir && !p.workdir);
	}
	ret = sfs_split_lowerdir(p.lowerdir, &layers, &count);
	if (nlayers > SFS_MAX_LOWERS) {
		FZ_CHECK(ret == -E2BIG);
	} else {
		FZ_CHECK(ret == 0);
		FZ_CHECK(count == nlayers);
		for (int i = 0; i < count; i++)
			FZ_CHECK(!strcmp(layers[i], paths[i]));
		sfs_strv_free(layers, count);
	}
	sfs_params_free(&p);
	fuse_opt_free_args(&args);
	free(more);
	free(opts);
out:
	fz_split_free(paths, n);
}

/* Raw mode: whatever is accepted is complete and splits cleanly. */
static void fz_argv(const uint8_t *data, size_t size)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct sfs_params p;
	char *strs[FZ_MAX_ARGS], *argv[FZ_MAX_ARGS + 1], **layers;
	int n, count, ret;

	n = fz_split(data, size, strs, FZ_MAX_ARGS);
	argv[0] = "stratafs";
	memcpy(argv + 1, strs, n * sizeof(*argv));
	ret = fz_parse(n + 1, argv, &p, &args);
	if (ret || p.show_help || p.show_version)
		goto out;
	FZ_CHECK(p.mountpoint);
	FZ_CHECK(p.lowerdir && *p.lowerdir);
	FZ_CHECK(!p.upperdir == !p.workdir);
	FZ_CHECK(!p.io || !strcmp(p.io, "uring") || !strcmp(p.io, "sync"));
	ret = sfs_split_lowerdir(p.lowerdir, &layers, &count);
	FZ_CHECK(ret == 0 || ret == -EINVAL || ret == -E2BIG);
	if (ret == 0) {
		FZ_CHECK(count >= 1 && count <= SFS_MAX_LOWERS);
		for (int i = 0; i < count; i++)
			FZ_CHECK(*layers[i]);
		fz_check_roundtrip(layers, count);
		sfs_strv_free(layers, count);
	}
out:
	sfs_params_free(&p);
	fuse_opt_free_args(&args);
	fz_split_free(strs, n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_quiet();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] <= 'L')
		fz_layers(data[0], data + 1, size - 1);
	else
		fz_argv(data + 1, size - 1);
	return 0;
}
