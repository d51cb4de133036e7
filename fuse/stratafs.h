/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stratafs internals: the union filesystem's structures and, grouped by
 * the file that defines them, every function shared between files.
 *
 * A node is one inode of the merged view. It holds file descriptors on
 * the real entries behind it (never paths, so depth is unlimited): the
 * upper entry if there is one, and the lower stack (for a directory all
 * the lower directories merged into it, for anything else the one lower
 * entry that shows through).
 */
#ifndef STRATAFS_H
#define STRATAFS_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "strata.h"

#define SFS_MAX_LOWERS 128
#define SFS_MAX_THREADS 16
/* Real inode numbers keep their low bits; the layer's filesystem goes above. */
#define SFS_INO_FSID_SHIFT 56
#define SFS_WORK_TMP "work"
/* the kernel's index directory, and the one stratafs used before it */
#define SFS_WORK_INDEX "index"
#define SFS_WORK_OLD_INDEX "strata-index"

struct sfs_layer {
	char *path;		/* as given, for messages */
	int fd;			/* O_RDONLY|O_DIRECTORY on the layer root */
	dev_t dev;
	unsigned fsid;		/* index of dev among the layers' devices */
	uint8_t uuid[16];	/* its filesystem's, as origins carry it */
};

/* An origin: a lower file's handle in the kernel overlayfs format (index.c). */
struct sfs_fh {
	uint8_t len;
	uint8_t buf[5 + 16 + 128];	/* header, uuid, MAX_HANDLE_SZ */
};

/* sfs_params.passthrough: what the options said */
enum {
	SFS_PASS_OFF = -1,	/* -o nopassthrough */
	SFS_PASS_DEFAULT = 0,	/* nothing: on where it can be */
	SFS_PASS_ASKED = 1,	/* -o passthrough: said when it cannot be */
};

struct sfs_params {
	char *lowerdir;		/* raw option, colon separated, \: escapes */
	char *upperdir;
	char *workdir;
	char *io;		/* "uring" (default) or "sync" */
	char *transport;	/* "uring", "dev", or NULL: uring if it can */
	char *timeout;		/* kernel cache timeout, seconds */
	char *statsfile;	/* where counters are exported, or NULL */
	char *control;		/* the control socket's path, or NULL */
	char *capacity;		/* bytes the upper may take; NULL or 0: no limit */
	char *usagefile;	/* where usage is kept across mounts, or NULL */
	/* ints, not bools: fuse_opt stores flag options as int */
	int userxattr;
	int passthrough;	/* SFS_PASS_*; sfs_fs.passthrough: in effect */
	int noallow_other;	/* root mounts: keep other users out */
	int nosupervisor;	/* serve in the process started (supervisor.c) */
	unsigned max_read;	/* libfuse's max_read=, which INIT must echo */
	int foreground;
	int debug;
	int show_help;
	int show_version;
	char *source;		/* mount.fuse3's first positional argument */
	char *mountpoint;
};

/* One entry of a lookup result: a real file in one layer. */
struct sfs_entry {
	int fd;			/* dir: O_RDONLY|O_DIRECTORY; else O_PATH */
	int16_t layer;		/* 0 upper, 1.. lowers top first */
	/*
	 * What reopens the entry after parking (inode.c). A handle of at
	 * most 8 bytes whose type fits a byte (ext4's, most of xfs's) is
	 * kept in fh_bytes, fh_len giving its size; any other in a block of
	 * its own, fh, with fh_len 0. Past the open-file limit every entry
	 * of a tree has one: a block each was 3 MiB over 130,000 entries.
	 */
	uint8_t fh_len;
	uint8_t fh_type;
	union {
		struct sfs_fhblock *fh;
		unsigned char fh_bytes[8];
	};
};

/* An entry's file handle too large for the entry (util.c, inode.c). */
struct sfs_fhblock {
	uint32_t len;
	int32_t type;
	unsigned char bytes[];
};

/*
 * A 4-byte mutex (lock.c): 0 free, 1 held, 2 held with sleepers. Not
 * recursive, like a default pthread mutex.
 */
struct sfs_lock {
	atomic_int v;
};

void sfs_lock_slow(struct sfs_lock *l);
void sfs_unlock_slow(struct sfs_lock *l);

static inline void sfs_lock(struct sfs_lock *l)
{
	int c = 0;

	if (!atomic_compare_exchange_strong(&l->v, &c, 1))
		sfs_lock_slow(l);
}

static inline bool sfs_trylock(struct sfs_lock *l)
{
	int c = 0;

	return atomic_compare_exchange_strong(&l->v, &c, 1);
}

static inline void sfs_unlock(struct sfs_lock *l)
{
	if (atomic_fetch_sub(&l->v, 1) != 1)
		sfs_unlock_slow(l);
}

/* What only a directory node has; in the node's own allocation. */
struct sfs_dirinfo {
	char *redirect;		/* absolute lower path of a moved dir; n->lock */
	int64_t subdirs;	/* merged dir: subdir count, -1 unknown; n->lock */
	atomic_ulong gen;	/* bumped whenever an entry changes */
	struct sfs_listing *listing;	/* kept while a stream reads; n->lock */
	bool opaque;		/* lower layers do not merge; n->lock */
	bool impure;		/* upper holds entries with an origin; n->lock */
};

/*
 * A file's passthrough state, while handles use it (passthrough.c): only
 * a file in use has it, not every node of a tree.
 */
struct sfs_pass {
	int64_t size;		/* the file's size when wrote began */
	int32_t backing;	/* the kernel's backing id */
	uint32_t handles;	/* open passthrough handles */
	bool wrote;		/* a writer since the first handle */
};

