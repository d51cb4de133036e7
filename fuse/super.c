// SPDX-License-Identifier: Apache-2.0
/*
 * The file system as a whole: the process's settings, layers and their
 * checks, the workdir and its lock, the root node, the mount and its
 * options, FUSE connection settings, and the operations table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"

struct sfs_fs *sfs;

/* Every node holds descriptors: take all the process may have. */
static void sfs_raise_nofile(void)
{
	struct rlimit rl;
	FILE *f;
	long max = 0;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	f = fopen("/proc/sys/fs/nr_open", "r");
	if (f) {
		if (fscanf(f, "%ld", &max) != 1)
			max = 0;
		fclose(f);
	}
	if (max > 0 && (rlim_t)max > rl.rlim_max) {
		struct rlimit want = { (rlim_t)max, (rlim_t)max };

		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

/* What the process needs before it opens a layer. */
void sfs_process_init(void)
{
	/* Modes come from the kernel already masked; ours must not mask again. */
	umask(0);
	sfs_raise_nofile();
	/*
	 * A node is allocated by the worker that looks it up and freed by
	 * whichever one gets the FORGET; with glibc's arena per thread (up
	 * to 8 per core) freed memory stays in arenas that other threads do
	 * not allocate from. Nodes live in the shared memory now (shm.c),
	 * listings and lookups' scratch still in the heap: two arenas and
	 * the thread caches keep contention low on this 2-core target.
	 */
	mallopt(M_ARENA_MAX, 2);
	/*
	 * Big buffers (libfuse's 1 MiB request buffer per thread, a write's
	 * data, a big listing) are mapped for themselves and unmapped when
	 * freed. glibc would otherwise raise this threshold past the first
	 * such buffer freed and carve the next ones from an arena, whose
	 * pages stay resident after free: 8 MiB after a sequential write,
	 * still there under every later workload.
	 */
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	sfs_crash_name = getenv("STRATAFS_CRASH_NAME");
	sfs_crash_after_name = getenv("STRATAFS_CRASH_AFTER");
}

/*
 * A layer is held through a private clone of its mount, as the kernel's
 * overlayfs holds its layers: the mount the user sees is never busy
 * because of the daemon, so the filesystem under a layer can be
 * unmounted the moment the union is, even while the daemon is still
 * exiting (its clone keeps the filesystem alive until then). TREE is a
 * clone (open_tree) or -1, and REL the layer's path below it: upper and
 * work share one clone, since renames between them need one mount.
 * Without the privilege to clone, or where the clone does not reach the
 * layer (a mount below the clone's root), it is opened where it is.
 */
static int sfs_open_cloned(int tree, const char *rel, int plain)
{
	struct stat want, got;
	int fd;

	if (tree < 0)
		return plain;
	fd = openat(tree, *rel ? rel : ".",
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(plain, &want) < 0 || fstat(fd, &got) < 0 ||
	    want.st_dev != got.st_dev || want.st_ino != got.st_ino) {
		if (fd >= 0)
			close(fd);
		return plain;
	}
	close(plain);
	return fd;
}

static int sfs_clone(const char *path)
{
	return path ? open_tree(AT_FDCWD, path,
				OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC) : -1;
}

static int sfs_open_layer_at(struct sfs_layer *l, const char *path,
			     const char *what, int tree, const char *rel)
{
	struct stat st;

	l->fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (l->fd < 0) {
		int ret = -errno;

		fprintf(stderr, "stratafs: %s '%s': %s\n", what, path,
			strerror(errno));
		return ret;
	}
	l->fd = sfs_open_cloned(tree, rel, l->fd);
	if (fstat(l->fd, &st) < 0)
		return -errno;
	l->dev = st.st_dev;
	l->path = sfs_shm_strdup(path);
	return l->path ? 0 : -ENOMEM;
}

static int sfs_open_layer(struct sfs_layer *l, const char *path,
			  const char *what)
{
	int tree = sfs_clone(path);
	int ret = sfs_open_layer_at(l, path, what, tree, "");

	if (tree >= 0)
		close(tree);
	return ret;
}

/* Length of the deepest directory holding both absolute paths. */
static size_t sfs_common_dir(const char *a, const char *b)
{
	size_t i = 0, last = 0;

	for (; a[i] && a[i] == b[i]; i++)
		if (a[i] == '/')
			last = i;
	/* a whole component in common: one path is the other's parent */
	if ((!a[i] || a[i] == '/') && (!b[i] || b[i] == '/'))
		last = i;
	return last;
}

/*
 * Where a freeze (freeze.c) renames the upper from, and how it opens the
 * new one through the workdir's mount (the clone below), which copy-ups
 * rename across: UP is the upper's real path, RUP and RWK the upper and
 * the workdir below their common directory (neither is inside the other).
 */
static int sfs_upper_paths(struct sfs_fs *fs, const char *up, const char *rup,
			   const char *rwk)
{
	size_t depth = *rwk != '\0';
	char *p;

	for (const char *c = rwk; *c; c++)
		depth += *c == '/';
	fs->upper_real = sfs_shm_strdup(up);
	fs->upper_from_work = p = sfs_shm_alloc(depth * 3 + strlen(rup) + 1);
	if (!fs->upper_real || !p)
		return -ENOMEM;
	while (depth--)
		p = stpcpy(p, "../");
	strcpy(p, rup);
	return 0;
}

/*
 * Upper and work through one clone, taken at the deepest directory
 * holding both (realpath'd, so no symlink is left in either).
 */
static int sfs_open_upper_work(struct sfs_fs *fs, struct sfs_layer *work)
{
	char *up = realpath(fs->params.upperdir, NULL);
	char *wk = realpath(fs->params.workdir, NULL);
	char *base = NULL;
	const char *rup = "", *rwk = "";
	int tree, ret;

	if (up && wk) {
		size_t l = sfs_common_dir(up, wk);

		base = l ? strndup(up, l) : strdup("/");
		rup = up[l] ? up + l + 1 : "";
		rwk = wk[l] ? wk + l + 1 : "";
	}
	tree = sfs_clone(base);
	ret = sfs_open_layer_at(&fs->upper, fs->params.upperdir, "upperdir",
				tree, rup);
	if (ret == 0)
		ret = sfs_open_layer_at(work, fs->params.workdir, "workdir",
					tree, rwk);
	if (ret == 0 && up && wk)
		ret = sfs_upper_paths(fs, up, rup, rwk);
	if (tree >= 0)
		close(tree);
	free(base);
	free(up);
	free(wk);
	return ret;
}

/* 1 when one path is the other or lies below it. */
static int sfs_paths_overlap(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t l = la < lb ? la : lb;

	if (strncmp(a, b, l))
		return 0;
	if (la == lb)
		return 1;
	/* "/" contains everything; otherwise the next char must be '/'. */
	if (l == 1 && a[0] == '/')
		return 1;
	return (la > lb ? a[l] : b[l]) == '/';
}

/*
 * A layer at, in or above the mountpoint would make the daemon serve
 * itself (fuse-overlayfs hangs there); upper and work nested in each
 * other, or in a lower, would corrupt what the view shows.
 */
static int sfs_check_overlap(struct sfs_fs *fs, char **paths, char **names,
			     int count)
{
	char *mnt = realpath(fs->params.mountpoint, NULL);
	char *real[SFS_MAX_LOWERS + 2];
	int ret = 0;

	if (!mnt) {
		ret = -errno;
		fprintf(stderr, "stratafs: mountpoint '%s': %s\n",
			fs->params.mountpoint, strerror(errno));
		return ret;
	}
	for (int i = 0; i < count; i++)
		real[i] = realpath(paths[i], NULL);
	for (int i = 0; i < count && !ret; i++) {
		if (!real[i])
			continue;
		if (sfs_paths_overlap(real[i], mnt)) {
			fprintf(stderr,
				"stratafs: %s '%s' overlaps the mountpoint '%s'\n",
				names[i], paths[i], fs->params.mountpoint);
			ret = -ELOOP;
			break;
		}
		for (int j = 0; j < i && !ret; j++) {
			/* lower layers may share trees with each other */
			if (!real[j] || (!strcmp(names[i], "lowerdir") &&
					 !strcmp(names[j], "lowerdir")))
				continue;
			if (sfs_paths_overlap(real[i], real[j])) {
				fprintf(stderr,
					"stratafs: %s '%s' and %s '%s' overlap\n",
					names[j], paths[j], names[i], paths[i]);
				ret = -ELOOP;
			}
		}
	}
	for (int i = 0; i < count; i++)
		free(real[i]);
	free(mnt);
	return ret;
}

static unsigned sfs_fsid(struct sfs_fs *fs, dev_t dev, dev_t *devs,
			 unsigned *ndevs)
{
	for (unsigned i = 0; i < *ndevs; i++)
		if (devs[i] == dev)
			return i;
	devs[*ndevs] = dev;
	return (*ndevs)++;
}

/*
 * How long a mount waits for the workdir's lock. The daemon of a mount
 * just unmounted holds it until it has exited (its workers joined, its
 * usage file written), and unmounting then mounting again at once is
 * what scripts do: kernel overlayfs lets go of a workdir at umount.
 */
#define SFS_WORK_LOCK_WAIT_MS 5000
#define SFS_WORK_LOCK_NAP_MS 10

static int sfs_lock_work(struct sfs_fs *fs)
{
	const struct timespec nap = { 0, SFS_WORK_LOCK_NAP_MS * 1000000L };

	for (int waited = 0; waited < SFS_WORK_LOCK_WAIT_MS;
	     waited += SFS_WORK_LOCK_NAP_MS) {
		if (flock(fs->workfd, LOCK_EX | LOCK_NB) == 0)
			return 0;
		if (errno != EWOULDBLOCK) {
			int ret = -errno;

			fprintf(stderr, "stratafs: locking workdir '%s': %s\n",
				fs->params.workdir, strerror(errno));
			return ret;
		}
		nanosleep(&nap, NULL);
	}
	fprintf(stderr, "stratafs: workdir '%s' is in use by another mount "
		"(waited %d s for it)\n", fs->params.workdir,
		SFS_WORK_LOCK_WAIT_MS / 1000);
	return -EBUSY;
}

/* Clears what a crash left in workdir/work and opens the scratch dirs. */
static int sfs_setup_work(struct sfs_fs *fs)
{
	int ret;

	ret = sfs_lock_work(fs);
	if (ret < 0)
		return ret;
	ret = strata_rmtree_at(fs->workfd, SFS_WORK_TMP);
	if (ret < 0 && ret != -ENOENT)
		goto out_err;
	/* the kernel's index dir, shared with it (index.c) */
	if (mkdirat(fs->workfd, SFS_WORK_TMP, 0700) < 0 ||
	    (mkdirat(fs->workfd, SFS_WORK_INDEX, 0700) < 0 && errno != EEXIST)) {
		ret = -errno;
		goto out_err;
	}
	fs->tmpfd = openat(fs->workfd, SFS_WORK_TMP,
			   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fs->indexfd = openat(fs->workfd, SFS_WORK_INDEX,
			     O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fs->tmpfd < 0 || fs->indexfd < 0) {
		ret = -errno;
		goto out_err;
	}
	/* entries are built in work/ and renamed into index/ (fuse/acl.c) */
	ret = strata_acl_clear(fs->tmpfd);
	if (ret == 0)
		ret = strata_acl_clear(fs->indexfd);
	if (ret < 0)
		goto out_err;
	/* The markers live in xattrs: refuse an upper that cannot hold them. */
	if (fsetxattr(fs->tmpfd, fs->xattr_opaque, "y", 1, 0) < 0) {
		ret = -errno;
		fprintf(stderr,
			"stratafs: workdir '%s' cannot hold %s xattrs: %s%s\n",
			fs->params.workdir, fs->xattr_prefix, strerror(errno),
			fs->params.userxattr ? "" : " (try -o userxattr)");
		return ret;
	}
	ret = sfs_probe_rename_whiteout(fs->tmpfd);
	if (ret < 0)
		goto out_err;
	fs->rename_whiteout = ret;
	return 0;

out_err:
	fprintf(stderr, "stratafs: workdir '%s': %s\n", fs->params.workdir,
		strerror(-ret));
	return ret;
}

static int sfs_setup_root(struct sfs_fs *fs)
{
	struct sfs_node *r = sfs_node_alloc(S_IFDIR, fs->nlower, "");
	struct stat st;
	int top;

	if (!r)
		return -ENOMEM;
	fs->root = r;
	atomic_init(&r->refs, 1);	/* the kernel's, never forgotten */
	/* teardown closes them all, also after a failure half way */
	for (int i = 0; i < fs->nlower; i++)
		sfs_node_lower(r)[i].fd = -1;
	if (sfs_has_upper()) {
		int fd = dup(fs->upper.fd);

		if (fd < 0)
			return -errno;
		r->up = (struct sfs_entry){ .fd = fd };
		atomic_store(&r->has_upper, true);
		sfs_node_di(r)->impure = sfs_dir_is_impure(fd) > 0;
	}
	for (int i = 0; i < fs->nlower; i++) {
		sfs_node_lower(r)[i].fd = dup(fs->lower[i].fd);
		sfs_node_lower(r)[i].layer = i + 1;
		if (sfs_node_lower(r)[i].fd < 0)
			return -errno;
	}
	atomic_fetch_add(&fs->node_fds, r->nlower + sfs_has_upper());
	top = sfs_has_upper() ? fs->upper.fd : fs->lower[0].fd;
	if (fstat(top, &st) < 0)
		return -errno;
	r->ino = sfs_ino_compose(sfs_has_upper() ? fs->upper.fsid :
						   fs->lower[0].fsid,
				 st.st_ino);
	return 0;
}

static void sfs_setup_xattr_names(struct sfs_fs *fs)
{
	const char *p = fs->params.userxattr ? "user.overlay." :
					       "trusted.overlay.";

	snprintf(fs->xattr_prefix, sizeof(fs->xattr_prefix), "%s", p);
	snprintf(fs->xattr_opaque, sizeof(fs->xattr_opaque), "%sopaque", p);
	snprintf(fs->xattr_redirect, sizeof(fs->xattr_redirect), "%sredirect",
		 p);
	snprintf(fs->xattr_impure, sizeof(fs->xattr_impure), "%simpure", p);
	snprintf(fs->xattr_ino, sizeof(fs->xattr_ino), "%sstrata.ino", p);
	snprintf(fs->xattr_origin, sizeof(fs->xattr_origin), "%sorigin", p);
	snprintf(fs->xattr_nlink, sizeof(fs->xattr_nlink), "%snlink", p);
	snprintf(fs->xattr_whiteout, sizeof(fs->xattr_whiteout), "%swhiteout",
		 p);
}

/*
 * The kernel's overlayfs refuses to enter a layer's root or the workdir
 * through a lookup (ELOOP): a redirect, or layers sharing a tree, could
 * otherwise show a layer inside itself.
 */
static void sfs_add_trap(struct sfs_fs *fs, int fd)
{
	struct stat st;

	if (fd >= 0 && fstat(fd, &st) == 0) {
		fs->traps[fs->ntraps].dev = st.st_dev;
		fs->traps[fs->ntraps].ino = st.st_ino;
		fs->ntraps++;
	}
}

bool sfs_is_trap(const struct stat *st)
{
	for (int i = 0; i < sfs->ntraps; i++)
		if (sfs->traps[i].ino == st->st_ino &&
		    sfs->traps[i].dev == st->st_dev)
			return true;
	return false;
}

int sfs_setup(struct sfs_fs *fs)
{
	char *paths[SFS_MAX_LOWERS + 2], *names[SFS_MAX_LOWERS + 2];
	dev_t devs[SFS_MAX_LOWERS + 1];
	unsigned ndevs = 0;
	char **lowers = NULL;
	int nlowers = 0, count = 0, ret;

	sfs = fs;
	fs->upper.fd = fs->workfd = fs->tmpfd = fs->indexfd = fs->nullfd = -1;
	fs->ctlfd = -1;
	/*
	 * Nothing changes the layers behind the daemon's back, so the kernel
	 * may keep names and attributes as long as it likes: every change
	 * comes through this mount and updates its caches.
	 */
	fs->timeout = fs->params.timeout ? strtod(fs->params.timeout, NULL) :
					   86400.0;
	sfs_setup_xattr_names(fs);

	ret = sfs_split_lowerdir(fs->params.lowerdir, &lowers, &nlowers);
	if (ret < 0) {
		fprintf(stderr, "stratafs: lowerdir '%s': %s\n",
			fs->params.lowerdir,
			ret == -E2BIG ? "too many layers" : "empty layer name");
		return ret;
	}
	for (int i = 0; i < nlowers; i++) {
		paths[count] = lowers[i];
		names[count++] = "lowerdir";
	}
	if (fs->params.upperdir) {
		paths[count] = fs->params.upperdir;
		names[count++] = "upperdir";
		paths[count] = fs->params.workdir;
		names[count++] = "workdir";
	}
	ret = sfs_check_overlap(fs, paths, names, count);
	if (ret < 0)
		goto out;

	for (int i = 0; i < nlowers; i++) {
		ret = sfs_open_layer(&fs->lower[i], lowers[i], "lowerdir");
		if (ret < 0)
			goto out;
		fs->nlower++;
	}
	if (fs->params.upperdir) {
		struct sfs_layer work = { .fd = -1 };

		ret = sfs_open_upper_work(fs, &work);
		fs->workfd = work.fd;
		sfs_shm_free(work.path);
		if (ret < 0)
			goto out;
		if (work.dev != fs->upper.dev) {
			fprintf(stderr,
				"stratafs: upperdir '%s' and workdir '%s' are on different filesystems\n",
				fs->params.upperdir, fs->params.workdir);
			ret = -EXDEV;
			goto out;
		}
		ret = sfs_setup_work(fs);
		if (ret < 0)
			goto out;
		fs->upper.fsid = sfs_fsid(fs, fs->upper.dev, devs, &ndevs);
	}
	for (int i = 0; i < fs->nlower; i++) {
		fs->lower[i].fsid = sfs_fsid(fs, fs->lower[i].dev, devs, &ndevs);
		sfs_layer_uuid(&fs->lower[i]);
	}
	if (fs->indexfd >= 0) {
		ret = sfs_index_convert(fs);
		if (ret < 0) {
			fprintf(stderr, "stratafs: workdir '%s': converting %s: %s\n",
				fs->params.workdir, SFS_WORK_OLD_INDEX,
				strerror(-ret));
			goto out;
		}
	}

	sfs_add_trap(fs, fs->upper.fd);
	sfs_add_trap(fs, fs->workfd);
	for (int i = 0; i < fs->nlower; i++)
		sfs_add_trap(fs, fs->lower[i].fd);

	fs->nullfd = open("/dev/null", O_PATH | O_CLOEXEC);
	if (fs->nullfd < 0) {
		ret = -errno;
		fprintf(stderr, "stratafs: /dev/null: %s\n", strerror(errno));
		goto out;
	}
	sfs_handles_init();
	sfs_fd_budget_init();
	ret = sfs_table_init(fs);
	if (ret == 0)
		ret = sfs_setup_root(fs);
	if (ret == 0)
		ret = sfs_usage_setup(fs);
	if (ret == 0)
		ret = sfs_control_open(fs);
out:
	sfs_strv_free(lowers, nlowers);
	return ret;
}

void sfs_teardown(struct sfs_fs *fs)
{
	struct sfs_hlink *h;

	if (fs->table) {
		/* handles the kernel never released (unmounted under them) */
		while ((h = sfs_handle_first(&fs->files)))
			sfs_file_close((struct sfs_file *)h);
		sfs_table_destroy(fs);
		pthread_mutex_destroy(&fs->handles_lock);
	}
	for (int i = 0; i < fs->nlower; i++) {
		close(fs->lower[i].fd);
		sfs_shm_free(fs->lower[i].path);
	}
	if (fs->upper.fd >= 0)
		close(fs->upper.fd);
	sfs_shm_free(fs->upper.path);
	sfs_shm_free(fs->upper_real);
	sfs_shm_free(fs->upper_from_work);
	if (fs->tmpfd >= 0)
		close(fs->tmpfd);
	if (fs->indexfd >= 0)
		close(fs->indexfd);
	if (fs->workfd >= 0)
		close(fs->workfd);
	if (fs->nullfd >= 0)
		close(fs->nullfd);
	sfs_control_close(fs);
}

/* libfuse takes "-o a=b": commas in a value must be escaped. */
static int sfs_add_fsname(struct fuse_args *args, const char *source)
{
	char *opt = malloc(strlen(source) * 2 + 16);
	char *w;
	int ret;

	if (!opt)
		return -1;
	w = opt + sprintf(opt, "-ofsname=");
	for (const char *s = source; *s; s++) {
		if (*s == ',' || *s == '\\')
			*w++ = '\\';
		*w++ = *s;
	}
	*w = '\0';
	ret = fuse_opt_add_arg(args, opt);
	free(opt);
	return ret;
}

/*
 * The libfuse session, mounted at the mountpoint, or on the connection
 * DEVFD when it is not -1 (a supervisor exec'd to take over, which finds
 * the mount made already). NULL when it failed, said on stderr.
 */
struct fuse_session *sfs_mount(struct sfs_fs *fs, struct fuse_args *args,
			       int devfd)
{
	struct fuse_session *se;
	char dev[32];

	/*
	 * Root mounts like the kernel's overlayfs: device nodes and setuid
	 * files in an image work, and every user gets in by the mode bits
	 * (default_permissions). First, so that nodev/nosuid given by the
	 * user still win.
	 */
	if ((geteuid() == 0 &&
	     fuse_opt_insert_arg(args, 1, fs->params.noallow_other ?
					      "-odev,suid" :
					      "-odev,suid,allow_other")) ||
	    /* without an upper layer the view is read-only, as statvfs says */
	    (!fs->params.upperdir && fuse_opt_add_arg(args, "-oro")) ||
	    fuse_opt_add_arg(args, "-odefault_permissions") ||
	    fuse_opt_add_arg(args, "-osubtype=stratafs") ||
	    sfs_add_fsname(args, fs->params.source ? fs->params.source :
						      "stratafs")) {
		fprintf(stderr, "stratafs: out of memory\n");
		return NULL;
	}
	se = fuse_session_new(args, &sfs_ops, sizeof(sfs_ops), fs);
	if (!se) {
		/* libfuse named the option it refused just above */
		fprintf(stderr, "stratafs: invalid mount options\n");
		return NULL;
	}
	snprintf(dev, sizeof(dev), "/dev/fd/%d", devfd);
	if (fuse_session_mount(se, devfd >= 0 ? dev : fs->params.mountpoint) ||
	    sfs_transport_setup(se)) {
		fuse_session_destroy(se);
		return NULL;
	}
	fs->se = se;
	return se;
}

/*
 * Ends the session, unmounting what it mounted. A session made on a
 * connection taken over (ADOPTED) never mounted, and libfuse would leave
 * the mount dead; it is ours all the same, and goes as libfuse takes its
 * own down: lazily, and only while the connection still lives.
 */
void sfs_unmount(struct sfs_fs *fs, bool adopted)
{
	struct fuse_session *se = fs->se;
	struct pollfd pfd = { .fd = fuse_session_fd(se) };

	if (adopted && strncmp(fs->params.mountpoint, "/dev/fd/", 8) &&
	    poll(&pfd, 1, 0) >= 0 && !(pfd.revents & POLLERR))
		umount2(fs->params.mountpoint, MNT_DETACH);
	fuse_session_unmount(se);
	fuse_session_destroy(se);
	fs->se = NULL;
}

static void sfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	/* The largest requests libfuse 3.14 can take: fewer round trips. */
	conn->max_write = 1 << 20;
	conn->max_readahead = 1 << 20;
	conn->max_read = sfs->params.max_read;
	/*
	 * No write-back cache: with it the kernel acknowledges writes from
	 * its page cache, so ENOSPC surfaces at fsync or close instead of at
	 * write(2), and timestamps drift from the upper layer's.
	 */
	/*
	 * HANDLE_KILLPRIV is left out: libfuse 3.14 never passes it on, and
	 * sfs_handshake asks for its successor, HANDLE_KILLPRIV_V2.
	 */
	/*
	 * Every change comes through the mount, and the kernel drops a
	 * directory's cached listing when it makes one there: let it list
	 * directories from its cache, and open them without asking us.
	 */
	if (sfs->timeout > 0)
		sfs->dir_cache = (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) ?
					 SFS_DIR_CACHE_NO_OPENDIR :
					 SFS_DIR_CACHE_ON;
	/*
	 * The kernel enforces ACLs only when told the daemon keeps them; it
	 * then reads them with GETXATTR. Only with DONT_MASK as well: the
	 * umask must not be applied before we know whether the parent has
	 * a default ACL, which replaces it (acl.c).
	 */
	if ((conn->capable & FUSE_CAP_POSIX_ACL) &&
	    (conn->capable & FUSE_CAP_DONT_MASK))
		conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
	/* lsattr and chattr on directories too (sfs_op_ioctl) */
	if (conn->capable & FUSE_CAP_IOCTL_DIR)
		conn->want |= FUSE_CAP_IOCTL_DIR;
#ifdef STRATA_TSAN
	/* read(2) and write(2) on /dev/fuse order requests for TSan */
	conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE |
			FUSE_CAP_SPLICE_MOVE);
#else
	/* a reply over io_uring is copied into the ring's buffers (uring.c) */
	if ((conn->capable & FUSE_CAP_SPLICE_WRITE) && !atomic_load(&sfs->uring))
		conn->want |= FUSE_CAP_SPLICE_WRITE;
	if (conn->capable & FUSE_CAP_SPLICE_READ)
		conn->want |= FUSE_CAP_SPLICE_READ;
#endif
}

const struct fuse_lowlevel_ops sfs_ops = {
	.init = sfs_op_init,
	.lookup = sfs_op_lookup,
	.forget = sfs_op_forget,
	.forget_multi = sfs_op_forget_multi,
	.getattr = sfs_op_getattr,
	.setattr = sfs_op_setattr,
	.readlink = sfs_op_readlink,
	.mknod = sfs_op_mknod,
	.mkdir = sfs_op_mkdir,
	.symlink = sfs_op_symlink,
	.link = sfs_op_link,
	.unlink = sfs_op_unlink,
	.rmdir = sfs_op_rmdir,
	.rename = sfs_op_rename,
	.create = sfs_op_create,
	.open = sfs_op_open,
	.read = sfs_op_read,
	.write_buf = sfs_op_write_buf,
	.flush = sfs_op_flush,
	.release = sfs_op_release,
	.fsync = sfs_op_fsync,
	.fallocate = sfs_op_fallocate,
	.lseek = sfs_op_lseek,
	.copy_file_range = sfs_op_copy_file_range,
	.opendir = sfs_op_opendir,
	.readdir = sfs_op_readdir,
	.readdirplus = sfs_op_readdirplus,
	.releasedir = sfs_op_releasedir,
	.fsyncdir = sfs_op_fsyncdir,
	.statfs = sfs_op_statfs,
	.setxattr = sfs_op_setxattr,
	.getxattr = sfs_op_getxattr,
	.listxattr = sfs_op_listxattr,
	.removexattr = sfs_op_removexattr,
	.ioctl = sfs_op_ioctl,
};
