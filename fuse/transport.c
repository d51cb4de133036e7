// SPDX-License-Identifier: Apache-2.0
/*
 * transport.c: how requests come in and replies go out. libfuse reads
 * and writes /dev/fuse through these hooks (fuse_session_custom_io):
 *  - FUSE_TMPFILE, which libfuse 3.14 does not know, is answered before
 *    libfuse sees it (tmpfile.c);
 *  - a request the kernel sends again after a worker died (its unique
 *    carries FUSE_UNIQUE_RESEND) is noted for its handler, which may find
 *    its work done already (sfs_req_resent), and for the lookup counts
 *    (resend.c), as is each reply that went out; a FORGET is written
 *    down the moment it is read: the start of every request is read
 *    into the shared memory (resend.c);
 *  - a request that came over io_uring is answered there (uring.c);
 *  - a reply can be captured instead of sent: the INIT exchange, which a
 *    new worker replays without the kernel ever seeing it (handshake.c).
 *    Swapping /dev/fuse for a pipe under libfuse would not do: the
 *    descriptor table is shared with the supervisor (supervisor.c), and
 *    the connection dies with its last descriptor.
 * The hooks leave libfuse no way to splice requests in, so
 * FUSE_CAP_SPLICE_READ goes; replies are still spliced out, but for
 * FUSE over io_uring, whose replies go into a ring's buffers (super.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include "stratafs.h"

/* Set while the request this thread is handling was sent again. */
static __thread bool sfs_resent;

/* Where replies go instead of the device; only before the loop runs. */
static struct sfs_capture *sfs_capturing;

/*
 * What TSan is told the device orders: a reply before every request it
 * makes possible (a FORGET after the LOOKUP reply, a RELEASE after the
 * OPEN). It learns that from read(2) and write(2) on descriptors it saw
 * opened (io_sync=2), but not on one a binary exec'd for an upgrade
 * inherits (supervisor.c).
 */
static char sfs_device_order;

bool sfs_req_resent(void)
{
	return sfs_resent;
}

void sfs_transport_capture(struct sfs_capture *c)
{
	if (c)
		c->len = 0;
	sfs_capturing = c;
}

/*
 * A request came in, from the device or a ring (uring.c): noted for its
 * handler and the lookup counts. False when it was answered here
 * (FUSE_TMPFILE), true when it is libfuse's to handle.
 */
bool sfs_transport_request(int fd, const void *buf, size_t len)
{
	const struct fuse_in_header *in = buf;

	/* in flight from here: a freeze waits for it, or it for the freeze */
	sfs_gate_enter();
	SFS_TSAN_ACQUIRE(&sfs_device_order);
	if (len < sizeof(*in))
		return true;
	sfs_resent = in->unique & SFS_UNIQUE_RESEND;
	sfs_resend_request(in->unique, sfs_resent);
	/* as a worker killed on its way out of read(2) dies: tests */
	if (in->opcode == FUSE_FORGET || in->opcode == FUSE_BATCH_FORGET)
		sfs_crash_after("forget.read");
	sfs_forget_read(buf, len);
	if (in->opcode != FUSE_TMPFILE)
		return true;
	sfs_tmpfile_request(fd, buf, len);
	return false;
}

/*
 * Reads a request into BUF (LEN bytes), its start by way of the thread's
 * area in the shared memory, where a FORGET outlives a thread killed
 * before its handler ran (resend.c).
 */
static ssize_t sfs_transport_read(int fd, char *buf, size_t len)
{
	size_t head;
	char *rx = sfs_forget_rx(&head);
	struct iovec iov[2];
	ssize_t n;

	if (!rx)
		return read(fd, buf, len);
	if (head > len)
		head = len;
	iov[0] = (struct iovec){ rx, head };
	iov[1] = (struct iovec){ buf + head, len - head };
	n = readv(fd, iov, 2);
	if (n > 0)
		memcpy(buf, rx, (size_t)n < head ? (size_t)n : head);
	return n;
}

static ssize_t sfs_hook_read(int fd, void *buf, size_t len, void *userdata)
{
	for (;;) {
		ssize_t n;

		/*
		 * libfuse's loop reads again only once the handler of the
		 * request before has returned: that request is no longer
		 * this thread's (gate.c).
		 */
		sfs_gate_leave();
		n = sfs_transport_read(fd, buf, len);

		if (n < 0 || sfs_transport_request(fd, buf, (size_t)n))
			return n;
	}
}

