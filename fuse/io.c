// SPDX-License-Identifier: Apache-2.0
/*
 * The I/O engine: every byte of file data that stratafs moves goes
 * through these functions, so the handlers never touch read(2) or
 * write(2) themselves. The functions that take a request reply to it.
 *
 * Two engines:
 * - uring (the default): each FUSE worker thread submits to its own
 *   io_uring and goes back to the FUSE device at once; one completion
 *   thread reaps every ring and sends the replies (the low-level API
 *   lets any thread reply). A worker is never blocked on backing I/O,
 *   so reads and writes to different files overlap.
 * - sync: pread/pwrite in the worker, reads spliced from the backing
 *   file into the FUSE device. Used where io_uring is unavailable
 *   (kernel.io_uring_disabled, seccomp, old kernels) with the same
 *   results, and by choice with -o io=sync.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "stratafs.h"

/*
 * The kernel fills read buffers behind valgrind's back; without this
 * every io_uring read would be reported as uninitialised memory.
 */
#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_DEFINED(addr, len) ((void)(addr), (void)(len))
#endif

#define SFS_RING_ENTRIES 64
#define SFS_IO_POOL_IDLE_MS 1000	/* see sfs_io_buf */

struct sfs_ring {
	struct io_uring uring;
	pthread_mutex_t cq_lock;	/* the submitter and the reaper both reap */
	int efd;		/* signalled on completions, but see submit */
	atomic_uint inflight;	/* submitted, not yet reaped */
	struct sfs_ring *next;	/* every ring, for teardown */
	struct sfs_ring *free_next;
};

struct sfs_io_op {
	void (*done)(struct sfs_io_op *op, int res);
	fuse_req_t req;
	char *buf;
	size_t len;
	off_t off;
	int fd;
	bool write;
	sem_t sem;		/* synchronous callers wait here */
	ssize_t res;
	struct sfs_claim claim;	/* a write's usage, settled before the reply */
};

static struct {
	bool uring;
	int epfd;
	int stopfd;
	pthread_t reaper;
	pthread_mutex_t lock;	/* guards the ring lists */
	struct sfs_ring *rings;
	struct sfs_ring *free;
	pthread_key_t key;
	bool write_direct;	/* buffered writes bypass the ring */
} sfs_io = { .epfd = -1, .stopfd = -1 };

static __thread struct sfs_ring *sfs_tls_ring;

static void sfs_io_pool_trim(bool all);

/* ---- synchronous primitives, shared by both engines ---- */

static ssize_t sfs_io_pread_sync(int fd, void *buf, size_t len, off_t off)
{
	ssize_t n;

	do {
		n = pread(fd, buf, len, off);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

static ssize_t sfs_io_pwrite_sync(int fd, const void *buf, size_t len,
				  off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done,
				   off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return done ? (ssize_t)done : -errno;
		done += n;
	}
	return done;
}

/* ---- the uring engine ---- */

/* A worker's ring goes back to the pool when the worker exits. */
static void sfs_ring_release(void *arg)
{
	struct sfs_ring *r = arg;

	pthread_mutex_lock(&sfs_io.lock);
	r->free_next = sfs_io.free;
	sfs_io.free = r;
	pthread_mutex_unlock(&sfs_io.lock);
}

static struct sfs_ring *sfs_ring_new(void)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct sfs_ring *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	if (io_uring_queue_init(SFS_RING_ENTRIES, &r->uring, 0) < 0)
		goto out_free;
	r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->efd < 0)
		goto out_queue;
	if (io_uring_register_eventfd(&r->uring, r->efd) < 0)
		goto out_efd;
	pthread_mutex_init(&r->cq_lock, NULL);
	ev.data.ptr = r;
	if (epoll_ctl(sfs_io.epfd, EPOLL_CTL_ADD, r->efd, &ev) < 0)
		goto out_efd;
	return r;

out_efd:
	close(r->efd);
out_queue:
	io_uring_queue_exit(&r->uring);
out_free:
	free(r);
	return NULL;
}

/* The calling thread's ring: its own, one from the pool, or a new one. */
static struct sfs_ring *sfs_ring_get(void)
{
	struct sfs_ring *r = sfs_tls_ring;

