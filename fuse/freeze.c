// SPDX-License-Identifier: Apache-2.0
/*
 * freeze.c: a live freeze, the daemon's half of a snapshot of a volume in
 * use. Over the control channel (control.c), `freeze NEWDIR` makes the
 * upper as it is now a read-only layer at NEWDIR, and the mount goes on
 * on a fresh, empty upper at the old path:
 *
 *  1. the names of hard-linked files linked up (below), then syncfs on
 *     the mount (what shared mappings wrote comes here) and on the
 *     upper, while requests still flow, so that little is left to write
 *     back later;
 *  2. the gate closes (gate.c): new requests wait, and those in flight
 *     finish, their replies sent;
 *  3. the upper directory is renamed to NEWDIR (a rename keeps every
 *     descriptor on it valid), an empty one with the same mode and owner
 *     is made at the old path and opened, and the old one, through the
 *     descriptor the daemon already holds, becomes the top lower layer;
 *  4. every node and open file is fixed up (below), in memory only: the
 *     window costs a walk of the node table and no per-file I/O, but
 *     for the hard-link index's entries (below);
 *  5. the gate opens; NEWDIR is synced once more, outside the window.
 *
 * The answer is "layer=NEWDIR bytes=N": N is what the frozen layer
 * allocates by the usage count (usage.c), the count in the window less
 * the recount of the fresh upper; 0 when the recount failed (unknown).
 *
 * The frozen layer is the kernel overlayfs format as the upper was, so
 * its whiteouts and opaque directories keep hiding what is below them:
 * NEWDIR:<old lowers> under the new upper shows what the mount shows,
 * to stratafs and to the kernel's overlayfs alike.
 *
 * Hard links. A lower layer has no index, so a name that reaches a copy
 * in the workdir's hard-link index through its lower name would show the
 * lower file's old data once frozen. Such names are linked into the
 * upper first (linkup.c): the bulk in step 1, while requests flow, and
 * what is left of it, appeared since, once the gate is closed; the index
 * entries then refer to files of the frozen layer, all of whose names
 * are there, and go once the upper has moved.
 *
 * Nodes and open files change in memory (switch.c). A passthrough
 * handle cannot be moved: the kernel reads and writes its backing file
 * without asking, and gives a later open of the same file the same
 * backing file. While one is open on an upper file, the freeze is
 * refused.
 *
 * The layer stack is in the shared state (struct sfs_fs), so a worker
 * that replaces this one, or the binary of an upgrade, serves it as it is
 * after the freeze; the new upper's descriptor is kept by each new worker
 * (sfs_freeze_fds).
 *
 * A worker that dies between the rename (3) and the end of the switch
 * (4) would leave its successor serving the renamed directory, the new
 * layer, as the upper: writes would land in a snapshot. So NEWDIR is in
 * the shared state for that span (sfs->freezing), and the next worker
 * finishes the freeze before it serves (sfs_freeze_takeover), as the
 * CSI plugin finishes the snapshot once the layer moved: both end where
 * the freeze would have; a death inside the switch is the switch's to
 * mend (switch.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"

/*
 * How long requests in flight may take to finish (a big copy-up) before
 * the freeze gives up; new ones wait meanwhile, so not long.
 */
#define SFS_FREEZE_DRAIN_MS 5000

struct sfs_freeze {
	const char *newdir;	/* as asked */
	char *copy;		/* NEWDIR, its last '/' cut: the parent */
	const char *newbase;
	int newparent;		/* NEWDIR's parent */
	const char *upbase;	/* the upper's name in its parent */
	int upparent;		/* the upper's parent, on the real mount */
	struct stat upst;	/* the upper, as its descriptor sees it */
	struct sfs_switch_plan sp;	/* the new stack, for switch.c */
	bool takeover;		/* finishing a dead worker's freeze */
	int64_t bytes;		/* what the frozen layer allocates, counted */
	char *out;		/* the error's message goes here */
	size_t size;
};

#define sfs_freeze_msg(z, ...) snprintf((z)->out, (z)->size, __VA_ARGS__)

/*
 * How many passthrough handles are open, and how many of them for
 * writing. The kernel writes a writer's backing file without the daemon:
 * it cannot be moved off the frozen file. A reader's backing file is the
 * frozen one too, and the kernel gives every passthrough open of a file
 * the backing file of the first: a writer opening it after the freeze
 * would get the frozen file.
 */