/*
 * A node is one inode of the merged view: one allocation, sized to it (a
 * big tree keeps one node per entry in memory): the fixed part, the
 * lower entries, the directory part for a directory, then the name.
 *
 * Lifetime. refs counts every holder: each lookup the kernel was told of
 * (a LOOKUP, CREATE, MKNOD... reply or a READDIRPLUS entry, until its
 * FORGET), each child whose ->parent it is, each open file handle, and
 * each thread using it. The node is freed when refs reaches zero, and
 * its reference on its parent is dropped then. nlookup counts the
 * kernel's lookups alone: a worker taking over from a dead one counts
 * refs again without the dead one's threads (sfs_table_takeover). Rules:
 *  - A request's node id is backed by the kernel's lookups only until
 *    the reply is sent: a FORGET on another thread may follow at once.
 *    So a handler takes its own reference (sfs_node_get_pinned) and
 *    drops it last (sfs_node_release), never between reply and return.
 *  - A pointer read from another node (->parent) is used only under
 *    that node's lock or after taking a reference under it
 *    (sfs_node_get_parent): a rename swaps ->parent and drops the old one.
 *  - The table hands out references only to nodes whose count is not
 *    zero (sfs_node_tryget): a node at zero is already being freed.
 *  - busy (pins) is not a reference: it only keeps the descriptors open
 *    (parking, below); every pin is taken under a reference.
 *
 * Locks, in the order they are taken:
 *   n->lock (a child's before its parent's, never two unrelated nodes)
 *     -> fs->table_lock -> fs->handles_lock
 * evict_lock is only ever try-locked; the evictor try-locks n->lock
 * while holding table_lock, which is why it must never block on it.
 *
 * Which field is guarded by what is noted at each: "table" is
 * fs->table_lock, "lock" is n->lock, "const" never changes after the
 * node is in the table, and atomics need no lock.
 */
struct sfs_node {
	uint64_t ino;		/* const: the st_ino we report */
	struct sfs_node *hnext;	/* table: hash chain */
	_Atomic uint64_t refs;		/* holders, as above */
	_Atomic uint64_t nlookup;	/* the kernel's lookups, within refs */
	struct sfs_node *parent;	/* lock; referenced; NULL for root */
	char *name;		/* lock: the inline copy, or one a rename made */
	int32_t index_nlink;	/* lock: indexed: names in view; -1 unknown */
	/*
	 * Descriptors are valid while the node is pinned (sfs_node_pin): an
	 * idle node may be parked, its descriptors closed and reopened from
	 * file handles on the next pin, so a tree of any size fits under the
	 * open-file limit. Park and unpark run under n->lock.
	 */
	atomic_int busy;	/* pins: operations using the descriptors */
	atomic_int nopen;	/* open file handles */
	struct sfs_lock lock;
	mode_t type;		/* const: S_IFMT bits */
	bool unhashed;		/* table: never found by number again */
	atomic_bool has_upper;	/* set once, at lookup or copy-up, after up */
	atomic_bool parked;
	atomic_bool used;	/* eviction's clock bit */
	bool no_park;		/* evictor only: a layer without file handles */
	bool linkable;		/* lock: an O_TMPFILE file, not named yet */
	atomic_bool nosec;	/* no setuid/setgid/capability to drop on write */
	atomic_bool stale;	/* unlinked and its data released */
	atomic_bool has_origin;	/* upper copy records the lower's inode number */
	atomic_bool indexed;	/* upper data lives in the hardlink index */
	atomic_bool unlinked;	/* no name left in the view */
	bool pass_used;		/* lock: passthrough since the last cached open */
	/*
	 * Data written since the last fsync: the upper filesystem may still
	 * allocate (st_blocks) when it writes back, so the kernel must not
	 * cache the attributes meanwhile. Bumped per write, 0 when synced.
	 */
	atomic_uint dirty;
	uint8_t nlower;		/* const, but for a freeze (freeze.c) */
	uint8_t lower_room;	/* const: entries the node's own allocation holds */
	/*
	 * The nlower entries (sfs_node_lower) are in the node's own room
	 * (lower_room of them, right after this struct), or once a freeze
	 * gave the node more layers than that, in an array of their own
	 * whose address the room holds (freeze.c). Changed only by a
	 * freeze, while no request runs (gate.c). A flag, not a pointer:
	 * 8 bytes a node are 1 MiB over a 130,000-entry tree.
	 */
	bool lower_out;
	/* the last freeze whose switch has reached the node (freeze.c) */
	_Atomic uint8_t fgen;
	/* the upper file's st_blocks as usage.c last counted it; -1 unknown */
	_Atomic int64_t ublocks;
	struct sfs_pass *pass;	/* lock: while passthrough handles are open */
	struct sfs_entry up;	/* the upper entry, once has_upper */
};

/* The room for lower entries in the node's own allocation. */
static inline struct sfs_entry *sfs_node_inline_lower(struct sfs_node *n)
{
	return (struct sfs_entry *)(n + 1);
}

static inline struct sfs_entry *sfs_node_lower(struct sfs_node *n)
{
	struct sfs_entry *room = sfs_node_inline_lower(n);

	return n->lower_out ? *(struct sfs_entry **)room : room;
}

/*
 * A directory's part, after the room for entries (inode.c); NULL for
 * anything else. Found, not pointed to, for the same reason.
 */
static inline struct sfs_dirinfo *sfs_node_di(struct sfs_node *n)
{
	return S_ISDIR(n->type) ?
		(struct sfs_dirinfo *)(sfs_node_inline_lower(n) + n->lower_room) :
		NULL;
}

/*
 * Every open handle is on a list, so that the ones whose release the
 * kernel had not sent when the mount went away are freed at exit.
 */
struct sfs_hlink {
	struct sfs_hlink *prev, *next;
};

/*
 * The upper layer's usage and its limit (usage.c), in the shared state:
 * a worker that replaces a dead one goes on from them. Atomics, no lock.
 */