	if (r)
		return r;
	pthread_mutex_lock(&sfs_io.lock);
	r = sfs_io.free;
	if (r) {
		sfs_io.free = r->free_next;
	} else {
		r = sfs_ring_new();
		if (r) {
			r->next = sfs_io.rings;
			sfs_io.rings = r;
		}
	}
	pthread_mutex_unlock(&sfs_io.lock);
	if (r) {
		sfs_tls_ring = r;
		pthread_setspecific(sfs_io.key, r);
	}
	return r;
}

static void sfs_ring_drain(struct sfs_ring *r);

/* Submits one read or write; false when the ring cannot take it. */
static bool sfs_ring_submit(struct sfs_io_op *op, bool write)
{
	struct sfs_ring *r = sfs_ring_get();
	struct io_uring_sqe *sqe;

	if (!r)
		return false;
	sqe = io_uring_get_sqe(&r->uring);
	if (!sqe) {
		io_uring_submit(&r->uring);
		sqe = io_uring_get_sqe(&r->uring);
		if (!sqe)
			return false;
	}
	if (write)
		io_uring_prep_write(sqe, op->fd, op->buf, op->len, op->off);
	else
		io_uring_prep_read(sqe, op->fd, op->buf, op->len, op->off);
	io_uring_sqe_set_data(sqe, op);
	SFS_TSAN_RELEASE(op);
	atomic_fetch_add(&r->inflight, 1);
	/*
	 * Page-cache hits and buffered writes complete inside the submit:
	 * the worker replies to those itself, sparing a wake-up of the
	 * completion thread, whose eventfd is off meanwhile. Anything that
	 * completes while it is off is caught by the drain after it is back
	 * on; later completions (io-wq, task work) signal it as usual.
	 */
	io_uring_cq_eventfd_toggle(&r->uring, false);
	if (io_uring_submit(&r->uring) < 1) {
		/*
		 * The entry stays in the submission queue, and the next
		 * submit would send it with OP long gone: a no-op instead.
		 */
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, NULL);
		atomic_fetch_sub(&r->inflight, 1);
		io_uring_cq_eventfd_toggle(&r->uring, true);
		return false;
	}
	sfs_ring_drain(r);
	io_uring_cq_eventfd_toggle(&r->uring, true);
	sfs_ring_drain(r);
	return true;
}

/*
 * Whether a read that came back short, RES bytes at OFF, may have been
 * cut rather than have met the end of the file. io_uring ends a read
 * that had to wait for the disk with what it had copied when the thread
 * that submitted it is gone by then (io_should_terminate_tw: the loop's
 * threads exit before the engine stops, when a worker is replaced or
 * the mount ends): whole pages of the page cache, so the cut falls on a
 * page boundary. A read that meets the end of the file mid-page is
 * taken as it is, sparing the pread that would find nothing more.
 */
static bool sfs_read_cut(off_t off, int res, size_t len)
{
	return res > 0 && (size_t)res < len &&
	       (off + res) % sysconf(_SC_PAGESIZE) == 0;
}

/*
 * The completion side, which finishes synchronously what the ring left
 * undone: rare, and a ring has one submitter (its worker).
 *  - EAGAIN and EINTR; ECANCELED for work a thread left queued when it
 *    exited, and EFAULT for work resumed after it did (both io_uring's);
 *    passed on, the error failed a reader's page, and the kernel took
 *    the short read for the end of the file;
 *  - a short write, and a read cut short (sfs_read_cut).
 */
static void sfs_ring_complete(struct sfs_io_op *op, int res, bool write)
{
	ssize_t more = 0;

	if (!write && res > 0)
		VALGRIND_MAKE_MEM_DEFINED(op->buf, res);
	if (res == -EAGAIN || res == -EINTR || res == -ECANCELED ||
	    res == -EFAULT) {
		res = write ? sfs_io_pwrite_sync(op->fd, op->buf, op->len, op->off)
			    : sfs_io_pread_sync(op->fd, op->buf, op->len, op->off);
	} else if (write && res >= 0 && (size_t)res < op->len) {
		more = sfs_io_pwrite_sync(op->fd, op->buf + res, op->len - res,
					  op->off + res);
	} else if (!write && sfs_read_cut(op->off, res, op->len)) {
		more = sfs_io_pread_sync(op->fd, op->buf + res, op->len - res,
					 op->off + res);
	}
	if (more > 0)
		res += more;
	op->done(op, res);
}

