/*
 * handshake.c: the FUSE INIT exchange, with the flags libfuse 3.14
 * cannot negotiate added to its reply.
 *
 * libfuse 3.14 builds the INIT reply from the capabilities it knows,
 * and it does not know FUSE_HANDLE_KILLPRIV_V2 (3.16 does). Without it
 * the kernel checks for privileges to drop itself: a GETXATTR of
 * security.capability before every write(2), which halves the rate of
 * small writes, and a GETATTR before every chown. With it the kernel
 * marks the superblock SB_NOSEC, so a file found free of privileges
 * once is written with no check at all, and it leaves the dropping to
 * us: sfs_file_killpriv on write, sfs_op_setattr on truncate, the
 * upper layer's own chown on chown.
 *
 * "-o passthrough" adds FUSE_PASSTHROUGH (see passthrough.c), which
 * libfuse 3.14 does not know either.
 *
 * The INIT request is the first the kernel sends, before any worker
 * runs, so this thread answers it alone: libfuse writes its reply into
 * a pipe standing in for /dev/fuse, and we pass it on with the flag
 * added when the kernel offered it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stratafs.h"

/*
 * Protocol 7.40 (Linux 6.9), newer than bookworm's linux-libc-dev: bit 37
 * of the flags, and the field after flags2 (an unused one in 7.38).
 */
#define SFS_FUSE_PASSTHROUGH (1ULL << 37)
#define sfs_max_stack_depth unused[0]

/* A reply is a header and fuse_init_out: room for both and more. */
#define SFS_HANDSHAKE_REPLY 4096

/*
 * Fills *buf with the next request: 1, or 0 when the session ends first
 * (a signal, or an unmount before the answer), or a negative errno.
 */
static int sfs_handshake_receive(struct fuse_session *se,
				 struct fuse_buf *buf)
{
	int ret;

	do {
		ret = fuse_session_receive_buf(se, buf);
	} while (ret == -EINTR && !fuse_session_exited(se));
	if (ret > 0)
		return 1;
	if (ret == 0 || ret == -ENODEV || ret == -EINTR) {
		/* the loop then returns at once, as it would have */
		fuse_session_exit(se);
		return 0;
	}
	return ret;
}

/* The flags the kernel offers in INIT, or 0 if buf is some other request. */
static uint64_t sfs_handshake_offered(const struct fuse_buf *buf)
{
	const struct fuse_in_header *in = buf->mem;
	const struct fuse_init_in *init = (const void *)(in + 1);
	uint64_t flags;

	/* every kernel with FUSE_HANDLE_KILLPRIV_V2 sends flags */
	if (buf->size < sizeof(*in) + offsetof(struct fuse_init_in, flags) +
				sizeof(init->flags) ||
	    in->opcode != FUSE_INIT)
		return 0;
	flags = init->flags;
	if ((flags & FUSE_INIT_EXT) &&
	    buf->size >= sizeof(*in) + offsetof(struct fuse_init_in, flags2) +
				 sizeof(init->flags2))
		flags |= (uint64_t)init->flags2 << 32;
	return flags;
}

/* What to add to libfuse's reply: see the top of the file. */
static uint64_t sfs_handshake_wanted(uint64_t offered)
{
	uint64_t want = FUSE_HANDLE_KILLPRIV_V2;

	if (sfs->params.passthrough) {
		if (offered & SFS_FUSE_PASSTHROUGH)
			want |= SFS_FUSE_PASSTHROUGH;
		else
			strata_warn("passthrough: this kernel does not offer it "
				    "(Linux 6.9 and later, built with "
				    "CONFIG_FUSE_PASSTHROUGH): file data goes "
				    "through the daemon");
	}
	return want & offered;
}

