// SPDX-License-Identifier: Apache-2.0
/*
 * switch.c: the part of a live freeze (freeze.c) done in memory while no
 * request runs: the layer stack, every open handle and every node.
 *
 * Nodes. An entry in the upper becomes one in lower layer 1, and every
 * lower entry's layer moves down by one. A directory's frozen entry goes
 * on top of its lower stack (alone, for an opaque one: lookups never
 * merged below it); anything else shows only that one entry. A node
 * keeps its inode number: the frozen layer is on the upper's filesystem,
 * so it has the upper's fsid, and a later copy-up records the number as
 * any copy-up does. The next change copies the file up again into the
 * new upper, as for any lower file. Nodes with no name in the view
 * (unlinked, or an O_TMPFILE not linked yet) are in no layer: they keep
 * their upper entry.
 *
 * Open files. A handle on an upper file is left on the frozen one: reads
 * go on there, and the next write, truncate or fallocate through it
 * copies the file up again and moves the handle to the copy (file.c).
 *
 * A worker dying half way. The switch keeps a record in the shared state
 * as it goes (struct sfs_switch): the phase it is in, the stack as it
 * was, and a copy of what it changes of the node in hand (only its
 * entries, for the many that just move down a layer), which lets go of
 * nothing until it is through. The next worker puts that node back
 * (sfs_switch_rollback), before it counts the nodes, and goes on from the
 * phase reached, past the nodes already through (sfs_switch_finish).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stratafs.h"

/* Calls FN on the root and on every node in the table, hashed or not. */
static void sfs_switch_each(void (*fn)(struct sfs_node *n, void *arg),
			    void *arg)
{
	fn(sfs->root, arg);
	pthread_mutex_lock(&sfs->table_lock);
	for (size_t i = 0; i < sfs->table_size; i++)
		for (struct sfs_node *n = sfs->table[i]; n; n = n->hnext)
			fn(n, arg);
	pthread_mutex_unlock(&sfs->table_lock);
}

/* A node with no name in the view: in no layer, so not frozen either. */
bool sfs_switch_nameless(struct sfs_node *n)
{
	return atomic_load(&n->unlinked) || n->linkable;
}

/* How many entries the node has once frozen. */
static int sfs_switch_count(struct sfs_node *n)
{
	if (!atomic_load(&n->has_upper) || sfs_switch_nameless(n))
		return n->nlower;
	if (!S_ISDIR(n->type) || (sfs_node_di(n)->opaque && n != sfs->root))
		return 1;
	return n->nlower + 1;
}

/*
 * How many entries the node's array holds: its own room, or for one a
 * freeze gave it, exactly the entries it has (only a freeze sets them).
 */
static int sfs_switch_room(struct sfs_node *n)
{
	return n->lower_out ? n->nlower : n->lower_room;
}

static bool sfs_switch_grows(struct sfs_node *n)
{
	return sfs_switch_count(n) > sfs_switch_room(n);
}

/*
 * The list is in the shared memory (sfs->sw.grow while a switch runs):
 * a worker finishing a switch frees what its predecessor made ready for
 * nodes it did not reach.
 */
static void sfs_switch_list(struct sfs_node *n, void *arg)
{
	struct sfs_switch_plan *z = arg;
	struct sfs_freeze_grow *g;

	if (!sfs_switch_grows(n) || z->grow_failed)
		return;
	if (z->ngrow == z->grow_cap) {
		size_t cap = z->grow_cap ? z->grow_cap * 2 : 16;

		g = sfs_shm_alloc(cap * sizeof(*g));
		if (!g) {
			z->grow_failed = true;
			return;
		}
		if (z->ngrow)
			memcpy(g, z->grow, z->ngrow * sizeof(*g));
		sfs_shm_free(z->grow);
		z->grow = g;
		z->grow_cap = cap;
	}
	z->grow[z->ngrow].node = n;
	z->grow[z->ngrow].lower = sfs_shm_alloc(sfs_switch_count(n) *
						sizeof(struct sfs_entry));
	if (!z->grow[z->ngrow++].lower)
		z->grow_failed = true;
}

static void sfs_switch_free_list(struct sfs_freeze_grow *grow, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sfs_shm_free(grow[i].lower);
	sfs_shm_free(grow);
}