/* Replies to whatever has completed on the ring. */
static void sfs_ring_drain(struct sfs_ring *r)
{
	struct io_uring_cqe *cqe;

	pthread_mutex_lock(&r->cq_lock);
	while (io_uring_peek_cqe(&r->uring, &cqe) == 0) {
		struct sfs_io_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&r->uring, cqe);
		if (op) {
			atomic_fetch_sub(&r->inflight, 1);
			SFS_TSAN_ACQUIRE(op);
			sfs_ring_complete(op, res, op->write);
		}
	}
	pthread_mutex_unlock(&r->cq_lock);
}

static void sfs_ring_reap(struct sfs_ring *r)
{
	eventfd_t v;

	eventfd_read(r->efd, &v);
	sfs_ring_drain(r);
}

static void *sfs_io_reaper(void *arg)
{
	struct epoll_event evs[16];

	for (;;) {
		/* woken once in a while to give idle buffers back */
		int n = epoll_wait(sfs_io.epfd, evs, 16, SFS_IO_POOL_IDLE_MS);

		if (n == 0 || (n < 0 && errno == EINTR)) {
			sfs_io_pool_trim(false);
			continue;
		}
		if (n < 0)
			break;
		for (int i = 0; i < n; i++) {
			if (!evs[i].data.ptr)
				return NULL;	/* the stop event */
			sfs_ring_reap(evs[i].data.ptr);
		}
	}
	return NULL;
}

static int sfs_io_uring_init(void)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct io_uring probe;
	int ret;

	/* One try up front, so an unusable io_uring is reported once. */
	ret = io_uring_queue_init(2, &probe, 0);
	if (ret < 0)
		return ret;
	io_uring_queue_exit(&probe);

	sfs_io.epfd = epoll_create1(EPOLL_CLOEXEC);
	sfs_io.stopfd = eventfd(0, EFD_CLOEXEC);
	if (sfs_io.epfd < 0 || sfs_io.stopfd < 0)
		return -errno;
	if (epoll_ctl(sfs_io.epfd, EPOLL_CTL_ADD, sfs_io.stopfd, &ev) < 0)
		return -errno;
	pthread_mutex_init(&sfs_io.lock, NULL);
	ret = pthread_key_create(&sfs_io.key, sfs_ring_release);
	if (ret)
		return -ret;
	ret = pthread_create(&sfs_io.reaper, NULL, sfs_io_reaper, NULL);
	if (ret) {
		pthread_key_delete(sfs_io.key);
		return -ret;
	}
	return 0;
}

/*
 * io_uring completes a buffered write inline only where the filesystem
 * can say "would block" (RWF_NOWAIT); elsewhere (ext4 as of 6.18) it
 * hands every write to one of its worker threads, and the completion
 * to ours: two thread switches that cost more than the write. There,
 * writes go straight to pwrite in the FUSE worker, which for the page
 * cache does not block either.
 */
static bool sfs_io_nowait_writes(void)
{
	struct iovec iov = { "x", 1 };
	char tmp[64];
	bool ok;
	int fd;

	if (!sfs || sfs->tmpfd < 0 || sfs_tmp_name(tmp, sizeof(tmp)) < 0)
		return true;
	fd = openat(sfs->tmpfd, tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC,
		    0600);
	if (fd < 0)
		return true;
	ok = pwritev2(fd, &iov, 1, 0, RWF_NOWAIT) == 1 || errno != EOPNOTSUPP;
	close(fd);
	unlinkat(sfs->tmpfd, tmp, 0);
	return ok;
}