struct sfs_usage {
	_Atomic int64_t bytes;		/* allocated: st_blocks * 512 */
	_Atomic int64_t inodes;
	_Atomic int64_t claimed;	/* reserved by writes in flight */
	_Atomic uint64_t capacity;	/* bytes; 0: no limit */
	_Atomic uint64_t changes;	/* bumped per change, for the saver */
};

enum sfs_dir_cache {
	SFS_DIR_CACHE_OFF,	/* every opendir and readdir reaches us */
	SFS_DIR_CACHE_ON,	/* opendir does, readdir until cached */
	SFS_DIR_CACHE_NO_OPENDIR,	/* neither opendir nor a cached readdir */
};

/* A node whose entries outgrow its own room at a freeze, and their array. */
struct sfs_freeze_grow {
	struct sfs_node *node;
	struct sfs_entry *lower;
};

/*
 * A freeze's switch, the in-memory half of it (freeze.c), as it goes: in
 * the shared state, so that a worker dying half way leaves its successor
 * what to undo and what to redo.
 */
struct sfs_switch {
	_Atomic int phase;	/* SFS_SWITCH_*: what is under way */
	uint8_t gen;		/* what the nodes switched carry (fgen) */
	int newfd, rootfd;	/* the new upper, and its root's entry */
	dev_t newdev;		/* the new upper: a trap from now on */
	ino_t newino;
	struct sfs_layer frozen;	/* the old upper, the new top layer */
	int nlower, ntraps;	/* the stack before */
	struct sfs_layer lower[SFS_MAX_LOWERS];
	/* the arrays made ready for nodes that grow, in the walk's order */
	struct sfs_freeze_grow *grow;
	size_t ngrow;
	/*
	 * The node being switched, and what the switch changes of it as it
	 * was: set once the copy is whole, cleared once what the node let
	 * go of is freed (each item cleared before it is).
	 */
	_Atomic(struct sfs_node *) node;
	/*
	 * Or the node whose entries only move down a layer, most of them,
	 * and their layers as they were (sfs_switch_shift).
	 */
	_Atomic(struct sfs_node *) shifting;
	int16_t layers[SFS_MAX_LOWERS];
	struct {
		struct sfs_entry up;
		struct sfs_entry *out;	/* the array, when lower_out */
		char *redirect;
		int64_t ublocks;
		int32_t index_nlink;
		uint8_t nlower;
		bool lower_out, has_upper, indexed, has_origin;
		bool opaque, impure;
		/* what it lets go of, freed once it is through */
		bool dropped;	/* its lower entries, in entries[] */
		struct sfs_entry *free_out;	/* an array it left */
		char *free_redirect;
	} was;
	struct sfs_entry entries[SFS_MAX_LOWERS + 1];
};

enum {
	SFS_SWITCH_NONE,
	SFS_SWITCH_LAYERS,	/* the stack, from sw's copy of it */
	SFS_SWITCH_FILES,	/* the open handles */
	SFS_SWITCH_NODES,	/* the nodes, then the root's new entry */
};

struct sfs_fs {
	struct sfs_params params;
	/*
	 * The layers. A freeze (freeze.c) changes them, while no request
	 * runs: here, in the shared state, so that a new worker and an
	 * upgraded binary serve the stack as it is now.
	 */
	struct sfs_layer upper;	/* fd -1 when read-only */
	int nlower;
	struct sfs_layer lower[SFS_MAX_LOWERS];
	char *upper_real;	/* the upper's real path, for a freeze's rename */
	/*
	 * NEWDIR from just before a freeze renames the upper until its
	 * switch is done: a worker that takes over from one that died in
	 * between finishes that freeze (freeze.c).
	 */
	_Atomic(char *) freezing;
	struct sfs_switch sw;
	uint8_t fgen;		/* the last freeze switched through: new nodes' */
	char *upper_from_work;	/* the upper's path from the workdir: "../u" */
	int workfd;		/* the workdir, flock'ed while mounted */
	int tmpfd;		/* workdir/work: temp entries for atomic moves */
	int indexfd;		/* workdir/index: lower hard links (index.c) */
	int nullfd;		/* O_PATH /dev/null: stands in for released files */
	/* the layers' roots and the workdir: never entered through a lookup */
	int ntraps;
	struct {
		dev_t dev;
		ino_t ino;
	} traps[SFS_MAX_LOWERS + 2];
	char xattr_prefix[32];	/* "trusted.overlay." or "user.overlay." */
	char xattr_opaque[48];
	char xattr_redirect[48];
	char xattr_ino[48];	/* ours: the inode number kept over copy-up */
	char xattr_origin[48];	/* the lower file's handle (index.c) */
	char xattr_impure[48];
	char xattr_nlink[48];	/* the union's link count of an indexed file */
	char xattr_whiteout[48];	/* marks an empty file a whiteout */
	bool rename_whiteout;	/* upper fs supports RENAME_WHITEOUT */
	_Atomic uint64_t tmp_seq;

	pthread_mutex_t handles_lock;
	struct sfs_hlink files;	/* list head */

	pthread_mutex_t table_lock;	/* the table, and each node's hnext */
	struct sfs_node **table;
	size_t table_size;
	size_t table_count;
	struct sfs_node *root;

	atomic_long node_fds;	/* descriptors held by nodes */
	atomic_long nodes;	/* nodes alive, the root aside */
	long fd_budget;		/* park idle nodes above this */
	pthread_mutex_t evict_lock;
	size_t evict_hand;	/* clock hand over the table, under table_lock */

	double timeout;		/* entry and attr timeout for the kernel */
	enum sfs_dir_cache dir_cache;	/* how the kernel caches listings */
	atomic_long listed;	/* entries in listings kept on nodes */
	struct fuse_session *se;
	atomic_bool passthrough;	/* negotiated, and not refused since */
	/* FUSE over io_uring agreed in INIT (uring.c), and its payload size */
	atomic_bool uring;
	uint32_t uring_payload;
	atomic_uint file_gen;	/* the next open file's generation */
	/* replies a dead worker counted lookups for (resend.c) */
	struct sfs_replying *unreplied[SFS_MAX_THREADS * 2];
	atomic_bool crashed_after;	/* sfs_crash_after fired (tests) */
	/* the control socket (control.c), and what was bound at its path */
	int ctlfd;
	dev_t ctl_dev;
	ino_t ctl_ino;
	struct sfs_usage usage;
};

