// SPDX-License-Identifier: Apache-2.0
/*
 * faultdisk: a disk that fails on command, for tests. A FUSE filesystem
 * with a file "disk", whose bytes are an image file's; a loop device over
 * MNT/disk is a block device whose every I/O reaches this daemon, since
 * the file bypasses the page cache (direct_io). Once "fail" is written
 * to MNT/ctl, every read, write and fsync of the disk fails with EIO, as
 * a dying disk's would; once "heal" is, it works again. The write to ctl
 * returns when the switch is made. It stands in for device-mapper's
 * error target on kernels without device-mapper.
 *
 *   faultdisk IMAGE MNT      (in the foreground; fusermount3 -u MNT ends it)
 */
#define FUSE_USE_VERSION 31

#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fd_image = -1;
static off_t image_size;
static int failing; /* read and written with atomics: threads serve it */

static int fd_getattr(const char *path, struct stat *st,
		      struct fuse_file_info *fi)
{
	(void)fi;
	memset(st, 0, sizeof(*st));
	if (!strcmp(path, "/")) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (!strcmp(path, "/disk")) {
		st->st_mode = S_IFREG | 0600;
		st->st_nlink = 1;
		st->st_size = image_size;
	} else if (!strcmp(path, "/ctl")) {
		st->st_mode = S_IFREG | 0200;
		st->st_nlink = 1;
	} else {
		return -ENOENT;
	}
	return 0;
}

static int fd_readdir(const char *path, void *buf, fuse_fill_dir_t fill,
		      off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	(void)off;
	(void)fi;
	(void)flags;
	if (strcmp(path, "/"))
		return -ENOTDIR;
	fill(buf, ".", NULL, 0, 0);
	fill(buf, "..", NULL, 0, 0);
	fill(buf, "disk", NULL, 0, 0);
	fill(buf, "ctl", NULL, 0, 0);
	return 0;
}

static int fd_open(const char *path, struct fuse_file_info *fi)
{
	if (strcmp(path, "/disk") && strcmp(path, "/ctl"))
		return -ENOENT;
	fi->direct_io = 1;
	return 0;
}

static int fd_read(const char *path, char *buf, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	ssize_t n;

	(void)path;
	(void)fi;
	if (__atomic_load_n(&failing, __ATOMIC_SEQ_CST))
		return -EIO;
	n = pread(fd_image, buf, size, off);
	return n < 0 ? -errno : (int)n;
}

static int fd_write(const char *path, const char *buf, size_t size,
		    off_t off, struct fuse_file_info *fi)
{
	ssize_t n;

	(void)fi;
	if (!strcmp(path, "/ctl")) {
		if (size >= 4 && (!memcmp(buf, "fail", 4) || !memcmp(buf, "heal", 4))) {
			__atomic_store_n(&failing, buf[0] == 'f', __ATOMIC_SEQ_CST);
			return (int)size;
		}
		return -EINVAL;
	}
	if (__atomic_load_n(&failing, __ATOMIC_SEQ_CST))
		return -EIO;
	n = pwrite(fd_image, buf, size, off);
	return n < 0 ? -errno : (int)n;
}

static int fd_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	(void)datasync;
	(void)fi;
	if (__atomic_load_n(&failing, __ATOMIC_SEQ_CST))
		return -EIO;
	return fdatasync(fd_image) < 0 ? -errno : 0;
}

static const struct fuse_operations fd_ops = {
	.getattr = fd_getattr,
	.readdir = fd_readdir,
	.open = fd_open,
	.read = fd_read,
	.write = fd_write,
	.fsync = fd_fsync,
};

int main(int argc, char **argv)
{
	/* the mount's type is fuse.<argv[0]>: fuse.faultdisk, whatever the file */
	char *fargv[] = { "faultdisk", "-f", argc > 2 ? argv[2] : NULL, NULL };
	struct stat st;

	if (argc != 3) {
		fprintf(stderr, "usage: faultdisk IMAGE MNT\n");
		return 2;
	}
	fd_image = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd_image < 0 || fstat(fd_image, &st) < 0) {
		perror(argv[1]);
		return 1;
	}
	image_size = st.st_size;
	return fuse_main(3, fargv, &fd_ops, NULL);
}
