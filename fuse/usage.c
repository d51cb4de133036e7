// SPDX-License-Identifier: Apache-2.0
/*
 * usage.c: what the upper layer spends, kept as it changes, and the
 * capacity (-o capacity=BYTES) it may not go past.
 *
 * What is counted: the blocks the upper filesystem allocates for the
 * upper layer and the workdir (st_blocks * 512, so sparse files cost
 * what they really take and a volume full by our count is full on the
 * disk too), and their inodes (whiteouts included). Each change is
 * counted where it is made, never by a walk:
 *  - data (write, copy_file_range, truncate, fallocate): the file's
 *    st_blocks after the change, less what the node last saw
 *    (sfs_node.ublocks, seeded before its first change);
 *  - copy-up: the copy's blocks and one inode;
 *  - create, mkdir, mknod, symlink, O_TMPFILE, whiteouts: the entry's
 *    blocks and one inode, and the blocks the directory grew by;
 *  - unlink, rmdir, a rename over a name: the inode's blocks and the
 *    inode once the last name went, and for an open file at its last
 *    close (until then the blocks stay taken on the disk too).
 * Approximations, all small and none a walk: a directory's growth by
 * copy-ups, renames and links into it is not counted; whiteouts inside a removed
 * directory are not given back; files in the hardlink index are
 * counted at copy-up and not given back. A walk at the next start
 * without a clean usage file puts all of it right.
 *
 * The limit: a write reserves the blocks it may allocate before it is
 * made (all of it for a hole, only what goes past the end of a dense
 * file), and is cut short at the room left, or refused with ENOSPC when
 * there is none; the reservation goes when the write is settled. So
 * concurrent writers never go past the limit together, and data already
 * written is never touched. Copy-up reserves the lower file's blocks;
 * a new entry needs one block of room.
 *
 * The counters live in the shared state (struct sfs_fs), so a worker
 * that replaces a dead one, or an upgraded binary, goes on from them.
 * -o usagefile=PATH keeps them across mounts: read at start, written
 * (temp file and rename) every few seconds by the serving process, and
 * marked clean at the daemon's orderly end. A start that finds no file,
 * a damaged one, or one not marked clean (the daemon before was killed,
 * and the last seconds may be missing) walks the upper layer once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_USAGE_BLOCK 4096
#define SFS_USAGE_SAVE_S 5
#define SFS_USAGE_MAGIC "strata-usage 1"

static struct {
	pthread_t thread;
	int stopfd;		/* eventfd: the saver ends when it is written */
	bool running;
	uint64_t saved;		/* the change count last written */
} sfs_saver = { .stopfd = -1 };

static int64_t sfs_round_up(int64_t v)
{
	return (v + SFS_USAGE_BLOCK - 1) & ~(int64_t)(SFS_USAGE_BLOCK - 1);
}

static int64_t sfs_round_down(int64_t v)
{
	return v & ~(int64_t)(SFS_USAGE_BLOCK - 1);
}

/* A byte count: decimal digits only, as the options and the verb take. */
int sfs_usage_parse(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end)
		return -EINVAL;
	if (errno == ERANGE || v > INT64_MAX)
		return -ERANGE;
	*out = v;
	return 0;
}

void sfs_usage_charge(int64_t bytes, int64_t inodes)
{
	struct sfs_usage *u = &sfs->usage;

	if (bytes)
		atomic_fetch_add(&u->bytes, bytes);
	if (inodes)
		atomic_fetch_add(&u->inodes, inodes);
	atomic_fetch_add(&u->changes, 1);
}

/* Whether NEED more bytes fit, counting what writes in flight reserved. */
int sfs_usage_room(int64_t need)
{
	struct sfs_usage *u = &sfs->usage;
	uint64_t cap = atomic_load(&u->capacity);

	if (!cap || need <= 0)
		return 0;
	return atomic_load(&u->bytes) + atomic_load(&u->claimed) + need >
			       (int64_t)cap ? -ENOSPC : 0;
}