int sfs_io_init(const char *engine)
{
	int ret;

	if (engine && !strcmp(engine, "sync"))
		return 0;
	ret = sfs_io_uring_init();
	if (ret < 0) {
		strata_warn("io_uring is unavailable (%s): using the sync engine",
			    strerror(-ret));
		if (sfs_io.epfd >= 0)
			close(sfs_io.epfd);
		if (sfs_io.stopfd >= 0)
			close(sfs_io.stopfd);
		sfs_io.epfd = sfs_io.stopfd = -1;
		return 0;
	}
	sfs_io.uring = true;
	sfs_io.write_direct = !sfs_io_nowait_writes();
	if (sfs_io.write_direct)
		strata_info("io_uring: upper filesystem has no non-blocking buffered writes; writing directly");
	return 0;
}

/*
 * Replies to what R still has in flight, waiting until DEADLINE
 * (sfs_now_ns) at most; false when time ran out.
 */
static bool sfs_ring_settle(struct sfs_ring *r, long long deadline)
{
	for (;;) {
		struct __kernel_timespec left;
		struct io_uring_cqe *cqe;
		long long ns;
		int ret;

		sfs_ring_drain(r);
		if (atomic_load(&r->inflight) == 0)
			return true;
		ns = deadline - sfs_now_ns();
		if (ns <= 0)
			return false;
		left.tv_sec = ns / 1000000000LL;
		left.tv_nsec = ns % 1000000000LL;
		ret = io_uring_wait_cqe_timeout(&r->uring, &cqe, &left);
		if (ret < 0 && ret != -ETIME && ret != -EINTR)
			return false;
	}
}

/*
 * After the FUSE loop, whose handlers have all returned: each read and
 * write still in flight is answered before the rings go. Left to the
 * ring's teardown, they were cancelled unanswered, and a supervised
 * mount's next worker served them again from the kernel's resend, while
 * the callers waited. A read stuck on a stalled layer does not hold the
 * exit for longer than SFS_IO_SETTLE_S: its request is the kernel's to
 * send again, or to fail with the connection.
 */
#define SFS_IO_SETTLE_S 5

void sfs_io_shutdown(void)
{
	long long deadline = sfs_now_ns() + SFS_IO_SETTLE_S * 1000000000LL;
	struct sfs_ring *r, *next;
	unsigned int left = 0;

	if (!sfs_io.uring)
		return;
	eventfd_write(sfs_io.stopfd, 1);
	pthread_join(sfs_io.reaper, NULL);
	for (r = sfs_io.rings; r; r = r->next)
		if (!sfs_ring_settle(r, deadline))
			left += atomic_load(&r->inflight);
	if (left)
		strata_warn("%u reads and writes still waiting on a layer "
			    "after %d s: left for the kernel to send again",
			    left, SFS_IO_SETTLE_S);
	for (r = sfs_io.rings; r; r = next) {
		next = r->next;
		io_uring_queue_exit(&r->uring);
		close(r->efd);
		pthread_mutex_destroy(&r->cq_lock);
		free(r);
	}
	sfs_io.rings = sfs_io.free = NULL;
	pthread_key_delete(sfs_io.key);
	close(sfs_io.epfd);
	close(sfs_io.stopfd);
	pthread_mutex_destroy(&sfs_io.lock);
	sfs_io.uring = false;
	/* last: what the settling ops freed went to the pool (sfs_io_buf_free) */
	sfs_io_pool_trim(true);
}

/* ---- operations ---- */

/*
 * O_DIRECT on the backing file wants the memory aligned too (to its
 * logical block size, at most a page on the filesystems we run on). The
 * caller's own buffer never reaches us, so the alignment asked of the
 * caller is what the backing filesystem asks of offsets and sizes, no
 * more: it checks those itself and answers EINVAL, as under the kernel's
 * overlayfs.
 */
#define SFS_DIRECT_ALIGN 4096

/*
 * A request's buffer past malloc's mapping threshold (super.c) is a
 * mapping of its own, and a new mapping costs a page fault per 4 KiB:
 * a 1 MiB read paid more for that than for the read. So those buffers
 * are all made SFS_IO_POOLED bytes, page aligned, and kept for reuse,
 * and the completion thread gives them back to the system once a second
 * went by without one taken: an idle daemon keeps none (the memory the
 * bench measures after its walks).
 */
