// SPDX-License-Identifier: Apache-2.0
/*
 * metaops: times metadata operations from inside one process, so that
 * what is measured is the filesystem, not process start-up (one `touch`
 * per file) or an interpreter's per-file overhead.
 *
 *   metaops create  DIR N     open(O_CREAT|O_EXCL) + close of DIR/f000000..
 *   metaops stat    DIR N     lstat of each of them
 *   metaops readdir DIR       opendir + readdir to the end, no stat
 *   metaops unlink  DIR N     unlink of each of them
 *   metaops append  FILE      open(O_WRONLY|O_APPEND) + write 16 bytes +
 *                             close: on a union mount, the first write
 *                             open of a lower file is its copy-up; then
 *                             sync(2), timed too
 *
 * Prints the elapsed wall time in seconds (CLOCK_MONOTONIC) on stdout;
 * for append two: until close returned, and until sync returned. For
 * readdir the entry count goes to stderr. Exits non-zero on the first
 * error, naming it, so a failure is recorded rather than a bogus time.
 *
 * Built by run.sh with: cc -O2 -o metaops metaops.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, const char *path)
{
	fprintf(stderr, "metaops: %s %s: %s\n", what, path, strerror(errno));
	exit(1);
}

/* Names are built into a buffer that already holds "DIR/", so the loop
 * does no allocation. */
static char path[4096];
static size_t dirlen;

static void set_dir(const char *dir)
{
	dirlen = (size_t)snprintf(path, sizeof(path), "%s/", dir);
	if (dirlen >= sizeof(path) - 16) {
		fprintf(stderr, "metaops: path too long\n");
		exit(2);
	}
}

static const char *name(long i)
{
	snprintf(path + dirlen, sizeof(path) - dirlen, "f%06ld", i);
	return path;
}

int main(int argc, char **argv)
{
	double t0, t1;
	long i, n = 0;

	if (argc < 3) {
		fprintf(stderr, "usage: metaops create|stat|unlink DIR N | "
				"readdir DIR | append FILE\n");
		return 2;
	}
	const char *op = argv[1];
	if (argc > 3)
		n = atol(argv[3]);

	if (strcmp(op, "create") == 0) {
		set_dir(argv[2]);
		t0 = now();
		for (i = 0; i < n; i++) {
			int fd = open(name(i), O_CREAT | O_EXCL | O_WRONLY, 0644);
			if (fd < 0)
				die("create", path);
			close(fd);
		}
		t1 = now();
	} else if (strcmp(op, "stat") == 0) {
		struct stat st;
		set_dir(argv[2]);
		t0 = now();
		for (i = 0; i < n; i++)
			if (lstat(name(i), &st) < 0)
				die("stat", path);
		t1 = now();
	} else if (strcmp(op, "unlink") == 0) {
		set_dir(argv[2]);
		t0 = now();
		for (i = 0; i < n; i++)
			if (unlink(name(i)) < 0)
				die("unlink", path);
		t1 = now();
	} else if (strcmp(op, "readdir") == 0) {
		long count = 0;
		t0 = now();
		DIR *d = opendir(argv[2]);
		if (!d)
			die("opendir", argv[2]);
		errno = 0;
		while (readdir(d))
			count++;
		if (errno)
			die("readdir", argv[2]);
		closedir(d);
		t1 = now();
		fprintf(stderr, "%ld\n", count);
	} else if (strcmp(op, "append") == 0) {
		static const char buf[16] = "strata-bench...\n";
		t0 = now();
		int fd = open(argv[2], O_WRONLY | O_APPEND);
		if (fd < 0)
			die("open", argv[2]);
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			die("write", argv[2]);
		if (close(fd) < 0)
			die("close", argv[2]);
		t1 = now();
		/* sync, not fsync or syncfs: a FUSE mount does not pass syncfs
		 * on to its daemon, and the copy is in the upper layer's
		 * filesystem, not necessarily in this file's. */
		sync();
		printf("%.6f %.6f\n", t1 - t0, now() - t0);
		return 0;
	} else {
		fprintf(stderr, "metaops: unknown operation %s\n", op);
		return 2;
	}
	printf("%.6f\n", t1 - t0);
	return 0;
}
