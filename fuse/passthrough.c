// SPDX-License-Identifier: Apache-2.0
/*
 * passthrough.c: file data that never reaches the daemon. On by default
 * where the kernel and our privileges allow it; "-o nopassthrough" turns
 * it off, and so does capacity= (a limit needs the daemon to see every
 * write; asked for together, the two are refused at mount).
 *
 * When an OPEN or CREATE reply carries FOPEN_PASSTHROUGH and the id of a
 * backing file (registered with FUSE_DEV_IOC_BACKING_OPEN), the kernel
 * reads, writes and maps that file itself (Linux 6.9 and later, built
 * with CONFIG_FUSE_PASSTHROUGH; registering needs CAP_SYS_ADMIN): no
 * round trip per read or write, and the page cache is the backing
 * file's. libfuse 3.14 knows nothing of it, so handshake.c negotiates it
 * and the replies are built here.
 *
 * Only files already in the upper layer go through: lower files stay
 * with the daemon so that a read-only handle follows a later copy-up (a
 * backing file is fixed for the life of the handle).
 *
 * Privileges are dropped as the kernel would, though the kernel writes
 * the backing file with the daemon's credentials: every kernel with FUSE
 * passthrough writes through backing_file_write_iter (fs/backing-file.c,
 * Linux 6.8+), which first removes privileges on the FUSE file with the
 * writer's own credentials. Under HANDLE_KILLPRIV_V2 that arrives as a
 * SETATTR without bits, which sfs_setattr answers with the writer's rule;
 * the upper filesystem drops a file capability on any write itself. So
 * files with setuid, setgid or a capability pass through as well, and one
 * that gains them while open loses them at the next write, whoever holds
 * the handle (tests/integration/test_passthrough.py, against kernel
 * overlayfs).
 *
 * The kernel's reads and writes pass the statistics' counters by too.
 * What can be counted is counted at open and last close: the handles
 * (passthrough_opens), and, as bytes written, what a file grew by while
 * it had passthrough writers. Overwrites in place and reads are not
 * seen; no kernel counter tells them per file.
 *
 * The kernel fails (EIO) an open that disagrees with the inode's other
 * open files: all passthrough with the same backing id, or none. So a
 * node's first handle decides for every handle opened while it is open,
 * and the backing id lives as long as the node has passthrough handles.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "stratafs.h"

/*
 * The parts of the kernel's FUSE ABI (protocol 7.40) that bookworm's
 * linux-libc-dev (6.1) does not have yet.
 */
#define SFS_FOPEN_PASSTHROUGH (1u << 7)
struct sfs_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};
#define SFS_IOC_BACKING_OPEN _IOW(FUSE_DEV_IOC_MAGIC, 1, struct sfs_backing_map)
#define SFS_IOC_BACKING_CLOSE _IOW(FUSE_DEV_IOC_MAGIC, 2, uint32_t)
/* fuse_open_out, whose padding became backing_id */
struct sfs_open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

bool sfs_pass_wanted(void)
{
	const struct sfs_params *p = &sfs->params;
	uint64_t cap = 0;

	if (p->passthrough != SFS_PASS_DEFAULT)
		return p->passthrough == SFS_PASS_ASKED;
	/* parsed and checked at start (params.c) */
	if (p->capacity)
		sfs_usage_parse(p->capacity, &cap);
	return p->upperdir && !cap;
}

/* A backing id for fd, or 0 when the kernel refuses it. */
static int sfs_pass_register(int fd)
{
	struct sfs_backing_map map = { .fd = fd };
	int id = ioctl(fuse_session_fd(sfs->se), SFS_IOC_BACKING_OPEN, &map);

	if (id > 0)
		return id;
	/* out of memory or descriptors passes; anything else will not */
	if (errno == ENOMEM || errno == EMFILE || errno == ENFILE)
		strata_debug("passthrough refused (%s): through the daemon",
			     strerror(errno));
	else if (atomic_exchange(&sfs->passthrough, false))
		strata_log(sfs->params.passthrough == SFS_PASS_ASKED ?
			   STRATA_LOG_WARN : STRATA_LOG_INFO,
			   "passthrough refused (%s%s): file data goes through "
			   "the daemon", strerror(errno),
			   errno == EPERM ? ", it needs CAP_SYS_ADMIN" :
			   errno == ELOOP ? ", a layer is stacked already" : "");
	return 0;
}

