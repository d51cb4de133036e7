// SPDX-License-Identifier: Apache-2.0
/*
 * shm.c: the shared arena's allocator. Blocks of small sizes are
 * rounded up by less than 8 bytes (a walked tree holds one node per
 * entry), memory handed out again is zeroed, and a freed big block's
 * pages go back to the system while the block stays usable. What the
 * memfd holds is read from its st_blocks: no timing, no guessing.
 */
#include <sys/stat.h>

#include "stratafs.h"
#include "unit.h"

#define ARENA (64 << 20)
#define HEADER 8	/* struct sfs_shm_block */

/* Bytes of the arena's memfd that have pages behind them. */
static long long arena_bytes(void)
{
	struct stat st;

	if (fstat(sfs_shm->memfd, &st) < 0)
		return -1;
	return (long long)st.st_blocks * 512;
}

/*
 * Nothing has been freed in a class before it is tested, so two blocks
 * asked for in a row are carved one after the other from the unused
 * end: their distance is the block's size.
 */
static void test_small_classes(void)
{
	for (size_t size = 1; size <= 256 - HEADER; size++) {
		char *a = sfs_shm_alloc(size), *b = sfs_shm_alloc(size);
		long long block = b - a;

		CHECK(a && b);
		CHECK(block >= (long long)(size + HEADER));
		CHECK(block % 8 == 0);
		/* rounded up by less than one step, or the smallest class */
		CHECK(block < (long long)(size + HEADER + 8) || block == 24);
	}
}

static void test_reused_zeroed(void)
{
	char *p = sfs_shm_alloc(100), *q;
	bool zero = true;

	CHECK(p != NULL);
	memset(p, 0xa5, 100);
	sfs_shm_free(p);
	q = sfs_shm_alloc(100);
	CHECK(q == p);	/* from the free list */
	for (int i = 0; i < 100; i++)
		zero &= q[i] == 0;
	CHECK(zero);
	sfs_shm_free(q);
}

/*
 * 1 MiB asked for lands in the 2 MiB class (the header does not fit in
 * 1 MiB): only the MiB asked for gets pages. Freed, its pages go but
 * the first; asked for again, the same block comes back, zeroed.
 */
static void test_big_block(void)
{
	size_t size = 1 << 20, page = (size_t)sysconf(_SC_PAGESIZE);
	long long before = arena_bytes(), used, freed;
	char *p = sfs_shm_alloc(size), *q;
	bool zero = true;

	CHECK(p != NULL);
	memset(p, 0xa5, size);
	used = arena_bytes() - before;
	CHECK(used >= (long long)size);
	CHECK(used <= (long long)(size + 2 * page));
	sfs_shm_free(p);
	freed = arena_bytes() - before;
	CHECK(freed <= (long long)page);
	q = sfs_shm_alloc(size);
	CHECK(q == p);
	for (size_t i = 0; i < size; i += 512)
		zero &= q[i] == 0 && q[size - 1 - i] == 0;
	CHECK(zero);
	sfs_shm_free(q);
}

/* Blocks under 8 KiB share their pages with others: never released. */
static void test_small_block_kept(void)
{
	char *p = sfs_shm_alloc(1000);
	long long before;

	CHECK(p != NULL);
	memset(p, 0xa5, 1000);
	before = arena_bytes();
	sfs_shm_free(p);
	CHECK_EQ_INT(arena_bytes(), before);
}

int main(void)
{
	if (sfs_shm_create(ARENA) < 0) {
		perror("sfs_shm_create");
		return 1;
	}
	test_small_classes();
	test_reused_zeroed();
	test_big_block();
	test_small_block_kept();
	return unit_done("test_shm");
}