/* The room left under the capacity, reservations counted. */
static int64_t sfs_usage_left(void)
{
	struct sfs_usage *u = &sfs->usage;
	int64_t left = (int64_t)atomic_load(&u->capacity) -
		       atomic_load(&u->bytes) - atomic_load(&u->claimed);

	return left > 0 ? left : 0;
}

/* Reserves NEED bytes (0 without a capacity); -ENOSPC when they do not fit. */
int sfs_usage_reserve(int64_t need, int64_t *claimed)
{
	struct sfs_usage *u = &sfs->usage;
	uint64_t cap = atomic_load(&u->capacity);
	int64_t c = atomic_load(&u->claimed);

	*claimed = 0;
	if (!cap || need <= 0)
		return 0;
	do {
		if (atomic_load(&u->bytes) + c + need > (int64_t)cap)
			return -ENOSPC;
	} while (!atomic_compare_exchange_weak(&u->claimed, &c, c + need));
	*claimed = need;
	return 0;
}

void sfs_usage_unreserve(int64_t claimed)
{
	if (claimed)
		atomic_fetch_sub(&sfs->usage.claimed, claimed);
}

/* Before the node's first change: what its upper file holds now. */
void sfs_usage_seed(struct sfs_node *n, int fd)
{
	int64_t unknown = -1;
	struct stat st;

	if (atomic_load(&n->ublocks) >= 0 || fstat(fd, &st) < 0)
		return;
	atomic_compare_exchange_strong(&n->ublocks, &unknown,
				       (int64_t)st.st_blocks);
}

/*
 * After a change through FD: the difference since the node last looked.
 * Two changes settling at once may see their fstat in either order; the
 * exchange keeps the sum right, and the next settle the last value.
 */
void sfs_usage_track(struct sfs_node *n, int fd)
{
	struct stat st;
	int64_t old;

	if (fstat(fd, &st) < 0)
		return;
	old = atomic_exchange(&n->ublocks, (int64_t)st.st_blocks);
	if (old >= 0 && old != (int64_t)st.st_blocks)
		sfs_usage_charge(((int64_t)st.st_blocks - old) * 512, 0);
}

/*
 * Before a write of LEN bytes at OFF through FD: how many of them may be
 * written (LEN, fewer at the capacity, or -ENOSPC when none fit), also
 * left in C->len. The
 * blocks it may allocate are reserved in C until sfs_usage_settle. A
 * dense file allocates only past its end; a file with holes may
 * allocate anywhere, so all of it is reserved.
 */
ssize_t sfs_usage_claim(struct sfs_node *n, int fd, off_t off, size_t len,
			struct sfs_claim *c)
{
	uint64_t cap = atomic_load(&sfs->usage.capacity);
	int64_t base, end, allowed, need;
	struct stat st;
	bool dense;

	c->node = n;
	c->bytes = 0;
	c->len = len;
	if (!cap && atomic_load(&n->ublocks) >= 0)
		return len;
	if (fstat(fd, &st) < 0)
		return -errno;
	sfs_usage_seed(n, fd);
	if (!cap || len == 0)
		return len;
	dense = (int64_t)st.st_blocks * 512 >= sfs_round_up(st.st_size);
	base = sfs_round_down(off);
	if (dense && base < sfs_round_up(st.st_size))
		base = sfs_round_up(st.st_size);
	end = sfs_round_up((int64_t)off + (int64_t)len);
	need = end - base;
	if (need <= 0 || sfs_usage_reserve(need, &c->bytes) == 0)
		return len;
	/* what fits: whole blocks of the room left, from the first new one */
	allowed = base + sfs_round_down(sfs_usage_left());
	if (allowed <= off || sfs_usage_reserve(allowed - base, &c->bytes) < 0)
		return -ENOSPC;
	c->len = allowed - off;
	return c->len;
}

