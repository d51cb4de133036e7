// SPDX-License-Identifier: Apache-2.0
/*
 * resend.c: what a worker that died in the middle of requests leaves
 * for the next one to count right (see supervisor.c). The kernel sends
 * again every request a worker read and did not answer; the handlers
 * make that safe for the filesystem (sfs_req_resent). What is left is
 * the kernel's lookup counts, which the nodes mirror in nlookup:
 *
 *  - FORGET has no answer, so the kernel never sends one again: a batch
 *    read and not done would leave nodes forever. The kernel hands a
 *    request over even to a thread already killed, which dies on its way
 *    out of read(2): the thread that answered an UNLINK is often the one
 *    that reads the FORGET it causes. So each thread reads the first
 *    SFS_RX_SHARED bytes of every request into the shared memory
 *    (sfs_forget_rx, transport.c): a FORGET that fits there is its own
 *    record from the moment the kernel wrote it, and each entry is marked
 *    done there before it is done; the next worker finishes what is left
 *    (sfs_rx_finish). A bigger batch is written down in the shared memory
 *    once read (sfs_forget_read), with the window between the two. At
 *    worst the entry in hand when the worker died is lost; none is ever
 *    done twice.
 *
 *  - A reply that names nodes (LOOKUP, CREATE, READDIRPLUS...) counts a
 *    lookup for each before it goes out, as the kernel will once it has
 *    it, and an OPEN or CREATE makes a handle. A worker that dies before
 *    the reply is out leaves counts the kernel never got, and a handle it
 *    will never release. Each thread writes down the nodes it counted
 *    and the handles it made for the request in hand (after making them,
 *    so that nothing is ever undone that was not done), and clears the
 *    list once the reply is out. A new worker keeps the lists it finds;
 *    when the kernel sends one of those requests again, that reply never
 *    reached it: the counts are undone and the handles closed. The
 *    kernel queues all it sends again ahead of anything new, so once a
 *    new request is read, every request sent again has
 *    been read too; but threads read side by side, and one may still be
 *    on its way from its read to here with a request sent again while
 *    another already handles a new one. So the lists left over are
 *    dropped (replies that did reach the kernel) only once a new request
 *    comes SFS_RESEND_GRACE_NS after the first new one; until then, and
 *    across the takeovers of workers killed sooner, a list waits for a
 *    request with its unique, which only a resend can bring. Dropping
 *    them at the first new request left counts the kernel never had, and
 *    their nodes until the unmount: a listing's worth per death.
 *
 *  - A request that cannot be done twice (RENAME_EXCHANGE swaps back)
 *    writes down on the same list how far it got (sfs_resend_step):
 *    sent again, its handler finds that step (sfs_req_step) and only
 *    finishes. What is left is the few instructions between the system
 *    call and the step's store.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/fuse.h>
#include <string.h>

#include "stratafs.h"

struct sfs_forgets {
	uint32_t count;
	_Atomic uint32_t done;
	struct {
		struct sfs_node *node;
		uint64_t nlookup;
	} ent[];
};

/*
 * Where a thread reads the start of each request. DONE counts the entries
 * of a FORGET there that are done, or being done; another request, or a
 * FORGET longer than the area (whose record is a struct sfs_forgets), has
 * nothing to finish.
 */
struct sfs_rx {
	_Atomic uint32_t done;
	uint32_t unused;
	union {
		struct fuse_in_header in;
		char data[SFS_RX_SHARED];
	};
};

struct sfs_replying {
	_Atomic uint64_t unique;	/* the request, without the resend bit */
	_Atomic uint32_t step;		/* how far it got (sfs_resend_step) */
	uint32_t cap;
	_Atomic uint32_t count;
	uintptr_t ent[];	/* a node, or a handle (SFS_REPLYING_FILE) */
};

#define SFS_REPLYING_MIN 64
/* the low bit of an entry: a handle opened, not a lookup counted */
#define SFS_REPLYING_FILE 1

