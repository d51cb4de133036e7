// SPDX-License-Identifier: Apache-2.0
/* namei.c: lookup through layers by the kernel's rules. */
#include <errno.h>

#include "fixture.h"
#include "unit.h"

static void test_rules(void)
{
	struct fixture fx;
	struct sfs_node *n;

	CHECK_EQ_INT(fixture_setup(&fx, 3, true), 0);
	/* topmost wins */
	fx_file(&fx, "l1/a", "top");
	fx_file(&fx, "l2/a", "below");
	/* a file hides a lower dir, and a dir a lower file */
	fx_file(&fx, "l1/f", "file");
	fx_dir(&fx, "l2/f");
	fx_dir(&fx, "l1/d");
	fx_file(&fx, "l2/d", "file");
	/* a whiteout in a middle layer hides deeper ones */
	fx_whiteout(&fx, "l2/w");
	fx_file(&fx, "l3/w", "hidden");
	/* directories merge down to an opaque one */
	fx_dir(&fx, "l1/m");
	fx_dir(&fx, "l2/m");
	fx_opaque(&fx, "l2/m");
	fx_dir(&fx, "l3/m");
	/* OCI markers in lower layers */
	fx_file(&fx, "l1/.wh.oci", "");
	fx_file(&fx, "l2/oci", "hidden");
	fx_dir(&fx, "l1/o");
	fx_file(&fx, "l1/o/.wh..wh..opq", "");
	fx_dir(&fx, "l2/o");

	CHECK_EQ_INT(fx_lookup(&fx, "a", &n), 0);
	if (n) {
		CHECK_EQ_INT(n->nlower, 1);
		CHECK_EQ_INT(sfs_node_lower(n)[0].layer, 1);
		CHECK(!atomic_load(&n->has_upper));
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_lookup(&fx, "f", &n), 0);
	if (n) {
		CHECK(S_ISREG(n->type));
		CHECK_EQ_INT(n->nlower, 1);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_lookup(&fx, "d", &n), 0);
	if (n) {
		CHECK(S_ISDIR(n->type));
		CHECK_EQ_INT(n->nlower, 1);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_lookup(&fx, "w", &n), -ENOENT);
	CHECK_EQ_INT(fx_lookup(&fx, "m", &n), 0);
	if (n) {
		CHECK_EQ_INT(n->nlower, 2);	/* l1 and the opaque l2 */
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_lookup(&fx, "oci", &n), -ENOENT);
	CHECK_EQ_INT(fx_lookup(&fx, ".wh.oci", &n), -ENOENT);
	CHECK_EQ_INT(fx_lookup(&fx, "o", &n), 0);
	if (n) {
		CHECK_EQ_INT(n->nlower, 1);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(sfs_lower_positive(fx.fs.root, "a"), 1);
	CHECK_EQ_INT(sfs_lower_positive(fx.fs.root, "w"), 0);
	CHECK_EQ_INT(sfs_lower_positive(fx.fs.root, "nope"), 0);
	fixture_done(&fx);
}

/* The lower entries merged at path, or the lookup's error. */
static int lower_count(struct fixture *fx, const char *path)
{
	struct sfs_node *n;
	int ret = fx_lookup(fx, path, &n);

	if (ret < 0)
		return ret;
	ret = n->nlower;
	sfs_node_release(n);
	return ret;
}

static void test_upper(void)
{
	struct fixture fx;
	struct sfs_node *n, *again;

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	fx_file(&fx, "l1/gone", "lower");
	fx_whiteout(&fx, "u/gone");
	fx_dir(&fx, "l1/dir");
	fx_file(&fx, "l1/dir/x", "x");
	fx_dir(&fx, "u/dir");
	fx_opaque(&fx, "u/dir");
	fx_dir(&fx, "l1/old");
	fx_file(&fx, "l1/old/y", "y");
	fx_dir(&fx, "u/moved");
	fx_redirect(&fx, "u/moved", "/old");

	CHECK_EQ_INT(fx_lookup(&fx, "gone", &n), -ENOENT);
	CHECK_EQ_INT(fx_lookup(&fx, "dir", &n), 0);
	if (n) {
		CHECK(sfs_node_di(n)->opaque);
		CHECK_EQ_INT(n->nlower, 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_lookup(&fx, "dir/x", &n), -ENOENT);
	/*
	 * A redirect through a name no layer can hold leads nowhere, in
	 * either form; the directory itself stays reachable (found by
	 * fuzz/redirect).
	 */
	{
		char val[300] = "/";

		memset(val + 1, 'n', 260);
		fx_dir(&fx, "u/long");
		fx_redirect(&fx, "u/long", val);
		fx_dir(&fx, "u/rlong");
		fx_redirect(&fx, "u/rlong", val + 1);
	}
	CHECK_EQ_INT(lower_count(&fx, "long"), 0);
	CHECK_EQ_INT(lower_count(&fx, "rlong"), 0);
	/* a redirect finds the lower part where it was */
	CHECK_EQ_INT(fx_lookup(&fx, "moved/y", &n), 0);
	if (n)
		sfs_node_release(n);
	/* one file, one node */
	CHECK_EQ_INT(fx_lookup(&fx, "moved", &n), 0);
	CHECK_EQ_INT(fx_lookup(&fx, "moved", &again), 0);
	CHECK(n == again);
	if (n) {
		CHECK_EQ_STR(sfs_node_di(n)->redirect, "/old");
		sfs_node_release(n);
		sfs_node_release(again);
	}
	fixture_done(&fx);
}

/*
 * A redirect that, joined to the rest of an absolute walk, gives a path
 * longer than PATH_MAX: the kernel walks it and finds nothing, so the
 * directory is reachable and nothing below merges. Here a moved upper
 * directory's walk meets a lower directory moved in its turn.
 */
static void test_redirect_past_path_max(void)
{
	char up[2048] = "/a", low[3072] = "";
	struct fixture fx;
	char comp[252];

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	memset(comp, 'p', 250);
	comp[250] = '\0';
	for (int i = 0; i < 6; i++)
		snprintf(up + strlen(up), sizeof(up) - strlen(up), "/%s", comp);
	for (int i = 0; i < 11; i++)
		snprintf(low + strlen(low), sizeof(low) - strlen(low), "/%s", comp);
	fx_dir(&fx, "u/c");
	fx_redirect(&fx, "u/c", up);
	fx_dir(&fx, "l1/a");
	fx_redirect(&fx, "l1/a", low);
	CHECK_EQ_INT(lower_count(&fx, "c"), 0);
	fixture_done(&fx);
}

/*
 * A redirect longer than a path, where the filesystem holds one: the
 * layers on a tmpfs, as ext4 without ea_inode holds none (found by
 * fuzz/redirect).
 */
static void test_redirect_longer_than_a_path(void)
{
	struct fixture fx;
	char val[5001] = "/";

	if (fixture_init_in(&fx, "/dev/shm", 1, true) < 0) {
		fprintf(stderr, "test_namei: no tmpfs at /dev/shm, skipped "
			"a redirect longer than a path\n");
		return;
	}
	CHECK_EQ_INT(sfs_setup(&fx.fs), 0);
	memset(val + 1, 'h', sizeof(val) - 2);
	fx_dir(&fx, "l1/d");
	fx_dir(&fx, "u/d");
	fx_redirect(&fx, "u/d", val);
	CHECK_EQ_INT(lower_count(&fx, "d"), 0);
	fixture_done(&fx);
}

/*
 * A ".wh.NAME" marker beside a directory NAME in one layer: the layer
 * replaced the directory, so the ones below do not merge into it
 * (found by fuzz/whiteout), nor below a redirect's walk through it.
 */
static void test_marker_beside_dir(void)
{
	struct fixture fx;
	struct sfs_node *n;

	CHECK_EQ_INT(fixture_setup(&fx, 2, true), 0);
	fx_dir(&fx, "l1/d");
	fx_file(&fx, "l1/d/mine", "");
	fx_file(&fx, "l1/.wh.d", "");
	fx_dir(&fx, "l2/d");
	fx_file(&fx, "l2/d/old", "");
	fx_dir(&fx, "l1/d/sub");
	fx_dir(&fx, "l2/d/sub");
	fx_dir(&fx, "u/r");
	fx_redirect(&fx, "u/r", "/d/sub");
	CHECK_EQ_INT(lower_count(&fx, "d"), 1);
	CHECK_EQ_INT(fx_lookup(&fx, "d/mine", &n), 0);
	if (n)
		sfs_node_release(n);
	CHECK_EQ_INT(fx_lookup(&fx, "d/old", &n), -ENOENT);
	CHECK_EQ_INT(lower_count(&fx, "r"), 1);
	fixture_done(&fx);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	test_rules();
	test_upper();
	test_redirect_past_path_max();
	test_redirect_longer_than_a_path();
	test_marker_beside_dir();
	return unit_done("test_namei");
}
