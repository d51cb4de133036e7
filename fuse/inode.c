// SPDX-License-Identifier: Apache-2.0
/*
 * Inodes of the merged view: the table that maps our stable inode
 * numbers to nodes, the two reference counts (the kernel's lookups and
 * our own holds), attributes and their changes.
 *
 * st_ino is the real inode number with the layer filesystem's index in
 * the top bits, so it is unique across layers on different filesystems;
 * a copied-up file keeps its lower number through an xattr, so copy-up
 * and remount never change it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_TABLE_MIN 1024
/* freed nodes between two trims of the heap */
#define SFS_TRIM_NODES 8192

static size_t sfs_hash(uint64_t ino, size_t size)
{
	ino ^= ino >> 33;
	ino *= 0xff51afd7ed558ccdULL;
	ino ^= ino >> 33;
	return ino & (size - 1);
}

uint64_t sfs_ino_compose(unsigned fsid, ino_t ino)
{
	uint64_t hi = (uint64_t)fsid << SFS_INO_FSID_SHIFT;

	if ((uint64_t)ino >> SFS_INO_FSID_SHIFT) {
		/*
		 * A filesystem with huge inode numbers: fold the high bits
		 * in. Collisions become possible, so say it once.
		 */
		static atomic_bool warned;

		if (!atomic_exchange(&warned, true))
			strata_warn("inode numbers above 2^56: st_ino may collide across layers");
		ino ^= ino >> SFS_INO_FSID_SHIFT;
		ino &= (1ULL << SFS_INO_FSID_SHIFT) - 1;
	}
	return hi | (uint64_t)ino;
}

int sfs_table_init(struct sfs_fs *fs)
{
	fs->table_size = SFS_TABLE_MIN;
	fs->table = sfs_shm_alloc(fs->table_size * sizeof(*fs->table));
	if (!fs->table)
		return -ENOMEM;
	pthread_mutex_init(&fs->table_lock, NULL);
	return 0;
}

static int sfs_node_nfds(struct sfs_node *n)
{
	return atomic_load(&n->has_upper) + n->nlower;
}

static char *sfs_node_inline_name(struct sfs_node *n)
{
	char *end = (char *)(sfs_node_inline_lower(n) + n->lower_room);

	return S_ISDIR(n->type) ? end + sizeof(struct sfs_dirinfo) : end;
}

/*
 * A node with room for NLOWER entries and its name, zeroed but for
 * them: the caller fills in the rest. There is room for one entry more
 * than a directory needs, and for one in any other node: what a freeze
 * (freeze.c) turns its upper entry into, so that a freeze allocates
 * nothing for the nodes made since the last one.
 */
struct sfs_node *sfs_node_alloc(mode_t type, int nlower, const char *name)
{
	int room = S_ISDIR(type) ? nlower + 1 : (nlower ? nlower : 1);
	size_t len = strlen(name) + 1;
	size_t size = sizeof(struct sfs_node) + room * sizeof(struct sfs_entry) +
		      (S_ISDIR(type) ? sizeof(struct sfs_dirinfo) : 0) + len;
	struct sfs_node *n = sfs_shm_alloc(size);

	if (!n)
		return NULL;
	n->type = type & S_IFMT;
	n->nlower = nlower;
	n->lower_room = room;
	n->index_nlink = -1;
	n->up.fd = -1;
	n->ublocks = -1;
	/* no switch runs while nodes are made: it is through for this one */
	n->fgen = sfs->fgen;
	if (S_ISDIR(type))
		sfs_node_di(n)->subdirs = -1;
	n->name = sfs_node_inline_name(n);
	memcpy(n->name, name, len);
	return n;
}

