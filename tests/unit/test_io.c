// SPDX-License-Identifier: Apache-2.0
/* io.c: the data paths copy-up uses, and the engine's replies, on real files. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"
#include "unit.h"

/*
 * The engine's replies, caught here in place of libfuse's: REQ is a
 * struct sfs_reply of the test's own.
 */
struct sfs_reply {
	sem_t done;
	size_t len;
	int err;
	char *buf;
	bool from_fd;		/* fuse_reply_data: read in the worker */
};

int fuse_reply_buf(fuse_req_t req, const char *buf, size_t size)
{
	struct sfs_reply *r = (struct sfs_reply *)req;

	r->buf = malloc(size ? size : 1);
	memcpy(r->buf, buf, size);
	r->len = size;
	sem_post(&r->done);
	return 0;
}

/*
 * A read done in the worker replies with its descriptor. When held, it
 * waits there, after saying so: a read in progress for as long as the
 * test wants one.
 */
static struct {
	bool held;
	sem_t entered, go;
} sfs_data_hold;

int fuse_reply_data(fuse_req_t req, struct fuse_bufvec *bufv,
		    enum fuse_buf_copy_flags flags)
{
	struct sfs_reply *r = (struct sfs_reply *)req;
	const struct fuse_buf *b = &bufv->buf[0];
	ssize_t n;

	(void)flags;
	if (sfs_data_hold.held) {
		sem_post(&sfs_data_hold.entered);
		while (sem_wait(&sfs_data_hold.go) < 0 && errno == EINTR)
			;
	}
	r->from_fd = true;
	r->buf = malloc(b->size ? b->size : 1);
	n = pread(b->fd, r->buf, b->size, b->pos);
	if (n < 0)
		r->err = errno;
	else
		r->len = (size_t)n;
	sem_post(&r->done);
	return 0;
}

int fuse_reply_err(fuse_req_t req, int err)
{
	struct sfs_reply *r = (struct sfs_reply *)req;

	r->err = err;
	sem_post(&r->done);
	return 0;
}

/*
 * Whether the page at OFF of FD is in the page cache: the cut needs the
 * rest of the range on disk, or the test proves nothing.
 */
static bool sfs_page_cached(int fd, off_t off)
{
	unsigned char vec = 0;
	void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, off);

	if (p == MAP_FAILED)
		return true;
	if (mincore(p, 4096, &vec) < 0)
		vec = 1;
	munmap(p, 4096);
	return vec & 1;
}

struct sfs_read_arg {
	struct sfs_reply *reply;
	int fd;
	size_t len;
};

/* A FUSE worker thread's life, short: one read handed over, then gone. */
static void *sfs_read_and_exit(void *p)
{
	struct sfs_read_arg *a = p;

	sfs_io_read((fuse_req_t)a->reply, a->fd, a->len, 0, false);
	return NULL;
}

/*
 * A read alone is done in the worker that got it, and answered before
 * sfs_io_read returns; one that comes while another is in progress goes
 * to the ring, whose thread answers. Returns the held read's thread:
 * the caller lets it go (sfs_read_release) when it wants no read in
 * progress any more.
 */
