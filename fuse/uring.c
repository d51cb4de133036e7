// SPDX-License-Identifier: Apache-2.0
/*
 * uring.c: FUSE over io_uring, the transport (Linux 6.14+, protocol
 * 7.42, CONFIG_FUSE_IO_URING, module parameter fuse.enable_uring=1).
 * libfuse 3.14 does not speak it; we speak the kernel ABI ourselves, as
 * Documentation/filesystems/fuse-io-uring.rst and fs/fuse/dev_uring.c
 * describe it, and still hand every request to libfuse's low-level ops.
 *
 * How it runs. The INIT reply carries FUSE_OVER_IO_URING (handshake.c).
 * The kernel keeps one queue per possible CPU and puts a request on the
 * queue of the CPU that sent it (task_cpu). Each queue here is served by
 * SFS_URING_THREADS threads pinned to that CPU, each with an io_uring of
 * its own (IORING_SETUP_SQE128: struct fuse_uring_cmd_req lives in the
 * SQE's 80-byte command area) and SFS_URING_DEPTH ring entries, handed
 * to the kernel with IORING_OP_URING_CMD / FUSE_IO_URING_CMD_REGISTER.
 * A thread runs its requests' handlers itself, and a handler may wait
 * (a read of a lower layer on a stalled filesystem; even the I/O
 * engine's submission, as io_uring polls a FUSE file synchronously): the
 * requests of that thread's entries wait behind it. One entry a thread
 * means that such a wait holds no request but its own, while the other
 * threads serve the queue (the kernel hands a request to any entry that
 * is free, the one freed last first: a lone caller keeps one thread
 * busy, warm on its CPU). Each entry is two buffers:
 * a struct fuse_uring_req_header (the fuse_in_header, the opcode's own
 * struct, the entry's commit id and payload size) and the payload (every
 * other argument). Once every queue has an entry, the kernel stops
 * queueing requests on /dev/fuse and completes an entry's command with
 * a request in its buffers instead: no read(2) per request, and the
 * answer is given on the CPU that asked. A reply goes back into the same
 * buffers, and FUSE_IO_URING_CMD_COMMIT_AND_FETCH both answers and hands
 * the entry back for the next request: no write(2) either.
 *
 * libfuse takes a request as one buffer laid out as /dev/fuse delivers
 * it (header, opcode struct, the rest): the thread copies it so, and
 * libfuse's replies reach sfs_uring_reply through the session's custom
 * I/O hook (transport.c), which finds the entry by the request's unique.
 * The copy also frees the entry's buffers for the reply at once: a
 * handler may still read its request (a name) after replying, and the
 * kernel may put the next request in those buffers as soon as the
 * commit is in.
 *
 * Only a ring's own thread submits to it. A reply made on it is queued
 * in the SQ and goes in with the wait for the next request: one
 * io_uring_enter(2) per request. A reply made on another thread (the
 * I/O engine's completion thread) is pushed on the ring's list and its
 * thread woken through an eventfd the ring reads. Either way the entry's
 * command is the pinned thread's, which matters: the kernel hands the
 * next request over in the context of the task that submitted the
 * command (io_uring_cmd_complete_in_task).
 *
 * Still on /dev/fuse (fs/fuse/dev_uring.c, fuse_io_uring_ops, 6.18):
 * INIT, FORGET and BATCH_FORGET, INTERRUPT, and every notification we
 * send; libfuse's loop keeps serving the device for them.
 *
 * A worker that dies. What the kernel does with a dead worker's ring
 * entries (fs/fuse/dev_uring.c, Linux 6.18; shown by tests/integration/
 * test_uring.py, which serves supervised over io_uring through
 * SFS_URING_SUPERVISED_ENV):
 *  - an idle entry is cancelled when its task exits (IO_URING_F_CANCEL),
 *    and the next worker registers entries of its own on the same
 *    queues: registering again works, and requests flow again;
 *  - a request being handed to an entry as its task dies fails with
 *    ECANCELED, and the program that made it sees the error;
 *  - a request the dead worker had been handed stays with its entry:
 *    FUSE_NOTIFY_RESEND queues again only what was read from /dev/fuse
 *    (fuse_resend walks the device queues, not the ring queues), so the
 *    program waits until the mount goes.
 * Neither can be mended from here. Supervised (supervisor.c), the mount
 * is served through /dev/fuse, where a worker's death is never seen;
 * -o nosupervisor serves over io_uring.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <stddef.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stratafs.h"

/* The kernel writes requests into the entries behind valgrind's back. */
#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)(addr), (void)(len))
#define RUNNING_ON_VALGRIND 0
#endif