/* After the claimed write (done or failed): its blocks, and the claim goes. */
void sfs_usage_settle(struct sfs_claim *c, int fd)
{
	if (c->node)
		sfs_usage_track(c->node, fd);
	sfs_usage_unreserve(c->bytes);
	c->bytes = 0;
}

/* A new entry at DIRFD/NAME: its blocks and its inode. */
void sfs_usage_entry(int dirfd, const char *name)
{
	struct stat st;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		sfs_usage_charge((int64_t)st.st_blocks * 512, 1);
	else
		sfs_usage_charge(0, 1);
}

/* An upper inode freed: what it took is given back. */
void sfs_usage_gone(const struct stat *st)
{
	sfs_usage_charge(-(int64_t)st->st_blocks * 512, -1);
}

/*
 * With a capacity the mount looks like a volume of that size: total
 * blocks from it, free from what is left (never more than the disk
 * has). Without one, the upper filesystem's numbers as they are.
 */
void sfs_usage_statfs(struct statvfs *sv)
{
	struct sfs_usage *u = &sfs->usage;
	uint64_t cap = atomic_load(&u->capacity);
	int64_t used = atomic_load(&u->bytes);
	uint64_t bs = sv->f_frsize ? sv->f_frsize : sv->f_bsize;
	uint64_t total, inuse, free;

	if (!cap || !bs)
		return;
	total = cap / bs;
	inuse = used > 0 ? ((uint64_t)used + bs - 1) / bs : 0;
	free = total > inuse ? total - inuse : 0;
	sv->f_blocks = total;
	if (sv->f_bfree > free)
		sv->f_bfree = free;
	if (sv->f_bavail > free)
		sv->f_bavail = free;
}

/* ---- the walk at start ---- */

/*
 * nftw has no argument for its callback; the walk runs once, at setup,
 * before any other thread exists.
 */
static struct {
	int64_t bytes, inodes;
	void *seen;		/* (dev, ino) of files with several names */
} sfs_walk;

struct sfs_walk_id {
	dev_t dev;
	ino_t ino;
};

static int sfs_walk_cmp(const void *a, const void *b)
{
	const struct sfs_walk_id *x = a, *y = b;

	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return 0;
}

static int sfs_walk_one(const char *path, const struct stat *st, int flag,
			struct FTW *ftw)
{
	struct sfs_walk_id *id, **found;

	if (flag == FTW_NS || flag == FTW_DNR)
		return 0;	/* what cannot be read is not counted */
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1) {
		id = malloc(sizeof(*id));
		if (!id)
			return -1;
		id->dev = st->st_dev;
		id->ino = st->st_ino;
		found = tsearch(id, &sfs_walk.seen, sfs_walk_cmp);
		if (!found) {
			free(id);
			return -1;
		}
		if (*found != id) {
			free(id);
			return 0;	/* another name of one counted */
		}
	}
	sfs_walk.bytes += (int64_t)st->st_blocks * 512;
	sfs_walk.inodes++;
	return 0;
}

static int sfs_usage_walk(struct sfs_fs *fs)
{
	const char *dirs[] = { fs->params.upperdir, fs->params.workdir };
	int ret = 0;

	sfs_walk.bytes = sfs_walk.inodes = 0;
	sfs_walk.seen = NULL;
	for (size_t i = 0; i < 2 && ret == 0; i++)
		if (nftw(dirs[i], sfs_walk_one, 32, FTW_PHYS | FTW_MOUNT) != 0)
			ret = errno ? -errno : -ENOMEM;
	tdestroy(sfs_walk.seen, free);
	sfs_walk.seen = NULL;
	if (ret < 0)
		return ret;
	atomic_store(&fs->usage.bytes, sfs_walk.bytes);
	atomic_store(&fs->usage.inodes, sfs_walk.inodes);
	return 0;
}

