// SPDX-License-Identifier: Apache-2.0
/* readdir.c: the merged listing, counts and emptiness. */
#include <dirent.h>
#include <errno.h>

#include "fixture.h"
#include "unit.h"

static bool has(struct sfs_dirent *e, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(e[i].name, name))
			return true;
	return false;
}

static off_t off_of(struct sfs_dirent *e, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(e[i].name, name))
			return e[i].off;
	return -1;
}

/* Offsets are unique, "." and ".." first, and a name keeps its offset. */
static void check_offsets(struct fixture *fx)
{
	struct sfs_dirent *a, *b;
	size_t na, nb;

	CHECK_EQ_INT(sfs_dir_list(fx->fs.root, &a, &na), 0);
	CHECK_EQ_INT(a[0].off, 1);
	CHECK_EQ_INT(a[1].off, 2);
	for (size_t i = 2; i < na; i++) {
		CHECK(a[i].off > 2);
		for (size_t j = 2; j < i; j++)
			CHECK(a[i].off != a[j].off);
	}
	fx_file(fx, "u/new", "");
	CHECK_EQ_INT(sfs_dir_list(fx->fs.root, &b, &nb), 0);
	CHECK_EQ_INT(nb, na + 1);
	for (size_t i = 0; i < na; i++)
		CHECK_EQ_INT(off_of(b, nb, a[i].name), a[i].off);
	sfs_dirents_free(a, na);
	sfs_dirents_free(b, nb);
}

/*
 * A ".wh.NAME" marker hides NAME in the layers below its own, never
 * beside it: whatever order readdir returns a layer in (found by
 * fuzz/whiteout). Sixteen pairs make a lucky order unlikely.
 */
static void test_markers_beside(void)
{
	struct sfs_dirent *ents;
	struct fixture fx;
	size_t count;
	char name[32];

	CHECK_EQ_INT(fixture_setup(&fx, 2, false), 0);
	for (int i = 0; i < 16; i++) {
		snprintf(name, sizeof(name), "l1/n%d", i);
		fx_file(&fx, name, "top");
		snprintf(name, sizeof(name), "l1/.wh.n%d", i);
		fx_file(&fx, name, "");
		snprintf(name, sizeof(name), "l2/n%d", i);
		fx_file(&fx, name, "hidden");
	}
	CHECK_EQ_INT(sfs_dir_list(fx.fs.root, &ents, &count), 0);
	CHECK_EQ_INT(count, 2 + 16);
	for (int i = 0; i < 16; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		CHECK(has(ents, count, name));
	}
	sfs_dirents_free(ents, count);
	fixture_done(&fx);
}

int main(void)
{
	struct sfs_dirent *ents;
	struct fixture fx;
	struct sfs_node *n;
	struct stat st;
	size_t count;
	int64_t subdirs;

	UNIT_REQUIRE_ROOT();
	CHECK_EQ_INT(fixture_setup(&fx, 2, true), 0);
	fx_file(&fx, "u/up", "");
	fx_whiteout(&fx, "u/gone");
	fx_file(&fx, "l1/gone", "");
	fx_file(&fx, "l1/both", "top");
	fx_file(&fx, "l2/both", "bottom");
	fx_file(&fx, "l1/.wh.oci", "");
	fx_file(&fx, "l2/oci", "");
	fx_dir(&fx, "l1/d1");
	fx_dir(&fx, "l2/d2");
	fx_dir(&fx, "u/d3");
	fx_dir(&fx, "l2/d1");
	fx_dir(&fx, "l1/e");
	fx_whiteout(&fx, "l1/e/x");
	fx_file(&fx, "l2/e/x", "");	/* no l2/e: ignored by openat */
	fx_dir(&fx, "l2/e");
	fx_file(&fx, "l2/e/x", "");

	CHECK_EQ_INT(sfs_dir_list(fx.fs.root, &ents, &count), 0);
	CHECK(has(ents, count, "."));
	CHECK(has(ents, count, ".."));
	CHECK(has(ents, count, "up"));
	CHECK(has(ents, count, "both"));
	CHECK(!has(ents, count, "gone"));
	CHECK(!has(ents, count, "oci"));
	CHECK(!has(ents, count, ".wh.oci"));
	/* . .. up both d1 d2 d3 e: each once */
	CHECK_EQ_INT(count, 8);
	for (size_t i = 0; i < count; i++) {
		if (strcmp(ents[i].name, "both"))
			continue;
		fstatat(fx.fd, "l1/both", &st, 0);
		CHECK_EQ_INT(ents[i].ino,
			     sfs_ino_compose(fx.fs.lower[0].fsid, st.st_ino));
		CHECK_EQ_INT(ents[i].type, DT_REG);
	}
	sfs_dirents_free(ents, count);
	check_offsets(&fx);

	CHECK_EQ_INT(sfs_dir_count_subdirs(fx.fs.root, &subdirs), 0);
	CHECK_EQ_INT(subdirs, 4);

	/* a merged dir holding only a whiteout is empty in the view */
	CHECK_EQ_INT(fx_lookup(&fx, "e", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_dir_check_empty(n), 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(sfs_dir_check_empty(fx.fs.root), -ENOTEMPTY);
	fixture_done(&fx);
	test_markers_beside();
	return unit_done("test_readdir");
}
