/*
 * The I/O engine: every byte of file data that stratafs moves goes
 * through these functions, so the handlers never touch read(2) or
 * write(2) themselves and a different engine (io_uring) can take over
 * here alone. The functions that take a request reply to it themselves,
 * which lets an asynchronous engine reply from its completion thread.
 *
 * This is the synchronous engine: reads are spliced from the backing
 * file into the FUSE device where the kernel allows it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "stratafs.h"

void sfs_io_read(fuse_req_t req, int fd, size_t size, off_t off)
{
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);

	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = fd;
	buf.buf[0].pos = off;
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

void sfs_io_write(fuse_req_t req, int fd, struct fuse_bufvec *in, off_t off)
{
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
	ssize_t n;

	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = fd;
	out.buf[0].pos = off;
	n = fuse_buf_copy(&out, in, 0);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
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

ssize_t sfs_io_pread(int fd, void *buf, size_t len, off_t off)
{
	ssize_t n;

	do {
		n = pread(fd, buf, len, off);
	} while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

ssize_t sfs_io_pwrite(int fd, const void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done,
				   off + done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		done += n;
	}
	return done;
}

/*
 * Copies [off, off+len) at the same offsets. copy_file_range lets the
 * filesystem share or offload the blocks; where it cannot (across
 * filesystems on old kernels, or filesystems without support) the bytes
 * go through a buffer.
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
			if (n > 0)
				n = sfs_io_pwrite(out, buf, n, off);
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