/* This thread's list, in the shared memory. */
static __thread struct sfs_replying *sfs_replying;
/* The request this thread is handling. */
static __thread uint64_t sfs_unique;
/* For a request sent again: the step the dead worker had written down. */
static __thread uint32_t sfs_step;
/* Whether lists a dead worker left may still be matched. */
static atomic_bool sfs_unreplied_open;
/* When the first new request came after a takeover: 0 before. */
static long long sfs_unreplied_first_new;
#define SFS_RESEND_GRACE_NS (1000LL * 1000 * 1000)
/* Over sfs->unreplied: a list is freed by whoever matches it first. */
static pthread_mutex_t sfs_unreplied_lock = PTHREAD_MUTEX_INITIALIZER;

/* The FORGET this thread read, written down before it is handled. */
static __thread struct sfs_forgets *sfs_forget_pending;
/* This thread's area; whether the request in hand was read into it. */
static __thread struct sfs_rx *sfs_rx;
static __thread bool sfs_rx_fresh;
/* Frees a thread's area when it ends (sfs_rx_exit). */
static pthread_key_t sfs_rx_key;
static pthread_once_t sfs_rx_once = PTHREAD_ONCE_INIT;

/* A journal of COUNT entries, tagged once whole, or NULL. */
static struct sfs_forgets *sfs_forgets_new(size_t count,
					   const struct fuse_forget_one *one,
					   const struct fuse_forget_data *data)
{
	struct sfs_forgets *j = sfs_shm ?
		sfs_shm_alloc(sizeof(*j) + count * sizeof(j->ent[0])) : NULL;

	if (!j)
		return NULL;
	j->count = (uint32_t)count;
	for (size_t i = 0; i < count; i++) {
		j->ent[i].node = sfs_node_get(one ? one[i].nodeid : data[i].ino);
		j->ent[i].nlookup = one ? one[i].nlookup : data[i].nlookup;
	}
	sfs_shm_tag(j, SFS_SHM_FORGET);
	return j;
}

/*
 * The entries of a FORGET or BATCH_FORGET of LEN bytes at BUF, which the
 * kernel wrote whole: how many, *ONE pointing at them (at SINGLE for a
 * FORGET). 0 for any other request.
 */
static uint32_t sfs_forget_parse(const void *buf, size_t len,
				 struct fuse_forget_one *single,
				 const struct fuse_forget_one **one)
{
	const struct fuse_in_header *in = buf;
	const struct fuse_batch_forget_in *b = (const void *)(in + 1);

	if (len < sizeof(*in))
		return 0;
	if (in->opcode == FUSE_FORGET &&
	    len >= sizeof(*in) + sizeof(struct fuse_forget_in)) {
		single->nodeid = in->nodeid;
		single->nlookup = ((const struct fuse_forget_in *)(in + 1))->nlookup;
		*one = single;
		return 1;
	}
	if (in->opcode == FUSE_BATCH_FORGET && len >= sizeof(*in) + sizeof(*b) &&
	    b->count <= (len - sizeof(*in) - sizeof(*b)) /
				sizeof(struct fuse_forget_one)) {
		*one = (const struct fuse_forget_one *)(b + 1);
		return b->count;
	}
	return 0;
}

/* The FORGET whose record the area is, if any: its entries, as above. */
static uint32_t sfs_rx_forgets(struct sfs_rx *rx,
			       struct fuse_forget_one *single,
			       const struct fuse_forget_one **one)
{
	if (rx->in.len > SFS_RX_SHARED)
		return 0;
	return sfs_forget_parse(rx->data, rx->in.len, single, one);
}

static void sfs_rx_free(struct sfs_rx *rx)
{
	sfs_shm_tag(rx, SFS_SHM_OTHER);
	sfs_shm_free(rx);
}

/*
 * A thread ends: its area goes, unless it holds a FORGET libfuse read
 * and dropped on its way out (a worker told to stop), left for the next.
 */
static void sfs_rx_exit(void *p)
{
	struct fuse_forget_one single;
	const struct fuse_forget_one *one;
	struct sfs_rx *rx = p;

	if (sfs_rx_forgets(rx, &single, &one) <= atomic_load(&rx->done))
		sfs_rx_free(rx);
}

static void sfs_rx_key_create(void)
{
	if (pthread_key_create(&sfs_rx_key, sfs_rx_exit) != 0)
		sfs_rx_key = (pthread_key_t)-1;
}

