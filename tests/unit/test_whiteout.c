// SPDX-License-Identifier: Apache-2.0
/* whiteout.c: the kernel's markers, made and read on a real directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"
#include "unit.h"

static struct sfs_fs fs;

static int mkfile(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_CREAT | O_WRONLY, 0644);

	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

static void test_names(void)
{
	char buf[300];
	struct stat st = { .st_mode = S_IFCHR, .st_rdev = makedev(0, 0) };

	CHECK(sfs_is_whiteout(&st));
	st.st_rdev = makedev(1, 3);
	CHECK(!sfs_is_whiteout(&st));
	st.st_mode = S_IFREG;
	st.st_rdev = 0;
	CHECK(!sfs_is_whiteout(&st));
	CHECK(sfs_is_wh_name(".wh.foo"));
	CHECK(!sfs_is_wh_name("foo.wh."));
	CHECK_EQ_INT(sfs_wh_name("foo", buf, sizeof(buf)), 0);
	CHECK_EQ_STR(buf, ".wh.foo");
	CHECK_EQ_INT(sfs_wh_name("foo", buf, 6), -ENAMETOOLONG);
}

static void test_whiteouts(int dir)
{
	struct stat st;

	CHECK_EQ_INT(sfs_whiteout_create(dir, "gone"), 0);
	CHECK(fstatat(dir, "gone", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	      sfs_is_whiteout(&st));
	/* never over something that is there */
	CHECK_EQ_INT(sfs_whiteout_create(dir, "gone"), -EEXIST);

	CHECK_EQ_INT(mkfile(dir, "file"), 0);
	CHECK_EQ_INT(sfs_whiteout_replace(dir, "file"), 0);
	CHECK(fstatat(dir, "file", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	      sfs_is_whiteout(&st));

	/* a directory holding whiteouts is swapped out whole */
	CHECK_EQ_INT(mkdirat(dir, "sub", 0755), 0);
	CHECK_EQ_INT(mknodat(dir, "sub/x", S_IFCHR, makedev(0, 0)), 0);
	CHECK_EQ_INT(sfs_whiteout_replace(dir, "sub"), 0);
	CHECK(fstatat(dir, "sub", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	      sfs_is_whiteout(&st));
}

static void test_whiteouts_by_hand(int dir)
{
	bool saved = fs.rename_whiteout;
	struct stat st;

	/* the path taken where the filesystem lacks RENAME_WHITEOUT */
	fs.rename_whiteout = false;
	CHECK_EQ_INT(mkfile(dir, "hand"), 0);
	CHECK_EQ_INT(sfs_whiteout_replace(dir, "hand"), 0);
	CHECK(fstatat(dir, "hand", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	      sfs_is_whiteout(&st));
	fs.rename_whiteout = saved;
}

static void test_xattrs(int dir)
{
	char *redirect = NULL;
	int sub, lower;

	CHECK_EQ_INT(mkdirat(dir, "od", 0755), 0);
	sub = openat(dir, "od", O_RDONLY | O_DIRECTORY);
	CHECK_EQ_INT(sfs_dir_is_opaque(sub, false), 0);
	CHECK_EQ_INT(sfs_set_opaque(sub), 0);
	CHECK_EQ_INT(sfs_dir_is_opaque(sub, false), 1);
	CHECK_EQ_INT(sfs_dir_is_impure(sub), 0);

	CHECK_EQ_INT(sfs_get_redirect(sub, &redirect), 0);
	CHECK(redirect == NULL);
	CHECK_EQ_INT(sfs_set_redirect(sub, "/a/b"), 0);
	CHECK_EQ_INT(sfs_get_redirect(sub, &redirect), 0);
	CHECK_EQ_STR(redirect, "/a/b");
	free(redirect);
	/* malformed redirects are refused, as the kernel refuses them */
	{
		static const char *const bad[] = { "/a//b", "a/b", "/", "//",
						   "/a/" };

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			CHECK_EQ_INT(sfs_set_redirect(sub, bad[i]), 0);
			CHECK_EQ_INT(sfs_get_redirect(sub, &redirect), -EINVAL);
			CHECK(redirect == NULL);
		}
		CHECK(!sfs_redirect_valid("", 0));
		CHECK(!sfs_redirect_valid("a\0b", 3));
		CHECK_EQ_INT(sfs_set_redirect(sub, "name"), 0);
		CHECK_EQ_INT(sfs_get_redirect(sub, &redirect), 0);
		CHECK_EQ_STR(redirect, "name");
		free(redirect);
	}
	close(sub);

	/* OCI layers mark opacity with an entry, honoured in lower layers only */
	CHECK_EQ_INT(mkdirat(dir, "oci", 0755), 0);
	lower = openat(dir, "oci", O_RDONLY | O_DIRECTORY);
	CHECK_EQ_INT(mkfile(lower, ".wh..wh..opq"), 0);
	CHECK_EQ_INT(sfs_dir_is_opaque(lower, true), 1);
	CHECK_EQ_INT(sfs_dir_is_opaque(lower, false), 0);
	close(lower);
}

/*
 * A redirect longer than a path, where the filesystem holds one (tmpfs
 * does, ext4 without ea_inode does not): read whole as the kernel reads
 * it, never ERANGE, and refused only when malformed (found by
 * fuzz/redirect; namei.c finds nothing where it leads).
 */
static void test_long_redirect(void)
{
	char tmpl[] = "/dev/shm/strata-unit-XXXXXX";
	char huge[5001] = "/", *redirect = NULL;
	int dir;

	if (!mkdtemp(tmpl)) {
		fprintf(stderr, "test_whiteout: no tmpfs at /dev/shm, skipped "
			"a redirect longer than a path\n");
		return;
	}
	dir = open(tmpl, O_RDONLY | O_DIRECTORY);
	memset(huge + 1, 'h', sizeof(huge) - 2);
	CHECK_EQ_INT(sfs_set_redirect(dir, huge), 0);
	CHECK_EQ_INT(sfs_get_redirect(dir, &redirect), 0);
	CHECK(redirect && !strcmp(redirect, huge));
	free(redirect);
	huge[3] = '/';
	huge[4] = '/';
	CHECK_EQ_INT(sfs_set_redirect(dir, huge), 0);
	CHECK_EQ_INT(sfs_get_redirect(dir, &redirect), -EINVAL);
	CHECK(redirect == NULL);
	close(dir);
	rmdir(tmpl);
}

int main(void)
{
	char tmpl[] = "/tmp/strata-unit-XXXXXX";
	int root, dir, probe;

	UNIT_REQUIRE_ROOT();
	if (!mkdtemp(tmpl))
		return 1;
	sfs = &fs;
	snprintf(fs.xattr_prefix, sizeof(fs.xattr_prefix), "trusted.overlay.");
	snprintf(fs.xattr_opaque, sizeof(fs.xattr_opaque), "trusted.overlay.opaque");
	snprintf(fs.xattr_redirect, sizeof(fs.xattr_redirect), "trusted.overlay.redirect");
	snprintf(fs.xattr_impure, sizeof(fs.xattr_impure), "trusted.overlay.impure");
	root = open(tmpl, O_RDONLY | O_DIRECTORY);
	mkdirat(root, "work", 0700);
	mkdirat(root, "upper", 0755);
	fs.tmpfd = openat(root, "work", O_RDONLY | O_DIRECTORY);
	dir = openat(root, "upper", O_RDONLY | O_DIRECTORY);
	probe = sfs_probe_rename_whiteout(fs.tmpfd);
	CHECK(probe >= 0);
	fs.rename_whiteout = probe > 0;

	test_names();
	test_whiteouts(dir);
	test_whiteouts_by_hand(dir);
	test_xattrs(dir);
	test_long_redirect();

	/* nothing is ever left behind in the workdir */
	{
		int wfd = openat(root, "work", O_RDONLY | O_DIRECTORY);
		DIR *d = fdopendir(wfd);
		int entries = 0;

		for (struct dirent *de; d && (de = readdir(d));)
			entries += de->d_name[0] != '.';
		CHECK_EQ_INT(entries, 0);
		if (d)
			closedir(d);
	}
	close(dir);
	close(fs.tmpfd);
	strata_rmtree_at(AT_FDCWD, tmpl);
	close(root);
	return unit_done("test_whiteout");
}