/* Threads serving a CPU's queue: as many requests as it holds at once. */
#define SFS_URING_THREADS 8
/* Entries a thread holds: more would wait behind a handler that waits. */
#define SFS_URING_DEPTH 1
/* Room in the SQ for the entries' commits and the eventfd's read. */
#define SFS_URING_SQ (SFS_URING_DEPTH * 2)
/* The kernel's FUSE_MIN_READ_BUFFER: no payload is ever smaller. */
#define SFS_URING_MIN_PAYLOAD 8192
/* The kernel's FUSE_DEFAULT_MAX_PAGES_PER_REQ, without FUSE_MAX_PAGES. */
#define SFS_URING_DEFAULT_PAGES 32

/* the sizes include/uapi/linux/fuse.h gives them */
_Static_assert(sizeof(struct sfs_fuse_uring_req_header) == 288,
	       "struct fuse_uring_req_header");
_Static_assert(sizeof(struct sfs_fuse_uring_cmd_req) == 24,
	       "struct fuse_uring_cmd_req");

struct sfs_uring_server;

/*
 * One ring entry. Its buffers belong to the kernel between a REGISTER
 * or COMMIT_AND_FETCH and the completion that hands a request over.
 * unique is the request it holds (its commit id), 0 once answered:
 * whoever swaps it to 0 commits, so an entry is never committed twice.
 */
struct sfs_uring_ent {
	struct sfs_uring_server *q;
	struct sfs_fuse_uring_req_header *hdr;
	char *payload;
	struct iovec iov[2];	/* what REGISTER hands the kernel */
	_Atomic uint64_t unique;
	/* answered on another thread: on q->replied until committed */
	uint64_t replied;
	struct sfs_uring_ent *next;
};

/*
 * One of the threads serving a kernel queue: its ring, its entries.
 * Lives from sfs_uring_start to sfs_uring_free, which runs once its
 * thread is joined and the I/O engine, the one other thread that
 * replies, has shut down. The ring, efd_val and req are the thread's
 * alone; replied is a lock-free stack any replying thread pushes on and
 * this one empties; the rest is set before the thread starts and never
 * changes.
 */
struct sfs_uring_server {
	struct io_uring ring;	/* its own thread's alone */
	/* entries answered on other threads, for the queue's thread */
	struct sfs_uring_ent *_Atomic replied;
	int efd;		/* wakes the thread for them */
	uint64_t efd_val;	/* where the ring reads the eventfd to */
	pthread_t thread;
	int qid;		/* the kernel's queue, the CPU the thread runs on */
	int err;		/* setting up: 0 once the kernel has the entries */
	bool ring_ok;		/* ring made, to be torn down */
	bool thread_ok;		/* thread started, to be joined */
	char *req;		/* the request, laid out for libfuse */
	size_t req_size;
	char *bufs;		/* every entry's header and payload */
	size_t bufs_size;
	struct sfs_uring_ent ent[SFS_URING_DEPTH];
};

static struct {
	struct fuse_session *se;
	int devfd;
	int n;			/* threads serving them, SFS_URING_THREADS each */
	struct sfs_uring_server *q;	/* n of them while running, else NULL */
	sem_t set_up;		/* one post per thread done setting up */
	atomic_bool stopping;
} sfs_uring;

/* The entry whose request this thread is handling. */
static __thread struct sfs_uring_ent *sfs_uring_cur;
/* The queue whose thread this is, on a queue's thread. */
static __thread struct sfs_uring_server *sfs_uring_self;

/* The user_data of the eventfd read: an address no entry has. */
#define SFS_URING_WAKE ((void *)&sfs_uring)

/*
 * The number of CPUs in a kernel CPU list ("0-3,5"), as
 * /sys/devices/system/cpu/possible gives it: the kernel makes that many
 * queues (num_possible_cpus()). Negative errno for a malformed list.
 */