static int sfs_freeze_pass_open(int *writers)
{
	int count = 0;

	*writers = 0;
	pthread_mutex_lock(&sfs->handles_lock);
	for (struct sfs_hlink *h = sfs->files.next; h != &sfs->files;
	     h = h->next) {
		struct sfs_file *f = (struct sfs_file *)h;

		if (!f->passthrough || sfs_switch_nameless(f->node))
			continue;
		count++;
		*writers += (f->flags & O_ACCMODE) != O_RDONLY;
	}
	pthread_mutex_unlock(&sfs->handles_lock);
	return count;
}

/*
 * What may change while requests run, checked again once none does:
 * passthrough writers, and names a freeze would leave reaching a file
 * of the hard-link index through its lower name (linkup.c).
 */
static int sfs_freeze_check_busy(struct sfs_freeze *z)
{
	int open, writers;

	open = sfs_freeze_pass_open(&writers);
	if (open) {
		sfs_freeze_msg(z, "%d passthrough handle%s open on upper files "
			       "(%d for writing): the kernel reads and writes "
			       "their files without the daemon, which cannot "
			       "move them off the frozen layer; close them and "
			       "freeze again", open, open > 1 ? "s are" : " is",
			       writers);
		return -EBUSY;
	}
	return sfs_linkup(z->out, z->size);
}