/* The kernel's name for a node: its address, 1 for the root. */
fuse_ino_t sfs_node_id(struct sfs_node *n)
{
	return n == sfs->root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static void sfs_node_free(struct sfs_node *n)
{
	bool parked = atomic_load(&n->parked);

	/* a worker's successor must not take over a node half freed */
	sfs_shm_tag(n, SFS_SHM_OTHER);
	atomic_fetch_sub(&sfs->nodes, 1);
	if (!parked)
		atomic_fetch_sub(&sfs->node_fds, sfs_node_nfds(n));
	if (atomic_load(&n->has_upper)) {
		if (!parked)
			close(n->up.fd);
		sfs_entry_drop_handle(&n->up);
	}
	for (int i = 0; i < n->nlower; i++) {
		if (!parked)
			close(sfs_node_lower(n)[i].fd);
		sfs_entry_drop_handle(&sfs_node_lower(n)[i]);
	}
	if (n->lower_out)
		sfs_shm_free(sfs_node_lower(n));
	if (n->name != sfs_node_inline_name(n))
		sfs_shm_free(n->name);
	if (sfs_node_di(n)) {
		sfs_shm_free(sfs_node_di(n)->redirect);
		sfs_dir_drop_listing(n);
	}
	sfs_shm_free(n);
}

void sfs_table_destroy(struct sfs_fs *fs)
{
	for (size_t i = 0; i < fs->table_size; i++) {
		struct sfs_node *n = fs->table[i], *next;

		for (; n; n = next) {
			next = n->hnext;
			sfs_node_free(n);
		}
	}
	sfs_shm_free(fs->table);
	fs->table = NULL;
	if (fs->root)
		sfs_node_free(fs->root);
	fs->root = NULL;
	pthread_mutex_destroy(&fs->table_lock);
}

static void sfs_table_grow(void)
{
	size_t size = sfs->table_size * 2;
	struct sfs_node **t = sfs_shm_alloc(size * sizeof(*t)), **old;

	if (!t)
		return;	/* longer chains, still correct */
	for (size_t i = 0; i < sfs->table_size; i++) {
		struct sfs_node *n = sfs->table[i], *next;

		for (; n; n = next) {
			size_t h = sfs_hash(n->ino, size);

			next = n->hnext;
			n->hnext = t[h];
			t[h] = n;
		}
	}
	/* the old array goes last: a successor never finds a freed one */
	old = sfs->table;
	sfs->table = t;
	sfs->table_size = size;
	sfs_shm_free(old);
}

static void sfs_table_remove(struct sfs_node *n)
{
	struct sfs_node **p = &sfs->table[sfs_hash(n->ino, sfs->table_size)];

	for (; *p; p = &(*p)->hnext) {
		if (*p == n) {
			*p = n->hnext;
			sfs->table_count--;
			return;
		}
	}
}

/*
 * A reference on a node that may be dying: its count reached zero and
 * the thread that dropped it is waiting for the table lock to unhash and
 * free it. Such a node is not revived; the caller treats it as absent.
 */
static bool sfs_node_tryget(struct sfs_node *n)
{
	uint64_t r = atomic_load(&n->refs);

	do {
		if (r == 0)
			return false;
	} while (!atomic_compare_exchange_weak(&n->refs, &r, r + 1));
	return true;
}

/* The live node for an inode number, referenced; caller holds the table lock. */
static struct sfs_node *sfs_table_find(uint64_t ino, mode_t type)
{
	struct sfs_node *n = sfs->table[sfs_hash(ino, sfs->table_size)];

	for (; n; n = n->hnext)
		if (n->ino == ino && (n->type & S_IFMT) == (type & S_IFMT) &&
		    !n->unhashed && sfs_node_tryget(n))
			return n;
	return NULL;
}

/* The node in the table for an inode number, referenced and pinned, or NULL. */
struct sfs_node *sfs_node_find(uint64_t ino, mode_t type)
{
	struct sfs_node *n;

	pthread_mutex_lock(&sfs->table_lock);
	n = sfs_table_find(ino, type);
	pthread_mutex_unlock(&sfs->table_lock);
	if (n && sfs_node_pin(n) < 0) {
		sfs_node_unref(n);
		n = NULL;
	}
	return n;
}

struct sfs_node *sfs_node_get(fuse_ino_t nodeid)
{
	if (nodeid == FUSE_ROOT_ID)
		return sfs->root;
	return (struct sfs_node *)(uintptr_t)nodeid;
}

/* Another reference; the caller already holds one (or the kernel does). */
void sfs_node_ref(struct sfs_node *n)
{
	atomic_fetch_add(&n->refs, 1);
}

/*
 * The kernel's lookup count is part of the node's references, and kept
 * on its own too: a new worker counts the references again from what
 * outlives a worker (supervisor.c), without those its threads held.
 */
void sfs_node_lookup_inc(struct sfs_node *n)
{
	atomic_fetch_add(&n->nlookup, 1);
	atomic_fetch_add(&n->refs, 1);
	sfs_resend_counted(n);
}


/* Nodes freed since the heap was last trimmed. */
static atomic_long sfs_freed;

/*
 * Drops COUNT references and frees the node once none is left. The
 * reference on the parent goes last, walking up iteratively so that a
 * deep tree being forgotten cannot overflow the stack. A node whose
 * count reached zero is found by nobody (sfs_node_tryget), so its
 * fields, parent included, are this thread's alone.
 */
static void sfs_node_put(struct sfs_node *n, uint64_t count)
{
	while (n) {
		struct sfs_node *parent;

		if (atomic_fetch_sub(&n->refs, count) != count ||
		    n == sfs->root)
			return;
		pthread_mutex_lock(&sfs->table_lock);
		sfs_table_remove(n);
		pthread_mutex_unlock(&sfs->table_lock);

		parent = n->parent;
		sfs_node_free(n);
		atomic_fetch_add(&sfs_freed, 1);
		n = parent;
		count = 1;
	}
}

/*
 * A node whose last name is gone is never found by number again: the
 * filesystem may reuse its inode number for a new file, which must get
 * a node of its own. It stays on its chain until the kernel forgets it,
 * so that an unmount without FORGETs still frees it at teardown.
 */
void sfs_node_unhash(struct sfs_node *n)
{
	pthread_mutex_lock(&sfs->table_lock);
	n->unhashed = true;
	pthread_mutex_unlock(&sfs->table_lock);
}

void sfs_node_forget(struct sfs_node *n, uint64_t count)
{
	atomic_fetch_sub(&n->nlookup, count);
	sfs_node_put(n, count);
}

void sfs_node_lookup_dec(struct sfs_node *n)
{
	sfs_node_forget(n, 1);
}

void sfs_node_unref(struct sfs_node *n)
{
	sfs_node_put(n, 1);
}

/*
 * The node's parent, referenced and pinned, or NULL for the root (or a
 * pin that failed: *err says). The parent pointer changes under n->lock
 * (a rename), and the old parent may go with the reference n held on it,
 * so the reference is taken before the lock is dropped.
 */
struct sfs_node *sfs_node_get_parent(struct sfs_node *n, int *err)
{
	struct sfs_node *parent;

	*err = 0;
	sfs_lock(&n->lock);
	parent = n->parent;
	if (parent)
		sfs_node_ref(parent);
	sfs_unlock(&n->lock);
	if (parent) {
		*err = sfs_node_pin(parent);
		if (*err < 0) {
			sfs_node_unref(parent);
			parent = NULL;
		}
	}
	return parent;
}

/*
 * Turns a lookup result into a node, taking over its descriptors. An
 * existing node with the same inode number is the same file (a hard
 * link, or a name looked up again) and is returned instead. The caller
 * gets one reference and one pin (sfs_node_release drops both).
 */
struct sfs_node *sfs_node_from_found(struct sfs_node *parent,
				     const char *name, struct sfs_found *f,
				     uint64_t ino, int *err)
{
	struct sfs_node *n, *fresh = NULL;
	size_t h;

	*err = 0;
	fresh = sfs_node_alloc(f->type, f->nlower, name);
	if (!fresh) {
		sfs_found_release(f);
		*err = -ENOMEM;
		return NULL;
	}

	pthread_mutex_lock(&sfs->table_lock);
	h = sfs_hash(ino, sfs->table_size);
	n = sfs_table_find(ino, f->type);
	if (n) {
		pthread_mutex_unlock(&sfs->table_lock);
		sfs_shm_free(fresh);
		sfs_found_release(f);
		*err = sfs_node_pin(n);
		if (*err < 0) {
			sfs_node_unref(n);
			return NULL;
		}
		return n;
	}

	n = fresh;
	n->ino = ino;
	atomic_init(&n->refs, 1);
	n->up = (struct sfs_entry){ .fd = f->upper };
	atomic_init(&n->has_upper, f->upper >= 0);
	atomic_init(&n->busy, 1);	/* pinned for the caller */
	if (f->nlower)
		memcpy(sfs_node_lower(n), f->lower,
		       f->nlower * sizeof(struct sfs_entry));
	atomic_fetch_add(&sfs->node_fds, sfs_node_nfds(n));
	if (sfs_node_di(n)) {
		sfs_node_di(n)->redirect = f->redirect;
		sfs_node_di(n)->opaque = f->opaque;
		sfs_node_di(n)->impure = f->impure;
	} else {
		sfs_shm_free(f->redirect);
	}
	n->indexed = f->indexed;
	n->has_origin = f->has_origin;
	n->parent = parent;
	if (parent)
		sfs_node_ref(parent);
	n->hnext = sfs->table[h];
	sfs->table[h] = n;
	/* whole and findable: a successor takes it over (sfs_table_takeover) */
	sfs_shm_tag(n, SFS_SHM_NODE);
	atomic_fetch_add(&sfs->nodes, 1);
	/*
	 * Two nodes a bucket on average: a chain step is one node read,
	 * little beside a request, and the table is half the memory (1 MiB
	 * over a 130,000-entry tree instead of 2).
	 */
	if (++sfs->table_count > 2 * sfs->table_size)
		sfs_table_grow();
	pthread_mutex_unlock(&sfs->table_lock);
	f->upper = -1;
	f->nlower = 0;
	f->redirect = NULL;
	return n;
}

/*
 * Parking. Each node's descriptors count against a budget below the
 * open-file limit; past it, idle nodes (no pin, no open handle) trade
 * their descriptors for file handles, round the table like a clock so
 * that recently used ones stay. A pin reopens a parked node. The busy
 * count and the parked flag are each written before the other is read
 * (sequentially consistent atomics), so a pin and a park never both
 * proceed: either the parker sees the pin and backs off, or the pin
 * sees the park and waits for it on the node lock.
 */
void sfs_fd_budget_init(void)
{
	struct rlimit rl = { 1024, 1024 };

	getrlimit(RLIMIT_NOFILE, &rl);
	/* a quarter stays for open files, listings and copy-up */
	sfs->fd_budget = rl.rlim_cur == RLIM_INFINITY ? 1L << 30 :
							 (long)rl.rlim_cur * 3 / 4;
	if (sfs->fd_budget < 64)
		sfs->fd_budget = 64;
	pthread_mutex_init(&sfs->evict_lock, NULL);
}

static int sfs_entry_mountfd(const struct sfs_entry *e)
{
	return e->layer == 0 ? sfs->upper.fd : sfs->lower[e->layer - 1].fd;
}

static int sfs_entry_handle(struct sfs_entry *e)
{
	unsigned char bytes[MAX_HANDLE_SZ];
	struct sfs_fhblock *fh;
	int len, type;

	if (e->fh_len || e->fh)
		return 0;
	len = sfs_fhandle_get(e->fd, "", AT_EMPTY_PATH, bytes, sizeof(bytes),
			      &type);
	if (len < 0)
		return len;
	if (len > 0 && (size_t)len <= sizeof(e->fh_bytes) &&
	    type >= 0 && type <= UINT8_MAX) {
		memcpy(e->fh_bytes, bytes, len);
		e->fh_type = (uint8_t)type;
		/* last: a successor finds the bytes whole, or no handle */
		atomic_thread_fence(memory_order_release);
		e->fh_len = (uint8_t)len;
		return 0;
	}
	/*
	 * An exact allocation, not a MAX_HANDLE_SZ one, whose unused tails
	 * would riddle the arena with holes too small for a node.
	 */
	fh = sfs_shm_alloc(sizeof(*fh) + len);
	if (!fh)
		return -ENOMEM;
	fh->len = (uint32_t)len;
	fh->type = type;
	memcpy(fh->bytes, bytes, len);
	atomic_thread_fence(memory_order_release);
	e->fh = fh;
	return 0;
}

void sfs_entry_drop_handle(struct sfs_entry *e)
{
	if (!e->fh_len)
		sfs_shm_free(e->fh);
	e->fh_len = 0;
	e->fh = NULL;
}

static int sfs_entry_reopen(struct sfs_entry *e, mode_t type)
{
	int flags = (S_ISDIR(type) ? O_RDONLY | O_DIRECTORY : O_PATH) |
		    O_CLOEXEC;
	int fd;

	if (e->fh_len)
		fd = sfs_fhandle_open(sfs_entry_mountfd(e), e->fh_bytes,
				      e->fh_len, e->fh_type, flags);
	else
		fd = sfs_fhandle_open(sfs_entry_mountfd(e), e->fh->bytes,
				      e->fh->len, e->fh->type, flags);
	if (fd < 0)
		return fd;
	e->fd = fd;
	return 0;
}

/* Caller holds n->lock; the node is idle. */
static void sfs_node_park(struct sfs_node *n)
{
	bool upper = atomic_load(&n->has_upper);
	int ret = 0;

	atomic_store(&n->parked, true);
	if (atomic_load(&n->busy)) {
		atomic_store(&n->parked, false);
		return;
	}
	if (upper)
		ret = sfs_entry_handle(&n->up);
	for (int i = 0; ret == 0 && i < n->nlower; i++)
		ret = sfs_entry_handle(&sfs_node_lower(n)[i]);
	if (ret < 0) {
		/* this layer's filesystem has no file handles: keep it open */
		n->no_park = true;
		atomic_store(&n->parked, false);
		return;
	}
	if (upper)
		close(n->up.fd);
	for (int i = 0; i < n->nlower; i++)
		close(sfs_node_lower(n)[i].fd);
	atomic_fetch_sub(&sfs->node_fds, sfs_node_nfds(n));
}

/* Caller holds n->lock. */
static int sfs_node_unpark(struct sfs_node *n)
{
	bool upper = atomic_load(&n->has_upper);
	int i = 0, ret = 0;

	if (upper)
		ret = sfs_entry_reopen(&n->up, n->type);
	if (ret < 0)
		goto out_err;
	for (i = 0; i < n->nlower; i++) {
		ret = sfs_entry_reopen(&sfs_node_lower(n)[i], n->type);
		if (ret < 0)
			goto out_close;
	}
	atomic_fetch_add(&sfs->node_fds, sfs_node_nfds(n));
	atomic_store(&n->parked, false);
	return 0;

out_close:
	while (i-- > 0)
		close(sfs_node_lower(n)[i].fd);
	if (upper)
		close(n->up.fd);
out_err:
	/* gone behind our back: the kernel gets ESTALE */
	return ret == -ENOENT ? -ESTALE : ret;
}

static bool sfs_node_parkable(struct sfs_node *n)
{
	return n != sfs->root && !n->no_park && !n->unlinked &&
	       !atomic_load(&n->busy) && !atomic_load(&n->parked) &&
	       !atomic_load(&n->nopen);
}

/* Parks what it can in the hand's next bucket; caller holds table_lock. */
static void sfs_evict_bucket(void)
{
	struct sfs_node *n;

	sfs->evict_hand = (sfs->evict_hand + 1) & (sfs->table_size - 1);
	for (n = sfs->table[sfs->evict_hand]; n; n = n->hnext) {
		if (!sfs_node_parkable(n))
			continue;
		if (atomic_exchange(&n->used, false))
			continue;
		if (!sfs_trylock(&n->lock))
			continue;
		if (sfs_node_parkable(n))
			sfs_node_park(n);
		sfs_unlock(&n->lock);
	}
}

/*
 * Turns the clock until the descriptors are back under the budget. The
 * table lock is given up every SFS_EVICT_BATCH buckets: on a big tree
 * the walk is long, and every lookup waits for that lock. The hand is
 * only an index, so the table may grow or shrink in between.
 */
#define SFS_EVICT_BATCH 64

static void sfs_evict(void)
{
	long target = sfs->fd_budget - sfs->fd_budget / 8;
	size_t steps;

	if (pthread_mutex_trylock(&sfs->evict_lock))
		return;	/* another thread is at it */
	pthread_mutex_lock(&sfs->table_lock);
	/* two turns of the clock: the first may only clear used bits */
	steps = 2 * sfs->table_size;
	for (size_t i = 1; steps-- && atomic_load(&sfs->node_fds) > target;
	     i++) {
		sfs_evict_bucket();
		if (i % SFS_EVICT_BATCH == 0) {
			/* let a woken waiter take it before we do again */
			pthread_mutex_unlock(&sfs->table_lock);
			sched_yield();
			pthread_mutex_lock(&sfs->table_lock);
		}
	}
	pthread_mutex_unlock(&sfs->table_lock);
	pthread_mutex_unlock(&sfs->evict_lock);
}

int sfs_node_pin(struct sfs_node *n)
{
	int ret = 0;

	atomic_fetch_add(&n->busy, 1);
	atomic_store(&n->used, true);
	if (!atomic_load(&n->parked))
		return 0;
	sfs_lock(&n->lock);
	if (atomic_load(&n->parked))
		ret = sfs_node_unpark(n);
	sfs_unlock(&n->lock);
	if (ret < 0)
		atomic_fetch_sub(&n->busy, 1);
	return ret;
}

/*
 * What a dead worker's threads held of a node died with them: its lock,
 * its pins, the references they took, and its listing (in their heap).
 * Its references are counted again from what outlives a worker: the
 * kernel's lookups here, its children and open handles below. Its
 * descriptors are in the descriptor table the workers share with the
 * supervisor, and stay valid unless it was parked, or half way to being
 * unparked: then the file handles open it again on the next pin, and
 * whatever the dead worker had opened for it is closed with the rest of
 * its leftovers.
 */
static void sfs_node_fds(void *p, void *set)
{
	struct sfs_node *n = p;

	if (atomic_load(&n->parked))
		return;
	if (atomic_load(&n->has_upper))
		sfs_fdset_add(set, n->up.fd);
	for (int i = 0; i < n->nlower; i++)
		sfs_fdset_add(set, sfs_node_lower(n)[i].fd);
}

static void sfs_node_reset(struct sfs_node *n, struct sfs_fdset *keep)
{
	atomic_store(&n->lock.v, 0);
	atomic_store(&n->busy, 0);
	atomic_store(&n->refs, atomic_load(&n->nlookup));
	if (sfs_node_di(n))
		sfs_node_di(n)->listing = NULL;
	sfs_node_fds(n, keep);
	if (!atomic_load(&n->parked))
		atomic_fetch_add(&sfs->node_fds, sfs_node_nfds(n));
}

/* Adds the descriptors every node holds to SET, changing nothing. */
void sfs_table_fds(struct sfs_fdset *set)
{
	sfs_node_fds(sfs->root, set);
	sfs_shm_walk(SFS_SHM_NODE, sfs_node_fds, set);
}

/*
 * A node at no reference was being freed when its worker died: it is
 * left out, and its memory is lost rather than freed twice.
 */
static void sfs_node_takeover(void *p, void *keep)
{
	struct sfs_node *n = p;
	size_t h;

	if (atomic_load(&n->refs) == 0) {
		sfs_shm_tag(n, SFS_SHM_OTHER);
		return;
	}
	sfs_node_reset(n, keep);
	atomic_fetch_add(&sfs->nodes, 1);
	if (n->unhashed)
		return;
	h = sfs_hash(n->ino, sfs->table_size);
	n->hnext = sfs->table[h];
	sfs->table[h] = n;
	sfs->table_count++;
}

/* Each child holds a reference on its parent. */
static void sfs_node_count_parent(void *p, void *arg)
{
	struct sfs_node *n = p;

	if (n->parent)
		atomic_fetch_add(&n->parent->refs, 1);
}

/*
 * A new worker takes over the nodes (worker.c). The table is made again
 * from the nodes themselves, found by walking the shared memory: the dead
 * worker may have died half way through a change to a hash chain. The
 * descriptors of every node kept are added to KEEP. The open handles'
 * references are counted next (sfs_files_takeover); sfs_table_prune then
 * frees the nodes only the dead worker's threads held.
 */
int sfs_table_takeover(struct sfs_fdset *keep)
{
	struct sfs_node **old = sfs->table;

	pthread_mutex_init(&sfs->table_lock, NULL);
	pthread_mutex_init(&sfs->evict_lock, NULL);
	sfs->table = sfs_shm_alloc(sfs->table_size * sizeof(*sfs->table));
	if (!sfs->table) {
		sfs->table = old;
		return -ENOMEM;
	}
	sfs_shm_free(old);
	sfs->table_count = 0;
	atomic_store(&sfs->node_fds, 0);
	atomic_store(&sfs->nodes, 0);
	atomic_store(&sfs->listed, 0);
	/* the counts references are made from come first */
	sfs_resend_takeover();
	sfs_node_reset(sfs->root, keep);
	atomic_store(&sfs->root->refs, 1);	/* the kernel's, never forgotten */
	sfs_shm_walk(SFS_SHM_NODE, sfs_node_takeover, keep);
	sfs_shm_walk(SFS_SHM_NODE, sfs_node_count_parent, NULL);
	return 0;
}

static void sfs_node_prune(void *p, void *arg)
{
	struct sfs_node *n = p;

	if (atomic_load(&n->refs) == 0) {
		atomic_store(&n->refs, 1);
		sfs_node_put(n, 1);
	}
}

void sfs_table_prune(void)
{
	sfs_shm_walk(SFS_SHM_NODE, sfs_node_prune, NULL);
}

static void sfs_node_leave(void *p, void *arg)
{
	struct sfs_node *n = p;

	if (sfs_node_di(n))
		sfs_dir_drop_listing(n);
}

/*
 * A worker that ends well leaves nothing of its own heap in the shared
 * state: listings are all it puts there.
 */
void sfs_table_leave(void)
{
	sfs_node_leave(sfs->root, NULL);
	sfs_shm_walk(SFS_SHM_NODE, sfs_node_leave, NULL);
}

void sfs_node_unpin(struct sfs_node *n)
{
	atomic_fetch_sub(&n->busy, 1);
	if (atomic_load(&sfs->node_fds) > sfs->fd_budget)
		sfs_evict();
}

/*
 * The node the kernel names in a request, referenced and pinned: drop
 * both with sfs_node_release. The kernel's lookup count keeps the node
 * alive until the request is answered, but no longer: once the reply
 * is out, a FORGET on another thread may drop that count, so the
 * handler's own reference is what keeps the node alive to the end.
 */
int sfs_node_get_pinned(fuse_ino_t nodeid, struct sfs_node **out)
{
	struct sfs_node *n = sfs_node_get(nodeid);
	int ret;

	sfs_node_ref(n);
	ret = sfs_node_pin(n);
	if (ret < 0) {
		sfs_node_unref(n);
		n = NULL;
	}
	*out = n;
	return ret;
}

void sfs_node_release(struct sfs_node *n)
{
	sfs_node_unpin(n);
	sfs_node_unref(n);
}

/* The node got an upper entry (copy-up); caller holds n->lock and a pin. */
void sfs_node_set_upper(struct sfs_node *n, int fd)
{
	n->up = (struct sfs_entry){ .fd = fd };
	atomic_fetch_add(&sfs->node_fds, 1);
	atomic_store(&n->has_upper, true);
}

/* Moves a node to a new name; the caller holds n->lock. */
int sfs_node_set_name(struct sfs_node *n, struct sfs_node *parent,
		      const char *name)
{
	char *dup = sfs_shm_strdup(name);
	struct sfs_node *old;

	if (!dup)
		return -ENOMEM;
	sfs_node_ref(parent);
	old = n->parent;
	n->parent = parent;
	if (n->name != sfs_node_inline_name(n))
		sfs_shm_free(n->name);
	n->name = dup;
	n->unlinked = false;
	if (old)
		sfs_node_unref(old);
	return 0;
}

/*
 * An entry of the directory changed (after the change is in the upper
 * layer): its listing generation moves on, and its merged subdirectory
 * count follows without a rescan.
 */
void sfs_node_dir_changed(struct sfs_node *dir, int subdir_delta)
{
	atomic_fetch_add(&sfs_node_di(dir)->gen, 1);
	sfs_lock(&dir->lock);
	if (sfs_node_di(dir)->subdirs >= 0)
		sfs_node_di(dir)->subdirs += subdir_delta;
	sfs_unlock(&dir->lock);
}

/*
 * An indexed file counts its names in view in the kernel's nlink xattr
 * (index.c): its real count includes the index entry and misses the
 * lower names not linked up. Caller holds n->lock.
 */
static int sfs_index_nlink_load(struct sfs_node *n)
{
	struct stat st, lst;
	char buf[16];
	int ret;

	if (n->index_nlink >= 0)
		return 0;
	ret = sfs_fstat(sfs_upper(n), &st);
	if (ret < 0)
		return ret;
	lst = st;
	if (n->nlower)
		sfs_fstat(sfs_node_lower(n)[0].fd, &lst);
	ret = sfs_node_xattr_get(n, sfs->xattr_nlink, buf, sizeof(buf));
	if (ret >= 0)
		ret = sfs_nlink_parse(buf, ret, st.st_nlink, lst.st_nlink);
	if (ret < 0) {
		/* none, or damaged: the real count, as the kernel falls back */
		strata_warn("ino %llx: no usable nlink xattr (%s)",
			    (unsigned long long)n->ino, strerror(-ret));
		ret = st.st_nlink;
	}
	n->index_nlink = ret;
	return 0;
}

/*
 * Reads the count in before anything changes the real one it is stored
 * relative to (sfs_lookup_node does, for every indexed node).
 */
int sfs_index_nlink_get(struct sfs_node *n)
{
	int ret;

	sfs_lock(&n->lock);
	ret = sfs_index_nlink_load(n);
	if (ret == 0)
		ret = n->index_nlink;
	sfs_unlock(&n->lock);
	return ret;
}

/*
 * Adds DELTA to the count of names in view and stores it relative to the
 * real count as it is now (a name linked up moves that, with DELTA 0).
 * When no name is left, neither is the index entry, as in the kernel.
 * Returns the new count.
 */
int sfs_index_nlink_add(struct sfs_node *n, int delta)
{
	struct sfs_fh fh;
	struct stat st;
	char val[16];
	int ret, len;

	sfs_lock(&n->lock);
	ret = sfs_index_nlink_load(n);
	if (ret == 0)
		ret = sfs_fstat(sfs_upper(n), &st);
	if (ret < 0)
		goto out;
	n->index_nlink = n->index_nlink + delta > 0 ? n->index_nlink + delta : 0;
	len = sfs_nlink_format(val, sizeof(val), n->index_nlink, st.st_nlink);
	ret = sfs_node_xattr_set(n, sfs->xattr_nlink, val, len, 0);
	if (ret == 0 && n->index_nlink == 0 && st.st_nlink == 1) {
		ret = sfs_node_xattr_get(n, sfs->xattr_origin, fh.buf,
					 sizeof(fh.buf));
		if (ret > 0) {
			fh.len = ret;
			sfs_index_remove(&fh);
		}
		ret = 0;
	}
	if (ret == 0)
		ret = n->index_nlink;
out:
	sfs_unlock(&n->lock);
	return ret;
}

int sfs_node_datafd(struct sfs_node *n)
{
	int upper = sfs_upper(n);

	return upper >= 0 ? upper : sfs_node_lower(n)[0].fd;
}

static bool sfs_node_is_merged_dir(struct sfs_node *n)
{
	return S_ISDIR(n->type) && (sfs_upper(n) >= 0) + n->nlower > 1;
}

int sfs_node_stat(struct sfs_node *n, struct stat *st)
{
	int ret;

	if (n->stale)
		return -ESTALE;
	ret = sfs_fstat(sfs_node_datafd(n), st);

	if (ret < 0)
		return ret;
	st->st_ino = n->ino;
	if (sfs_node_is_merged_dir(n)) {
		int64_t subdirs;

		/* Counted once, then kept up to date by dir.c. */
		sfs_lock(&n->lock);
		subdirs = sfs_node_di(n)->subdirs;
		sfs_unlock(&n->lock);
		if (subdirs < 0) {
			ret = sfs_dir_count_subdirs(n, &subdirs);
			if (ret < 0)
				return ret;
			sfs_lock(&n->lock);
			sfs_node_di(n)->subdirs = subdirs;
			sfs_unlock(&n->lock);
		}
		st->st_nlink = 2 + subdirs;
	}
	if (n->indexed) {
		sfs_lock(&n->lock);
		ret = sfs_index_nlink_load(n);
		if (ret == 0)
			st->st_nlink = n->index_nlink;
		sfs_unlock(&n->lock);
		if (ret < 0)
			return ret;
	}
	/*
	 * No override for a removed file: the real count is what the
	 * kernel's overlayfs reports too (an upper file's fell to 0, a lower
	 * one's stays), and an indexed file's own count fell with it.
	 */
	return 0;
}

void sfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct sfs_node *n;
	struct stat st;
	int ret = sfs_node_get_pinned(ino, &n);

	double timeout = 0;

	sfs_count(STRATA_ST_GETATTR, 1);
	if (ret == 0) {
		ret = sfs_node_stat(n, &st);
		timeout = sfs_attr_timeout(n);
		sfs_node_release(n);
	}
	if (ret < 0)
		sfs_reply_err(req, ret);
	else
		fuse_reply_attr(req, &st, timeout);
}