/* An open file. */
struct sfs_file {
	struct sfs_hlink link;	/* first: the list holds these */
	pthread_mutex_t lock;
	_Atomic int fd;
	int oldfd;		/* the lower fd a copy-up replaced, or -1 */
	atomic_bool upper;	/* fd is on the upper copy */
	/* the kernel does its I/O (passthrough.c); a freeze reads it unlocked */
	atomic_bool passthrough;
	uint16_t gen;		/* in the handle the kernel holds, as a check */
	int flags;
	struct sfs_node *node;	/* referenced */
};

/* One name of a merged listing. */
struct sfs_dirent {
	char *name;
	uint64_t ino;
	unsigned char type;	/* DT_* */
	off_t off;		/* the name's offset, stable across listings */
};

/* A directory's merged listing, in offset order. */
struct sfs_listing {
	atomic_int refs;
	unsigned long gen;	/* the directory's generation at listing */
	size_t count;
	struct sfs_dirent *ents;
};

/* A lookup's result before it becomes a node. */
struct sfs_found {
	mode_t type;
	struct stat st;		/* of the topmost entry */
	int upper;		/* fd or -1 */
	int nlower;
	struct sfs_entry lower[SFS_MAX_LOWERS];
	char *redirect;
	bool opaque;
	bool indexed;		/* upper is the hardlink index's copy */
	bool has_origin;
	bool impure;		/* upper dir holds entries with an origin */
	uint64_t lower_ino;	/* lower[0]'s number (sfs_lower_ino) */
};

extern struct sfs_fs *sfs;

/*
 * ThreadSanitizer sees no ordering through the kernel. Between a reply
 * and the request it makes possible (a FORGET after the LOOKUP reply,
 * a RELEASE after the last READ) it sees the write(2) and read(2) on
 * /dev/fuse, which order them for it; so a TSan build receives with
 * read(2), not splice(2) (super.c). What it cannot see at all is an
 * io_uring op going in on one thread and completing on another: the
 * submitter releases the op, the completion acquires it (io.c).
 */
#ifdef STRATA_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void AnnotateNewMemory(const char *f, int l, uintptr_t mem, size_t size);
#define SFS_TSAN_RELEASE(p) __tsan_release(p)
#define SFS_TSAN_ACQUIRE(p) __tsan_acquire(p)
/* memory the shared allocator hands out again is new, as malloc's is */
#define SFS_TSAN_NEW(p, n) AnnotateNewMemory(__FILE__, __LINE__, (uintptr_t)(p), n)
#else
#define SFS_TSAN_RELEASE(p) ((void)(p))
#define SFS_TSAN_ACQUIRE(p) ((void)(p))
#define SFS_TSAN_NEW(p, n) ((void)(p), (void)(n))
#endif

static inline bool sfs_has_upper(void)
{
	return sfs->upper.fd >= 0;
}

/*
 * Whether lower layer LAYER (1-based) may be an upper a freeze made: on
 * the upper's filesystem, where its copied-up entries keep their numbers
 * (sfs_lower_ino).
 */
static inline bool sfs_lower_was_upper(int layer)
{
	return sfs_has_upper() && sfs->lower[layer - 1].fsid == sfs->upper.fsid;
}

/* How long the kernel may keep the node's attributes. */
static inline double sfs_attr_timeout(struct sfs_node *n)
{
	return atomic_load(&n->dirty) ? 0 : sfs->timeout;
}

/* The node's upper descriptor, or -1 when it has no upper entry. Pinned. */
static inline int sfs_upper(struct sfs_node *n)
{
	return atomic_load(&n->has_upper) ? n->up.fd : -1;
}

/* params.c */
int sfs_params_escape(int argc, char **argv, struct fuse_args *out);
int sfs_params_parse(struct fuse_args *args, struct sfs_params *p);
void sfs_params_free(struct sfs_params *p);
int sfs_split_lowerdir(const char *spec, char ***out, int *count);
void sfs_strv_free(char **v, int count);
void sfs_usage(const char *prog);

/* super.c */
void sfs_process_init(void);
int sfs_setup(struct sfs_fs *fs);
struct fuse_session *sfs_mount(struct sfs_fs *fs, struct fuse_args *args,
			       int devfd);
void sfs_unmount(struct sfs_fs *fs, bool adopted);
bool sfs_is_trap(const struct stat *st);
void sfs_teardown(struct sfs_fs *fs);
extern const struct fuse_lowlevel_ops sfs_ops;

/* namei.c */
int sfs_lookup_name(struct sfs_node *dir, const char *name,
		    struct sfs_found *f);
int sfs_lower_positive(struct sfs_node *dir, const char *name);
void sfs_found_release(struct sfs_found *f);
int sfs_lookup_node(struct sfs_node *dir, const char *name,
		    struct sfs_node **out);
int sfs_lookup_held(struct sfs_node *dir, const char *name, struct stat *st,
		    int *state, struct sfs_node **out);
int sfs_fill_entry(struct sfs_node *n, struct fuse_entry_param *e);
int sfs_entry_reply(fuse_req_t req, struct sfs_node *n);
void sfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
extern const char *sfs_crash_name;
extern const char *sfs_crash_after_name;
void sfs_crash_after(const char *name);

