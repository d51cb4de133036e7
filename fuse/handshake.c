// SPDX-License-Identifier: Apache-2.0
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
 * Passthrough (on by default: passthrough.c) adds FUSE_PASSTHROUGH, which
 * libfuse 3.14 does not know either; FUSE over io_uring, the transport
 * when it can be (uring.c), adds FUSE_OVER_IO_URING (protocol 7.42,
 * Linux 6.14): with it in the reply, the kernel takes ring entries.
 *
 * The INIT request is the first the kernel sends, before any worker
 * thread runs, so this thread answers it alone: libfuse's reply is
 * captured (transport.c), and we pass it on with the flag added when the
 * kernel offered it.
 */
#define _GNU_SOURCE
#include <errno.h>
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
static uint64_t sfs_handshake_wanted(uint64_t offered, bool supervised)
{
	uint64_t want = FUSE_HANDLE_KILLPRIV_V2;

	if (sfs_uring_usable(offered, supervised))
		want |= SFS_FUSE_OVER_IO_URING;

	if (sfs_pass_wanted()) {
		if (offered & SFS_FUSE_PASSTHROUGH)
			want |= SFS_FUSE_PASSTHROUGH;
		else
			strata_log(sfs->params.passthrough == SFS_PASS_ASKED ?
				   STRATA_LOG_WARN : STRATA_LOG_INFO,
				   "passthrough: this kernel does not offer it "
				   "(Linux 6.9 and later, built with "
				   "CONFIG_FUSE_PASSTHROUGH): file data goes "
				   "through the daemon");
	} else if (sfs->params.passthrough == SFS_PASS_DEFAULT &&
		   sfs->params.upperdir) {
		strata_info("passthrough: off, as capacity= needs the daemon "
			    "to see every write");
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
	if (flags & SFS_FUSE_OVER_IO_URING)
		sfs_uring_agreed(init);
	return flags;
}

/*
 * Keeps the INIT request, as it came, for the workers after this one:
 * the kernel sends it once per connection.
 */
static int sfs_handshake_keep(const struct fuse_buf *buf)
{
	if (!sfs_shm)
		return 0;	/* one process, never replaced */
	if (buf->size > sizeof(sfs_shm->init))
		return -E2BIG;
	memcpy(sfs_shm->init, buf->mem, buf->size);
	sfs_shm->init_len = (uint32_t)buf->size;
	return 0;
}

int sfs_handshake(struct fuse_session *se, bool supervised)
{
	struct fuse_buf buf = { .mem = NULL };
	struct sfs_capture *cap = NULL;
	uint64_t want, added;
	ssize_t done;
	int ret;

	ret = sfs_handshake_receive(se, &buf);
	if (ret <= 0)
		goto out;
	ret = sfs_handshake_keep(&buf);
	if (ret < 0)
		goto out;
	want = sfs_handshake_wanted(sfs_handshake_offered(&buf), supervised);
	/* libfuse's reply must not splice what a ring answers (super.c) */
	atomic_store(&sfs->uring, (want & SFS_FUSE_OVER_IO_URING) != 0);
	if (!want) {
		/* nothing to add: libfuse answers as it always does */
		fuse_session_process_buf(se, &buf);
		goto out;
	}
	cap = malloc(sizeof(*cap));
	if (!cap) {
		ret = -ENOMEM;
		goto out;
	}
	sfs_transport_capture(cap);
	fuse_session_process_buf(se, &buf);
	sfs_transport_capture(NULL);
	added = sfs_handshake_patch(cap->buf, (ssize_t)cap->len, want);
	if (!(added & SFS_FUSE_OVER_IO_URING))
		atomic_store(&sfs->uring, false);
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
	done = write(fuse_session_fd(se), cap->buf, cap->len);
	if (done != (ssize_t)cap->len) {
		/* the device takes a reply whole or not at all */
		ret = done < 0 ? -errno : -EIO;
		goto out;
	}
out:
	/* this thread reads no more requests: INIT is done with (gate.c) */
	sfs_gate_leave();
	if (ret < 0)
		strata_err("FUSE INIT: %s", strerror(-ret));
	free(cap);
	free(buf.mem);
	return ret;
}

/*
 * A worker after the first: its libfuse session must see the INIT that
 * the kernel sent the first one, and negotiate the same, but its reply
 * goes nowhere. What was negotiated outside libfuse (passthrough) is in
 * the shared state already.
 */
int sfs_handshake_replay(struct fuse_session *se)
{
	struct fuse_buf buf = { .size = sfs_shm->init_len };
	struct sfs_capture *cap = malloc(sizeof(*cap));
	int ret = 0;

	buf.mem = malloc(buf.size);
	if (!cap || !buf.mem) {
		ret = -ENOMEM;
		goto out;
	}
	memcpy(buf.mem, sfs_shm->init, buf.size);
	sfs_transport_capture(cap);
	fuse_session_process_buf(se, &buf);
	sfs_transport_capture(NULL);
	/* libfuse answers an INIT it cannot take with an error */
	if (cap->len < sizeof(struct fuse_out_header) ||
	    ((struct fuse_out_header *)cap->buf)->error)
		ret = -EPROTO;
out:
	if (ret < 0)
		strata_err("FUSE INIT replayed: %s", strerror(-ret));
	free(cap);
	free(buf.mem);
	return ret;
}