void sfs_switch_unprepare(struct sfs_switch_plan *z)
{
	if (sfs->sw.grow == z->grow) {
		sfs->sw.grow = NULL;
		sfs->sw.ngrow = 0;
	}
	sfs_switch_free_list(z->grow, z->ngrow);
	z->grow = NULL;
	z->ngrow = z->grow_cap = 0;
}

/*
 * Allocates, before anything changes, the arrays of the nodes whose
 * entries will not fit in their own room: the root, and directories
 * frozen before that have an upper entry again. Few, on any freeze.
 */
int sfs_switch_prepare(struct sfs_switch_plan *z)
{
	sfs_switch_each(sfs_switch_list, z);
	if (z->grow_failed) {
		sfs_switch_unprepare(z);
		return -ENOMEM;
	}
	/* for a successor, should this worker die before the switch is through */
	sfs->sw.grow = z->grow;
	sfs->sw.ngrow = z->ngrow;
	return 0;
}

/* What a worker that died in a freeze had made ready, and not used. */
void sfs_switch_free_left(void)
{
	sfs_switch_free_list(sfs->sw.grow, sfs->sw.ngrow);
	sfs->sw.grow = NULL;
	sfs->sw.ngrow = 0;
}

/*
 * The array the node's entries go in. The walk meets nodes in the order
 * sfs_switch_prepare's did (nothing changes the table in between):
 * those that grow come up in the list's order. TOOK: the list's entry,
 * which the node owns once it is through.
 */
static struct sfs_entry *sfs_switch_array(struct sfs_switch_plan *z,
					  struct sfs_node *n,
					  struct sfs_freeze_grow **took)
{
	if (!sfs_switch_grows(n))
		return sfs_node_lower(n);
	/* listed, by the same test on the same node: a miss is a bug */
	if (z->grow_next == z->ngrow || z->grow[z->grow_next].node != n)
		abort();
	*took = &z->grow[z->grow_next++];
	return (*took)->lower;
}

/*
 * What the switch changes of N, as it is now (sfs->sw.was), so that the
 * next worker can put it back if this one dies before N is through.
 * Published once whole.
 */
static void sfs_switch_save(struct sfs_node *n)
{
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_dirinfo *di = sfs_node_di(n);

	memset(&sw->was, 0, sizeof(sw->was));
	sw->was.up = n->up;
	sw->was.out = n->lower_out ? sfs_node_lower(n) : NULL;
	sw->was.redirect = di ? di->redirect : NULL;
	sw->was.ublocks = atomic_load(&n->ublocks);
	sw->was.index_nlink = n->index_nlink;
	sw->was.nlower = n->nlower;
	sw->was.lower_out = n->lower_out;
	sw->was.has_upper = atomic_load(&n->has_upper);
	sw->was.indexed = atomic_load(&n->indexed);
	sw->was.has_origin = atomic_load(&n->has_origin);
	sw->was.opaque = di && di->opaque;
	sw->was.impure = di && di->impure;
	/* a loop: see sfs_switch_shift */
	for (int i = 0; i < n->nlower; i++)
		sw->entries[i] = sfs_node_lower(n)[i];
	atomic_store_explicit(&sw->node, n, memory_order_release);
}

/* N as sfs_switch_save found it: the worker that changed it died. */
static void sfs_switch_restore(struct sfs_node *n)
{
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_dirinfo *di = sfs_node_di(n);

	n->lower_out = sw->was.lower_out;
	if (n->lower_out)
		*(struct sfs_entry **)sfs_node_inline_lower(n) = sw->was.out;
	n->nlower = sw->was.nlower;
	memcpy(sfs_node_lower(n), sw->entries, n->nlower * sizeof(sw->entries[0]));
	n->up = sw->was.up;
	atomic_store(&n->ublocks, sw->was.ublocks);
	n->index_nlink = sw->was.index_nlink;
	atomic_store(&n->has_upper, sw->was.has_upper);
	atomic_store(&n->indexed, sw->was.indexed);
	atomic_store(&n->has_origin, sw->was.has_origin);
	if (di) {
		di->redirect = sw->was.redirect;
		di->opaque = sw->was.opaque;
		di->impure = sw->was.impure;
	}
}

/*
 * Once N is through: what it let go of. Each item is cleared in the
 * record before it is freed, so that the next worker, finishing this
 * for a worker that died here, frees nothing twice (at worst it loses
 * one block). CLOSE: the descriptors too; a worker taking over leaves
 * them to its sweep of what no node holds (worker.c).
 */
