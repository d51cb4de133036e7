// SPDX-License-Identifier: Apache-2.0
/* inode.c: the inode table, stable numbers and descriptor parking. */
#include <errno.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include "fixture.h"
#include "unit.h"

#define NFILES 200

static void test_numbers(void)
{
	struct fixture fx;
	struct sfs_node *a, *b;
	struct stat st, real;

	CHECK_EQ_INT(fixture_setup(&fx, 2, true), 0);
	fx_file(&fx, "l1/a", "a");
	fx_file(&fx, "l2/b", "b");
	CHECK_EQ_INT(fx_lookup(&fx, "a", &a), 0);
	CHECK_EQ_INT(fx_lookup(&fx, "b", &b), 0);
	if (a && b) {
		CHECK_EQ_INT(sfs_node_stat(a, &st), 0);
		fstatat(fx.fd, "l1/a", &real, 0);
		CHECK_EQ_INT(st.st_ino, sfs_ino_compose(fx.fs.lower[0].fsid,
							real.st_ino));
		/* one filesystem here: upper and lowers share an fsid */
		CHECK_EQ_INT(fx.fs.lower[0].fsid, fx.fs.upper.fsid);
		/* copy-up keeps the number */
		CHECK_EQ_INT(sfs_copy_up(a), 0);
		CHECK_EQ_INT(sfs_node_stat(a, &st), 0);
		CHECK_EQ_INT(st.st_ino, sfs_ino_compose(fx.fs.lower[0].fsid,
							real.st_ino));
		sfs_node_release(a);
		sfs_node_release(b);
	}
	/* and a fresh lookup after copy-up finds it through the xattr */
	CHECK_EQ_INT(fx_lookup(&fx, "a", &a), 0);
	if (a) {
		CHECK(a->has_origin);
		CHECK_EQ_INT(a->ino, sfs_ino_compose(fx.fs.lower[0].fsid,
						     real.st_ino));
		sfs_node_release(a);
	}
	fixture_done(&fx);
}

/*
 * Whether the entry kept its handle where its size says: in the entry
 * when it is small (fh_len), else in a block of its own. Returns 1 for
 * one kept in the entry, 0 for one out of it.
 */
static int check_handle_place(struct fixture *fx, const char *path,
			      const struct sfs_entry *e)
{
	unsigned char bytes[MAX_HANDLE_SZ];
	int type, len;

	len = sfs_fhandle_get(fx->fd, path, 0, bytes, sizeof(bytes), &type);
	CHECK(len > 0);
	if (len <= (int)sizeof(e->fh_bytes) && type >= 0 && type <= UINT8_MAX) {
		CHECK_EQ_INT(e->fh_len, len);
		CHECK_EQ_INT(e->fh_type, type);
		CHECK(memcmp(e->fh_bytes, bytes, e->fh_len) == 0);
		return 1;
	}
	CHECK_EQ_INT(e->fh_len, 0);
	CHECK(e->fh != NULL);
	if (e->fh) {
		CHECK_EQ_INT(e->fh->len, len);
		CHECK(memcmp(e->fh->bytes, bytes, len) == 0);
	}
	return 0;
}

