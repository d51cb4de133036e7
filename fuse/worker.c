// SPDX-License-Identifier: Apache-2.0
/*
 * worker.c: the process that serves requests, and what a new one does to
 * take over from one that died (see supervisor.c for the whole picture).
 *
 * A worker shares its descriptor table with the supervisor and with
 * every worker before it, so the descriptors of nodes and open files
 * stay valid when a worker dies. What a dead worker had opened for
 * itself (its rings, its pipes, a descriptor half way through a lookup)
 * is left over in that table too: a new worker closes every descriptor
 * that neither the supervisor had before the first worker started nor
 * a node or an open file holds.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_FDSET_WORD 64

static int sfs_fdset_init(struct sfs_fdset *s)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -errno;
	s->size = rl.rlim_cur == RLIM_INFINITY ? 1U << 20 : (size_t)rl.rlim_cur;
	s->bits = calloc((s->size + SFS_FDSET_WORD - 1) / SFS_FDSET_WORD,
			 sizeof(*s->bits));
	return s->bits ? 0 : -ENOMEM;
}

void sfs_fdset_add(struct sfs_fdset *s, int fd)
{
	if (fd >= 0 && (size_t)fd < s->size)
		s->bits[fd / SFS_FDSET_WORD] |= 1ULL << (fd % SFS_FDSET_WORD);
}

static bool sfs_fdset_has(const struct sfs_fdset *s, int fd)
{
	return (size_t)fd < s->size &&
	       (s->bits[fd / SFS_FDSET_WORD] >> (fd % SFS_FDSET_WORD)) & 1;
}

void sfs_fdset_free(struct sfs_fdset *s)
{
	free(s->bits);
	s->bits = NULL;
}

/*
 * Calls fn on each descriptor open in this process but the one used to
 * list them; stops at the first error fn returns.
 */
int sfs_fd_each(int (*fn)(int fd, void *arg), void *arg)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int ret = 0;

	if (!d)
		return -errno;
	while (ret == 0 && (de = readdir(d))) {
		int fd = atoi(de->d_name);

		if (de->d_name[0] != '.' && fd != dirfd(d))
			ret = fn(fd, arg);
	}
	closedir(d);
	return ret;
}

static int sfs_fdset_add_each(int fd, void *s)
{
	sfs_fdset_add(s, fd);
	return 0;
}

/*
 * S becomes the descriptors open now that no node or open file holds:
 * the supervisor's own, which every worker keeps. Those of nodes and
 * open files each worker finds again; their numbers, once closed, may
 * be taken by anything.
 */
int sfs_fdset_own(struct sfs_fdset *s)
{
	struct sfs_fdset state;
	int ret = sfs_fdset_init(s);

	if (ret == 0)
		ret = sfs_fdset_init(&state);
	if (ret < 0) {
		sfs_fdset_free(s);
		return ret;
	}
	sfs_table_fds(&state);
	sfs_files_fds(&state);
	ret = sfs_fd_each(sfs_fdset_add_each, s);
	for (size_t i = 0; i < s->size && i < state.size; i += SFS_FDSET_WORD)
		s->bits[i / SFS_FDSET_WORD] &= ~state.bits[i / SFS_FDSET_WORD];
	sfs_fdset_free(&state);
	if (ret < 0)
		sfs_fdset_free(s);
	return ret;
}

static int sfs_fd_sweep(int fd, void *keep)
{
	if (fd > STDERR_FILENO && !sfs_fdset_has(keep, fd))
		close(fd);
	return 0;
}

/*
 * Takes over what the worker before left in the shared memory, and
 * closes what it left in the descriptor table. BASE: the supervisor's
 * own descriptors.
 */
static int sfs_worker_takeover(const struct sfs_fdset *base)
{
	struct sfs_fdset keep;
	int ret;

	ret = sfs_fdset_init(&keep);
	if (ret < 0)
		return ret;
	for (size_t i = 0; i < base->size && i < keep.size; i += SFS_FDSET_WORD)
		keep.bits[i / SFS_FDSET_WORD] = base->bits[i / SFS_FDSET_WORD];
	sfs_shm_takeover();
	/* an upper a freeze opened is not among the supervisor's own */
	sfs_freeze_fds(&keep);
	/* a node a switch died in, as it was: counted as it is then */
	sfs_switch_rollback();
	ret = sfs_table_takeover(&keep);
	if (ret == 0) {
		sfs_files_takeover(&keep);
		ret = sfs_freeze_takeover(&keep);
		/* a freeze it finished moved readers to new descriptors */
		sfs_files_fds(&keep);
	}
	if (ret == 0) {
		sfs_table_prune();
		ret = sfs_fd_each(sfs_fd_sweep, &keep);
	}
	/* a copy-up or a whiteout half made: nobody will finish it now */
	if (ret == 0)
		ret = sfs_tmp_clear();
	sfs_fdset_free(&keep);
	return ret;
}