/*
 * After a freeze (freeze.c), in its window: the upper is a new, empty
 * directory and the workdir is cleared, so what was counted belongs to
 * the frozen layer now. Counting both again is a walk of a few entries.
 * *FROZEN is what the count held beyond the new one: the frozen layer's
 * blocks (the workdir is in both counts), 0 when unknown. The saver is
 * told, so that the usage file stops holding the old count.
 */
int sfs_usage_recount(int64_t *frozen)
{
	int64_t before = atomic_load(&sfs->usage.bytes), after;
	int ret;

	*frozen = 0;
	ret = sfs_usage_walk(sfs);
	if (ret < 0)
		return ret;
	atomic_fetch_add(&sfs->usage.changes, 1);
	after = atomic_load(&sfs->usage.bytes);
	if (before > after)
		*frozen = before - after;
	return 0;
}

/* ---- the usage file ---- */

/* 0 with the counters from a clean file; -ENOENT, -EBADMSG or -EAGAIN (not clean). */
static int sfs_usage_load(struct sfs_fs *fs, const char *path)
{
	char buf[256], magic[32];
	long long bytes, inodes;
	int clean, fd, end = 0;
	ssize_t len;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	len = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (len < 0)
		return -errno;
	buf[len] = '\0';
	if (sscanf(buf, "%31[^\n]\nbytes=%lld\ninodes=%lld\nclean=%d\n%n",
		   magic, &bytes, &inodes, &clean, &end) != 4 ||
	    end != len || strcmp(magic, SFS_USAGE_MAGIC) || bytes < 0 ||
	    inodes < 0 || (clean != 0 && clean != 1))
		return -EBADMSG;
	if (!clean)
		return -EAGAIN;
	atomic_store(&fs->usage.bytes, bytes);
	atomic_store(&fs->usage.inodes, inodes);
	return 0;
}

/* Writes the counters to the usage file: temp file, fsync, rename. */
int sfs_usage_save(bool clean)
{
	const char *path = sfs->params.usagefile;
	struct sfs_usage *u = &sfs->usage;
	char tmp[PATH_MAX], buf[256];
	uint64_t changes = atomic_load(&u->changes);
	int fd, len, ret = 0;

	if (!path)
		return 0;
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid()) >=
	    sizeof(tmp))
		return -ENAMETOOLONG;
	len = snprintf(buf, sizeof(buf), SFS_USAGE_MAGIC "\nbytes=%" PRId64
		       "\ninodes=%" PRId64 "\nclean=%d\n",
		       atomic_load(&u->bytes), atomic_load(&u->inodes),
		       clean ? 1 : 0);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (write(fd, buf, len) != len || fsync(fd) < 0)
		ret = errno ? -errno : -EIO;
	close(fd);
	if (ret == 0 && rename(tmp, path) < 0)
		ret = -errno;
	if (ret < 0) {
		unlink(tmp);
		return ret;
	}
	sfs_saver.saved = changes;
	return 0;
}

/*
 * At setup, in the process that mounts: the capacity, and the counters
 * from the usage file or a walk. The file is marked not clean at once:
 * from now on only an orderly end may vouch for it.
 */
int sfs_usage_setup(struct sfs_fs *fs)
{
	const char *path = fs->params.usagefile;
	uint64_t cap = 0;
	int ret = -ENOENT;

	if (fs->params.capacity)
		sfs_usage_parse(fs->params.capacity, &cap);	/* checked */
	atomic_store(&fs->usage.capacity, cap);
	atomic_store(&fs->usage.claimed, 0);
	if (!sfs_has_upper())
		return 0;
	if (path)
		ret = sfs_usage_load(fs, path);
	if (ret < 0) {
		if (path && ret != -ENOENT)
			strata_warn("usagefile %s: %s: counting the upper layer anew",
				    path, ret == -EAGAIN ? "the daemon before did not stop cleanly" :
				    ret == -EBADMSG ? "damaged" : strerror(-ret));
		ret = sfs_usage_walk(fs);
		if (ret < 0) {
			fprintf(stderr, "stratafs: upperdir '%s': counting its usage: %s\n",
				fs->params.upperdir, strerror(-ret));
			return ret;
		}
	}
	ret = sfs_usage_save(false);
	if (ret < 0)
		fprintf(stderr, "stratafs: usagefile=%s: %s\n", path,
			strerror(-ret));
	return ret;
}