/*
 * Where this thread reads the first *SIZE bytes of its next request, in
 * the shared memory; NULL without one (or out of it): then libfuse's
 * buffer takes it all.
 */
void *sfs_forget_rx(size_t *size)
{
	struct sfs_rx *rx = sfs_rx;

	sfs_rx_fresh = false;
	if (!sfs_shm)
		return NULL;
	if (!rx) {
		pthread_once(&sfs_rx_once, sfs_rx_key_create);
		if (sfs_rx_key == (pthread_key_t)-1)
			return NULL;
		rx = sfs_shm_alloc(sizeof(*rx));
		if (!rx)
			return NULL;
		if (pthread_setspecific(sfs_rx_key, rx) != 0) {
			sfs_shm_free(rx);
			return NULL;
		}
		sfs_shm_tag(rx, SFS_SHM_RX);
		sfs_rx = rx;
	}
	/*
	 * The FORGET before is done: first no FORGET, then nothing done.
	 * The other way round, a worker killed in between would leave its
	 * successor a FORGET to do again.
	 */
	__atomic_store_n(&rx->in.opcode, 0, __ATOMIC_SEQ_CST);
	atomic_store(&rx->done, 0);
	sfs_rx_fresh = true;
	*size = SFS_RX_SHARED;
	return rx->data;
}

/*
 * A request was read: a FORGET or BATCH_FORGET (LEN bytes at BUF, which
 * the kernel wrote whole) that did not fit in the thread's area is
 * written down at once, for its handler.
 */
void sfs_forget_read(const void *buf, size_t len)
{
	struct fuse_forget_one single;
	const struct fuse_forget_one *one;
	uint32_t count = sfs_forget_parse(buf, len, &single, &one);
	bool fresh = sfs_rx_fresh;

	sfs_rx_fresh = false;
	sfs_forget_pending = NULL;
	if (count && !(fresh && len <= SFS_RX_SHARED))
		sfs_forget_pending = sfs_forgets_new(count, one, NULL);
}

/*
 * Where the FORGET of COUNT entries libfuse hands on was written down:
 * the thread's area, or sfs_forget_pending's journal (NULL: nowhere).
 */
static _Atomic uint32_t *sfs_forget_record(size_t count,
					    struct fuse_forget_data *forgets)
{
	struct sfs_forgets *j = sfs_forget_pending;
	struct fuse_forget_one single;
	const struct fuse_forget_one *one;

	/* libfuse hands on what was read, in order; anything else: anew */
	if (j && j->count == count)
		return &j->done;
	if (j) {
		sfs_shm_tag(j, SFS_SHM_OTHER);
		sfs_shm_free(j);
	}
	sfs_forget_pending = NULL;
	if (sfs_rx && sfs_rx_forgets(sfs_rx, &single, &one) == count &&
	    atomic_load(&sfs_rx->done) == 0)
		return &sfs_rx->done;
	sfs_forget_pending = sfs_forgets_new(count, NULL, forgets);
	return sfs_forget_pending ? &sfs_forget_pending->done : NULL;
}

void sfs_forget_batch(size_t count, struct fuse_forget_data *forgets)
{
	_Atomic uint32_t *done = sfs_forget_record(count, forgets);
	struct sfs_forgets *j = sfs_forget_pending;

	sfs_forget_pending = NULL;
	for (size_t i = 0; i < count; i++) {
		if (done)
			atomic_store(done, (uint32_t)i + 1);
		sfs_node_forget(sfs_node_get(forgets[i].ino),
				forgets[i].nlookup);
	}
	if (j) {
		sfs_shm_tag(j, SFS_SHM_OTHER);
		sfs_shm_free(j);
	}
}

/* A list with room for one more node, or NULL (then it goes unwritten). */
static struct sfs_replying *sfs_replying_room(void)
{
	struct sfs_replying *r = sfs_replying, *big;
	uint32_t count = r ? atomic_load(&r->count) : 0;
	uint32_t cap = r ? r->cap * 2 : SFS_REPLYING_MIN;