static volatile sig_atomic_t sfs_worker_stopped;

/* SIGUSR1, from the supervisor: end the loop, to be replaced. */
static void sfs_worker_stop(int sig)
{
	sfs_worker_stopped = 1;
	fuse_session_exit(sfs->se);
}

/*
 * Serves requests until the session ends: 0, or 1 for an error. REPLAY:
 * a worker after the first, which takes over the INIT exchange.
 * SUPERVISED: another worker may follow this one.
 */
int sfs_serve(struct fuse_session *se, bool replay, bool supervised)
{
	struct fuse_loop_config *cfg;
	int ret = 1;

	/* the completion thread must be in the process that serves */
	if (sfs_io_init(sfs->params.io) < 0)
		return 1;
	if ((replay ? sfs_handshake_replay(se) :
		      sfs_handshake(se, supervised)) < 0)
		goto out_io;
	/*
	 * The rings carry the requests once they are set up; the device
	 * still carries FORGET, INTERRUPT and anything before (uring.c).
	 */
	if (sfs_uring_start(se) < 0)
		goto out_uring;
	if (sfs_control_start() < 0)
		goto out_uring;
	if (sfs_usage_start() < 0)
		goto out_control;
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		goto out_usage;
	/*
	 * A cloned descriptor per thread spreads the device's locking; but
	 * when a worker dies, the kernel fails the requests on descriptors
	 * that closed with it (ECONNABORTED). Supervised, every thread reads
	 * the one descriptor the supervisor holds open.
	 */
	fuse_loop_cfg_set_clone_fd(cfg, sfs_shm ? 0 : 1);
	fuse_loop_cfg_set_max_threads(cfg, SFS_MAX_THREADS);
	/* idle workers stay, and so do their rings */
	fuse_loop_cfg_set_idle_threads(cfg, SFS_MAX_THREADS);
	ret = fuse_session_loop_mt(se, cfg) < 0 ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
out_usage:
	sfs_usage_stop();
out_control:
	sfs_control_stop();
out_uring:
	sfs_uring_stop();
	/* the engine's last replies may still go to a ring */
	sfs_io_shutdown();
	sfs_uring_free();
	return ret;
out_io:
	sfs_io_shutdown();
	return ret;
}

/*
 * The worker's life, in the child the supervisor cloned: the exit status
 * (0 when the session ended, SFS_WORKER_REPLACED when stopped to be
 * replaced, SFS_WORKER_UNFIT when it could not take over). TAKEOVER: a
 * worker ran before this one.
 */
int sfs_worker_run(struct fuse_session *se, const sigset_t *mask,
		   pid_t supervisor, bool takeover,
		   const struct sfs_fdset *base)
{
	/* no SA_RESTART: the loop's wait for its threads must end at once */
	struct sigaction sa = { .sa_handler = sfs_worker_stop };
	int ret;

	/* never outlive the supervisor: nobody would replace this worker */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != supervisor)
		return 1;
	prctl(PR_SET_NAME, "stratafs-worker");
	if (takeover) {
		ret = sfs_worker_takeover(base);
		if (ret < 0) {
			strata_err("taking over from the worker before: %s",
				   strerror(-ret));
			return SFS_WORKER_UNFIT;
		}
	}
	/* said here, not at the clone: one that cannot take over never did */
	strata_info("worker %d serves the mount", (int)getpid());
	if (fuse_set_signal_handlers(se) < 0 || sigaction(SIGUSR1, &sa, NULL) < 0)
		return 1;
	sigprocmask(SIG_SETMASK, mask, NULL);
	ret = sfs_serve(se, takeover, true);
	fuse_remove_signal_handlers(se);
	sfs_table_leave();
	if (ret == 0 && sfs_worker_stopped)
		return SFS_WORKER_REPLACED;
	return ret;
}
