// SPDX-License-Identifier: Apache-2.0
/* copy_up.c: atomic copies with data, holes, metadata and xattrs. */
#include <errno.h>

#include "fixture.h"
#include "unit.h"

static void test_file(void)
{
	struct fixture fx;
	struct sfs_node *n;
	struct stat lst, ust;
	char buf[64];
	int fd;

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	fx_dir(&fx, "l1/a");
	fx_dir(&fx, "l1/a/b");
	fx_file(&fx, "l1/a/b/f", "lower data");
	fchmodat(fx.fd, "l1/a/b/f", 04751, 0);
	fchownat(fx.fd, "l1/a/b/f", 123, 456, 0);
	fchmodat(fx.fd, "l1/a/b/f", 04751, 0);
	fd = openat(fx.fd, "l1/a/b/f", O_RDONLY);
	fsetxattr(fd, "user.keep", "v", 1, 0);
	fsetxattr(fd, "trusted.overlay.private", "p", 1, 0);
	close(fd);
	/* a sparse file: 1 MiB hole, then data */
	fd = openat(fx.fd, "l1/sparse", O_CREAT | O_WRONLY, 0644);
	CHECK_EQ_INT(pwrite(fd, "end", 3, 1 << 20), 3);
	close(fd);

	CHECK_EQ_INT(fx_lookup(&fx, "a/b/f", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up(n), 0);
		CHECK(atomic_load(&n->has_upper));
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_read(&fx, "u/a/b/f", buf, sizeof(buf)), 10);
	CHECK_EQ_STR(buf, "lower data");
	fstatat(fx.fd, "l1/a/b/f", &lst, 0);
	fstatat(fx.fd, "u/a/b/f", &ust, 0);
	CHECK_EQ_INT(ust.st_mode, lst.st_mode);
	CHECK_EQ_INT(ust.st_uid, 123);
	CHECK_EQ_INT(ust.st_gid, 456);
	CHECK_EQ_INT(ust.st_mtim.tv_nsec, lst.st_mtim.tv_nsec);
	fd = openat(fx.fd, "u/a/b/f", O_RDONLY);
	CHECK_EQ_INT(fgetxattr(fd, "user.keep", buf, sizeof(buf)), 1);
	/* private markers never travel up with the copy */
	CHECK(fgetxattr(fd, "trusted.overlay.private", buf, sizeof(buf)) < 0);
	close(fd);
	/* parents come up with their metadata */
	CHECK(fx_exists(&fx, "u/a/b"));

	CHECK_EQ_INT(fx_lookup(&fx, "sparse", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up(n), 0);
		sfs_node_release(n);
	}
	fstatat(fx.fd, "u/sparse", &ust, 0);
	CHECK_EQ_INT(ust.st_size, (1 << 20) + 3);
	CHECK(ust.st_blocks * 512 < (1 << 20));	/* the hole stayed a hole */

	/* the lower layer is untouched and the workdir is clean */
	CHECK_EQ_INT(fx_read(&fx, "l1/a/b/f", buf, sizeof(buf)), 10);
	CHECK_EQ_INT(fx_count(&fx, "w/work"), 0);
	fixture_done(&fx);
}

static void test_meta_only_and_special(void)
{
	struct fixture fx;
	struct sfs_node *n;
	struct stat st;
	char buf[64];

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	fx_file(&fx, "l1/t", "to be truncated");
	symlinkat("target", fx.fd, "l1/link");
	mknodat(fx.fd, "l1/fifo", S_IFIFO | 0640, 0);

	CHECK_EQ_INT(fx_lookup(&fx, "t", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up_meta(n), 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fx_read(&fx, "u/t", buf, sizeof(buf)), 0);

	CHECK_EQ_INT(fx_lookup(&fx, "link", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up(n), 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(readlinkat(fx.fd, "u/link", buf, sizeof(buf)), 6);

	CHECK_EQ_INT(fx_lookup(&fx, "fifo", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up(n), 0);
		sfs_node_release(n);
	}
	CHECK_EQ_INT(fstatat(fx.fd, "u/fifo", &st, AT_SYMLINK_NOFOLLOW), 0);
	CHECK(S_ISFIFO(st.st_mode) && (st.st_mode & 07777) == 0640);
	CHECK_EQ_INT(fx_count(&fx, "w/work"), 0);
	fixture_done(&fx);
}

static void test_readonly(void)
{
	struct fixture fx;
	struct sfs_node *n;

	CHECK_EQ_INT(fixture_setup(&fx, 1, false), 0);
	fx_file(&fx, "l1/x", "x");
	CHECK_EQ_INT(fx_lookup(&fx, "x", &n), 0);
	if (n) {
		CHECK_EQ_INT(sfs_copy_up(n), -EROFS);
		sfs_node_release(n);
	}
	fixture_done(&fx);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	test_file();
	test_meta_only_and_special();
	test_readonly();
	return unit_done("test_copy_up");
}