int sfs_uring_cpus(const char *list)
{
	const char *s = list;
	int count = 0;

	while (*s && *s != '\n') {
		char *end;
		long a = strtol(s, &end, 10), b = a;

		if (end == s || a < 0)
			return -EINVAL;
		s = end;
		if (*s == '-') {
			b = strtol(s + 1, &end, 10);
			if (end == s + 1 || b < a)
				return -EINVAL;
			s = end;
		}
		if (b - a + 1 > 4096 - count)
			return -EINVAL;
		count += (int)(b - a + 1);
		if (*s == ',')
			s++;
		else if (*s && *s != '\n')
			return -EINVAL;
	}
	return count ? count : -EINVAL;
}

static int sfs_uring_possible(void)
{
	char buf[256];
	FILE *f = fopen("/sys/devices/system/cpu/possible", "re");
	int ret;

	if (!f)
		return -errno;
	ret = fgets(buf, sizeof(buf), f) ? sfs_uring_cpus(buf) : -EIO;
	fclose(f);
	return ret;
}

/*
 * For tests only (tests/integration/test_uring.py): serve over io_uring
 * though supervised, to show what a worker's death does to its requests.
 */
#define SFS_URING_SUPERVISED_ENV "STRATAFS_URING_SUPERVISED"

/*
 * Whether the kernel should be asked for FUSE over io_uring in INIT,
 * given the flags it OFFERED. Said once in the log when it is not used
 * though the options did not rule it out. SUPERVISED: another worker
 * may follow this one, which the transport cannot carry (the top of the
 * file says why).
 */
bool sfs_uring_usable(uint64_t offered, bool supervised)
{
	const char *t = sfs->params.transport;
	const char *why = NULL;
	struct io_uring probe;
	char reason[160];
	int ret;

	if (t && !strcmp(t, "dev"))
		return false;
	if (supervised && getenv(SFS_URING_SUPERVISED_ENV)) {
		strata_warn("%s is set: FUSE over io_uring though supervised; a "
			    "worker's death fails or strands its requests",
			    SFS_URING_SUPERVISED_ENV);
		supervised = false;
	}
	if (RUNNING_ON_VALGRIND) {
		/* valgrind 3.19 runs the rings' registration into a hang */
		why = "valgrind cannot run it";
	} else if (!(offered & SFS_FUSE_OVER_IO_URING)) {
		/* the kernel offers it only while the parameter is set */
		why = access(STRATA_FUSE_URING_PARAM, F_OK) ?
			      "this kernel has no FUSE over io_uring (Linux 6.14 "
			      "and later, CONFIG_FUSE_IO_URING)" :
			      "the module parameter fuse.enable_uring is 0 "
			      "(" STRATA_FUSE_URING_PARAM ")";
	} else if (supervised) {
		why = "a worker's death would fail or strand the requests its "
		      "rings held (Linux 6.18 resends only what waits on "
		      "/dev/fuse); -o nosupervisor serves over io_uring";
	} else if ((ret = io_uring_queue_init(2, &probe,
					      IORING_SETUP_SQE128)) < 0) {
		snprintf(reason, sizeof(reason),
			 "io_uring refused (%s): kernel.io_uring_disabled, "
			 "seccomp or privileges", strerror(-ret));
		why = reason;
	} else {
		io_uring_queue_exit(&probe);
		return true;
	}
	if (t)
		strata_warn("transport=uring: %s: serving through /dev/fuse",
			    why);
	else
		strata_info("transport: /dev/fuse, not io_uring: %s", why);
	return false;
}

/*
 * The payload buffer an entry needs: the kernel refuses a smaller one
 * (fuse_uring_create: the larger of FUSE_MIN_READ_BUFFER, max_write and
 * max_pages pages), from the INIT reply that will go out.
 */
void sfs_uring_agreed(const struct fuse_init_out *o)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t pages = (o->flags & FUSE_MAX_PAGES) && o->max_pages ?
			       o->max_pages : SFS_URING_DEFAULT_PAGES;
	size_t size = SFS_URING_MIN_PAYLOAD;

	if (o->max_write > size)
		size = o->max_write;
	if (pages * page > size)
		size = pages * page;
	sfs->uring_payload = (uint32_t)size;
}