/* BASE: where the layers are; returns how many handles the entries held */
static int test_parking_in(const char *base)
{
	struct sfs_node *nodes[NFILES];
	struct fixture fx;
	char name[32];
	struct stat st;
	int parked = 0, inline_fh = 0;

	CHECK_EQ_INT(fixture_init_in(&fx, base, 1, true), 0);
	CHECK_EQ_INT(sfs_setup(&fx.fs), 0);
	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "l1/f%03d", i);
		fx_file(&fx, name, name);
	}
	/* a tiny budget, so that most nodes must park */
	fx.fs.fd_budget = 32;
	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "f%03d", i);
		CHECK_EQ_INT(sfs_lookup_node(fx.fs.root, name, &nodes[i]), 0);
		/* the kernel's reference keeps it in the table */
		sfs_node_lookup_inc(nodes[i]);
		sfs_node_release(nodes[i]);
	}
	CHECK(atomic_load(&fx.fs.node_fds) <= 32);
	for (int i = 0; i < NFILES; i++) {
		if (!atomic_load(&nodes[i]->parked))
			continue;
		parked++;
		snprintf(name, sizeof(name), "l1/f%03d", i);
		inline_fh += check_handle_place(&fx, name,
						&sfs_node_lower(nodes[i])[0]);
	}
	CHECK(parked >= NFILES - 32);

	/* a parked node comes back on a pin, with the same file behind it */
	for (int i = 0; i < NFILES; i++) {
		char buf[32];
		int fd;

		CHECK_EQ_INT(sfs_node_pin(nodes[i]), 0);
		CHECK(!atomic_load(&nodes[i]->parked));
		CHECK_EQ_INT(sfs_node_stat(nodes[i], &st), 0);
		fd = sfs_reopen(sfs_node_datafd(nodes[i]), O_RDONLY);
		CHECK(fd >= 0);
		if (fd >= 0) {
			ssize_t n = read(fd, buf, sizeof(buf) - 1);

			buf[n < 0 ? 0 : n] = '\0';
			snprintf(name, sizeof(name), "l1/f%03d", i);
			CHECK_EQ_STR(buf, name);
			close(fd);
		}
		sfs_node_unpin(nodes[i]);
	}
	CHECK(atomic_load(&fx.fs.node_fds) <= 32);

	/* a pinned node is never parked */
	CHECK_EQ_INT(sfs_node_pin(nodes[0]), 0);
	for (int i = 1; i < NFILES; i++) {
		CHECK_EQ_INT(sfs_node_pin(nodes[i]), 0);
		sfs_node_unpin(nodes[i]);
	}
	CHECK(!atomic_load(&nodes[0]->parked));
	CHECK_EQ_INT(sfs_node_stat(nodes[0], &st), 0);
	sfs_node_unpin(nodes[0]);

	/* a file removed behind a parked node's back gives ESTALE, no crash */
	for (int i = 0; i < NFILES && !atomic_load(&nodes[5]->parked); i++) {
		CHECK_EQ_INT(sfs_node_pin(nodes[i]), 0);
		sfs_node_unpin(nodes[i]);
	}
	if (atomic_load(&nodes[5]->parked)) {
		unlinkat(fx.fd, "l1/f005", 0);
		CHECK_EQ_INT(sfs_node_pin(nodes[5]), -ESTALE);
	}
	for (int i = 0; i < NFILES; i++)
		sfs_node_lookup_dec(nodes[i]);
	CHECK_EQ_INT(fx.fs.table_count, 0);
	fixture_done(&fx);
	return inline_fh;
}

/*
 * ext4's handles (8 bytes) fit in the entry, tmpfs's (12) do not: both
 * ways of keeping one are parked and brought back (the first wherever
 * /var/tmp is ext4).
 */
static void test_parking(void)
{
	struct statfs sfs_tmp;

	CHECK_EQ_INT(statfs("/var/tmp", &sfs_tmp), 0);
	if (sfs_tmp.f_type == EXT4_SUPER_MAGIC)
		CHECK(test_parking_in("/var/tmp") > 0);
	else
		test_parking_in("/var/tmp");
	CHECK_EQ_INT(test_parking_in("/dev/shm"), 0);
}

/*
 * A node whose last name went away is never found by number again, yet
 * still freed at teardown if the kernel never forgot it (run under the
 * sanitizer build, a leak here fails the program).
 */
static void test_unhashed(void)
{
	struct fixture fx;
	struct sfs_node *n, *again;

	CHECK_EQ_INT(fixture_setup(&fx, 1, true), 0);
	fx_file(&fx, "l1/gone", "x");
	CHECK_EQ_INT(fx_lookup(&fx, "gone", &n), 0);
	if (n) {
		sfs_node_lookup_inc(n);
		again = sfs_node_find(n->ino, n->type);
		CHECK(again == n);
		if (again)
			sfs_node_release(again);
		sfs_node_unhash(n);
		CHECK(sfs_node_find(n->ino, n->type) == NULL);
		sfs_node_release(n);
	}
	fixture_done(&fx);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	test_numbers();
	test_parking();
	test_unhashed();
	return unit_done("test_inode");
}