	if (r && count < r->cap)
		return r;
	big = sfs_shm_alloc(sizeof(*big) + cap * sizeof(big->ent[0]));
	if (!big)
		return NULL;
	big->cap = cap;
	atomic_store(&big->unique, sfs_unique);
	if (r) {
		memcpy(big->ent, r->ent, count * sizeof(r->ent[0]));
		atomic_store(&big->step, atomic_load(&r->step));
	}
	atomic_store(&big->count, count);
	/* never two lists for one request: the old one goes first */
	if (r) {
		sfs_shm_tag(r, SFS_SHM_OTHER);
		sfs_shm_free(r);
	}
	sfs_shm_tag(big, SFS_SHM_REPLY);
	sfs_replying = big;
	return big;
}

/*
 * This thread's list, for the request in hand: one a failed reply left
 * (its counts were undone) starts over.
 */
static struct sfs_replying *sfs_replying_mine(void)
{
	struct sfs_replying *r = sfs_replying;

	if (r && atomic_load(&r->unique) != sfs_unique) {
		atomic_store(&r->count, 0);
		atomic_store(&r->step, 0);
		atomic_store(&r->unique, sfs_unique);
	}
	return sfs_replying_room();
}

/* ENT was made for the reply to the request in hand. */
static void sfs_replying_add(uintptr_t ent)
{
	struct sfs_replying *r;
	uint32_t count;

	if (!sfs_shm || !sfs_unique)
		return;
	r = sfs_replying_mine();
	if (!r)
		return;
	count = atomic_load(&r->count);
	r->ent[count] = ent;
	atomic_store(&r->count, count + 1);
}

/* N was counted for the reply to the request in hand. */
void sfs_resend_counted(struct sfs_node *n)
{
	sfs_replying_add((uintptr_t)n);
}

/*
 * F was opened for the reply to the request in hand: a worker that dies
 * before the reply is out leaves a handle the kernel will never release.
 */
void sfs_resend_opened(struct sfs_file *f)
{
	sfs_replying_add((uintptr_t)f | SFS_REPLYING_FILE);
}

/*
 * F is closed before the reply (an error after the open): off the list
 * first, in one store (0 stands for nothing), so that a resend never
 * closes it twice.
 */
void sfs_resend_closed(struct sfs_file *f)
{
	struct sfs_replying *r = sfs_replying;
	uintptr_t ent = (uintptr_t)f | SFS_REPLYING_FILE;

	if (!r || atomic_load(&r->unique) != sfs_unique)
		return;
	for (uint32_t i = 0; i < atomic_load(&r->count); i++)
		if (r->ent[i] == ent)
			r->ent[i] = 0;
}

/* The request in hand got as far as STEP; 0 is the start. */
void sfs_resend_step(uint32_t step)
{
	struct sfs_replying *r;

	if (!sfs_shm || !sfs_unique)
		return;
	r = sfs_replying_mine();
	if (r)
		atomic_store(&r->step, step);
}

uint32_t sfs_req_step(void)
{
	return sfs_step;
}

/* The reply to UNIQUE is out: the kernel has the counts now. */
void sfs_resend_replied(uint64_t unique)
{
	struct sfs_replying *r = sfs_replying;

	if (r && atomic_load(&r->unique) == (unique & ~SFS_UNIQUE_RESEND)) {
		atomic_store(&r->count, 0);
		atomic_store(&r->step, 0);
	}
}

/* The counts and handles of a reply that never reached the kernel. */
static void sfs_replying_undo(struct sfs_replying *r)
{
	for (uint32_t i = 0; i < atomic_load(&r->count); i++) {
		uintptr_t ent = r->ent[i];

		if (ent & SFS_REPLYING_FILE)
			sfs_file_close((struct sfs_file *)(ent & ~SFS_REPLYING_FILE));
		else if (ent)
			sfs_node_forget((struct sfs_node *)ent, 1);
	}
	sfs_shm_tag(r, SFS_SHM_OTHER);
	sfs_shm_free(r);
}

static void sfs_replying_drop(struct sfs_replying *r)
{
	sfs_shm_tag(r, SFS_SHM_OTHER);
	sfs_shm_free(r);
}

