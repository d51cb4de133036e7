// SPDX-License-Identifier: Apache-2.0
/*
 * csi/record.c: JSON records written atomically and read back, and what
 * a damaged, oversized or symlinked record reads as.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "csi.h"
#include "unit.h"

static int scratch(char *dir)
{
	strcpy(dir, "/tmp/strata-unit-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	return open(dir, O_RDONLY | O_DIRECTORY);
}

static void put(int dirfd, const char *name, const char *text)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd >= 0) {
		if (write(fd, text, strlen(text)) < 0)
			perror(name);
		close(fd);
	}
}

static void test_round_trip(int dirfd)
{
	json_object *o = json_object_new_object(), *back = NULL;
	struct stat st;

	json_object_object_add(o, "name", json_object_new_string("a/b \"c\"\n"));
	json_object_object_add(o, "n", json_object_new_int64(1LL << 40));
	CHECK_EQ_INT(csi_record_write(dirfd, "r.json", o), 0);
	json_object_put(o);
	/* the temporary file is gone, the record is private */
	CHECK(fstatat(dirfd, ".r.json.tmp", &st, 0) < 0 && errno == ENOENT);
	CHECK_EQ_INT(fstatat(dirfd, "r.json", &st, 0), 0);
	CHECK_EQ_INT(st.st_mode & 0777, 0600);
	CHECK_EQ_INT(csi_record_read(dirfd, "r.json", &back), 0);
	CHECK_EQ_STR(csi_json_str(back, "name"), "a/b \"c\"\n");
	CHECK_EQ_INT(csi_json_int(back, "n"), 1LL << 40);
	/* absent keys and keys of another type */
	CHECK(csi_json_str(back, "missing") == NULL);
	CHECK(csi_json_str(back, "n") == NULL);
	CHECK_EQ_INT(csi_json_int(back, "missing"), 0);
	json_object_put(back);
	CHECK_EQ_INT(csi_record_remove(dirfd, "r.json"), 0);
	CHECK_EQ_INT(csi_record_remove(dirfd, "r.json"), 0);	/* idempotent */
	CHECK_EQ_INT(csi_record_read(dirfd, "r.json", &back), -ENOENT);
	CHECK(back == NULL);
}

static void test_bad_records(int dirfd)
{
	json_object *o = (json_object *)1;
	char *big;

	put(dirfd, "cut.json", "{\"id\": \"trunc");
	CHECK_EQ_INT(csi_record_read(dirfd, "cut.json", &o), -EBADMSG);
	CHECK(o == NULL);
	put(dirfd, "array.json", "[1, 2]");
	CHECK_EQ_INT(csi_record_read(dirfd, "array.json", &o), -EBADMSG);
	put(dirfd, "empty.json", "");
	CHECK_EQ_INT(csi_record_read(dirfd, "empty.json", &o), -EBADMSG);
	/* a record is never followed through a symlink */
	put(dirfd, "target.json", "{}");
	CHECK_EQ_INT(symlinkat("target.json", dirfd, "link.json"), 0);
	CHECK_EQ_INT(csi_record_read(dirfd, "link.json", &o), -ELOOP);
	/* nor read without bound */
	big = malloc((2 << 20) + 1);
	if (big) {
		memset(big, ' ', 2 << 20);
		big[0] = '{';
		big[2 << 20] = '\0';
		put(dirfd, "big.json", big);
		free(big);
		CHECK_EQ_INT(csi_record_read(dirfd, "big.json", &o), -EFBIG);
	}
}

int main(void)
{
	char dir[64];
	int dirfd = scratch(dir);

	CHECK(dirfd >= 0);
	if (dirfd < 0)
		return unit_done("test_csi_record");
	test_round_trip(dirfd);
	test_bad_records(dirfd);
	strata_rmtree_at(AT_FDCWD, dir);
	close(dirfd);
	return unit_done("test_csi_record");
}