static void *sfs_usage_loop(void *arg)
{
	struct pollfd pfd = { .fd = sfs_saver.stopfd, .events = POLLIN };
	int ret;

	for (;;) {
		ret = poll(&pfd, 1, SFS_USAGE_SAVE_S * 1000);
		if (ret < 0 && errno == EINTR)
			continue;
		if (ret != 0)
			break;
		if (atomic_load(&sfs->usage.changes) != sfs_saver.saved &&
		    (ret = sfs_usage_save(false)) < 0)
			strata_warn("usagefile %s: %s", sfs->params.usagefile,
				    strerror(-ret));
	}
	return NULL;
}

/* In the serving process: the saver thread, with -o usagefile. */
int sfs_usage_start(void)
{
	int ret;

	if (!sfs->params.usagefile || !sfs_has_upper())
		return 0;
	sfs_saver.saved = 0;
	sfs_saver.stopfd = eventfd(0, EFD_CLOEXEC);
	if (sfs_saver.stopfd < 0)
		return -errno;
	ret = -pthread_create(&sfs_saver.thread, NULL, sfs_usage_loop, NULL);
	if (ret < 0) {
		close(sfs_saver.stopfd);
		sfs_saver.stopfd = -1;
		return ret;
	}
	sfs_saver.running = true;
	return 0;
}

/* The serving process's last save; the orderly end marks it clean after. */
void sfs_usage_stop(void)
{
	uint64_t one = 1;
	int ret;

	if (!sfs_saver.running)
		return;
	if (write(sfs_saver.stopfd, &one, sizeof(one)) < 0)
		strata_err("usage: stopping the saver: %s", strerror(errno));
	pthread_join(sfs_saver.thread, NULL);
	close(sfs_saver.stopfd);
	sfs_saver.stopfd = -1;
	sfs_saver.running = false;
	ret = sfs_usage_save(false);
	if (ret < 0)
		strata_warn("usagefile %s: %s", sfs->params.usagefile,
			    strerror(-ret));
}

/* ---- control verbs ---- */

int sfs_usage_verb(int argc, char **argv, char *out, size_t size)
{
	struct sfs_usage *u = &sfs->usage;

	snprintf(out, size, "used=%" PRId64 " inodes=%" PRId64
		 " capacity=%" PRIu64,
		 atomic_load(&u->bytes), atomic_load(&u->inodes),
		 (uint64_t)atomic_load(&u->capacity));
	return 0;
}

int sfs_capacity_verb(int argc, char **argv, char *out, size_t size)
{
	uint64_t cap;
	int ret = sfs_usage_parse(argv[0], &cap);

	if (ret < 0) {
		snprintf(out, size, "capacity '%.64s': expected a number of "
			 "bytes (digits only, 0 for no limit)", argv[0]);
		return -EINVAL;
	}
	if (!sfs_has_upper()) {
		snprintf(out, size, "capacity: the mount has no upper layer");
		return -EROFS;
	}
	if (cap && atomic_load(&sfs->passthrough)) {
		snprintf(out, size, "capacity: the mount runs with passthrough, "
			 "where the kernel writes without the daemon: no limit "
			 "could be kept");
		return -EINVAL;
	}
	atomic_store(&sfs->usage.capacity, cap);
	atomic_fetch_add(&sfs->usage.changes, 1);
	snprintf(out, size, "capacity=%" PRIu64, cap);
	return 0;
}
