// SPDX-License-Identifier: Apache-2.0
/*
 * OCI ".wh." names (fuse/whiteout.c) and what they do to lookups
 * (fuse/namei.c) and listings (fuse/readdir.c).
 *
 * The input builds three lower layers of a real stratafs instance
 * without FUSE: files, directories and whiteout devices named from a
 * small set ("a", "b", the directory "d", their ".wh." markers, the
 * opaque marker, and one name taken from the input with its marker),
 * at the root or inside "d". Then, for the root and for "d":
 *  - lookup and listing agree with each other, and with the OCI image
 *    spec's rules: a name shows from the topmost layer that has it,
 *    unless a whiteout or a ".wh." marker in a layer above hid it; a
 *    marker hides only what is below its own layer; markers never show;
 *  - "d" merges the directories below it until one is opaque, or a
 *    layer marks "d" itself as whited out;
 * and the name mapping itself: sfs_wh_name() gives ".wh." + NAME
 * exactly when it fits, and sfs_is_wh_name() knows the result.
 */
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "fixture.h"
#include "fuzz.h"

#define FZ_LAYERS 3
#define FZ_NAMES 9
#define FZ_D 2		/* the one name that may hold entries */
#define FZ_OPQ 6
#define FZ_RAW 7	/* the input's own name, then its marker */
#define FZ_MAX_OPS 24

enum fz_kind { FZ_NONE, FZ_FILE, FZ_DIR, FZ_WHITEOUT };

/* What each layer holds at the root and inside "d", by name index. */
struct fz_tree {
	enum fz_kind root[FZ_LAYERS][FZ_NAMES];
	enum fz_kind d[FZ_LAYERS][FZ_NAMES];
};

static struct fixture fz_fx;
static int fz_layer_fd[FZ_LAYERS];
static bool fz_can_mknod;
static char fz_names[FZ_NAMES][NAME_MAX + 8] = {
	"a", "b", "d", ".wh.a", ".wh.b", ".wh.d", ".wh..wh..opq",
};

/* The index of ".wh." + names[i] in the set, or -1. */
static int fz_marker_of(int i)
{
	for (int m = 0; m < FZ_NAMES; m++)
		if (sfs_is_wh_name(fz_names[m]) &&
		    !strcmp(fz_names[m] + 4, fz_names[i]))
			return m;
	return -1;
}

/*
 * What a merged directory shows at names[i], given the layers it merges
 * (top first) and what each holds there: FZ_NONE when nothing shows.
 */
static enum fz_kind fz_expect(enum fz_kind (*at)[FZ_NAMES],
			      const int *stack, int n, int i)
{
	int marker = fz_marker_of(i);

	if (sfs_is_wh_name(fz_names[i]))
		return FZ_NONE;
	for (int s = 0; s < n; s++) {
		enum fz_kind k = at[stack[s]][i];

		if (k != FZ_NONE)
			return k == FZ_WHITEOUT ? FZ_NONE : k;
		if (marker >= 0 && at[stack[s]][marker] != FZ_NONE)
			return FZ_NONE;
	}
	return FZ_NONE;
}

/* The layers "d" merges, top first; 0 when it is no visible directory. */
static int fz_expect_d_stack(const struct fz_tree *t, int *stack)
{
	int marker = fz_marker_of(FZ_D), n = 0;

	for (int l = 0; l < FZ_LAYERS; l++) {
		enum fz_kind k = t->root[l][FZ_D];

		if (k == FZ_DIR) {
			stack[n++] = l;
			/* an opaque "d", or a marker beside it, hides the rest */
			if (t->d[l][FZ_OPQ] != FZ_NONE ||
			    t->root[l][marker] != FZ_NONE)
				break;
			continue;
		}
		if (k != FZ_NONE || t->root[l][marker] != FZ_NONE)
			break;
	}
	return n;
}