static void sfs_switch_release(struct sfs_node *n, bool close_fds)
{
	struct sfs_switch *sw = &sfs->sw;
	void *p;

	for (int i = 0; sw->was.dropped && i < sw->was.nlower; i++) {
		struct sfs_entry e = sw->entries[i];

		sw->entries[i] = (struct sfs_entry){ .fd = -1 };
		atomic_signal_fence(memory_order_seq_cst);
		if (close_fds && !atomic_load(&n->parked)) {
			close(e.fd);
			atomic_fetch_sub(&sfs->node_fds, 1);
		}
		sfs_entry_drop_handle(&e);
	}
	p = sw->was.free_out;
	sw->was.free_out = NULL;
	atomic_signal_fence(memory_order_seq_cst);
	sfs_shm_free(p);
	p = sw->was.free_redirect;
	sw->was.free_redirect = NULL;
	atomic_signal_fence(memory_order_seq_cst);
	sfs_shm_free(p);
	atomic_store_explicit(&sw->node, NULL, memory_order_release);
}

/*
 * Tests: the worker dies in the switch of the node NAME, half way
 * (freeze:NAME) or once through but for what it lets go of (frozen:NAME).
 */
static void sfs_switch_crash_in(const char *when, struct sfs_node *n)
{
	const char *point = sfs_crash_after_name;
	size_t len = strlen(when);

	if (point && !strncmp(point, when, len) && !strcmp(point + len, n->name))
		sfs_crash_after(point);
}

/*
 * A node in no upper entry (or with no name): its entries move down a
 * layer, and that is all. Most nodes are such on any freeze after the
 * first, so the record is only their layers as they were, which the
 * next worker puts back (sfs_switch_rollback) if this one dies before
 * the node is through. A loop, not memcpy: for a few bytes, the string
 * instruction that memcpy picks cost more than the whole of the rest of
 * a node (perf, tests/bench/freeze-stall.py).
 */
static void sfs_switch_shift(struct sfs_node *n)
{
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_entry *lower = sfs_node_lower(n);

	for (int i = 0; i < n->nlower; i++)
		sw->layers[i] = lower[i].layer;
	atomic_store_explicit(&sw->shifting, n, memory_order_release);
	for (int i = 0; i < n->nlower; i++)
		lower[i].layer++;
	sfs_switch_crash_in("freeze:", n);
	atomic_store_explicit(&n->fgen, sw->gen, memory_order_release);
	atomic_store_explicit(&sw->shifting, NULL, memory_order_release);
}

/*
 * The node as the frozen stack shows it; see the top of the file. What
 * it lets go of is freed only once it is through (fgen), so that until
 * then sfs->sw.was can put it back.
 */
static void sfs_switch_node(struct sfs_node *n, void *arg)
{
	struct sfs_switch_plan *z = arg;
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_freeze_grow *took = NULL;
	struct sfs_entry *lower, *to, top;
	int count;

	if (atomic_load(&n->fgen) == sw->gen)
		return;		/* through before its worker died */
	if (!atomic_load(&n->has_upper) || sfs_switch_nameless(n)) {
		sfs_switch_shift(n);
		return;
	}
	sfs_switch_save(n);
	lower = sfs_node_lower(n);
	top = n->up;
	count = n->nlower;
	for (int i = 0; i < n->nlower; i++)
		lower[i].layer++;
	top.layer = 1;
	if (!S_ISDIR(n->type) || (sfs_node_di(n)->opaque && n != sfs->root)) {
		/* the frozen entry hid these already */
		sw->was.dropped = true;
		count = 0;
	}
	to = sfs_switch_array(z, n, &took);
	memmove(to + 1, lower, count * sizeof(*lower));
	to[0] = top;
	if (to != lower) {
		/* the room is free once the entries left it */
		if (n->lower_out)
			sw->was.free_out = lower;
		*(struct sfs_entry **)sfs_node_inline_lower(n) = to;
		n->lower_out = true;
	}
	n->nlower = count + 1;
	n->up = (struct sfs_entry){ .fd = -1 };
	atomic_store(&n->ublocks, -1);	/* counted no more: usage.c */
	atomic_store(&n->has_upper, false);
	atomic_store(&n->indexed, false);
	atomic_store(&n->has_origin, false);
	n->index_nlink = -1;
	if (sfs_node_di(n)) {
		/*
		 * The markers were the upper directory's: the frozen one
		 * keeps them, and the node's path in the frozen layer is its
		 * path in the view, which a later rename's redirect names.
		 */
		sfs_node_di(n)->opaque = false;
		sfs_node_di(n)->impure = false;
		sw->was.free_redirect = sfs_node_di(n)->redirect;
		sfs_node_di(n)->redirect = NULL;
	}
	sfs_switch_crash_in("freeze:", n);
	atomic_store_explicit(&n->fgen, sw->gen, memory_order_release);
	sfs_switch_crash_in("frozen:", n);
	if (took)
		took->lower = NULL;	/* the node's now */
	sfs_switch_release(n, true);
}