/* Adds flags to a successful reply of len bytes; what it added. */
static uint64_t sfs_handshake_patch(char *reply, ssize_t len, uint64_t flags)
{
	struct fuse_out_header *out = (struct fuse_out_header *)reply;
	struct fuse_init_out *init = (struct fuse_init_out *)(out + 1);

	/* an error reply (a protocol libfuse refused) goes on untouched */
	if ((size_t)len < sizeof(*out) + offsetof(struct fuse_init_out, unused) +
				  sizeof(init->unused[0]) ||
	    out->error != 0)
		return 0;
	init->flags |= (uint32_t)flags;
	if (flags >> 32) {
		init->flags |= FUSE_INIT_EXT;
		init->flags2 |= (uint32_t)(flags >> 32);
	}
	/*
	 * The upper and lower layers' filesystems may not be stacked
	 * themselves (the kernel refuses such backing files): that leaves
	 * room for one overlayfs on top of this mount.
	 */
	if (flags & SFS_FUSE_PASSTHROUGH)
		init->sfs_max_stack_depth = 1;
	return flags;
}

/*
 * Lets libfuse process buf with its replies going into a pipe; the
 * reply is left in *reply, *len bytes.
 */
static int sfs_handshake_capture(struct fuse_session *se,
				 const struct fuse_buf *buf, char *reply,
				 ssize_t *len)
{
	int fd = fuse_session_fd(se);
	int pipefd[2], saved;
	int ret = 0;

	saved = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (saved < 0)
		return -errno;
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		ret = -errno;
		goto out_saved;
	}
	if (dup3(pipefd[1], fd, O_CLOEXEC) < 0) {
		ret = -errno;
		goto out_pipe;
	}
	fuse_session_process_buf(se, buf);
	/* /dev/fuse goes back whatever happened */
	if (dup3(saved, fd, O_CLOEXEC) < 0) {
		ret = -errno;
		goto out_pipe;
	}
	/* all write ends closed: an empty pipe reads as 0, never blocks */
	close(pipefd[1]);
	pipefd[1] = -1;
	*len = read(pipefd[0], reply, SFS_HANDSHAKE_REPLY);
	if (*len < 0)
		ret = -errno;
out_pipe:
	close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
out_saved:
	close(saved);
	return ret;
}

int sfs_handshake(struct fuse_session *se)
{
	struct fuse_buf buf = { .mem = NULL };
	char *reply = NULL;
	uint64_t want, added;
	ssize_t len = 0, done;
	int ret;

	ret = sfs_handshake_receive(se, &buf);
	if (ret <= 0)
		goto out;
	want = sfs_handshake_wanted(sfs_handshake_offered(&buf));
	if (!want) {
		/* nothing to add: libfuse answers as it always does */
		fuse_session_process_buf(se, &buf);
		ret = 0;
		goto out;
	}
	reply = malloc(SFS_HANDSHAKE_REPLY);
	if (!reply) {
		ret = -ENOMEM;
		goto out;
	}
	ret = sfs_handshake_capture(se, &buf, reply, &len);
	if (ret < 0)
		goto out;
	added = sfs_handshake_patch(reply, len, want);
	/*
	 * Said before the reply goes: the mount is up as soon as the kernel
	 * has it, and whoever reads the log then must find what was agreed.
	 * A reply that fails ends the session, so nothing acts on it.
	 */
	if (added & FUSE_HANDLE_KILLPRIV_V2)
		strata_debug("INIT: asked for HANDLE_KILLPRIV_V2 as well");
	if (added & SFS_FUSE_PASSTHROUGH) {
		atomic_store(&sfs->passthrough, true);
		strata_info("passthrough: the kernel reads and writes upper "
			    "files itself");
	}
	done = write(fuse_session_fd(se), reply, len);
	if (done != len) {
		/* the device takes a reply whole or not at all */
		ret = done < 0 ? -errno : -EIO;
		goto out;
	}
	ret = 0;
out:
	if (ret < 0)
		strata_err("FUSE INIT: %s", strerror(-ret));
	free(reply);
	free(buf.mem);
	return ret;
}