/* inode.c */
int sfs_table_init(struct sfs_fs *fs);
void sfs_table_destroy(struct sfs_fs *fs);
struct sfs_node *sfs_node_alloc(mode_t type, int nlower, const char *name);
fuse_ino_t sfs_node_id(struct sfs_node *n);
void sfs_entry_drop_handle(struct sfs_entry *e);
struct sfs_node *sfs_node_get(fuse_ino_t nodeid);
struct sfs_node *sfs_node_find(uint64_t ino, mode_t type);
struct sfs_node *sfs_node_from_found(struct sfs_node *parent,
				     const char *name, struct sfs_found *f,
				     uint64_t ino, int *err);
void sfs_node_ref(struct sfs_node *n);
void sfs_node_unref(struct sfs_node *n);
int sfs_node_pin(struct sfs_node *n);
void sfs_node_unpin(struct sfs_node *n);
int sfs_node_get_pinned(fuse_ino_t nodeid, struct sfs_node **out);
struct sfs_node *sfs_node_get_parent(struct sfs_node *n, int *err);
void sfs_node_release(struct sfs_node *n);
struct sfs_fdset;
int sfs_table_takeover(struct sfs_fdset *keep);
void sfs_table_prune(void);
void sfs_table_fds(struct sfs_fdset *set);
void sfs_table_leave(void);
void sfs_node_set_upper(struct sfs_node *n, int fd);
void sfs_fd_budget_init(void);
void sfs_node_lookup_inc(struct sfs_node *n);
void sfs_node_forget(struct sfs_node *n, uint64_t count);
void sfs_node_lookup_dec(struct sfs_node *n);
void sfs_node_unhash(struct sfs_node *n);
int sfs_node_datafd(struct sfs_node *n);
int sfs_node_stat(struct sfs_node *n, struct stat *st);
int sfs_node_set_name(struct sfs_node *n, struct sfs_node *parent,
		      const char *name);
void sfs_node_dir_changed(struct sfs_node *dir, int subdir_delta);
uint64_t sfs_ino_compose(unsigned fsid, ino_t ino);
int sfs_index_nlink_get(struct sfs_node *n);
int sfs_index_nlink_add(struct sfs_node *n, int delta);
void sfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void sfs_op_forget_multi(fuse_req_t req, size_t count,
			 struct fuse_forget_data *forgets);
void sfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void sfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		    int valid, struct fuse_file_info *fi);
void sfs_op_readlink(fuse_req_t req, fuse_ino_t ino);
void sfs_op_statfs(fuse_req_t req, fuse_ino_t ino);

/* dir.c */
void sfs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		  mode_t mode, dev_t rdev);
void sfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		  mode_t mode);
void sfs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		    const char *name);
void sfs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		 const char *newname);
void sfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void sfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void sfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		   fuse_ino_t newparent, const char *newname,
		   unsigned int flags);
void sfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		   mode_t mode, struct fuse_file_info *fi);

/* readdir.c */
int sfs_dir_list(struct sfs_node *dir, struct sfs_dirent **out,
		 size_t *count);
void sfs_dirents_free(struct sfs_dirent *ents, size_t count);
int sfs_dir_count_subdirs(struct sfs_node *dir, int64_t *out);
int sfs_dir_check_empty(struct sfs_node *dir);
void sfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void sfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi);
void sfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			off_t off, struct fuse_file_info *fi);
void sfs_op_releasedir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi);
void sfs_dir_drop_listing(struct sfs_node *dir);
void sfs_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi);

/* copy_up.c */
int sfs_copy_up(struct sfs_node *n);
int sfs_copy_up_meta(struct sfs_node *n);
int sfs_copy_up_name(struct sfs_node *dir, const char *name,
		     struct sfs_node *n);

/* index.c */
void sfs_layer_uuid(struct sfs_layer *l);
int sfs_fh_encode(int fd, const struct sfs_layer *l, struct sfs_fh *fh);
int sfs_fh_decode(const struct sfs_fh *fh, int *layer);
int sfs_origin_fh_get(int dirfd, const char *name, struct sfs_fh *fh);
int sfs_origin_fh_set(int dirfd, const char *name, const struct sfs_fh *fh);
int sfs_index_open(const struct sfs_fh *fh, mode_t type, struct stat *st);
int sfs_index_install(const char *tmp, const struct sfs_fh *fh);
void sfs_index_remove(const struct sfs_fh *fh);
int sfs_nlink_parse(const char *buf, size_t len, nlink_t upper, nlink_t lower);
int sfs_nlink_format(char *buf, size_t size, nlink_t nlink, nlink_t upper);
int sfs_index_convert(struct sfs_fs *fs);
int sfs_upper_ino(int dirfd, const char *name, ino_t real, bool impure,
		  uint64_t *ino, bool *indexed);
uint64_t sfs_lower_ino(int dirfd, const char *name, int layer, ino_t real,
		       bool impure);
int sfs_index_find(int fd, int layer, mode_t type);

/* file.c */
void sfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void sfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		 struct fuse_file_info *fi);
void sfs_op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *buf,
		      off_t off, struct fuse_file_info *fi);
void sfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void sfs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void sfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		  struct fuse_file_info *fi);
void sfs_op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
		      off_t length, struct fuse_file_info *fi);
void sfs_op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		  struct fuse_file_info *fi);
void sfs_op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			    struct fuse_file_info *fi_in, fuse_ino_t ino_out,
			    off_t off_out, struct fuse_file_info *fi_out,
			    size_t len, int flags);
int sfs_file_open(struct sfs_node *n, int flags, struct sfs_file **out);
void sfs_file_close(struct sfs_file *f);
uint64_t sfs_file_handle(const struct sfs_file *f);
struct sfs_file *sfs_file_of(const struct fuse_file_info *fi);
void sfs_files_takeover(struct sfs_fdset *keep);
void sfs_files_fds(struct sfs_fdset *set);
mode_t sfs_killpriv_bits(fuse_req_t req, const struct stat *st);
int sfs_file_reply(fuse_req_t req, struct sfs_file *f,
		   struct fuse_file_info *fi, const struct fuse_entry_param *e);
