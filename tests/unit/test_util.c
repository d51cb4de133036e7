// SPDX-License-Identifier: Apache-2.0
/* util.c and the inode numbering of inode.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stratafs.h"
#include "unit.h"

static void test_rmtree(int root)
{
	int fd;

	CHECK_EQ_INT(mkdirat(root, "t", 0700), 0);
	CHECK_EQ_INT(mkdirat(root, "t/a", 0700), 0);
	CHECK_EQ_INT(mkdirat(root, "t/a/b", 0700), 0);
	fd = openat(root, "t/a/b/f", O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0);
	close(fd);
	CHECK_EQ_INT(symlinkat("/etc", root, "t/a/link"), 0);
	CHECK_EQ_INT(strata_rmtree_at(root, "t"), 0);
	CHECK(faccessat(root, "t", F_OK, AT_SYMLINK_NOFOLLOW) < 0);
	/* a symlink to a directory is removed, never followed */
	CHECK(access("/etc/passwd", F_OK) == 0);
	CHECK_EQ_INT(strata_rmtree_at(root, "missing"), -ENOENT);
}

static void test_open_reopen(int root)
{
	struct stat st;
	char path[64];
	int fd, pfd, rfd;

	fd = openat(root, "file", O_CREAT | O_WRONLY, 0644);
	CHECK(fd >= 0);
	CHECK_EQ_INT(write(fd, "hello", 5), 5);
	close(fd);

	pfd = sfs_open_entry(root, "file", S_IFREG);
	CHECK(pfd >= 0);
	CHECK_EQ_INT(sfs_fstat(pfd, &st), 0);
	CHECK_EQ_INT(st.st_size, 5);
	CHECK_EQ_INT(sfs_proc_path(pfd, path, sizeof(path)), 0);
	CHECK(strncmp(path, "/proc/self/fd/", 14) == 0);
	CHECK_EQ_INT(sfs_proc_path(pfd, path, 8), -ENAMETOOLONG);

	rfd = sfs_reopen(pfd, O_RDONLY);
	CHECK(rfd >= 0);
	if (rfd >= 0) {
		char buf[8] = { 0 };

		CHECK_EQ_INT(read(rfd, buf, sizeof(buf)), 5);
		CHECK_EQ_STR(buf, "hello");
		close(rfd);
	}
	close(pfd);
	CHECK_EQ_INT(sfs_open_entry(root, "nope", S_IFREG), -ENOENT);
	/* entries are opened without following symlinks */
	CHECK_EQ_INT(symlinkat(".", root, "sl"), 0);
	CHECK_EQ_INT(sfs_open_entry(root, "sl", S_IFDIR), -ENOTDIR);
}

static void test_ino(void)
{
	CHECK_EQ_INT(sfs_ino_compose(0, 1234), 1234);
	CHECK_EQ_INT(sfs_ino_compose(2, 1234), (2ULL << 56) | 1234);
	/* different layers' filesystems never share a number */
	CHECK(sfs_ino_compose(1, 77) != sfs_ino_compose(2, 77));
	/* huge inode numbers are folded below the layer bits */
	CHECK_EQ_INT(sfs_ino_compose(1, (1ULL << 60) | 5) >> 56, 1);
}

static void test_errno(void)
{
	CHECK_EQ_INT(sfs_errno(-ENOENT), ENOENT);
	CHECK_EQ_INT(sfs_errno(0), 0);
	CHECK_EQ_INT(sfs_errno(12), 0);
}

int main(void)
{
	char tmpl[] = "/tmp/strata-unit-XXXXXX";
	int root;

	if (!mkdtemp(tmpl))
		return 77;
	root = open(tmpl, O_RDONLY | O_DIRECTORY);
	test_rmtree(root);
	test_open_reopen(root);
	test_ino();
	test_errno();
	strata_rmtree_at(AT_FDCWD, tmpl);
	close(root);
	return unit_done("test_util");
}