/* NEWDIR: absolute, missing, its parent there and on the upper's fs. */
static int sfs_freeze_check_newdir(struct sfs_freeze *z)
{
	char *slash;
	struct stat st;

	if (z->newdir[0] != '/') {
		sfs_freeze_msg(z, "'%.4000s' is not an absolute path: give the "
			       "new layer's path from /", z->newdir);
		return -EINVAL;
	}
	z->copy = strdup(z->newdir);
	if (!z->copy)
		return -ENOMEM;
	/* a trailing slash names the same directory */
	for (size_t l = strlen(z->copy); l > 1 && z->copy[l - 1] == '/'; l--)
		z->copy[l - 1] = '\0';
	slash = strrchr(z->copy, '/');
	z->newbase = slash + 1;
	if (!*z->newbase || !strcmp(z->newbase, ".") ||
	    !strcmp(z->newbase, "..")) {
		sfs_freeze_msg(z, "'%.4000s' does not name a new directory",
			       z->newdir);
		return -EINVAL;
	}
	*slash = '\0';
	z->newparent = open(slash == z->copy ? "/" : z->copy,
			    O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (z->newparent < 0) {
		int ret = -errno;

		sfs_freeze_msg(z, "the parent of '%.4000s': %s%s", z->newdir,
			       strerror(-ret), ret == -ENOENT ?
			       ": make it first" : "");
		return ret;
	}
	if (fstatat(z->newparent, z->newbase, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		sfs_freeze_msg(z, "'%.4000s' exists: a freeze makes the layer's "
			       "directory itself", z->newdir);
		return -EEXIST;
	}
	if (errno != ENOENT) {
		int ret = -errno;

		sfs_freeze_msg(z, "'%.4000s': %s", z->newdir, strerror(errno));
		return ret;
	}
	if (fstat(z->newparent, &st) < 0)
		return -errno;
	if (st.st_dev != sfs->upper.dev) {
		sfs_freeze_msg(z, "'%.4000s' is on another filesystem than the "
			       "upper '%.4000s': a freeze renames the upper, "
			       "so the new layer must be on its filesystem",
			       z->newdir, sfs->upper_real);
		return -EXDEV;
	}
	return 0;
}

/* The upper's parent, checked to still hold the upper the daemon serves. */
static int sfs_freeze_open_upper(struct sfs_freeze *z)
{
	char *parent = strdup(sfs->upper_real), *slash;
	struct stat st;
	int ret = 0;

	if (!parent)
		return -ENOMEM;
	slash = strrchr(parent, '/');
	*slash = '\0';
	z->upbase = sfs->upper_real + (slash - parent) + 1;
	z->upparent = open(slash == parent ? "/" : parent,
			   O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (z->upparent < 0 || fstat(sfs->upper.fd, &z->upst) < 0 ||
	    fstatat(z->upparent, z->upbase, &st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	else if (st.st_dev != z->upst.st_dev || st.st_ino != z->upst.st_ino)
		ret = -ESTALE;
	if (ret < 0)
		sfs_freeze_msg(z, "the upper '%.4000s' is not where it was: %s",
			       sfs->upper_real, strerror(-ret));
	free(parent);
	return ret;
}

#define SFS_FUSE_SUPER_MAGIC 0x65735546

/*
 * What programs wrote through a shared mapping is in the kernel's page
 * cache of the mount until written back, through this daemon: a syncfs
 * of the mount sends it here while requests still flow, so that it is
 * in the upper before the freeze. Found by the mountpoint's path, and
 * checked to be this mount (a FUSE root with our root's number); a
 * daemon given only a /dev/fuse descriptor does not know where it is.
 */
static void sfs_freeze_sync_mount(void)
{
	const char *mnt = sfs->params.mountpoint;
	struct statfs sfst;
	struct stat st;
	int fd;

	if (!mnt || mnt[0] != '/' || !strncmp(mnt, "/dev/fd/", 8))
		return;
	fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstatfs(fd, &sfst) == 0 && sfst.f_type == SFS_FUSE_SUPER_MAGIC &&
	    fstat(fd, &st) == 0 && st.st_ino == sfs->root->ino &&
	    syncfs(fd) < 0)
		strata_warn("freeze: syncing the mount: %s", strerror(errno));
	close(fd);
}

/* Everything a freeze needs that can fail, before the gate closes. */
static int sfs_freeze_prepare(struct sfs_freeze *z)
{
	int ret;

	if (!sfs_has_upper()) {
		sfs_freeze_msg(z, "a read-only mount has no upper to freeze");
		return -EROFS;
	}
	if (!sfs->upper_real || !sfs->upper_from_work) {
		sfs_freeze_msg(z, "the upper's real path is not known");
		return -EOPNOTSUPP;
	}
	if (sfs->nlower + 1 > SFS_MAX_LOWERS ||
	    sfs->ntraps >= SFS_MAX_LOWERS + 2) {
		sfs_freeze_msg(z, "the mount has %d lower layers already, and "
			       "stratafs serves at most %d: freeze a copy, or "
			       "flatten the layers", sfs->nlower,
			       SFS_MAX_LOWERS);
		return -E2BIG;
	}
	ret = sfs_freeze_check_newdir(z);
	if (ret == 0)
		ret = sfs_freeze_open_upper(z);
	if (ret == 0)
		ret = sfs_freeze_check_busy(z);
	if (ret < 0)
		return ret;
	z->sp.frozen = sfs->upper;
	z->sp.frozen.path = sfs_shm_strdup(z->newdir);
	if (!z->sp.frozen.path)
		return -ENOMEM;
	/* most dirty data goes now, while requests still flow */
	sfs_freeze_sync_mount();
	if (syncfs(sfs->upper.fd) < 0) {
		ret = -errno;
		sfs_freeze_msg(z, "syncing the upper: %s", strerror(errno));
		return ret;
	}
	return 0;
}

/*
 * The new upper, as the old one was made: mode, owner and ACLs. Opened
 * through the workdir's mount, where copy-ups rename from (super.c).
 */
static int sfs_freeze_make_upper(struct sfs_freeze *z)
{
	struct stat st;
	int ret;

	/*
	 * Taking over, the dead worker or the plugin may have made it:
	 * empty either way, since nothing served it yet.
	 */
	if (mkdirat(z->upparent, z->upbase, 0700) < 0 &&
	    (errno != EEXIST || !z->takeover))
		return -errno;
	if (fchownat(z->upparent, z->upbase, z->upst.st_uid, z->upst.st_gid,
		     AT_SYMLINK_NOFOLLOW) < 0 ||
	    fchmodat(z->upparent, z->upbase, z->upst.st_mode & 07777, 0) < 0 ||
	    fstatat(z->upparent, z->upbase, &st, AT_SYMLINK_NOFOLLOW) < 0)
		goto out_errno;
	z->sp.newfd = openat(sfs->workfd, sfs->upper_from_work,
			  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (z->sp.newfd < 0)
		goto out_errno;
	ret = fstat(z->sp.newfd, &z->upst) < 0 ? -errno : 0;
	if (ret == 0 && (z->upst.st_dev != st.st_dev ||
			 z->upst.st_ino != st.st_ino))
		ret = -ESTALE;	/* the workdir's way there leads elsewhere */
	z->sp.newdev = z->upst.st_dev;
	z->sp.newino = z->upst.st_ino;
	/* the old upper, renamed: still the root's attributes until now */
	if (ret == 0)
		ret = strata_acl_copy(sfs->upper.fd, z->sp.newfd);
	if (ret == 0) {
		z->sp.rootfd = dup(z->sp.newfd);
		if (z->sp.rootfd < 0)
			ret = -errno;
	}
	if (ret == 0)
		return 0;
	close(z->sp.newfd);
	z->sp.newfd = -1;
	unlinkat(z->upparent, z->upbase, AT_REMOVEDIR);
	return ret;

out_errno:
	ret = -errno;
	unlinkat(z->upparent, z->upbase, AT_REMOVEDIR);
	return ret;
}

/* The freeze is over, through or undone: no worker need finish it. */
static void sfs_freeze_done(void)
{
	atomic_store(&sfs->freezing, NULL);
}

static long sfs_freeze_us(const struct timespec *a, const struct timespec *b)
{
	return (b->tv_sec - a->tv_sec) * 1000000L +
	       (b->tv_nsec - a->tv_nsec) / 1000;
}

static int sfs_freeze(struct sfs_freeze *z)
{
	struct timespec closed, opened;
	int ret, counted;

	ret = sfs_freeze_prepare(z);
	if (ret < 0)
		return ret;
	ret = sfs_gate_close(SFS_FREEZE_DRAIN_MS);
	if (ret < 0) {
		sfs_freeze_msg(z, "requests still in flight after %d ms: "
			       "nothing was changed; try again",
			       SFS_FREEZE_DRAIN_MS);
		return ret;
	}
	clock_gettime(CLOCK_MONOTONIC, &closed);
	ret = sfs_freeze_check_busy(z);
	if (ret == 0) {
		ret = sfs_switch_prepare(&z->sp);
		if (ret < 0)
			sfs_freeze_msg(z, "no memory for the nodes' layers");
	}
	if (ret < 0)
		goto out_open;
	atomic_store(&sfs->freezing, z->sp.frozen.path);
	if (renameat(z->upparent, z->upbase, z->newparent, z->newbase) < 0) {
		ret = -errno;
		sfs_freeze_msg(z, "renaming the upper '%.4000s' to '%.4000s': %s",
			       sfs->upper_real, z->newdir, strerror(errno));
		goto out_open;
	}
	sfs_crash_after("freeze.moved");
	ret = sfs_freeze_make_upper(z);
	if (ret < 0) {
		sfs_freeze_msg(z, "making the new upper '%.4000s': %s",
			       sfs->upper_real, strerror(-ret));
		if (renameat(z->newparent, z->newbase, z->upparent,
			     z->upbase) < 0)
			strata_err("freeze: renaming '%s' back to '%s': %s: the "
				   "upper is at the new path now", z->newdir,
				   sfs->upper_real, strerror(errno));
		goto out_open;
	}
	sfs_crash_after("freeze.made");
	/* what no request owns: none is in flight to finish it */
	if (sfs_tmp_clear() < 0)
		strata_warn("freeze: clearing the workdir's temporary entries");
	/* every name is linked up: the entries are the frozen layer's files */
	sfs_linkup_drop();
	sfs_switch_run(&z->sp);
	counted = sfs_usage_recount(&z->bytes);
	if (counted < 0)
		strata_warn("freeze: counting the new upper's usage: %s",
			    strerror(-counted));
	sfs_crash_after("freeze.through");
out_open:
	sfs_freeze_done();
	sfs_gate_open();
	clock_gettime(CLOCK_MONOTONIC, &opened);
	if (ret < 0)
		return ret;
	strata_info("freeze: the upper is layer %s now; requests waited "
		    "%ld us", z->newdir, sfs_freeze_us(&closed, &opened));
	/* the frozen layer changes no more: what the first sync left */
	if (syncfs(sfs->lower[0].fd) < 0)
		strata_warn("freeze: syncing %s: %s", z->newdir, strerror(errno));
	return 0;
}

int sfs_freeze_verb(int argc, char **argv, char *out, size_t size)
{
	struct sfs_freeze z = {
		.newdir = argv[0], .newparent = -1, .upparent = -1,
		.sp = { .newfd = -1, .rootfd = -1 }, .out = out, .size = size,
	};
	int ret = sfs_freeze(&z);

	if (ret == 0)
		snprintf(out, size, "layer=%s bytes=%" PRId64, z.newdir,
			 z.bytes);
	sfs_switch_unprepare(&z.sp);
	sfs_shm_free(z.sp.frozen.path);
	if (z.newparent >= 0)
		close(z.newparent);
	if (z.upparent >= 0)
		close(z.upparent);
	free(z.copy);
	return ret;
}

/*
 * The layers' descriptors: a new worker keeps them (worker.c). The
 * supervisor's own set has those it opened at the start, not the upper a
 * freeze opened since.
 */
void sfs_freeze_fds(struct sfs_fdset *keep)
{
	sfs_fdset_add(keep, sfs->upper.fd);
	for (int i = 0; i < sfs->nlower; i++)
		sfs_fdset_add(keep, sfs->lower[i].fd);
	sfs_switch_fds(keep);
}

/*
 * Before a new worker serves: a freeze its predecessor died in after
 * renaming the upper (see the top of the file) is finished, with a fresh
 * upper and the switch. If the upper is still where it was, nothing had
 * moved, or the freeze had put it back: there is nothing to do. KEEP
 * gets the descriptors the switch opens. An error leaves the worker
 * unable to serve: the upper it had is a layer now.
 */
int sfs_freeze_takeover(struct sfs_fdset *keep)
{
	char msg[512] = "";
	struct sfs_freeze z = {
		.newdir = atomic_load(&sfs->freezing), .newparent = -1,
		.upparent = -1, .sp = { .newfd = -1, .rootfd = -1 }, .out = msg,
		.size = sizeof(msg), .takeover = true,
	};
	const char *where = "in its switch";
	int ret;

	sfs_switch_free_left();
	if (!z.newdir)
		return 0;
	if (sfs_switch_pending())
		goto finish;
	ret = sfs_freeze_open_upper(&z);
	if (ret == 0) {
		/*
		 * The upper is where it was: the rename had not happened or
		 * was undone, or the switch was through (NEWDIR is the top
		 * layer's path then, and stays). Cleared before it is freed:
		 * a worker dying in between must not find it freed.
		 */
		bool through = sfs->nlower > 0 &&
			       sfs->lower[0].path == z.newdir;

		strata_info("freeze: the worker before died in a freeze into "
			    "%s %s: nothing to finish", z.newdir, through ?
			    "once it was through" : "before its upper moved");
		sfs_freeze_done();
		if (!through)
			sfs_shm_free((char *)z.newdir);
		goto out;
	}
	if (ret != -ENOENT && ret != -ESTALE)
		goto out_err;
	z.sp.frozen = sfs->upper;
	z.sp.frozen.path = (char *)z.newdir;
	ret = sfs_freeze_make_upper(&z);
	if (ret < 0) {
		sfs_freeze_msg(&z, "making the new upper '%.400s': %s",
			       sfs->upper_real, strerror(-ret));
		goto out_err;
	}
	sfs_fdset_add(keep, z.sp.newfd);
	sfs_fdset_add(keep, z.sp.rootfd);
	where = "after its upper moved";
finish:
	ret = sfs_switch_finish(&z.sp);
	if (ret < 0) {
		sfs_freeze_msg(&z, "no memory for the nodes' layers");
		goto out_err;
	}
	if (sfs_usage_recount(&z.bytes) < 0)
		strata_warn("freeze: counting the new upper's usage");
	strata_warn("freeze: finished the freeze into %s that the worker "
		    "before died %s", sfs->lower[0].path, where);
	goto out;
out_err:
	strata_err("freeze: the worker before died in a freeze into %s "
		   "after its upper moved, and it cannot be finished: %s",
		   z.newdir, msg);
	if (z.sp.newfd >= 0)
		close(z.sp.newfd);
	if (z.sp.rootfd >= 0)
		close(z.sp.rootfd);
	sfs_switch_unprepare(&z.sp);
	if (z.upparent >= 0)
		close(z.upparent);
	return ret;
out:
	sfs_freeze_done();
	sfs_switch_unprepare(&z.sp);
	if (z.upparent >= 0)
		close(z.upparent);
	return 0;
}