void sfs_op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		  struct fuse_file_info *fi, unsigned flags,
		  const void *in_buf, size_t in_bufsz, size_t out_bufsz);

/* xattr.c */
struct sfs_xpath {
	char path[PATH_MAX];
	bool follow;		/* a /proc link to follow, or a real name */
	char tmp[64];		/* a temporary link in the workdir, or "" */
	struct sfs_node *parent;	/* pinned for a lower symlink's name */
};

bool sfs_xattr_is_private(const char *name);
int sfs_xpath_entry(struct sfs_xpath *x, int dirfd, const char *name);
int sfs_xpath_fd(struct sfs_xpath *x, int fd);
int sfs_xpath_lower_name(struct sfs_xpath *x, struct sfs_node *parent,
			 struct sfs_node *n);
int sfs_xpath_node(struct sfs_xpath *x, struct sfs_node *n);
void sfs_xpath_done(struct sfs_xpath *x);
int sfs_xattr_get(const struct sfs_xpath *x, const char *name, void *buf,
		  size_t size);
int sfs_xattr_set(const struct sfs_xpath *x, const char *name,
		  const void *val, size_t size, int flags);
int sfs_xattr_copy(const struct sfs_xpath *from, const struct sfs_xpath *to);
int sfs_node_xattr_get(struct sfs_node *n, const char *name, void *buf,
		       size_t size);
int sfs_node_xattr_set(struct sfs_node *n, const char *name, const void *val,
		       size_t size, int flags);
int sfs_ino_xattr_get(int dirfd, const char *name, uint64_t *ino);
int sfs_ino_xattr_set(int dirfd, const char *name, uint64_t ino);
void sfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     const char *value, size_t size, int flags);
void sfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
		     size_t size);
void sfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void sfs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* acl.c */
/* The ACLs a new entry gets from its parent's default ACL (acl.c). */
struct sfs_acl {
	void *def;	/* the parent's default ACL, or NULL: none */
	size_t len;	/* of each */
	void *access;	/* its access ACL, in def's allocation; NULL: none */
};

bool sfs_acl_is_name(const char *name);
int sfs_acl_count(const void *buf, size_t len);
int sfs_acl_masq(void *buf, size_t len, mode_t *mode);
int sfs_acl_inherit(struct sfs_node *dir, mode_t *mode, mode_t umask,
		    struct sfs_acl *a);
int sfs_acl_set_new(const struct sfs_xpath *x, mode_t type,
		    const struct sfs_acl *a);
void sfs_acl_free(struct sfs_acl *a);
int sfs_acl_kill_sgid(fuse_req_t req, struct sfs_node *n, const char *name);

/* whiteout.c */
bool sfs_is_whiteout(const struct stat *st);
bool sfs_is_wh_name(const char *name);
int sfs_wh_name(const char *name, char *buf, size_t size);
int sfs_dir_is_opaque(int dirfd, bool lower);
int sfs_is_xwhiteout(int dirfd, const char *name, const struct stat *st);
int sfs_set_opaque(int dirfd);
int sfs_dir_is_impure(int dirfd);
int sfs_mark_impure(struct sfs_node *dir);
bool sfs_redirect_valid(const char *r, size_t len);
int sfs_get_redirect(int dirfd, char **out);
int sfs_set_redirect(int dirfd, const char *path);
int sfs_whiteout_create(int dirfd, const char *name);
int sfs_whiteout_replace(int dirfd, const char *name);
int sfs_tmp_name(char *buf, size_t size);
int sfs_tmp_remove(const char *name);
int sfs_tmp_clear(void);
int sfs_probe_rename_whiteout(int tmpfd);

/* passthrough.c */
int sfs_pass_open(struct sfs_file *f, int open_flags);
void sfs_pass_release(struct sfs_file *f);
bool sfs_pass_keep_cache(struct sfs_node *n);
bool sfs_pass_wanted(void);
int sfs_pass_reply(fuse_req_t req, const struct fuse_entry_param *e,
		   uint64_t fh, int backing, int open_flags);
struct fuse_entry_out;
void sfs_entry_out(struct fuse_entry_out *o, const struct fuse_entry_param *e);

/* tmpfile.c */
void sfs_tmpfile_request(int fd, const void *buf, size_t len);

/* resend.c; the resend bit is Linux 6.9's, newer than linux-libc-dev */
#define SFS_UNIQUE_RESEND (1ULL << 63)
struct fuse_forget_data;
void sfs_forget_batch(size_t count, struct fuse_forget_data *forgets);
void sfs_forget_read(const void *buf, size_t len);
/*
 * A request's first bytes read into the shared memory: with DONE and the
 * block's header, the 4 KiB class (shm.c); 8 bytes more took 8 KiB.
 */
#define SFS_RX_SHARED (4096 - 16)
void *sfs_forget_rx(size_t *size);
void sfs_resend_counted(struct sfs_node *n);
void sfs_resend_opened(struct sfs_file *f);
void sfs_resend_closed(struct sfs_file *f);
void sfs_resend_request(uint64_t unique, bool resent);
void sfs_resend_replied(uint64_t unique);
void sfs_resend_takeover(void);
/* the steps of a request that cannot be done twice (RENAME_EXCHANGE) */
enum { SFS_STEP_DISK = 1, SFS_STEP_NODES = 2 };
void sfs_resend_step(uint32_t step);
uint32_t sfs_req_step(void);

/* transport.c */
struct sfs_capture {
	size_t len;
	char buf[4096];		/* an INIT reply, and more */
};

int sfs_transport_setup(struct fuse_session *se);
bool sfs_transport_request(int fd, const void *buf, size_t len);
void sfs_transport_trim(char *buf, size_t n);
ssize_t sfs_transport_writev(int fd, struct iovec *iov, int count);
void sfs_transport_capture(struct sfs_capture *c);
bool sfs_req_resent(void);

