// SPDX-License-Identifier: Apache-2.0
/* usage.c: byte counts, a write's claim on the room left, statfs, verbs. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "stratafs.h"
#include "unit.h"

#define KiB 1024LL

static void test_parse(void)
{
	uint64_t v = 7;

	CHECK_EQ_INT(sfs_usage_parse("0", &v), 0);
	CHECK_EQ_INT(v, 0);
	CHECK_EQ_INT(sfs_usage_parse("10485760", &v), 0);
	CHECK_EQ_INT(v, 10485760);
	CHECK_EQ_INT(sfs_usage_parse("9223372036854775807", &v), 0);
	CHECK_EQ_INT(sfs_usage_parse("9223372036854775808", &v), -ERANGE);
	CHECK_EQ_INT(sfs_usage_parse("99999999999999999999", &v), -ERANGE);
	CHECK_EQ_INT(sfs_usage_parse("", &v), -EINVAL);
	CHECK_EQ_INT(sfs_usage_parse("-1", &v), -EINVAL);
	CHECK_EQ_INT(sfs_usage_parse("+1", &v), -EINVAL);
	CHECK_EQ_INT(sfs_usage_parse(" 1", &v), -EINVAL);
	CHECK_EQ_INT(sfs_usage_parse("1M", &v), -EINVAL);
	CHECK_EQ_INT(sfs_usage_parse(NULL, &v), -EINVAL);
}

/* A write through the claim, as io.c makes it. */
static ssize_t claimed_write(struct sfs_node *n, int fd, off_t off, size_t len)
{
	static char buf[256 * 1024];
	struct sfs_claim c;
	ssize_t fits = sfs_usage_claim(n, fd, off, len, &c);

	if (fits < 0)
		return fits;
	memset(buf, 'u', fits);
	fits = pwrite(fd, buf, fits, off);
	sfs_usage_settle(&c, fd);
	return fits;
}

static void test_claims(int dir)
{
	static struct sfs_node n;
	struct sfs_usage *u = &sfs->usage;
	int fd = openat(dir, "f", O_CREAT | O_RDWR | O_TRUNC, 0600);
	int64_t claimed;

	n.ublocks = -1;
	atomic_store(&u->capacity, 64 * KiB);
	/* a new file: all of it fits, and is counted after */
	CHECK_EQ_INT(claimed_write(&n, fd, 0, 16 * KiB), 16 * KiB);
	CHECK_EQ_INT(atomic_load(&u->bytes), 16 * KiB);
	CHECK_EQ_INT(atomic_load(&u->claimed), 0);
	/* past the room: cut short at it, to the block */
	CHECK_EQ_INT(claimed_write(&n, fd, 16 * KiB, 64 * KiB), 48 * KiB);
	CHECK_EQ_INT(atomic_load(&u->bytes), 64 * KiB);
	/* full: appending fails, overwriting allocated data does not */
	CHECK_EQ_INT(claimed_write(&n, fd, 64 * KiB, 1), -ENOSPC);
	CHECK_EQ_INT(claimed_write(&n, fd, 0, 16 * KiB), 16 * KiB);
	CHECK_EQ_INT(atomic_load(&u->bytes), 64 * KiB);
	/* a reservation holds room for a write in flight */
	atomic_store(&u->capacity, 128 * KiB);
	CHECK_EQ_INT(sfs_usage_reserve(60 * KiB, &claimed), 0);
	CHECK_EQ_INT(sfs_usage_room(8 * KiB), -ENOSPC);
	CHECK_EQ_INT(claimed_write(&n, fd, 64 * KiB, 8 * KiB), 4 * KiB);
	sfs_usage_unreserve(claimed);
	CHECK_EQ_INT(atomic_load(&u->claimed), 0);
	/* truncating gives back what the file allocated */
	sfs_usage_seed(&n, fd);
	CHECK_EQ_INT(ftruncate(fd, 0), 0);
	sfs_usage_track(&n, fd);
	CHECK_EQ_INT(atomic_load(&u->bytes), 0);
	/* a hole may allocate anywhere: the whole write must fit */
	CHECK_EQ_INT(ftruncate(fd, 1 << 20), 0);
	atomic_store(&u->capacity, 4 * KiB);
	CHECK_EQ_INT(claimed_write(&n, fd, 512 * KiB, 8 * KiB), 4 * KiB);
	CHECK_EQ_INT(claimed_write(&n, fd, 520 * KiB, 4 * KiB), -ENOSPC);
	/* no capacity: everything fits, and is still counted */
	atomic_store(&u->capacity, 0);
	CHECK_EQ_INT(claimed_write(&n, fd, 0, 128 * KiB), 128 * KiB);
	CHECK(atomic_load(&u->bytes) >= 128 * KiB);
	close(fd);
}