/* A and B open the same file. */
static bool sfs_switch_same_file(int a, int b)
{
	struct stat sa, sb;

	return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 &&
	       sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/*
 * Open handles, before the nodes change. Those on upper files stay on
 * them, frozen now, and follow the next copy-up (file.c). A reader still
 * on the lower file that a copy-up replaced would read past the copy it
 * has not followed yet: it moves to the copy now. Nothing reads through
 * a handle meanwhile (gate.c), so what it leaves is closed at once.
 * AGAIN: finishing for a worker that died in here, which may have moved
 * a reader already (its handle then says "not upper", as a reader's on
 * the lower file does).
 */
static void sfs_switch_files(bool again)
{
	pthread_mutex_lock(&sfs->handles_lock);
	for (struct sfs_hlink *h = sfs->files.next; h != &sfs->files;
	     h = h->next) {
		struct sfs_file *f = (struct sfs_file *)h;
		struct sfs_node *n = f->node;
		int fd;

		if (!atomic_load(&n->has_upper) || sfs_switch_nameless(n))
			continue;
		/* the node is open, so never parked: up.fd is valid */
		if (!atomic_load(&f->upper) &&
		    !(again && sfs_switch_same_file(f->fd, n->up.fd))) {
			fd = sfs_reopen(n->up.fd,
					O_RDONLY | (f->flags & O_DIRECT));
			if (fd < 0) {
				strata_warn("freeze: a reader of %s stays on "
					    "the lower file: %s", n->name,
					    strerror(-fd));
				continue;
			}
			/* never a descriptor in two places, nor in none */
			fd = atomic_exchange(&f->fd, fd);
			close(fd);
		}
		fd = f->oldfd;
		f->oldfd = -1;
		atomic_signal_fence(memory_order_seq_cst);
		if (fd >= 0)
			close(fd);
		atomic_store(&f->upper, false);
		sfs_crash_after("freeze.files");
	}
	pthread_mutex_unlock(&sfs->handles_lock);
}

/*
 * The switch, from here on recorded in sfs->sw: the stack as it was, the
 * new upper, the nodes' new generation and the arrays made ready.
 */
static void sfs_switch_begin(struct sfs_switch_plan *z)
{
	struct sfs_switch *sw = &sfs->sw;

	sw->gen = sfs->fgen + 1;
	sw->newfd = z->newfd;
	sw->rootfd = z->rootfd;
	sw->newdev = z->newdev;
	sw->newino = z->newino;
	sw->frozen = z->frozen;
	sw->nlower = sfs->nlower;
	memcpy(sw->lower, sfs->lower, sfs->nlower * sizeof(sw->lower[0]));
	sw->ntraps = sfs->ntraps;
	atomic_store(&sw->node, NULL);
	atomic_store(&sw->shifting, NULL);
	atomic_store(&sw->phase, SFS_SWITCH_LAYERS);
}

/* The stack, made from the record: the same however often it is done. */
static void sfs_switch_layers(void)
{
	struct sfs_switch *sw = &sfs->sw;

	sfs->lower[0] = sw->frozen;
	memcpy(&sfs->lower[1], sw->lower, sw->nlower * sizeof(sw->lower[0]));
	sfs->nlower = sw->nlower + 1;
	sfs->upper.fd = sw->newfd;
	sfs->traps[sw->ntraps].dev = sw->newdev;
	sfs->traps[sw->ntraps].ino = sw->newino;
	sfs->ntraps = sw->ntraps + 1;
}

/*
 * Inside the window: the layers and every node and handle, no I/O. In
 * phases a successor goes on from (sfs_switch_finish), each of which
 * can be done again: the stack is made from the record, a handle moved
 * is seen to be, a node through carries the new generation, and the one
 * a worker died in is put back first (sfs_switch_rollback).
 */
void sfs_switch_run(struct sfs_switch_plan *z)
{
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_node *root = sfs->root;

	switch (atomic_load(&sw->phase)) {
	case SFS_SWITCH_NONE:
		sfs_switch_begin(z);
		/* fall through */
	case SFS_SWITCH_LAYERS:
		sfs_switch_layers();
		sfs_crash_after("freeze.layers");
		atomic_store(&sw->phase, SFS_SWITCH_FILES);
		/* fall through */
	case SFS_SWITCH_FILES:
		sfs_switch_files(z->again);
		atomic_store(&sw->phase, SFS_SWITCH_NODES);
		/* fall through */
	default:
		sfs_switch_each(sfs_switch_node, z);
		/* the root always has an upper entry: every copy-up starts there */
		if (!atomic_load(&root->has_upper)) {
			root->up = (struct sfs_entry){ .fd = sw->rootfd };
			atomic_store(&root->has_upper, true);
			atomic_fetch_add(&sfs->node_fds, 1);
		}
	}
	sfs->fgen = sw->gen;
	sw->grow = NULL;	/* z's, freed by its owner */
	sw->ngrow = 0;
	atomic_store(&sw->phase, SFS_SWITCH_NONE);
	/* the stack's now */
	z->frozen.path = NULL;
	z->newfd = -1;
	z->rootfd = -1;
}

/*
 * Before a new worker counts the nodes (worker.c): the node a switch
 * died in is put back as it was, or, had it got through, what it let go
 * of is freed. The switch itself goes on in sfs_switch_finish.
 */
void sfs_switch_rollback(void)
{
	struct sfs_switch *sw = &sfs->sw;
	struct sfs_node *n = atomic_load(&sw->shifting);

	if (atomic_load(&sw->phase) == SFS_SWITCH_NONE)
		return;
	if (n) {
		/* through, it has nothing to free */
		if (atomic_load(&n->fgen) != sw->gen)
			for (int i = 0; i < n->nlower; i++)
				sfs_node_lower(n)[i].layer = sw->layers[i];
		atomic_store(&sw->shifting, NULL);
		return;
	}
	n = atomic_load(&sw->node);
	if (!n)
		return;
	if (atomic_load(&n->fgen) != sw->gen) {
		sfs_switch_restore(n);
		atomic_store(&sw->node, NULL);
		return;
	}
	/* through: an array it took from the list is its own */
	for (size_t i = 0; i < sw->ngrow; i++)
		if (sw->grow[i].node == n)
			sw->grow[i].lower = NULL;
	sfs_switch_release(n, false);
}

/* A switch is under way: a worker died in it (the next one asks). */
bool sfs_switch_pending(void)
{
	return atomic_load(&sfs->sw.phase) != SFS_SWITCH_NONE;
}

/* The descriptors a switch under way holds: the stack may be either. */
void sfs_switch_fds(struct sfs_fdset *keep)
{
	struct sfs_switch *sw = &sfs->sw;

	if (!sfs_switch_pending())
		return;
	sfs_fdset_add(keep, sw->frozen.fd);
	sfs_fdset_add(keep, sw->newfd);
	sfs_fdset_add(keep, sw->rootfd);
}

/*
 * The switch of a freeze the worker before died in: from the phase it
 * had reached, with the record's stack and descriptors, or, had it not
 * begun, from Z as the caller made it (a fresh upper). Arrays are made
 * again for the nodes not reached (those the dead worker made ready are
 * freed by then: sfs_switch_free_left).
 */
int sfs_switch_finish(struct sfs_switch_plan *z)
{
	struct sfs_switch *sw = &sfs->sw;
	int ret = sfs_switch_prepare(z);

	if (ret < 0)
		return ret;
	if (sfs_switch_pending()) {
		z->frozen = sw->frozen;
		z->newfd = sw->newfd;
		z->rootfd = sw->rootfd;
		z->again = true;
	}
	/* the upper moved only once every name was linked up (linkup.c) */
	sfs_linkup_drop();
	sfs_switch_run(z);
	return 0;
}