static int sfs_set_times(struct sfs_node *n, int fd, const struct stat *attr,
			 int valid)
{
	struct timespec tv[2] = {
		{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_OMIT }
	};
	char path[64];

	if (valid & FUSE_SET_ATTR_ATIME_NOW)
		tv[0].tv_nsec = UTIME_NOW;
	else if (valid & FUSE_SET_ATTR_ATIME)
		tv[0] = attr->st_atim;
	if (valid & FUSE_SET_ATTR_MTIME_NOW)
		tv[1].tv_nsec = UTIME_NOW;
	else if (valid & FUSE_SET_ATTR_MTIME)
		tv[1] = attr->st_mtim;

	/* a /proc link cannot stand for a symlink; the O_PATH fd can */
	if (S_ISLNK(n->type))
		return utimensat(sfs_upper(n), "", tv,
				 AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0 ?
			       -errno : 0;
	if (fd >= 0)
		return futimens(fd, tv) < 0 ? -errno : 0;
	sfs_proc_path(sfs_node_datafd(n), path, sizeof(path));
	return utimensat(AT_FDCWD, path, tv, 0) < 0 ? -errno : 0;
}

static int sfs_truncate(struct sfs_node *n, int fd, off_t size)
{
	int tfd = fd, ret = 0;

	if (tfd < 0) {
		tfd = sfs_reopen(sfs_upper(n), O_WRONLY);
		if (tfd < 0)
			return tfd;
	}
	/* growing leaves a hole: only what shrinking frees is counted */
	sfs_usage_seed(n, tfd);
	if (ftruncate(tfd, size) < 0)
		ret = -errno;
	sfs_usage_track(n, tfd);
	if (fd < 0)
		close(tfd);
	return ret;
}

/* The bits of a SETATTR that change something besides ctime. */
#define SFS_SET_ATTR_ANY                                                      \
	(FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID |         \
	 FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME |     \
	 FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW)

/* Drops the setuid/setgid bits this caller's write would (file.c). */
static int sfs_setattr_killpriv(fuse_req_t req, int upper)
{
	struct stat st;
	mode_t kill;
	int ret;

	ret = sfs_fstat(upper, &st);
	if (ret < 0)
		return ret;
	kill = sfs_killpriv_bits(req, &st);
	return kill ? sfs_fd_chmod(upper, st.st_mode & 07777 & ~kill) : 0;
}

static void sfs_setattr(fuse_req_t req, struct sfs_node *n, struct stat *attr,
			int valid, struct fuse_file_info *fi)
{
	struct sfs_file *f = sfs_file_of(fi);
	int fd = (f && f->upper) ? f->fd : -1;
	struct stat st;
	int upper, ret;

	if (!sfs_has_upper()) {
		fuse_reply_err(req, EROFS);
		return;
	}
	/* Truncating to zero needs none of the old data. */
	if ((valid & FUSE_SET_ATTR_SIZE) && attr->st_size == 0)
		ret = sfs_copy_up_meta(n);
	else
		ret = sfs_copy_up(n);
	if (ret < 0)
		goto out_err;
	upper = sfs_upper(n);
	/* attributes change: the next write checks privileges again */
	atomic_store(&n->nosec, false);

	/*
	 * chown(-1, -1) changes nothing but ctime: the kernel sends no bit
	 * for it, and the upper filesystem's own no-op chown sets ctime.
	 */
	if (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID) ||
	    !(valid & SFS_SET_ATTR_ANY)) {
		uid_t uid = (valid & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t gid = (valid & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;

		if (fchownat(upper, "", uid, gid,
			     AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
			ret = -errno;
			goto out_err;
		}
	}
	/*
	 * No bits is also how the kernel asks us to drop privileges after
	 * a passthrough write: the FUSE file's file_remove_privs, in the
	 * writer's context, loses ATTR_MODE on the way under
	 * HANDLE_KILLPRIV_V2 (root's writes send nothing). The no-op chown
	 * above drops setuid, and setgid when group-executable; a writer
	 * outside the file's group drops setgid in any case, as on a chown
	 * by such a caller.
	 */
	if (!(valid & SFS_SET_ATTR_ANY) && S_ISREG(n->type)) {
		ret = sfs_setattr_killpriv(req, upper);
		if (ret < 0)
			goto out_err;
	}
	if (valid & FUSE_SET_ATTR_MODE) {
		if (S_ISLNK(n->type)) {
			ret = -EOPNOTSUPP;
			goto out_err;
		}
		ret = fd >= 0 ? (fchmod(fd, attr->st_mode) < 0 ? -errno : 0) :
				sfs_fd_chmod(upper, attr->st_mode);
		if (ret < 0)
			goto out_err;
	}
	if (valid & FUSE_SET_ATTR_SIZE) {
		ret = sfs_truncate(n, fd, attr->st_size);
		if (ret == 0 && !(valid & FUSE_SET_ATTR_MODE))
			ret = sfs_setattr_killpriv(req, upper);
		if (ret < 0)
			goto out_err;
	}
	if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME |
		     FUSE_SET_ATTR_ATIME_NOW | FUSE_SET_ATTR_MTIME_NOW)) {
		ret = sfs_set_times(n, fd, attr, valid);
		if (ret < 0)
			goto out_err;
	}
	ret = sfs_node_stat(n, &st);
	if (ret < 0)
		goto out_err;
	fuse_reply_attr(req, &st, sfs_attr_timeout(n));
	return;

out_err:
	sfs_reply_err(req, ret);
}

void sfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		    int valid, struct fuse_file_info *fi)
{
	struct sfs_node *n;
	int ret = sfs_node_get_pinned(ino, &n);

	sfs_count(STRATA_ST_SETATTR, 1);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	sfs_setattr(req, n, attr, valid, fi);
	sfs_node_release(n);
}

