// SPDX-License-Identifier: Apache-2.0
/*
 * tmpfile.c: open(O_TMPFILE), which the kernel sends as FUSE_TMPFILE
 * (protocol 7.37, Linux 6.1). libfuse 3.14 has no handler for it and
 * answers ENOSYS, after which the kernel refuses O_TMPFILE on the mount
 * for good (EOPNOTSUPP), where the kernel's overlayfs makes the file in
 * the upper directory.
 *
 * So the transport (transport.c) hands FUSE_TMPFILE requests here
 * before libfuse sees them, and they are answered on the descriptor they
 * came from.
 *
 * The file is an unnamed file in the upper directory (copied up first),
 * a node with no name, and an open handle. A later linkat(2) of it
 * arrives as an ordinary LINK and names it (dir.c); the kernel itself
 * keeps a file opened with O_EXCL from being linked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "stratafs.h"

/* Answers one request on the device it came from: ERR, or ARGS. */
static int sfs_tmpfile_reply(int fd, uint64_t unique, int err,
			     struct iovec *args, int nargs)
{
	struct fuse_out_header out = { .unique = unique, .error = err };
	struct iovec iov[3] = { { &out, sizeof(out) } };

	out.len = sizeof(out);
	for (int i = 0; i < nargs; i++) {
		iov[i + 1] = args[i];
		out.len += args[i].iov_len;
	}
	/* ENOENT: the request was interrupted and is gone */
	return sfs_transport_writev(fd, iov, nargs + 1) < 0 ? -errno : 0;
}

/* The unnamed file in the upper directory of IN's node, as a new node. */
static int sfs_tmpfile_node(const struct fuse_in_header *in,
			    const struct fuse_create_in *arg,
			    struct sfs_node **out)
{
	mode_t mode = S_IFREG | (arg->mode & 07777);
	uid_t uid = in->uid;
	gid_t gid = in->gid;
	struct sfs_acl acl = { 0 };
	struct sfs_node *dir;
	struct sfs_xpath x;
	struct sfs_found f;
	int fd, ret;

	ret = sfs_node_get_pinned(in->nodeid, &dir);
	if (ret < 0)
		return ret;
	ret = sfs_has_upper() ? sfs_copy_up(dir) : -EROFS;
	if (ret == 0 && sfs_usage_room(1) < 0)
		ret = -ENOSPC;
	/* FUSE_DONT_MASK: the umask, or the parent's default ACL (acl.c) */
	if (ret == 0)
		ret = sfs_acl_inherit(dir, &mode, arg->umask, &acl);
	if (ret < 0)
		goto out;
	sfs_new_owner(dir, &mode, &uid, &gid);
	/* never O_EXCL here: a later link(2) must be able to name it */
	fd = openat(sfs_upper(dir), ".", O_TMPFILE | O_RDWR | O_CLOEXEC,
		    mode & 07777);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	memset(&f, 0, sizeof(f));
	f.type = S_IFREG;
	f.upper = -1;
	if (fchown(fd, uid, gid) < 0 ||
	    /* chown cleared setuid/setgid; the caller asked for them */
	    ((mode & (S_ISUID | S_ISGID)) && fchmod(fd, mode & 07777) < 0))
		ret = -errno;
	if (ret == 0 && acl.def) {
		ret = sfs_xpath_fd(&x, fd);
		if (ret == 0)
			ret = sfs_acl_set_new(&x, mode, &acl);
	}
	if (ret == 0)
		ret = f.upper = sfs_reopen(fd, O_PATH);
	close(fd);
	if (ret >= 0)
		ret = sfs_fstat(f.upper, &f.st);
	if (ret < 0) {
		sfs_found_release(&f);
		goto out;
	}
	*out = sfs_node_from_found(dir, "", &f,
				   sfs_ino_compose(sfs->upper.fsid, f.st.st_ino),
				   &ret);
	if (*out) {
		/* given back at its last close, unless it is linked by then */
		sfs_usage_charge(0, 1);
		sfs_lock(&(*out)->lock);
		(*out)->unlinked = true;
		(*out)->linkable = true;
		sfs_unlock(&(*out)->lock);
	}
out:
	sfs_acl_free(&acl);
	sfs_node_release(dir);
	return ret;
}

/* Answers a FUSE_TMPFILE request (LEN bytes at BUF) read from FD. */
void sfs_tmpfile_request(int fd, const void *buf, size_t len)
{
	const struct fuse_in_header *in = buf;
	const struct fuse_create_in *arg = (const void *)(in + 1);
	struct fuse_open_out open = { 0 };
	struct fuse_entry_param e;
	struct fuse_entry_out entry;
	struct sfs_node *n = NULL;
	struct sfs_file *f;
	struct iovec iov[2];
	int ret = -EINVAL;

	sfs_count(STRATA_ST_CREATE, 1);
	if (len >= sizeof(*in) + sizeof(*arg))
		ret = sfs_tmpfile_node(in, arg, &n);
	if (ret == 0)
		ret = sfs_fill_entry(n, &e);
	/* the file's own open flags, without what made it unnamed */
	if (ret == 0)
		ret = sfs_file_open(n, arg->flags & ~O_TMPFILE, &f);
	if (ret < 0) {
		sfs_tmpfile_reply(fd, in->unique, ret, NULL, 0);
		goto out;
	}
	sfs_entry_out(&entry, &e);
	/* FLUSH does nothing here, as for every open (sfs_file_reply) */
	open.fh = sfs_file_handle(f);
	open.open_flags = FOPEN_NOFLUSH;
	iov[0] = (struct iovec){ &entry, sizeof(entry) };
	iov[1] = (struct iovec){ &open, sizeof(open) };
	sfs_node_lookup_inc(n);
	if (sfs_tmpfile_reply(fd, in->unique, 0, iov, 2) < 0) {
		sfs_file_close(f);
		sfs_node_lookup_dec(n);
	}
out:
	if (n)
		sfs_node_release(n);
}