static pthread_t sfs_read_hold(struct sfs_read_arg *held)
{
	struct timespec until;
	pthread_t t;
	int ret;

	sfs_data_hold.held = true;
	sem_init(&sfs_data_hold.entered, 0, 0);
	sem_init(&sfs_data_hold.go, 0, 0);
	CHECK_EQ_INT(pthread_create(&t, NULL, sfs_read_and_exit, held), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	while ((ret = sem_timedwait(&sfs_data_hold.entered, &until)) < 0 &&
	       errno == EINTR)
		;
	/* not done in the worker: the ring's thread has answered it */
	CHECK_EQ_INT(ret, 0);
	sfs_data_hold.held = false;
	return t;
}

static void sfs_read_release(pthread_t t, struct sfs_read_arg *held)
{
	sem_post(&sfs_data_hold.go);
	pthread_join(t, NULL);
	CHECK(held->reply->from_fd);
	CHECK_EQ_INT(held->reply->err, 0);
	CHECK_EQ_INT(held->reply->len, held->len);
	free(held->reply->buf);
	sem_destroy(&sfs_data_hold.entered);
	sem_destroy(&sfs_data_hold.go);
}

static void sfs_test_read_alone_or_not(const char *dir)
{
	struct sfs_reply alone = { .err = 0 }, held = { .err = 0 };
	struct sfs_reply second = { .err = 0 };
	struct sfs_read_arg harg = { &held, -1, 4096 };
	char path[256], data[8192];
	pthread_t t;
	int fd;

	snprintf(path, sizeof(path), "%s/alone", dir);
	fd = open(path, O_CREAT | O_RDWR, 0600);
	memset(data, 'a', 4096);
	memset(data + 4096, 'b', 4096);
	CHECK_EQ_INT(pwrite(fd, data, sizeof(data), 0), (long long)sizeof(data));
	CHECK_EQ_INT(sfs_io_init("uring"), 0);

	sem_init(&alone.done, 0, 0);
	sfs_io_read((fuse_req_t)&alone, fd, 4096, 4096, false);
	CHECK_EQ_INT(sem_trywait(&alone.done), 0);	/* answered already */
	CHECK(alone.from_fd);
	CHECK_EQ_INT(alone.len, 4096);
	CHECK(alone.buf && memcmp(alone.buf, data + 4096, 4096) == 0);

	sem_init(&held.done, 0, 0);
	sem_init(&second.done, 0, 0);
	harg.fd = fd;
	t = sfs_read_hold(&harg);
	sfs_io_read((fuse_req_t)&second, fd, 8192, 0, false);
	while (sem_wait(&second.done) < 0 && errno == EINTR)
		;
	CHECK(!second.from_fd);	/* through the ring */
	CHECK_EQ_INT(second.len, 8192);
	CHECK(second.buf && memcmp(second.buf, data, 8192) == 0);
	sfs_read_release(t, &harg);
	sfs_io_shutdown();
	free(alone.buf);
	free(second.buf);
	sem_destroy(&alone.done);
	sem_destroy(&held.done);
	sem_destroy(&second.done);
	close(fd);
}

/*
 * A read the engine cannot finish at once (the first page cached, the
 * rest on disk) waits for the disk, then goes on in the thread that
 * submitted it; when that thread has exited by then (a worker's threads,
 * at its end), io_uring ends it with what it had: a page. The reply must
 * still be the whole range: the kernel takes a short read for the end
 * of the file.
 */
static void sfs_test_read_outlives_thread(const char *dir)
{
	const size_t len = 64 * 4096;
	char path[256], *data = malloc(len);
	struct sfs_reply held = { .err = 0 };
	struct sfs_read_arg harg = { &held, -1, 4096 };
	int fd, shorts = 0;
	pthread_t hold;
	size_t mapped;

	snprintf(path, sizeof(path), "%s/cold", dir);
	fd = open(path, O_CREAT | O_RDWR, 0600);
	for (size_t i = 0; i < len; i++)
		data[i] = (char)(i * 7 + 3);
	CHECK_EQ_INT(pwrite(fd, data, len, 0), (long long)len);
	CHECK_EQ_INT(fsync(fd), 0);
	harg.fd = fd;
	/* no readahead past the page read: the rest stays on disk */
	CHECK_EQ_INT(posix_fadvise(fd, 0, len, POSIX_FADV_RANDOM), 0);
	/* the daemon's threshold (super.c): each 256 KiB buffer a mapping */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	mapped = mallinfo2().hblkhd;
	CHECK_EQ_INT(sfs_io_init("uring"), 0);
	/* one read in progress throughout, so that the rounds' use the ring */
	sem_init(&held.done, 0, 0);
	hold = sfs_read_hold(&harg);
	/*
	 * The last round stops the engine at once: what it has in flight
	 * is answered before sfs_io_shutdown returns.
	 */
	for (int round = 0; round <= 20; round++) {
		struct sfs_reply reply = { .err = 0 };
		struct sfs_read_arg arg = { &reply, fd, len };
		char page[4096];
		pthread_t t;

		sem_init(&reply.done, 0, 0);
		posix_fadvise(fd, 0, len, POSIX_FADV_DONTNEED);
		CHECK_EQ_INT(pread(fd, page, sizeof(page), 0), 4096);
		CHECK(!sfs_page_cached(fd, 4096));
		CHECK_EQ_INT(pthread_create(&t, NULL, sfs_read_and_exit, &arg), 0);
		pthread_join(t, NULL);
		if (round == 20) {
			sfs_read_release(hold, &harg);
			sfs_io_shutdown();
			CHECK_EQ_INT(sem_trywait(&reply.done), 0);
		} else {
			while (sem_wait(&reply.done) < 0 && errno == EINTR)
				;
		}
		CHECK_EQ_INT(reply.err, 0);
		CHECK(!reply.from_fd);
		if (reply.len != len)
			shorts++;
		else
			CHECK(memcmp(reply.buf, data, len) == 0);
		free(reply.buf);
		sem_destroy(&reply.done);
	}
	CHECK_EQ_INT(shorts, 0);
	/* the last round's buffer, freed as the engine stopped, is not kept */
	CHECK_EQ_INT(mallinfo2().hblkhd, mapped);
	sem_destroy(&held.done);
	close(fd);
	free(data);
}

int main(void)
{
	char tmpl[] = "/tmp/strata-unit-XXXXXX";
	size_t size = 3 * (1 << 20) + 123;	/* more than one chunk */
	char *a = malloc(size), *b = malloc(size);
	int root, in, out;

	if (!a || !b || !mkdtemp(tmpl))
		return 1;
	root = open(tmpl, O_RDONLY | O_DIRECTORY);
	for (size_t i = 0; i < size; i++)
		a[i] = (char)(i * 31 + 7);
	in = openat(root, "in", O_CREAT | O_RDWR, 0600);
	out = openat(root, "out", O_CREAT | O_RDWR, 0600);
	CHECK_EQ_INT(sfs_io_pwrite(in, a, size, 0), (long long)size);

	CHECK_EQ_INT(sfs_io_copy_range(in, out, 0, size), 0);
	CHECK_EQ_INT(sfs_io_pread(out, b, size, 0), (long long)size);
	CHECK(memcmp(a, b, size) == 0);

	/* a range at an offset lands at the same offset */
	CHECK_EQ_INT(ftruncate(out, 0), 0);
	CHECK_EQ_INT(sfs_io_copy_range(in, out, 4096, 8192), 0);
	CHECK_EQ_INT(sfs_io_pread(out, b, 8192, 4096), 8192);
	CHECK(memcmp(a + 4096, b, 8192) == 0);

	/* asking past the end copies what is there and stops */
	CHECK_EQ_INT(sfs_io_copy_range(in, out, size - 10, 1000), 0);
	CHECK_EQ_INT(lseek(out, 0, SEEK_END), (long long)size);

	/* errors come back as negative errno */
	CHECK_EQ_INT(sfs_io_pread(-1, b, 1, 0), -EBADF);
	CHECK_EQ_INT(sfs_io_pwrite(-1, b, 1, 0), -EBADF);
	CHECK_EQ_INT(sfs_io_copy_range(in, -1, 0, 10), -EBADF);

	close(in);
	close(out);
	sfs_test_read_alone_or_not(tmpl);
	sfs_test_read_outlives_thread(tmpl);
	strata_rmtree_at(AT_FDCWD, tmpl);
	close(root);
	free(a);
	free(b);
	return unit_done("test_io");
}