static void test_statfs(void)
{
	struct sfs_usage *u = &sfs->usage;
	struct statvfs sv = { .f_bsize = 4096, .f_frsize = 4096,
			      .f_blocks = 1000000, .f_bfree = 500000,
			      .f_bavail = 400000 };

	atomic_store(&u->capacity, 0);
	sfs_usage_statfs(&sv);
	CHECK_EQ_INT(sv.f_blocks, 1000000);
	atomic_store(&u->capacity, 40 * 4096);
	atomic_store(&u->bytes, 10 * 4096 + 1);
	sfs_usage_statfs(&sv);
	CHECK_EQ_INT(sv.f_blocks, 40);
	CHECK_EQ_INT(sv.f_bfree, 29);
	CHECK_EQ_INT(sv.f_bavail, 29);
	/* never more free than the disk has */
	sv.f_blocks = 1000000;
	sv.f_bfree = sv.f_bavail = 3;
	sfs_usage_statfs(&sv);
	CHECK_EQ_INT(sv.f_bavail, 3);
	/* past the capacity (lowered live): nothing free, no wrap */
	atomic_store(&u->bytes, 80 * 4096);
	sv.f_bfree = sv.f_bavail = 500000;
	sfs_usage_statfs(&sv);
	CHECK_EQ_INT(sv.f_bfree, 0);
}

static void test_verbs(void)
{
	char out[256], *argv[1];

	atomic_store(&sfs->usage.bytes, 12288);
	atomic_store(&sfs->usage.inodes, 3);
	atomic_store(&sfs->usage.capacity, 0);
	CHECK_EQ_INT(sfs_usage_verb(0, NULL, out, sizeof(out)), 0);
	CHECK_EQ_STR(out, "used=12288 inodes=3 capacity=0");
	argv[0] = "1048576";
	CHECK_EQ_INT(sfs_capacity_verb(1, argv, out, sizeof(out)), 0);
	CHECK_EQ_STR(out, "capacity=1048576");
	CHECK_EQ_INT(atomic_load(&sfs->usage.capacity), 1048576);
	argv[0] = "lots";
	CHECK_EQ_INT(sfs_capacity_verb(1, argv, out, sizeof(out)), -EINVAL);
	CHECK(strstr(out, "capacity 'lots': expected a number of bytes") != NULL);
	CHECK_EQ_INT(atomic_load(&sfs->usage.capacity), 1048576);
	/* passthrough in effect (negotiated), whatever the options said */
	atomic_store(&sfs->passthrough, true);
	argv[0] = "5";
	CHECK_EQ_INT(sfs_capacity_verb(1, argv, out, sizeof(out)), -EINVAL);
	CHECK(strstr(out, "passthrough") != NULL);
	atomic_store(&sfs->passthrough, false);
}

int main(void)
{
	static struct sfs_fs fs;
	char tmpl[] = "/tmp/strata-unit-XXXXXX";
	int dir;

	if (!mkdtemp(tmpl))
		return 1;
	dir = open(tmpl, O_RDONLY | O_DIRECTORY);
	sfs = &fs;
	fs.upper.fd = dir;
	test_parse();
	test_claims(dir);
	test_statfs();
	test_verbs();
	unlinkat(dir, "f", 0);
	close(dir);
	rmdir(tmpl);
	return unit_done("test_usage");
}
