// SPDX-License-Identifier: Apache-2.0
/* xattr.c: private names, copying, the origin number. */
#include <errno.h>

#include "fixture.h"
#include "unit.h"

int main(void)
{
	struct sfs_xpath a, b;
	struct fixture fx;
	struct sfs_node *n;
	uint64_t ino = 0;
	char buf[16];

	UNIT_REQUIRE_ROOT();
	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	CHECK(sfs_xattr_is_private("trusted.overlay.opaque"));
	CHECK(sfs_xattr_is_private("trusted.overlay.strata.ino"));
	CHECK(!sfs_xattr_is_private("trusted.overlayfoo"));
	CHECK(!sfs_xattr_is_private("user.overlay.opaque"));
	CHECK(!sfs_xattr_is_private("security.capability"));

	fx_file(&fx, "l1/a", "");
	fx_file(&fx, "u/b", "");
	CHECK_EQ_INT(sfs_xpath_entry(&a, fx.fd, "l1/a"), 0);
	CHECK_EQ_INT(sfs_xpath_entry(&b, fx.fd, "u/b"), 0);
	CHECK_EQ_INT(sfs_xattr_set(&a, "user.one", "1", 1, 0), 0);
	CHECK_EQ_INT(sfs_xattr_set(&a, "trusted.x", "2", 1, 0), 0);
	CHECK_EQ_INT(sfs_xattr_set(&a, "trusted.overlay.opaque", "y", 1, 0), 0);
	CHECK_EQ_INT(sfs_xattr_copy(&a, &b), 0);
	CHECK_EQ_INT(sfs_xattr_get(&b, "user.one", buf, sizeof(buf)), 1);
	CHECK_EQ_INT(sfs_xattr_get(&b, "trusted.x", buf, sizeof(buf)), 1);
	CHECK_EQ_INT(sfs_xattr_get(&b, "trusted.overlay.opaque", buf,
				   sizeof(buf)), -ENODATA);
	CHECK_EQ_INT(sfs_xattr_get(&b, "user.none", buf, sizeof(buf)), -ENODATA);
	CHECK_EQ_INT(sfs_xattr_get(&b, "user.one", buf, 0), 1);

	/* the origin number, on regular files and symlinks alike */
	CHECK_EQ_INT(sfs_ino_xattr_get(fx.fd, "u/b", &ino), 0);
	CHECK_EQ_INT(sfs_ino_xattr_set(fx.fd, "u/b", 0x0100000000001234ULL), 0);
	CHECK_EQ_INT(sfs_ino_xattr_get(fx.fd, "u/b", &ino), 1);
	CHECK_EQ_INT(ino, 0x0100000000001234ULL);
	symlinkat("b", fx.fd, "u/s");
	CHECK_EQ_INT(sfs_ino_xattr_set(fx.fd, "u/s", 42), 0);
	CHECK_EQ_INT(sfs_ino_xattr_get(fx.fd, "u/s", &ino), 1);
	CHECK_EQ_INT(ino, 42);

	/*
	 * A symlink's xattrs are reached by a real name: its lower name
	 * before copy-up, a temporary link in the workdir after, which
	 * works whatever names it has left.
	 */
	symlinkat("a", fx.fd, "l1/sl");
	CHECK_EQ_INT(sfs_xpath_entry(&a, fx.fd, "l1/sl"), 0);
	CHECK_EQ_INT(sfs_xattr_set(&a, "trusted.s", "s", 1, 0), 0);
	CHECK_EQ_INT(fx_lookup(&fx, "sl", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_node_xattr_get(n, "trusted.s", buf,
						sizeof(buf)), 1);
		CHECK_EQ_INT(sfs_copy_up(n), 0);
		CHECK_EQ_INT(sfs_node_xattr_get(n, "trusted.s", buf,
						sizeof(buf)), 1);
		CHECK_EQ_INT(sfs_node_xattr_set(n, "trusted.t", "t", 1, 0), 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(sfs_xpath_entry(&b, fx.fd, "u/sl"), 0);
	CHECK_EQ_INT(sfs_xattr_get(&b, "trusted.s", buf, sizeof(buf)), 1);
	CHECK_EQ_INT(sfs_xattr_get(&b, "trusted.t", buf, sizeof(buf)), 1);
	/* and the temporary links are gone */
	CHECK_EQ_INT(fx_count(&fx, "w/work"), 0);
	fixture_done(&fx);
	return unit_done("test_xattr");
}
