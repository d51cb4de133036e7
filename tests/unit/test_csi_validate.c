// SPDX-License-Identifier: Apache-2.0
/*
 * csi/validate.c and csi/path.c: what a request's ids, names, options
 * and paths must be before they reach anything, and how a path is
 * resolved: never through a symlink, never into the plugin's own
 * directories, never outside an allowed prefix.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "csi.h"
#include "unit.h"

static void test_ids_and_names(void)
{
	CHECK(csi_volume_id_valid("sv-0123456789abcdef0123456789abcdef"));
	CHECK(!csi_volume_id_valid("sv-0123456789ABCDEF0123456789abcdef"));
	CHECK(!csi_volume_id_valid("sv-0123456789abcdef0123456789abcde"));
	CHECK(!csi_volume_id_valid("sv-0123456789abcdef0123456789abcdef0"));
	CHECK(!csi_volume_id_valid("xx-0123456789abcdef0123456789abcdef"));
	CHECK(!csi_volume_id_valid("sv-../456789abcdef0123456789abcdef"));
	CHECK(!csi_volume_id_valid(""));

	CHECK_EQ_INT(csi_layer_name_check("base"), 0);
	CHECK_EQ_INT(csi_layer_name_check("dataset-v3.1_x"), 0);
	CHECK_EQ_INT(csi_layer_name_check(".hidden"), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check(".."), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check("a..b"), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check("a/b"), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check("a,b"), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check("a:b"), -EINVAL);
	CHECK_EQ_INT(csi_layer_name_check(""), -EINVAL);
}

static void test_split_layers(void)
{
	char **v;
	int n;

	CHECK_EQ_INT(csi_split_layers("", &v, &n), 0);
	CHECK_EQ_INT(n, 0);
	CHECK_EQ_INT(csi_split_layers("a,b,c", &v, &n), 0);
	CHECK_EQ_INT(n, 3);
	if (n == 3) {
		CHECK_EQ_STR(v[0], "a");
		CHECK_EQ_STR(v[2], "c");
	}
	csi_free_strv(v, n);
	/* an empty element is kept, for the name check to refuse */
	CHECK_EQ_INT(csi_split_layers("a,,b", &v, &n), 0);
	CHECK_EQ_INT(n, 3);
	if (n == 3)
		CHECK_EQ_STR(v[1], "");
	csi_free_strv(v, n);
}

