// SPDX-License-Identifier: Apache-2.0
/* io.c: the data paths copy-up uses, on real files. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stratafs.h"
#include "unit.h"

int main(void)
{
	char tmpl[] = "/tmp/strata-unit-XXXXXX";
	size_t size = 3 * (1 << 20) + 123;	/* more than one chunk */
	char *a = malloc(size), *b = malloc(size);
	int root, in, out;

	if (!a || !b || !mkdtemp(tmpl))
		return 1;
	root = open(tmpl, O_RDONLY | O_DIRECTORY);
	for (size_t i = 0; i < size; i++)
		a[i] = (char)(i * 31 + 7);
	in = openat(root, "in", O_CREAT | O_RDWR, 0600);
	out = openat(root, "out", O_CREAT | O_RDWR, 0600);
	CHECK_EQ_INT(sfs_io_pwrite(in, a, size, 0), (long long)size);

	CHECK_EQ_INT(sfs_io_copy_range(in, out, 0, size), 0);
	CHECK_EQ_INT(sfs_io_pread(out, b, size, 0), (long long)size);
	CHECK(memcmp(a, b, size) == 0);

	/* a range at an offset lands at the same offset */
	CHECK_EQ_INT(ftruncate(out, 0), 0);
	CHECK_EQ_INT(sfs_io_copy_range(in, out, 4096, 8192), 0);
	CHECK_EQ_INT(sfs_io_pread(out, b, 8192, 4096), 8192);
	CHECK(memcmp(a + 4096, b, 8192) == 0);

	/* asking past the end copies what is there and stops */
	CHECK_EQ_INT(sfs_io_copy_range(in, out, size - 10, 1000), 0);
	CHECK_EQ_INT(lseek(out, 0, SEEK_END), (long long)size);

	/* errors come back as negative errno */
	CHECK_EQ_INT(sfs_io_pread(-1, b, 1, 0), -EBADF);
	CHECK_EQ_INT(sfs_io_pwrite(-1, b, 1, 0), -EBADF);
	CHECK_EQ_INT(sfs_io_copy_range(in, -1, 0, 10), -EBADF);

	close(in);
	close(out);
	strata_rmtree_at(AT_FDCWD, tmpl);
	close(root);
	free(a);
	free(b);
	return unit_done("test_io");
}