/* Prepares an SQE128 for a FUSE command on ENT. */
static void sfs_uring_prep(struct io_uring_sqe *sqe, struct sfs_uring_ent *e,
			   uint32_t op, uint64_t commit_id)
{
	/* an SQE128 is two SQEs' room; the command area runs into the second */
	char *raw = (char *)(uintptr_t)sqe;
	struct sfs_fuse_uring_cmd_req *cmd = (void *)(raw + offsetof(
		struct io_uring_sqe, cmd));

	memset(raw, 0, 2 * sizeof(*sqe));
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = sfs_uring.devfd;
	sqe->cmd_op = op;
	cmd->commit_id = commit_id;
	cmd->qid = (uint16_t)e->q->qid;
	io_uring_sqe_set_data(sqe, e);
}

/* An SQE of Q's ring, submitting what waits if it is full. */
static struct io_uring_sqe *sfs_uring_sqe(struct sfs_uring_server *q)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

	if (!sqe) {
		io_uring_submit(&q->ring);
		sqe = io_uring_get_sqe(&q->ring);
	}
	return sqe;
}

/*
 * On Q's thread: answers the request E holds and hands E back for the
 * next one, with the next submit.
 */
static void sfs_uring_commit(struct sfs_uring_server *q,
			     struct sfs_uring_ent *e, uint64_t unique)
{
	struct io_uring_sqe *sqe = sfs_uring_sqe(q);

	if (!sqe) {
		/* never: the SQ holds twice the entries */
		strata_err("FUSE over io_uring: queue %d: no room to commit",
			   q->qid);
		return;
	}
	sfs_uring_prep(sqe, e, SFS_FUSE_IO_URING_CMD_COMMIT_AND_FETCH, unique);
}

/* Reads the eventfd through the ring: its completion wakes the thread. */
static int sfs_uring_arm_wake(struct sfs_uring_server *q)
{
	struct io_uring_sqe *sqe = sfs_uring_sqe(q);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_read(sqe, q->efd, &q->efd_val, sizeof(q->efd_val), 0);
	io_uring_sqe_set_data(sqe, SFS_URING_WAKE);
	return 0;
}

/* From another thread: E is answered, for Q's thread to commit. */
static void sfs_uring_hand_over(struct sfs_uring_server *q,
				struct sfs_uring_ent *e, uint64_t unique)
{
	struct sfs_uring_ent *head = atomic_load(&q->replied);

	e->replied = unique;
	do {
		e->next = head;
	} while (!atomic_compare_exchange_weak(&q->replied, &head, e));
	/* an empty list means the thread may sleep: wake it */
	if (!head)
		eventfd_write(q->efd, 1);
}

/* On Q's thread: commits what other threads answered. */
static void sfs_uring_take_over(struct sfs_uring_server *q)
{
	struct sfs_uring_ent *e = atomic_exchange(&q->replied, NULL);

	while (e) {
		struct sfs_uring_ent *next = e->next;

		sfs_uring_commit(q, e, e->replied);
		e = next;
	}
}

/* The entry holding request UNIQUE, taken from it; NULL when none does. */
static struct sfs_uring_ent *sfs_uring_take(uint64_t unique)
{
	struct sfs_uring_ent *e = sfs_uring_cur;
	uint64_t want = unique;

	if (!unique || !sfs_uring.q)
		return NULL;
	if (e && atomic_compare_exchange_strong(&e->unique, &want, 0))
		return e;
	for (int i = 0; i < sfs_uring.n; i++) {
		for (int j = 0; j < SFS_URING_DEPTH; j++) {
			e = &sfs_uring.q[i].ent[j];
			want = unique;
			if (atomic_compare_exchange_strong(&e->unique, &want, 0))
				return e;
		}
	}
	return NULL;
}

/*
 * A reply, as libfuse hands it to the custom I/O hook: the header and
 * whatever follows. Its length, or -ENOENT when no ring entry holds the
 * request (it came through /dev/fuse), or another negative errno.
 */
