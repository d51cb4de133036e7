// SPDX-License-Identifier: Apache-2.0
/* index.c: origins in the kernel's encoding, the index, the count. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "fixture.h"
#include "unit.h"

int main(void)
{
	struct sfs_fh fh, back;
	struct fixture fx;
	struct stat st, ist;
	char buf[16];
	int fd, layer, n;

	UNIT_REQUIRE_ROOT();
	/* the count, relative to the upper inode's own or the lower one's */
	CHECK_EQ_INT(sfs_nlink_parse("U+0", 3, 2, 9), 2);
	CHECK_EQ_INT(sfs_nlink_parse("U+1", 3, 1, 9), 2);
	CHECK_EQ_INT(sfs_nlink_parse("U-1", 3, 3, 9), 2);
	CHECK_EQ_INT(sfs_nlink_parse("L-2", 3, 1, 5), 3);
	CHECK_EQ_INT(sfs_nlink_parse("U-5", 3, 2, 9), -EINVAL);
	CHECK_EQ_INT(sfs_nlink_parse("X+1", 3, 2, 9), -EINVAL);
	CHECK_EQ_INT(sfs_nlink_parse("U1", 2, 2, 9), -EINVAL);
	CHECK_EQ_INT(sfs_nlink_parse("U+1x", 4, 2, 9), -EINVAL);
	n = sfs_nlink_format(buf, sizeof(buf), 3, 1);
	CHECK_EQ_INT(n, 3);
	CHECK(!memcmp(buf, "U+2", 3));
	n = sfs_nlink_format(buf, sizeof(buf), 1, 3);
	CHECK(!memcmp(buf, "U-2", 3));

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	fx_file(&fx, "l1/a", "data");
	CHECK_EQ_INT(linkat(fx.fd, "l1/a", fx.fd, "l1/b", 0), 0);
	fd = openat(fx.fd, "l1/a", O_PATH);
	CHECK(fd >= 0);
	/* version 0, magic 0xfb, length, flags, type, uuid, handle */
	CHECK_EQ_INT(sfs_fh_encode(fd, &fx.fs.lower[0], &fh), 0);
	CHECK_EQ_INT(fh.buf[0], 0);
	CHECK_EQ_INT(fh.buf[1], 0xfb);
	CHECK_EQ_INT(fh.buf[2], fh.len);
	CHECK(fh.len > 21);
	/* it leads back to the file */
	n = sfs_fh_decode(&fh, &layer);
	CHECK(n >= 0);
	if (n >= 0) {
		fstat(n, &st);
		fstat(fd, &ist);
		CHECK_EQ_INT(st.st_ino, ist.st_ino);
		CHECK_EQ_INT(layer, 0);
		close(n);
	}
	/* stored and read back as the origin xattr */
	fx_file(&fx, "u/c", "");
	CHECK_EQ_INT(sfs_origin_fh_get(fx.fd, "u/c", &back), 0);
	CHECK_EQ_INT(sfs_origin_fh_set(fx.fd, "u/c", &fh), 0);
	CHECK_EQ_INT(sfs_origin_fh_get(fx.fd, "u/c", &back), 1);
	CHECK_EQ_INT(back.len, fh.len);
	CHECK(!memcmp(back.buf, fh.buf, fh.len));
	/* nothing in the index yet; the copy is found once installed */
	CHECK_EQ_INT(sfs_index_open(&fh, S_IFREG, &st), -ENOENT);
	CHECK_EQ_INT(sfs_index_find(fd, 1, S_IFREG), -ENOENT);
	fx_file(&fx, "w/work/tmp", "copy");
	CHECK_EQ_INT(sfs_index_install("tmp", &fh), 0);
	n = sfs_index_find(fd, 1, S_IFREG);
	CHECK(n >= 0);
	if (n >= 0)
		close(n);
	/* of another type, it is not used */
	CHECK_EQ_INT(sfs_index_open(&fh, S_IFDIR, &st), -ENOENT);
	sfs_index_remove(&fh);
	CHECK_EQ_INT(sfs_index_open(&fh, S_IFREG, &st), -ENOENT);
	close(fd);
	fixture_done(&fx);
	return unit_done("test_index");
}