/* OPEN_FLAGS: the open(2) flags, which f->flags keeps only in part */
int sfs_pass_open(struct sfs_file *f, int open_flags)
{
	struct sfs_node *n = f->node;
	struct sfs_pass *p;
	struct stat st;
	int id = 0;

	if (!atomic_load(&sfs->passthrough) || !S_ISREG(n->type) ||
	    !atomic_load(&f->upper))
		return 0;
	sfs_lock(&n->lock);
	if (!n->pass) {
		/*
		 * Another handle is open without: this one must be too. An
		 * O_APPEND handle stays with the daemon: the kernel opens
		 * the backing file with the open's own flags, and an F_SETFL
		 * that clears O_APPEND later never reaches it (adding it
		 * does: the kernel passes the user file's append on per
		 * write). With passthrough already on, it joins it in
		 * direct I/O instead (sfs_pass_reply).
		 */
		if (atomic_load(&n->nopen) > 1 || (open_flags & O_APPEND))
			goto out;
		p = sfs_shm_alloc(sizeof(*p));
		if (!p)
			goto out;	/* through the daemon, as before */
		p->backing = sfs_pass_register(f->fd);
		if (!p->backing) {
			sfs_shm_free(p);
			goto out;
		}
		n->pass = p;
		n->pass_used = true;
	}
	p = n->pass;
	p->handles++;
	f->passthrough = true;
	sfs_count(STRATA_ST_PASS_OPENS, 1);
	/* the kernel writes it without us: as if written from now on */
	if ((f->flags & O_ACCMODE) != O_RDONLY) {
		atomic_fetch_add(&n->dirty, 1);
		if (!p->wrote && fstat(f->fd, &st) == 0) {
			p->size = st.st_size;
			p->wrote = true;
		}
	}
	id = p->backing;
out:
	sfs_unlock(&n->lock);
	return id;
}

void sfs_pass_release(struct sfs_file *f)
{
	struct sfs_node *n = f->node;
	struct sfs_pass *p;
	struct stat st;
	uint32_t id;

	if (!f->passthrough)
		return;
	sfs_lock(&n->lock);
	p = n->pass;
	if (--p->handles == 0) {
		if (p->wrote && fstat(f->fd, &st) == 0 && st.st_size > p->size)
			sfs_count(STRATA_ST_WRITE_BYTES,
				  (uint64_t)(st.st_size - p->size));
		id = (uint32_t)p->backing;
		n->pass = NULL;
		sfs_shm_free(p);
		/* after the session, the ids went with the connection */
		if (sfs->se)
			ioctl(fuse_session_fd(sfs->se), SFS_IOC_BACKING_CLOSE,
			      &id);
	}
	sfs_unlock(&n->lock);
}

bool sfs_pass_keep_cache(struct sfs_node *n)
{
	bool keep;

	/*
	 * Passthrough writes bypass the page cache of the FUSE inode: pages
	 * it kept from before are stale, and the next ordinary open drops
	 * them.
	 */
	sfs_lock(&n->lock);
	keep = !n->pass_used;
	n->pass_used = false;
	sfs_unlock(&n->lock);
	return keep;
}

/* libfuse's timeouts, split as the protocol wants them */
static void sfs_pass_timeout(double t, uint64_t *sec, uint32_t *nsec)
{
	*sec = (uint64_t)t;
	*nsec = (uint32_t)((t - (double)*sec) * 1e9);
}

/* An entry reply's body, for the replies built here and in tmpfile.c. */
void sfs_entry_out(struct fuse_entry_out *o, const struct fuse_entry_param *e)
{
	const struct stat *st = &e->attr;

	memset(o, 0, sizeof(*o));
	o->nodeid = e->ino;
	o->generation = e->generation;
	sfs_pass_timeout(e->entry_timeout, &o->entry_valid,
			 &o->entry_valid_nsec);
	sfs_pass_timeout(e->attr_timeout, &o->attr_valid, &o->attr_valid_nsec);
	o->attr.ino = st->st_ino;
	o->attr.mode = st->st_mode;
	o->attr.nlink = st->st_nlink;
	o->attr.uid = st->st_uid;
	o->attr.gid = st->st_gid;
	o->attr.rdev = st->st_rdev;
	o->attr.size = st->st_size;
	o->attr.blksize = st->st_blksize;
	o->attr.blocks = st->st_blocks;
	o->attr.atime = st->st_atim.tv_sec;
	o->attr.atimensec = st->st_atim.tv_nsec;
	o->attr.mtime = st->st_mtim.tv_sec;
	o->attr.mtimensec = st->st_mtim.tv_nsec;
	o->attr.ctime = st->st_ctim.tv_sec;
	o->attr.ctimensec = st->st_ctim.tv_nsec;
}

int sfs_pass_reply(fuse_req_t req, const struct fuse_entry_param *e,
		   uint64_t fh, int backing, int open_flags)
{
	struct fuse_entry_out entry;
	/* FLUSH does nothing here, as for every open (sfs_file_reply) */
	struct sfs_open_out open = {
		.fh = fh,
		.open_flags = SFS_FOPEN_PASSTHROUGH | FOPEN_NOFLUSH,
		.backing_id = backing,
	};
	struct iovec iov[2];
	int n = 0;

	/*
	 * An O_APPEND open of a file already in passthrough (sfs_pass_open
	 * starts none for it). The kernel fails with EIO any open of such
	 * a file that is not passthrough too, and a passthrough one keeps
	 * O_APPEND past an F_SETFL that clears it. Direct I/O with the
	 * backing file sends its reads and writes here, each with the
	 * offset the kernel chose from the flags of the moment, and leaves
	 * the backing file to mmap(2) alone.
	 */
	if (open_flags & O_APPEND)
		open.open_flags |= FOPEN_DIRECT_IO;

	if (e) {
		sfs_entry_out(&entry, e);
		iov[n++] = (struct iovec){ &entry, sizeof(entry) };
	}
	iov[n++] = (struct iovec){ &open, sizeof(open) };
	return fuse_reply_iov(req, iov, n);
}