ssize_t sfs_uring_reply(const struct iovec *iov, int count)
{
	const struct fuse_out_header *out = iov[0].iov_base;
	struct sfs_uring_ent *e;
	size_t total = 0, room;
	char *hdr, *pay;

	if (count < 1 || iov[0].iov_len < sizeof(*out))
		return -ENOENT;
	e = sfs_uring_take(out->unique);
	if (!e)
		return -ENOENT;
	hdr = e->hdr->in_out;
	pay = e->payload;
	room = sfs->uring_payload;
	for (int i = 0; i < count; i++) {
		const char *p = iov[i].iov_base;
		size_t n = iov[i].iov_len;

		/* the header to its place, everything after it to the payload */
		if (total < sizeof(*out)) {
			size_t h = sizeof(*out) - total;

			if (h > n)
				h = n;
			memcpy(hdr + total, p, h);
			p += h;
			n -= h;
			total += h;
		}
		if (total - sizeof(*out) + n > room) {
			strata_err("FUSE over io_uring: a reply of more than %zu "
				   "bytes: answered EIO instead", room);
			((struct fuse_out_header *)hdr)->error = -EIO;
			((struct fuse_out_header *)hdr)->len = sizeof(*out);
			total = sizeof(*out);
			break;
		}
		memcpy(pay + (total - sizeof(*out)), p, n);
		total += n;
	}
	e->hdr->ring_ent_in_out.payload_sz = (uint32_t)(total - sizeof(*out));
	/* the buffers go to the kernel, and back to the queue's thread */
	SFS_TSAN_RELEASE(e);
	if (e->q == sfs_uring_self)
		sfs_uring_commit(e->q, e, out->unique);
	else
		sfs_uring_hand_over(e->q, e, out->unique);
	return (ssize_t)total;
}

/* Answers ENT's request with ERR, without libfuse. */
static void sfs_uring_fail(struct sfs_uring_ent *e, uint64_t unique, int err)
{
	struct fuse_out_header out = {
		.len = sizeof(out), .error = err, .unique = unique,
	};
	struct iovec iov = { &out, sizeof(out) };

	sfs_uring_reply(&iov, 1);
}

/*
 * Hands the request in E to libfuse, laid out as /dev/fuse gives it:
 * the header, the opcode's struct (the kernel's first argument, in
 * op_in), then the payload (every other argument). fuse_in_header.len
 * counts them all, so the struct's size is what the payload leaves.
 */
static void sfs_uring_serve(struct sfs_uring_server *q, struct sfs_uring_ent *e)
{
	const struct fuse_in_header *in = (const void *)e->hdr->in_out;
	uint32_t psz = e->hdr->ring_ent_in_out.payload_sz;
	struct fuse_buf buf = { .mem = q->req };
	size_t opsz;

	SFS_TSAN_ACQUIRE(e);
	VALGRIND_MAKE_MEM_DEFINED(e->hdr, sizeof(*e->hdr));
	atomic_store(&e->unique, e->hdr->ring_ent_in_out.commit_id);
	if (in->len < sizeof(*in) + (size_t)psz || psz > sfs->uring_payload ||
	    in->len - sizeof(*in) - psz > SFS_FUSE_URING_OP_IN_OUT_SZ) {
		strata_err("FUSE over io_uring: request %llu (opcode %u) of %u "
			   "bytes with a payload of %u does not add up: "
			   "answered EIO", (unsigned long long)in->unique,
			   in->opcode, in->len, psz);
		sfs_uring_fail(e, in->unique, -EIO);
		return;
	}
	opsz = in->len - sizeof(*in) - psz;
	VALGRIND_MAKE_MEM_DEFINED(e->payload, psz);
	memcpy(q->req, in, sizeof(*in));
	memcpy(q->req + sizeof(*in), e->hdr->op_in, opsz);
	memcpy(q->req + sizeof(*in) + opsz, e->payload, psz);
	buf.size = in->len;
	sfs_count(STRATA_ST_URING_REQUESTS, 1);
	sfs_uring_cur = e;
	if (sfs_transport_request(sfs_uring.devfd, q->req, buf.size))
		fuse_session_process_buf(sfs_uring.se, &buf);
	sfs_transport_trim(q->req, buf.size);
	sfs_gate_leave();
	sfs_uring_cur = NULL;
}

/*
 * Makes Q's ring and hands the kernel its entries; 0, or a negative
 * errno (then the kernel serves through /dev/fuse: a REGISTER it
 * refuses turns FUSE over io_uring off for the connection).
 */