/* A request was read: UNIQUE as the kernel sent it. */
void sfs_resend_request(uint64_t unique, bool resent)
{
	bool drop = false;
	size_t left = 0;

	sfs_unique = unique & ~SFS_UNIQUE_RESEND;
	sfs_step = 0;
	if (!atomic_load(&sfs_unreplied_open))
		return;
	pthread_mutex_lock(&sfs_unreplied_lock);
	if (!resent) {
		long long now = sfs_now_ns();

		if (!sfs_unreplied_first_new)
			sfs_unreplied_first_new = now;
		drop = now - sfs_unreplied_first_new >= SFS_RESEND_GRACE_NS;
	}
	for (size_t i = 0; i < SFS_MAX_THREADS * 2; i++) {
		struct sfs_replying *r = sfs->unreplied[i];

		if (!r)
			continue;
		if (resent && atomic_load(&r->unique) == sfs_unique) {
			sfs->unreplied[i] = NULL;
			sfs_step = atomic_load(&r->step);
			sfs_replying_undo(r);
		} else if (drop) {
			sfs->unreplied[i] = NULL;
			sfs_replying_drop(r);
		} else {
			left++;
		}
	}
	if (!left)
		atomic_store(&sfs_unreplied_open, false);
	pthread_mutex_unlock(&sfs_unreplied_lock);
}

static void sfs_forgets_finish(void *p, void *arg)
{
	struct sfs_forgets *j = p;

	for (uint32_t i = atomic_load(&j->done); i < j->count; i++)
		atomic_fetch_sub(&j->ent[i].node->nlookup, j->ent[i].nlookup);
	sfs_shm_tag(j, SFS_SHM_OTHER);
	sfs_shm_free(j);
}

/* A dead worker's thread's area: the FORGET it read and left undone. */
static void sfs_rx_finish(void *p, void *arg)
{
	struct fuse_forget_one single;
	const struct fuse_forget_one *one;
	struct sfs_rx *rx = p;
	uint32_t count = sfs_rx_forgets(rx, &single, &one);

	for (uint32_t i = atomic_load(&rx->done); i < count; i++)
		atomic_fetch_sub(&sfs_node_get(one[i].nodeid)->nlookup,
				 one[i].nlookup);
	sfs_rx_free(rx);
}

static void sfs_replying_keep(void *p, void *arg)
{
	struct sfs_replying *r = p;
	size_t *slot = arg;
	const size_t max = SFS_MAX_THREADS * 2;

	if (!atomic_load(&r->count) && !atomic_load(&r->step)) {
		sfs_replying_drop(r);
		return;
	}
	/* full: the oldest goes, the likeliest to be a reply that got out */
	if (*slot == max) {
		sfs_replying_drop(sfs->unreplied[0]);
		memmove(&sfs->unreplied[0], &sfs->unreplied[1],
			(max - 1) * sizeof(sfs->unreplied[0]));
		(*slot)--;
	}
	sfs_shm_tag(r, SFS_SHM_OTHER);
	sfs->unreplied[(*slot)++] = r;
}

/*
 * A new worker, before it counts references again from nlookup: the
 * FORGETs left half done are finished, and the lists of counts for
 * replies in flight are kept to be matched. Those the worker before
 * kept and had not matched stay too: a worker killed before it read
 * what the kernel sent again leaves those requests to be sent again to
 * this one (dropping them counted a lookup twice, a node per death).
 */
void sfs_resend_takeover(void)
{
	size_t slot = 0;

	for (size_t i = 0; i < SFS_MAX_THREADS * 2; i++) {
		struct sfs_replying *r = sfs->unreplied[i];

		sfs->unreplied[i] = NULL;
		if (r)
			sfs->unreplied[slot++] = r;
	}
	sfs_shm_walk(SFS_SHM_FORGET, sfs_forgets_finish, NULL);
	sfs_shm_walk(SFS_SHM_RX, sfs_rx_finish, NULL);
	sfs_shm_walk(SFS_SHM_REPLY, sfs_replying_keep, &slot);
	sfs_unreplied_first_new = 0;
	atomic_store(&sfs_unreplied_open, slot > 0);
}