void sfs_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct sfs_node *n;
	char buf[PATH_MAX + 1];
	ssize_t len;
	int ret = sfs_node_get_pinned(ino, &n);

	sfs_count(STRATA_ST_READLINK, 1);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	len = readlinkat(sfs_node_datafd(n), "", buf, sizeof(buf));
	if (len < 0)
		len = -errno;
	sfs_node_release(n);
	if (len < 0) {
		sfs_reply_err(req, (int)len);
		return;
	}
	if ((size_t)len >= sizeof(buf)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	buf[len] = '\0';
	fuse_reply_readlink(req, buf);
}

void sfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;
	int fd = sfs_has_upper() ? sfs->upper.fd : sfs->lower[0].fd;

	sfs_count(STRATA_ST_STATFS, 1);
	if (fstatvfs(fd, &sv) < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	sfs_usage_statfs(&sv);
	fuse_reply_statfs(req, &sv);
}

void sfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct fuse_forget_data one = { .ino = ino, .nlookup = nlookup };

	sfs_count(STRATA_ST_FORGET, 1);
	sfs_forget_batch(1, &one);
	fuse_reply_none(req);
}

void sfs_op_forget_multi(fuse_req_t req, size_t count,
			 struct fuse_forget_data *forgets)
{
	sfs_count(STRATA_ST_FORGET, 1);
	sfs_forget_batch(count, forgets);
	fuse_reply_none(req);
	/*
	 * The kernel forgets in storms (memory pressure, drop_caches): give
	 * the freed nodes' pages back rather than hold the walk's peak for
	 * good. A trim every few thousand nodes costs little.
	 */
	if (atomic_load(&sfs_freed) >= SFS_TRIM_NODES) {
		atomic_store(&sfs_freed, 0);
		malloc_trim(0);
	}
}