static int sfs_uring_register(struct sfs_uring_server *q)
{
	struct io_uring_cqe *cqe;
	int ret;

	ret = io_uring_queue_init(SFS_URING_SQ, &q->ring, IORING_SETUP_SQE128);
	if (ret < 0)
		return ret;
	q->ring_ok = true;
	for (int i = 0; i < SFS_URING_DEPTH; i++) {
		struct sfs_uring_ent *e = &q->ent[i];
		struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);

		/* the SQ has room for twice the entries */
		if (!sqe)
			return -EBUSY;
		sfs_uring_prep(sqe, e, SFS_FUSE_IO_URING_CMD_REGISTER, 0);
		sqe->addr = (uintptr_t)e->iov;
		sqe->len = 2;
	}
	ret = sfs_uring_arm_wake(q);
	if (ret == 0)
		ret = io_uring_submit(&q->ring);
	if (ret < 0)
		return ret;
	/*
	 * A command is issued within the submit: one the kernel refused has
	 * completed with its error already. A success completes only with a
	 * request, which the loop takes.
	 */
	if (io_uring_peek_cqe(&q->ring, &cqe) == 0 && cqe->res < 0 &&
	    io_uring_cqe_get_data(cqe) != SFS_URING_WAKE) {
		ret = cqe->res;
		io_uring_cqe_seen(&q->ring, cqe);
		return ret;
	}
	return 0;
}

/* One completion on Q's ring; false when the thread is to end. */
static bool sfs_uring_complete(struct sfs_uring_server *q,
			       struct sfs_uring_ent *e, int res, int *live)
{
	if (e == SFS_URING_WAKE) {
		sfs_uring_take_over(q);
		if (atomic_load(&sfs_uring.stopping))
			return false;
		if (sfs_uring_arm_wake(q) < 0) {
			strata_err("FUSE over io_uring: queue %d: cannot wait for "
				   "replies made elsewhere", q->qid);
			return false;
		}
		return true;
	}
	if (res < 0) {
		/* the connection is gone (ENOTCONN), or a commit failed */
		if (res != -ENOTCONN)
			strata_err("FUSE over io_uring: queue %d: an entry "
				   "ended: %s", q->qid, strerror(-res));
		return --*live > 0;
	}
	sfs_uring_serve(q, e);
	return true;
}

/*
 * Submits the commits made meanwhile and waits for the next request in
 * one system call, then handles every completion there is.
 */
static void sfs_uring_loop(struct sfs_uring_server *q)
{
	int live = SFS_URING_DEPTH;
	bool going = true;

	while (going) {
		struct io_uring_cqe *cqe;
		int ret = io_uring_submit_and_wait(&q->ring, 1);

		if (ret < 0 && ret != -EINTR && ret != -EAGAIN &&
		    ret != -EBUSY) {
			strata_err("FUSE over io_uring: queue %d: %s", q->qid,
				   strerror(-ret));
			break;
		}
		while (going && io_uring_peek_cqe(&q->ring, &cqe) == 0) {
			struct sfs_uring_ent *e = io_uring_cqe_get_data(cqe);
			int res = cqe->res;

			io_uring_cqe_seen(&q->ring, cqe);
			going = sfs_uring_complete(q, e, res, &live);
		}
	}
	/* what the last requests answered goes in before the thread ends */
	io_uring_submit(&q->ring);
}