/*
 * uring.c: FUSE over io_uring. The kernel ABI is protocol 7.42 (Linux
 * 6.14), newer than bookworm's linux-libc-dev (7.38): transcribed from
 * include/uapi/linux/fuse.h, under names of our own.
 */
#define SFS_FUSE_OVER_IO_URING (1ULL << 41)	/* INIT flags2, bit 9 */
#define SFS_FUSE_URING_IN_OUT_HEADER_SZ 128
#define SFS_FUSE_URING_OP_IN_OUT_SZ 128
/* enum fuse_uring_cmd, in the SQE's cmd_op */
#define SFS_FUSE_IO_URING_CMD_REGISTER 1
#define SFS_FUSE_IO_URING_CMD_COMMIT_AND_FETCH 2

/* struct fuse_uring_ent_in_out: the entry's part of the header buffer */
struct sfs_fuse_uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;	/* the request's unique, to commit it by */
	uint32_t payload_sz;	/* bytes of payload, either way */
	uint32_t padding;
	uint64_t reserved;
};

/* struct fuse_uring_req_header: a ring entry's first buffer */
struct sfs_fuse_uring_req_header {
	char in_out[SFS_FUSE_URING_IN_OUT_HEADER_SZ];	/* fuse_in/out_header */
	char op_in[SFS_FUSE_URING_OP_IN_OUT_SZ];	/* the opcode's struct */
	struct sfs_fuse_uring_ent_in_out ring_ent_in_out;
};

/* struct fuse_uring_cmd_req: in the SQE128's 80-byte command area */
struct sfs_fuse_uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

struct fuse_init_out;
int sfs_uring_cpus(const char *list);
bool sfs_uring_usable(uint64_t offered, bool supervised);
void sfs_uring_agreed(const struct fuse_init_out *o);
int sfs_uring_start(struct fuse_session *se);
ssize_t sfs_uring_reply(const struct iovec *iov, int count);
void sfs_uring_stop(void);
void sfs_uring_free(void);

/* handshake.c */
int sfs_handshake(struct fuse_session *se, bool supervised);
int sfs_handshake_replay(struct fuse_session *se);

/* io.c: all file data moves through here */
int sfs_io_init(const char *engine);
void sfs_io_shutdown(void);
void sfs_io_read(fuse_req_t req, int fd, size_t size, off_t off, bool direct);
struct sfs_claim;
void sfs_io_write(fuse_req_t req, int fd, struct fuse_bufvec *in, off_t off,
		  bool direct, const struct sfs_claim *claim);
void sfs_io_copy_file(fuse_req_t req, int in, off_t off_in, int out,
		      off_t off_out, size_t len, int flags);
int sfs_io_copy_range(int in, int out, off_t off, size_t len);
ssize_t sfs_io_pread(int fd, void *buf, size_t len, off_t off);
ssize_t sfs_io_pwrite(int fd, const void *buf, size_t len, off_t off);

/* control.c */
struct sfs_control_verb {
	const char *name;
	/* 0 or -errno; the result, or the error's message, goes in OUT */
	int (*fn)(int argc, char **argv, char *out, size_t size);
	int min, max;	/* how many arguments follow the verb */
};

int sfs_control_open(struct sfs_fs *fs);
void sfs_control_close(struct sfs_fs *fs);
int sfs_control_start(void);
void sfs_control_stop(void);

/* usage.c */
struct sfs_claim {
	struct sfs_node *node;	/* whose blocks to settle, or NULL */
	int64_t bytes;		/* room reserved until then */
	size_t len;		/* how much of the write fits */
};

int sfs_usage_parse(const char *s, uint64_t *out);
int sfs_usage_setup(struct sfs_fs *fs);
int sfs_usage_start(void);
void sfs_usage_stop(void);
int sfs_usage_save(bool clean);
int sfs_usage_recount(int64_t *frozen);
void sfs_usage_charge(int64_t bytes, int64_t inodes);
int sfs_usage_room(int64_t need);
int sfs_usage_reserve(int64_t need, int64_t *claimed);
void sfs_usage_unreserve(int64_t claimed);
void sfs_usage_seed(struct sfs_node *n, int fd);
void sfs_usage_track(struct sfs_node *n, int fd);
ssize_t sfs_usage_claim(struct sfs_node *n, int fd, off_t off, size_t len,
			struct sfs_claim *c);
void sfs_usage_settle(struct sfs_claim *c, int fd);
void sfs_usage_entry(int dirfd, const char *name);
void sfs_usage_gone(const struct stat *st);
struct statvfs;
void sfs_usage_statfs(struct statvfs *sv);
int sfs_usage_verb(int argc, char **argv, char *out, size_t size);
int sfs_capacity_verb(int argc, char **argv, char *out, size_t size);
/* gate.c: requests in flight, and the freeze that waits them out */
void sfs_gate_enter(void);
void sfs_gate_leave(void);
void sfs_gate_hold(void);
void sfs_gate_put(void);
int sfs_gate_close(int timeout_ms);
void sfs_gate_open(void);

/* linkup.c: the hard-link index before a freeze */
int sfs_linkup(char *out, size_t size);
void sfs_linkup_drop(void);

/* freeze.c */
int sfs_freeze_verb(int argc, char **argv, char *out, size_t size);
void sfs_freeze_fds(struct sfs_fdset *keep);
int sfs_freeze_takeover(struct sfs_fdset *keep);