#define SFS_IO_SMALL (128 * 1024)	/* super.c's M_MMAP_THRESHOLD */
#define SFS_IO_POOLED (1 << 20)		/* max_write, and the biggest read */
#define SFS_IO_POOL_MAX 32		/* > the kernel's background requests */

static struct {
	pthread_mutex_t lock;
	void *buf[SFS_IO_POOL_MAX];
	int count;
	bool taken;		/* since the completion thread last looked */
} sfs_io_pool = { .lock = PTHREAD_MUTEX_INITIALIZER };

/*
 * Every buffer of such a size is made whole, whichever the engine, so
 * that the pool never holds a smaller one; only the uring engine keeps
 * them, having a completion thread to give them back.
 */
static bool sfs_io_pooled(size_t len)
{
	return len > SFS_IO_SMALL && len <= SFS_IO_POOLED;
}

static void *sfs_io_buf(size_t len, bool direct)
{
	void *buf = NULL;

	if (sfs_io_pooled(len)) {
		pthread_mutex_lock(&sfs_io_pool.lock);
		sfs_io_pool.taken = true;
		if (sfs_io_pool.count)
			buf = sfs_io_pool.buf[--sfs_io_pool.count];
		pthread_mutex_unlock(&sfs_io_pool.lock);
		if (!buf && posix_memalign(&buf, SFS_DIRECT_ALIGN, SFS_IO_POOLED))
			return NULL;
		return buf;
	}
	if (!direct)
		return malloc(len ? len : 1);
	len = (len + SFS_DIRECT_ALIGN - 1) & ~(size_t)(SFS_DIRECT_ALIGN - 1);
	if (posix_memalign(&buf, SFS_DIRECT_ALIGN, len ? len : SFS_DIRECT_ALIGN))
		return NULL;
	return buf;
}

/* LEN as given to sfs_io_buf */
static void sfs_io_buf_free(void *buf, size_t len)
{
	if (buf && sfs_io_pooled(len) && sfs_io.uring) {
		pthread_mutex_lock(&sfs_io_pool.lock);
		if (sfs_io_pool.count < SFS_IO_POOL_MAX) {
			sfs_io_pool.buf[sfs_io_pool.count++] = buf;
			buf = NULL;
		}
		pthread_mutex_unlock(&sfs_io_pool.lock);
	}
	free(buf);
}

/* ALL: whether or not one was taken since the last call */
static void sfs_io_pool_trim(bool all)
{
	void *drop[SFS_IO_POOL_MAX];
	int n = 0;

	pthread_mutex_lock(&sfs_io_pool.lock);
	if (all || !sfs_io_pool.taken) {
		n = sfs_io_pool.count;
		memcpy(drop, sfs_io_pool.buf, n * sizeof(drop[0]));
		sfs_io_pool.count = 0;
	}
	sfs_io_pool.taken = false;
	pthread_mutex_unlock(&sfs_io_pool.lock);
	while (n--)
		free(drop[n]);
}

static struct sfs_io_op *sfs_io_op_new(fuse_req_t req, int fd, size_t len,
				       off_t off, bool direct)
{
	struct sfs_io_op *op = calloc(1, sizeof(*op));

	if (!op)
		return NULL;
	op->buf = sfs_io_buf(len, direct);
	if (!op->buf) {
		free(op);
		return NULL;
	}
	op->req = req;
	op->fd = fd;
	op->len = len;
	op->off = off;
	/* its reply may come from the completion thread: in flight till then */
	sfs_gate_hold();
	return op;
}

static void sfs_io_op_free(struct sfs_io_op *op)
{
	sfs_io_buf_free(op->buf, op->len);
	free(op);
	sfs_gate_put();
}

/*
 * Reads in progress, wherever they are done. One alone is done in the
 * worker (sfs_io_read): through the ring its reply comes from the
 * completion thread, a second thread to wake, which at one request at a
 * time costs more than the overlap gains (O_DIRECT 4 KiB random reads of
 * a lower file, one job: 1.2 to 2x the IOPS in the worker).
 */
static atomic_uint sfs_io_reading;