static void test_path_check(void)
{
	static const char *const good[] = { "/a", "/a/b", "/a/b.c/..d", "/a/.b" };
	static const char *const bad[] = {
		"", "a", "a/b", "/", "//a", "/a//b", "/a/", "/a/.", "/a/./b",
		"/a/..", "/a/../b", "/..", "/a\nb", "/a\x7f", "/a\tb",
	};
	char why[256];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		CHECK_EQ_INT(csi_path_check(good[i], why, sizeof(why)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_EQ_INT(csi_path_check(bad[i], why, sizeof(why)), -EINVAL);
}

static struct csi_map_entry entry(const char *k, const char *v)
{
	struct csi_map_entry e = { .key = (char *)k, .value = (char *)v };

	return e;
}

static void test_options(void)
{
	struct csi_map_entry e[3];
	void *p[3] = { &e[0], &e[1], &e[2] };
	bool pt;
	char why[256];

	e[0] = entry("layers", "base");
	e[1] = entry("passthrough", "true");
	e[2] = entry("csi.storage.k8s.io/pvc/name", "x");
	CHECK_EQ_INT(csi_volume_options_check(3, p, "parameter", &pt, why,
					      sizeof(why)), 0);
	CHECK(pt);
	/* the last duplicate wins, as in proto3 */
	e[2] = entry("passthrough", "false");
	CHECK_EQ_INT(csi_volume_options_check(3, p, "parameter", &pt, why,
					      sizeof(why)), 0);
	CHECK(!pt);
	CHECK_EQ_STR(csi_map_get(3, p, "passthrough"), "false");
	e[2] = entry("passthrough", "yes");
	CHECK_EQ_INT(csi_volume_options_check(3, p, "parameter", &pt, why,
					      sizeof(why)), -EINVAL);
	e[2] = entry("colour", "red");
	CHECK_EQ_INT(csi_volume_options_check(3, p, "parameter", &pt, why,
					      sizeof(why)), -EINVAL);
	CHECK(strstr(why, "colour") != NULL);
}

/* A tree with a symlink in it, a guarded "store" and an allowed prefix. */
static void test_path_resolve(void)
{
	char root[64] = "/tmp/strata-unit-XXXXXX", path[256], why[512];
	struct csi_plugin p = { 0 };
	struct csi_path pp;
	int fd;

	CHECK(mkdtemp(root) != NULL);
	fd = open(root, O_RDONLY | O_DIRECTORY);
	mkdirat(fd, "kubelet", 0755);
	mkdirat(fd, "kubelet/pods", 0755);
	mkdirat(fd, "store", 0755);
	mkdirat(fd, "store/layers", 0755);
	mkdirat(fd, "elsewhere", 0755);
	CHECK_EQ_INT(symlinkat("../elsewhere", fd, "kubelet/link"), 0);
	CHECK_EQ_INT(symlinkat("../store", fd, "kubelet/tostore"), 0);
	snprintf(path, sizeof(path), "%s/store", root);
	CHECK_EQ_INT(csi_guard_add(&p, path), 0);
	snprintf(path, sizeof(path), "%s/kubelet", root);
	p.cfg.prefixes[0] = strdup(path);
	p.cfg.nprefixes = 1;

	snprintf(path, sizeof(path), "%s/kubelet/pods/t", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), 0);
	CHECK_EQ_STR(pp.name, "t");
	/* made, opened, and a file is never taken for a directory */
	{
		bool made;
		int dfd = csi_path_open(&pp, true, &made);

		CHECK(dfd >= 0 && made);
		if (dfd >= 0)
			close(dfd);
	}
	csi_path_release(&pp);
	/* a symlink anywhere on the way */
	snprintf(path, sizeof(path), "%s/kubelet/link/t", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), -ELOOP);
	snprintf(path, sizeof(path), "%s/kubelet/link", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), 0);
	CHECK_EQ_INT(csi_path_open(&pp, false, NULL), -ELOOP);
	csi_path_release(&pp);
	/* outside the prefix, in the guarded store, above it */
	snprintf(path, sizeof(path), "%s/elsewhere/t", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), -EPERM);
	snprintf(path, sizeof(path), "%s/kubelet-evil", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), -EPERM);
	p.cfg.nprefixes = 0;
	snprintf(path, sizeof(path), "%s/store/layers/base", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), -EPERM);
	CHECK_EQ_INT(csi_path_resolve(&p, root, &pp, why, sizeof(why)), -EPERM);
	/* a parent that does not exist */
	snprintf(path, sizeof(path), "%s/no/such", root);
	CHECK_EQ_INT(csi_path_resolve(&p, path, &pp, why, sizeof(why)), -ENOENT);
	/* the plugin's own paths need no guard, but still no symlink */
	snprintf(path, sizeof(path), "%s/store/layers/x", root);
	CHECK_EQ_INT(csi_path_resolve(NULL, path, &pp, why, sizeof(why)), 0);
	csi_path_release(&pp);
	snprintf(path, sizeof(path), "%s/kubelet/tostore/x", root);
	CHECK_EQ_INT(csi_path_resolve(NULL, path, &pp, why, sizeof(why)), -ELOOP);

	free(p.cfg.prefixes[0]);
	csi_guards_free(&p);
	close(fd);
	strata_rmtree_at(AT_FDCWD, root);
}

int main(void)
{
	test_ids_and_names();
	test_split_layers();
	test_path_check();
	test_options();
	test_path_resolve();
	return unit_done("test_csi_validate");
}