static void *sfs_uring_thread(void *arg)
{
	struct sfs_uring_server *q = arg;
	cpu_set_t set;

	/*
	 * The kernel queues a request on the queue of the CPU it was made
	 * on: answered on that CPU, it needs no wake-up of another. An
	 * offline CPU refuses; its queue still needs its entries.
	 */
	CPU_ZERO(&set);
	CPU_SET(q->qid, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	sfs_uring_self = q;
	q->err = sfs_uring_register(q);
	sem_post(&sfs_uring.set_up);
	if (q->err == 0)
		sfs_uring_loop(q);
	return NULL;
}

static int sfs_uring_server_init(struct sfs_uring_server *q, int qid)
{
	size_t hsz = sizeof(struct sfs_fuse_uring_req_header);
	size_t payload = sfs->uring_payload;

	q->qid = qid;
	q->efd = eventfd(0, EFD_CLOEXEC);
	if (q->efd < 0)
		return -errno;
	/* mapped, not touched: only what requests use becomes resident */
	q->req_size = sizeof(struct fuse_in_header) +
		      SFS_FUSE_URING_OP_IN_OUT_SZ + payload;
	q->bufs_size = SFS_URING_DEPTH * (hsz + payload);
	q->req = mmap(NULL, q->req_size, PROT_READ | PROT_WRITE,
		      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	q->bufs = mmap(NULL, q->bufs_size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q->req == MAP_FAILED || q->bufs == MAP_FAILED)
		return -ENOMEM;
	for (int i = 0; i < SFS_URING_DEPTH; i++) {
		struct sfs_uring_ent *e = &q->ent[i];

		e->q = q;
		/* payloads first: page aligned, the headers packed after */
		e->payload = q->bufs + i * payload;
		e->hdr = (void *)(q->bufs + SFS_URING_DEPTH * payload + i * hsz);
		e->iov[0] = (struct iovec){ e->hdr, hsz };
		e->iov[1] = (struct iovec){ e->payload, payload };
	}
	return 0;
}

/*
 * After the handshake, when INIT agreed on FUSE over io_uring: a queue
 * per possible CPU, each registered by its own thread. 0, or a negative
 * errno when the transport cannot run (said in the log).
 */
int sfs_uring_start(struct fuse_session *se)
{
	int nq, n, ret = 0, started = 0;

	if (!atomic_load(&sfs->uring))
		return 0;
	nq = sfs_uring_possible();
	if (nq < 0) {
		strata_err("FUSE over io_uring: the possible CPUs: %s",
			   strerror(-nq));
		return nq;
	}
	n = nq * SFS_URING_THREADS;
	sfs_uring.q = calloc((size_t)n, sizeof(*sfs_uring.q));
	if (!sfs_uring.q)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		sfs_uring.q[i].efd = -1;
	sfs_uring.n = n;
	sfs_uring.se = se;
	sfs_uring.devfd = fuse_session_fd(se);
	atomic_store(&sfs_uring.stopping, false);
	sem_init(&sfs_uring.set_up, 0, 0);
	for (int i = 0; i < n && ret == 0; i++) {
		struct sfs_uring_server *q = &sfs_uring.q[i];

		ret = sfs_uring_server_init(q, i / SFS_URING_THREADS);
		if (ret == 0)
			ret = -pthread_create(&q->thread, NULL,
					      sfs_uring_thread, q);
		if (ret == 0) {
			q->thread_ok = true;
			started++;
		}
	}
	for (int i = 0; i < started; i++)
		sem_wait(&sfs_uring.set_up);
	for (int i = 0; i < started && ret == 0; i++)
		ret = sfs_uring.q[i].err;
	if (ret == -ENOTCONN || ret == -ECONNABORTED) {
		/*
		 * Unmounted (or aborted) while the threads registered: the
		 * device's loop sees the end and the daemon exits as at any
		 * unmount.
		 */
		strata_info("FUSE over io_uring: the connection ended while "
			    "the queues were set up");
		return 0;
	}
	if (ret < 0) {
		strata_err("FUSE over io_uring: setting up the queues: %s",
			   strerror(-ret));
		return ret;
	}
	strata_info("transport: FUSE over io_uring, %d queues, each served by "
		    "%d threads pinned to its CPU with %d entry each", nq,
		    SFS_URING_THREADS, SFS_URING_DEPTH);
	return 0;
}

/* Ends the queues' threads: no request comes through a ring after this. */
void sfs_uring_stop(void)
{
	atomic_store(&sfs_uring.stopping, true);
	for (int i = 0; i < sfs_uring.n; i++) {
		struct sfs_uring_server *q = &sfs_uring.q[i];

		if (!q->thread_ok)
			continue;
		eventfd_write(q->efd, 1);
		pthread_join(q->thread, NULL);
		q->thread_ok = false;
	}
}

/*
 * After the I/O engine's shutdown, whose last replies still commit:
 * closing a ring cancels the kernel's hold on its entries.
 */
void sfs_uring_free(void)
{
	for (int i = 0; i < sfs_uring.n; i++) {
		struct sfs_uring_server *q = &sfs_uring.q[i];

		if (q->ring_ok)
			io_uring_queue_exit(&q->ring);
		if (q->req && q->req != MAP_FAILED)
			munmap(q->req, q->req_size);
		if (q->bufs && q->bufs != MAP_FAILED)
			munmap(q->bufs, q->bufs_size);
		if (q->efd >= 0)
			close(q->efd);
	}
	if (sfs_uring.q)
		sem_destroy(&sfs_uring.set_up);
	free(sfs_uring.q);
	sfs_uring.q = NULL;
	sfs_uring.n = 0;
}