static int fz_make(int dirfd, const char *name, enum fz_kind k)
{
	int fd;

	switch (k) {
	case FZ_DIR:
		return mkdirat(dirfd, name, 0755);
	case FZ_WHITEOUT:
		return mknodat(dirfd, name, S_IFCHR, makedev(0, 0));
	default:
		fd = openat(dirfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
			    0644);
		if (fd >= 0)
			close(fd);
		return fd < 0 ? -1 : 0;
	}
}

/*
 * One operation: two bytes say which layer, what kind, where (root or
 * inside "d") and which name. Impossible ones (a name taken, "d" not a
 * directory, a name too long) are skipped; the tree records what is.
 */
static void fz_apply(struct fz_tree *t, uint8_t op, uint8_t which)
{
	int l = op % FZ_LAYERS, i = which % FZ_NAMES, dirfd;
	enum fz_kind k = (enum fz_kind)(FZ_FILE + (op / FZ_LAYERS) % 3);
	bool in_d = (op / 9) % 2;

	if (k == FZ_WHITEOUT && !fz_can_mknod)
		return;
	if (!in_d) {
		if (t->root[l][i] == FZ_NONE &&
		    fz_make(fz_layer_fd[l], fz_names[i], k) == 0)
			t->root[l][i] = k;
		return;
	}
	if (t->root[l][FZ_D] == FZ_NONE &&
	    fz_make(fz_layer_fd[l], "d", FZ_DIR) == 0)
		t->root[l][FZ_D] = FZ_DIR;
	if (t->root[l][FZ_D] != FZ_DIR || t->d[l][i] != FZ_NONE)
		return;
	dirfd = openat(fz_layer_fd[l], "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	FZ_CHECK(dirfd >= 0);
	if (fz_make(dirfd, fz_names[i], k) == 0)
		t->d[l][i] = k;
	close(dirfd);
}

static void fz_clear(const struct fz_tree *t)
{
	for (int l = 0; l < FZ_LAYERS; l++)
		for (int i = 0; i < FZ_NAMES; i++)
			if (t->root[l][i] != FZ_NONE)
				FZ_CHECK(strata_rmtree_at(fz_layer_fd[l],
							  fz_names[i]) == 0);
}

static enum fz_kind fz_kind_of(mode_t type)
{
	return S_ISDIR(type) ? FZ_DIR : FZ_FILE;
}

/* Lookup and listing of one merged directory against the model. */
static void fz_check_dir(struct sfs_node *dir, enum fz_kind (*at)[FZ_NAMES],
			 const int *stack, int n)
{
	struct sfs_dirent *ents;
	size_t count, shown = 0;

	FZ_CHECK(sfs_dir_list(dir, &ents, &count) == 0);
	for (int i = 0; i < FZ_NAMES; i++) {
		enum fz_kind want = fz_expect(at, stack, n, i);
		struct sfs_found f;
		int ret = sfs_lookup_name(dir, fz_names[i], &f), listed = 0;

		if (want == FZ_NONE) {
			/* the raw name's marker may be too long for any layer */
			FZ_CHECK(ret == (strlen(fz_names[i]) > NAME_MAX ?
					 -ENAMETOOLONG : -ENOENT));
		} else {
			FZ_CHECK(ret == 0);
			FZ_CHECK(fz_kind_of(f.type) == want);
			sfs_found_release(&f);
			shown++;
		}
		for (size_t e = 0; e < count; e++)
			listed += !strcmp(ents[e].name, fz_names[i]);
		FZ_CHECK(listed == (want != FZ_NONE));
	}
	/* ".", "..", and nothing the model does not show */
	FZ_CHECK(count == shown + 2);
	sfs_dirents_free(ents, count);
}

static void fz_check_tree(struct fz_tree *t)
{
	int all[FZ_LAYERS] = { 0, 1, 2 }, stack[FZ_LAYERS], n;
	struct sfs_node *d;

	fz_check_dir(fz_fx.fs.root, t->root, all, FZ_LAYERS);
	n = fz_expect_d_stack(t, stack);
	if (!n)
		return;
	FZ_CHECK(sfs_lookup_node(fz_fx.fs.root, "d", &d) == 0);
	FZ_CHECK(d->nlower == n);
	for (int s = 0; s < n; s++)
		FZ_CHECK(sfs_node_lower(d)[s].layer == stack[s] + 1);
	fz_check_dir(d, t->d, stack, n);
	sfs_node_release(d);
}

/* The name mapping alone, on the raw name at every buffer size around it. */
static void fz_check_mapping(const char *name)
{
	size_t len = strlen(name);
	char buf[NAME_MAX + 8];

	FZ_CHECK(sfs_is_wh_name(name) == !strncmp(name, ".wh.", 4));
	for (size_t size = len + 3; size <= len + 5; size++) {
		int ret;

		if (size > sizeof(buf))
			break;
		ret = sfs_wh_name(name, buf, size);
		if (len + 4 >= size) {
			FZ_CHECK(ret == -ENAMETOOLONG);
			continue;
		}
		FZ_CHECK(ret == 0);
		FZ_CHECK(!strncmp(buf, ".wh.", 4) && !strcmp(buf + 4, name));
		FZ_CHECK(sfs_is_wh_name(buf));
	}
}

/* The input's own name, or "r" where it cannot be one distinct name. */
static void fz_set_raw(const char *raw)
{
	size_t len = strlen(raw);

	snprintf(fz_names[FZ_RAW], sizeof(fz_names[FZ_RAW]), "%s",
		 len && len <= NAME_MAX && !strchr(raw, '/') &&
		 strcmp(raw, ".") && strcmp(raw, "..") ? raw : "r");
	snprintf(fz_names[FZ_RAW + 1], sizeof(fz_names[FZ_RAW + 1]),
		 ".wh.%s", fz_names[FZ_RAW]);
	for (int i = 0; i < FZ_RAW; i++)
		if (!strcmp(fz_names[i], fz_names[FZ_RAW]) ||
		    !strcmp(fz_names[i], fz_names[FZ_RAW + 1])) {
			strcpy(fz_names[FZ_RAW], "r");
			strcpy(fz_names[FZ_RAW + 1], ".wh.r");
			break;
		}
}

static void fz_done(void)
{
	for (int l = 0; l < FZ_LAYERS; l++)
		close(fz_layer_fd[l]);
	fixture_done(&fz_fx);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_quiet();
	FZ_CHECK(fixture_setup(&fz_fx, FZ_LAYERS, false) == 0);
	atexit(fz_done);
	for (int l = 0; l < FZ_LAYERS; l++) {
		char name[8];

		snprintf(name, sizeof(name), "l%d", l + 1);
		fz_layer_fd[l] = openat(fz_fx.fd, name,
					O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		FZ_CHECK(fz_layer_fd[l] >= 0);
	}
	/* whiteout devices need CAP_MKNOD; without it the markers still run */
	fz_can_mknod = fz_make(fz_layer_fd[0], "probe", FZ_WHITEOUT) == 0;
	if (fz_can_mknod)
		unlinkat(fz_layer_fd[0], "probe", 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fz_tree t;
	size_t nops;
	char *raw;

	if (size < 1)
		return 0;
	nops = data[0] % (FZ_MAX_OPS + 1);
	if (nops > (size - 1) / 2)
		nops = (size - 1) / 2;
	raw = fz_strndup(data + 1 + 2 * nops, size - 1 - 2 * nops);
	fz_check_mapping(raw);
	fz_set_raw(raw);
	free(raw);

	memset(&t, 0, sizeof(t));
	for (size_t i = 0; i < nops; i++)
		fz_apply(&t, data[1 + 2 * i], data[2 + 2 * i]);
	fz_check_tree(&t);
	fz_clear(&t);
	return 0;
}