/* Every reply goes out through here: libfuse's, and tmpfile.c's. */
ssize_t sfs_transport_writev(int fd, struct iovec *iov, int count)
{
	const struct fuse_out_header *out = iov[0].iov_base;
	struct sfs_capture *c = sfs_capturing;
	size_t total = 0;
	ssize_t done;

	if (!c) {
		SFS_TSAN_RELEASE(&sfs_device_order);
		/* a request that came over a ring is answered there */
		done = sfs_uring_reply(iov, count);
		if (done == -ENOENT)
			done = writev(fd, iov, count);
		else if (done < 0) {
			errno = (int)-done;
			done = -1;
		}
		/* libfuse puts the header alone in the first vector */
		if (done > 0 && iov[0].iov_len >= sizeof(*out))
			sfs_resend_replied(out->unique);
		return done;
	}
	for (int i = 0; i < count; i++) {
		size_t room = sizeof(c->buf) - c->len;
		size_t n = iov[i].iov_len < room ? iov[i].iov_len : room;

		memcpy(c->buf + c->len, iov[i].iov_base, n);
		c->len += n;
		total += iov[i].iov_len;
	}
	return (ssize_t)total;
}

static ssize_t sfs_hook_writev(int fd, struct iovec *iov, int count,
			       void *userdata)
{
	return sfs_transport_writev(fd, iov, count);
}

static ssize_t sfs_hook_splice_send(int fdin, off_t *offin, int fdout,
				    off_t *offout, size_t len,
				    unsigned int flags, void *userdata)
{
	SFS_TSAN_RELEASE(&sfs_device_order);
	return splice(fdin, offin, fdout, offout, len, flags);
}

/*
 * Each libfuse thread reads requests into a buffer of its own, sized for
 * the biggest write (1 MiB and a page), and keeps it for its life: once
 * a thread has received a big write, the whole buffer stays resident,
 * up to 16 MiB over the pool (and as much again for the copies of their
 * requests the ring threads keep: uring.c). Once the thread has served
 * SFS_RX_QUIET requests in a row that each fit in SFS_RX_KEEP bytes,
 * the pages past that go back to the system (MADV_DONTNEED; the next
 * big write faults them in again, zeroed). Counted in requests, not
 * time: a thread that serves writes keeps its pages, and one that went
 * back to lookups gives them up within a walk.
 */
#define SFS_RX_KEEP (16 << 10)
#define SFS_RX_QUIET 1024

static __thread struct {
	char *buf;		/* the thread's buffer, as libfuse gave it */
	size_t used;		/* bytes of it a request may have touched */
	unsigned quiet;		/* small requests since */
} sfs_rx;

void sfs_transport_trim(char *buf, size_t n)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t from, to;

	if (buf != sfs_rx.buf) {
		sfs_rx.buf = buf;
		sfs_rx.used = 0;
	}
	if (n > SFS_RX_KEEP) {
		if (n > sfs_rx.used)
			sfs_rx.used = n;
		sfs_rx.quiet = 0;
		return;
	}
	if (sfs_rx.used <= SFS_RX_KEEP || ++sfs_rx.quiet < SFS_RX_QUIET)
		return;
	from = ((uintptr_t)buf + SFS_RX_KEEP + page - 1) & ~(page - 1);
	to = ((uintptr_t)buf + sfs_rx.used) & ~(page - 1);
	if (to > from)
		madvise((void *)from, to - from, MADV_DONTNEED);
	sfs_rx.used = 0;
}

static ssize_t sfs_hook_read_rx(int fd, void *buf, size_t len,
				void *userdata)
{
	ssize_t n = sfs_hook_read(fd, buf, len, userdata);

	if (n > 0)
		sfs_transport_trim(buf, (size_t)n);
	return n;
}

/* Before INIT: libfuse offers splicing by what the hooks provide. */
int sfs_transport_setup(struct fuse_session *se)
{
	static const struct fuse_custom_io io = {
		.read = sfs_hook_read_rx,
		.writev = sfs_hook_writev,
		.splice_send = sfs_hook_splice_send,
	};

	return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}