/* switch.c: a freeze's change of the stack, the handles and the nodes */
struct sfs_switch_plan {
	struct sfs_layer frozen;	/* what the old upper becomes */
	int newfd;		/* the new upper, through the workdir's mount */
	int rootfd;		/* the root node's own descriptor on it */
	dev_t newdev;		/* the new upper's */
	ino_t newino;
	/* the nodes that outgrow their room, in the shared memory */
	struct sfs_freeze_grow *grow;
	size_t ngrow, grow_cap, grow_next;
	bool grow_failed;
	bool again;		/* finishing a switch a worker died in */
};
bool sfs_switch_nameless(struct sfs_node *n);
int sfs_switch_prepare(struct sfs_switch_plan *z);
void sfs_switch_unprepare(struct sfs_switch_plan *z);
void sfs_switch_run(struct sfs_switch_plan *z);
bool sfs_switch_pending(void);
void sfs_switch_fds(struct sfs_fdset *keep);
void sfs_switch_free_left(void);
void sfs_switch_rollback(void);
int sfs_switch_finish(struct sfs_switch_plan *z);

/* progress.c */
struct sfs_progress;
struct sfs_progress *sfs_progress_begin(int fd, int layer, off_t total);
void sfs_progress_set(struct sfs_progress *p, off_t done);
void sfs_progress_end(struct sfs_progress *p);
int sfs_progress_verb(int argc, char **argv, char *out, size_t size);

/* stats.c */
extern struct strata_stats *sfs_stats;
int sfs_stats_open(const char *path, bool fresh);
void sfs_stats_close(void);

static inline void sfs_count(enum strata_stat what, uint64_t n)
{
	if (sfs_stats)
		__atomic_fetch_add(&sfs_stats->v[what], n, __ATOMIC_RELAXED);
}

/*
 * shm.c: what a worker's successor finds. Every struct that lives there
 * (sfs_fs, sfs_node and its parts, sfs_file) is read by the next binary
 * too after an upgrade in place: change one, and bump SFS_SHM_VERSION.
 */
#define SFS_SHM_VERSION 6
#define SFS_SHM_CLASSES 51
/* The shared mapping's size: sparse, so only what is used is resident. */
#define SFS_SHM_SIZE (64ULL << 30)

enum sfs_shm_tag {
	SFS_SHM_FREE,
	SFS_SHM_OTHER,	/* part of something else, or not whole yet */
	SFS_SHM_NODE,	/* a node in the table */
	SFS_SHM_FILE,	/* an open file handle */
	SFS_SHM_FORGET,	/* FORGETs being done (resend.c) */
	SFS_SHM_REPLY,	/* lookups counted for a reply (resend.c) */
	SFS_SHM_RX,	/* where a thread reads requests (resend.c) */
};

struct sfs_shm {
	uint64_t layout;	/* of the binary that made it (sfs_shm_attach) */
	void *self;		/* where it is mapped, in every process */
	int memfd;		/* the supervisor's, kept for an exec */
	size_t size;
	_Atomic size_t top;	/* the unused end */
	pthread_mutex_t top_lock;
	pthread_mutex_t lock[SFS_SHM_CLASSES];
	void *free[SFS_SHM_CLASSES];
	struct sfs_fs *fs;	/* the filesystem's state, in the mapping */
	uint32_t init_len;	/* the kernel's INIT request, as it came */
	char init[512];
};

extern struct sfs_shm *sfs_shm;
int sfs_shm_create(size_t size);
int sfs_shm_attach(int fd, void *addr);
void *sfs_shm_alloc(size_t size);
void sfs_shm_free(void *p);
char *sfs_shm_strdup(const char *s);
void sfs_shm_tag(void *p, enum sfs_shm_tag tag);
bool sfs_shm_tagged(const void *p, enum sfs_shm_tag tag);
void sfs_shm_walk(enum sfs_shm_tag tag, void (*fn)(void *p, void *arg),
		  void *arg);
void sfs_shm_takeover(void);

/* supervisor.c */
int sfs_run(const struct sfs_params *p, struct fuse_args *args, char **argv);

/* worker.c */
struct sfs_fdset {
	size_t size;		/* descriptors below this fit */
	uint64_t *bits;
};

/* A worker's exit status when it stopped to be replaced. */
#define SFS_WORKER_REPLACED 75
/* ... and when it could not take over from the one before. */
#define SFS_WORKER_UNFIT 76

int sfs_fd_each(int (*fn)(int fd, void *arg), void *arg);
int sfs_fdset_own(struct sfs_fdset *s);
void sfs_fdset_add(struct sfs_fdset *s, int fd);
void sfs_fdset_free(struct sfs_fdset *s);
int sfs_serve(struct fuse_session *se, bool replay, bool supervised);
int sfs_worker_run(struct fuse_session *se, const sigset_t *mask,
		   pid_t supervisor, bool takeover,
		   const struct sfs_fdset *base);

/* util.c */
long long sfs_now_ns(void);
void sfs_handles_init(void);
void sfs_handle_add(struct sfs_hlink *head, struct sfs_hlink *h);
void sfs_handle_del(struct sfs_hlink *h);
struct sfs_hlink *sfs_handle_first(struct sfs_hlink *head);
int sfs_proc_path(int fd, char *buf, size_t size);
int sfs_reopen(int fd, int flags);
int sfs_fstat(int fd, struct stat *st);
int sfs_open_entry(int dirfd, const char *name, mode_t type);
int sfs_rename(int olddir, const char *old, int newdir, const char *new,
	       unsigned int flags);
int sfs_unlinkat(int dirfd, const char *name, int flags);
int sfs_errno(int ret);
void sfs_reply_err(fuse_req_t req, int ret);
void sfs_new_owner(struct sfs_node *dir, mode_t *mode, uid_t *uid, gid_t *gid);
int sfs_fd_chmod(int fd, mode_t mode);
bool sfs_req_in_group(fuse_req_t req, gid_t gid);
bool sfs_req_capable(fuse_req_t req, int cap);
int sfs_fhandle_get(int dirfd, const char *path, int at_flags,
		    unsigned char *bytes, size_t room, int *type);
int sfs_fhandle_open(int mountfd, const unsigned char *bytes, size_t len,
		     int type, int flags);

#endif