static void sfs_io_read_done(struct sfs_io_op *op, int res)
{
	atomic_fetch_sub(&sfs_io_reading, 1);
	if (res < 0)
		fuse_reply_err(op->req, -res);
	else
		fuse_reply_buf(op->req, op->buf, res);
	sfs_io_op_free(op);
}

static void sfs_io_write_done(struct sfs_io_op *op, int res)
{
	sfs_usage_settle(&op->claim, op->fd);
	if (res < 0)
		fuse_reply_err(op->req, -res);
	else
		fuse_reply_write(op->req, res);
	sfs_io_op_free(op);
}

static void sfs_io_read_sync(fuse_req_t req, int fd, size_t size, off_t off)
{
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);

	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

/* Splicing copies through page-aligned pipe buffers: fine for O_DIRECT. */
void sfs_io_read(fuse_req_t req, int fd, size_t size, off_t off, bool direct)
{
	struct sfs_io_op *op;

	if (!sfs_io.uring) {
		sfs_io_read_sync(req, fd, size, off);
		return;
	}
	if (atomic_fetch_add(&sfs_io_reading, 1) == 0)
		goto sync;	/* alone */
	op = sfs_io_op_new(req, fd, size, off, direct);
	if (!op) {
		atomic_fetch_sub(&sfs_io_reading, 1);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	op->done = sfs_io_read_done;
	if (sfs_ring_submit(op, false))
		return;
	sfs_io_op_free(op);
sync:
	sfs_io_read_sync(req, fd, size, off);
	atomic_fetch_sub(&sfs_io_reading, 1);
}

/* The write's data, or its first C->len bytes: what fits the capacity. */
static size_t sfs_io_write_len(struct fuse_bufvec *in,
			       const struct sfs_claim *c)
{
	size_t len = fuse_buf_size(in);

	return c && c->len < len ? c->len : len;
}

static void sfs_io_write_sync(fuse_req_t req, int fd, struct fuse_bufvec *in,
			      off_t off, struct sfs_claim *c)
{
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(sfs_io_write_len(in, c));
	ssize_t n;

	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = fd;
	out.buf[0].pos = off;
	n = fuse_buf_copy(&out, in, 0);
	sfs_usage_settle(c, fd);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/*
 * O_DIRECT: libfuse's buffer (or its pipe's pages, spliced at any
 * offset) has no alignment to offer, so the data goes through an
 * aligned one.
 */
static void sfs_io_write_aligned(fuse_req_t req, int fd,
				 struct fuse_bufvec *in, off_t off,
				 struct sfs_claim *c)
{
	size_t len = sfs_io_write_len(in, c);
	struct fuse_bufvec dst = FUSE_BUFVEC_INIT(len);
	ssize_t n;

	dst.buf[0].mem = sfs_io_buf(len, true);
	if (!dst.buf[0].mem) {
		sfs_usage_settle(c, fd);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	n = fuse_buf_copy(&dst, in, 0);
	if (n >= 0)
		n = sfs_io_pwrite_sync(fd, dst.buf[0].mem, n, off);
	sfs_io_buf_free(dst.buf[0].mem, len);
	sfs_usage_settle(c, fd);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

/*
 * libfuse reuses its request buffer once we return, so the data is
 * copied into the operation before the worker lets go of it. CLAIM (or
 * NULL) is the write's share of the capacity (usage.c): at most
 * CLAIM->len bytes are written, and it is settled before the reply.
 */
void sfs_io_write(fuse_req_t req, int fd, struct fuse_bufvec *in, off_t off,
		  bool direct, const struct sfs_claim *claim)
{
	struct sfs_claim c = claim ? *claim : (struct sfs_claim){ 0 };
	size_t len = sfs_io_write_len(in, claim);
	struct fuse_bufvec dst = FUSE_BUFVEC_INIT(len);
	struct sfs_io_op *op;

	if (!sfs_io.uring || sfs_io.write_direct) {
		if (direct)
			sfs_io_write_aligned(req, fd, in, off, &c);
		else
			sfs_io_write_sync(req, fd, in, off, &c);
		return;
	}
	op = sfs_io_op_new(req, fd, len, off, direct);
	if (!op) {
		sfs_usage_settle(&c, fd);
		fuse_reply_err(req, ENOMEM);
		return;
	}
	dst.buf[0].mem = op->buf;
	if (fuse_buf_copy(&dst, in, 0) != (ssize_t)len) {
		sfs_io_op_free(op);
		if (direct)
			sfs_io_write_aligned(req, fd, in, off, &c);
		else
			sfs_io_write_sync(req, fd, in, off, &c);
		return;
	}
	op->claim = c;
	op->done = sfs_io_write_done;
	op->write = true;
	if (!sfs_ring_submit(op, true)) {
		/* the data is in op->buf already, aligned */
		ssize_t n = sfs_io_pwrite_sync(fd, op->buf, len, off);

		sfs_io_write_done(op, (int)n);
	}
}

static void sfs_io_wake(struct sfs_io_op *op, int res)
{
	op->res = res;
	sem_post(&op->sem);
}

/* A blocking read or write through the ring, for copy-up. */
static ssize_t sfs_io_ring_wait(int fd, void *buf, size_t len, off_t off,
				bool write)
{
	struct sfs_io_op op = {
		.done = sfs_io_wake, .buf = buf, .len = len, .off = off,
		.fd = fd, .write = write,
	};
	ssize_t ret;

	sem_init(&op.sem, 0, 0);
	if (!sfs_ring_submit(&op, write)) {
		sem_destroy(&op.sem);
		return write ? sfs_io_pwrite_sync(fd, buf, len, off)
			     : sfs_io_pread_sync(fd, buf, len, off);
	}
	while (sem_wait(&op.sem) < 0 && errno == EINTR)
		;
	ret = op.res;
	sem_destroy(&op.sem);
	return ret;
}

ssize_t sfs_io_pread(int fd, void *buf, size_t len, off_t off)
{
	if (sfs_io.uring)
		return sfs_io_ring_wait(fd, buf, len, off, false);
	return sfs_io_pread_sync(fd, buf, len, off);
}

ssize_t sfs_io_pwrite(int fd, const void *buf, size_t len, off_t off)
{
	if (sfs_io.uring)
		return sfs_io_ring_wait(fd, (void *)buf, len, off, true);
	return sfs_io_pwrite_sync(fd, buf, len, off);
}

void sfs_io_copy_file(fuse_req_t req, int in, off_t off_in, int out,
		      off_t off_out, size_t len, int flags)
{
	loff_t ioff = off_in, ooff = off_out;
	ssize_t n = copy_file_range(in, &ioff, out, &ooff, len, flags);

	if (n < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_write(req, n);
}

/*
 * Copies [off, off+len) at the same offsets. copy_file_range lets the
 * filesystem share or offload the blocks; where it cannot (across
 * filesystems on old kernels, or filesystems without support) the bytes
 * go through a buffer and the engine.
 */
int sfs_io_copy_range(int in, int out, off_t off, size_t len)
{
	const size_t chunk = 1 << 20;
	char *buf = NULL;
	bool cfr = true;
	int ret = 0;

	while (len > 0) {
		size_t want = len < chunk ? len : chunk;
		ssize_t n;

		if (cfr) {
			loff_t ioff = off, ooff = off;

			n = copy_file_range(in, &ioff, out, &ooff, want, 0);
			if (n < 0 && (errno == EXDEV || errno == EINVAL ||
				      errno == EOPNOTSUPP || errno == ENOSYS)) {
				cfr = false;
				continue;
			}
			if (n < 0) {
				ret = -errno;
				break;
			}
		} else {
			if (!buf) {
				buf = malloc(chunk);
				if (!buf) {
					ret = -ENOMEM;
					break;
				}
			}
			n = sfs_io_pread(in, buf, want, off);
			if (n > 0) {
				ssize_t w = sfs_io_pwrite(out, buf, n, off);

				n = (w < 0 || w == n) ? w : -EIO;
			}
			if (n < 0) {
				ret = n;
				break;
			}
		}
		if (n == 0)
			break;	/* the source shrank: nothing more to copy */
		off += n;
		len -= n;
	}
	free(buf);
	return ret;
}
