// SPDX-License-Identifier: Apache-2.0
/*
 * stratafs runs as two processes, so that no crash of the code that
 * serves requests is ever seen by the programs using the mount.
 *
 * The supervisor is the process that was started: it opens the layers,
 * mounts (or takes the connection it is given as /dev/fd/N), makes the
 * shared memory (shm.c), and then does nothing but watch its one child,
 * the worker, which serves every request (worker.c). What must outlive a
 * worker is held by the supervisor, or shared with it:
 *  - The /dev/fuse descriptor, the only one requests travel on: the
 *    kernel fails the requests a device descriptor holds when it closes
 *    for good, so every worker thread reads from the supervisor's (no
 *    cloned descriptors).
 *  - The descriptor table itself. A worker is cloned from the supervisor
 *    like fork(2), but with CLONE_FILES: the two share one table, so the
 *    descriptors of every node and open file stay valid when a worker
 *    dies, deleted files and all. A worker never execs (exec would give
 *    it a table of its own).
 *  - The nodes and the open file handles, in the shared memory, where
 *    node ids and file handles point: a new worker finds every one the
 *    kernel holds (worker.c says how it makes them whole again).
 *  - The INIT request, which a new worker replays into its own libfuse
 *    session; the kernel sends INIT once, and only the first worker's
 *    reply goes to it (handshake.c).
 *
 * When the worker dies (a signal, an abort, the OOM killer), the
 * supervisor asks the kernel to send again the requests the worker had
 * taken and not answered (FUSE_NOTIFY_RESEND, Linux 6.9), and clones a
 * new one; a request sent again finds its work done, or not, and never
 * half done (sfs_req_resent). A worker that dies young (or could not
 * take over) SFS_MAX_QUICK times in a row is a request or a state that
 * kills every worker: the supervisor then gives up, which aborts the
 * connection, rather than loop.
 *
 * SIGHUP replaces the worker on purpose, to upgrade stratafs in place:
 * the worker is told to stop (SIGUSR1), finishes what it is serving, and
 * the supervisor execs the stratafs binary as it is on disk now with the
 * state handed over (sfs_resume), which then starts a worker of its own.
 * A binary that cannot read the state goes back to the previous one.
 * SIGTERM and SIGINT stop both processes; an unmount ends the worker's
 * session, and then the supervisor.
 *
 * Without FUSE_NOTIFY_RESEND (before Linux 6.9), or with -o
 * nosupervisor, one process does it all, as before.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"

/* Linux 6.9's protocol 7.40, newer than bookworm's linux-libc-dev. */
#define SFS_FUSE_NOTIFY_RESEND 7

/* Where the state goes to the binary exec'd in the supervisor's place. */
#define SFS_RESUME_ENV "STRATAFS_RESUME"
/* execs of a new binary that may find its state's address taken */
#define SFS_ATTACH_TRIES 16
/* how long a worker told to stop may keep serving before it is told again */
#define SFS_STOP_AGAIN_MS 100

/* A worker younger than this when it dies died young; so many in a row... */
#define SFS_QUICK_NS 1000000000LL
#define SFS_MAX_QUICK 5

struct sfs_super {
	struct sfs_fs *fs;
	struct fuse_session *se;
	char **argv;
	char *exe;		/* the binary's path, to exec it again */
	int exefd;		/* the binary running now, to go back to */
	int sigfd;
	sigset_t mask;		/* the signal mask a worker starts with */
	struct sfs_fdset base;	/* its own descriptors (sfs_fdset_own) */
	pid_t worker;		/* 0 while none runs */
	struct timespec born;	/* when it started */
	unsigned quick;		/* workers in a row that died young */
	bool adopted;		/* the connection came from the binary before */
	bool started;		/* a worker ran already */
	bool stopping;		/* SIGTERM or SIGINT: the session ends */
	bool replacing;		/* SIGHUP: the worker stops for an exec */
};

/*
 * Asks the kernel to queue again every request a worker read and did not
 * answer. 0, or a negative errno: -EINVAL from a kernel without it.
 */
static int sfs_resend(struct fuse_session *se)
{
	struct fuse_out_header out = {
		.len = sizeof(out),
		.error = SFS_FUSE_NOTIFY_RESEND,
	};

	if (write(fuse_session_fd(se), &out, sizeof(out)) != sizeof(out))
		return -errno;
	return 0;
}

/* fork(2), sharing the descriptor table: see the top of the file. */
static pid_t sfs_clone_files(void)
{
	/* nothing buffered twice: the child writes its own */
	fflush(NULL);
	return (pid_t)syscall(SYS_clone, CLONE_FILES | SIGCHLD, NULL, NULL,
			      NULL, NULL);
}

static int sfs_super_start(struct sfs_super *sv)
{
	pid_t self = getpid();
	pid_t pid = sfs_clone_files();

	if (pid < 0) {
		strata_err("starting a worker: %s", strerror(errno));
		return -errno;
	}
	if (pid == 0)
		exit(sfs_worker_run(sv->se, &sv->mask, self,
				    sv->started || sv->adopted, &sv->base));
	sv->worker = pid;
	sv->started = true;
	clock_gettime(CLOCK_MONOTONIC, &sv->born);
	return 0;
}

/* Every descriptor but the supervisor's own survives the exec. */
static int sfs_keep_on_exec(int fd, void *sv)
{
	if (fd != ((struct sfs_super *)sv)->sigfd)
		fcntl(fd, F_SETFD, 0);
	return 0;
}

/*
 * A binary copied with its loader and libraries (the CSI plugin's daemon
 * bundle) names its loader relative to its own directory and finds its
 * libraries through LD_LIBRARY_PATH, the bundle. The next binary, REAL
 * (resolved, through the bundle directory's "current" link), may be in
 * another bundle: this process moves into it, and when it runs as a
 * bundle itself, its library path goes along, so that the new loader
 * never loads the old libraries (nor the old one, on the way back, the
 * new ones).
 */
static void sfs_super_bundle(const char *real)
{
	const char *lib = getenv("LD_LIBRARY_PATH");
	char *copy = strdup(real), *self = realpath("/proc/self/exe", NULL);
	const char *dir;

	if (!copy)
		goto out;
	dir = dirname(copy);
	if (chdir(dir) < 0)
		strata_warn("upgrade: cd %s: %s", dir, strerror(errno));
	if (lib && self && !strcmp(lib, dirname(self)) &&
	    setenv("LD_LIBRARY_PATH", dir, 1) < 0)
		strata_warn("upgrade: LD_LIBRARY_PATH: %s", strerror(errno));
out:
	free(self);
	free(copy);
}

/*
 * Execs BIN (a path, or the descriptor FD when BIN is NULL) in this
 * process, with SPEC saying where the state is; returns only when it
 * failed.
 */
static int sfs_super_exec(struct sfs_super *sv, const char *bin, int fd,
			  const char *spec)
{
	const char *lib = getenv("LD_LIBRARY_PATH");
	char link[64], *real, *oldlib = lib ? strdup(lib) : NULL;
	int cwd, ret;

	sfs_proc_path(fd, link, sizeof(link));
	real = realpath(bin ? bin : link, NULL);
	sfs_fd_each(sfs_keep_on_exec, sv);
	/* opened after the sweep above: the next binary never holds it */
	cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (real) {
		sfs_super_bundle(real);
		if (bin)
			bin = real;
	}
	if (setenv(SFS_RESUME_ENV, spec, 1) == 0) {
		fflush(NULL);
		if (bin)
			execv(bin, sv->argv);
		else
			execveat(fd, "", sv->argv, environ, AT_EMPTY_PATH);
	}
	ret = -errno;
	strata_err("upgrade: exec %s: %s", bin ? bin : "the previous binary",
		   strerror(-ret));
	/* serving on as before: where it ran from, and its libraries */
	unsetenv(SFS_RESUME_ENV);
	if (cwd >= 0 && fchdir(cwd) < 0)
		strata_warn("upgrade: back to the old directory: %s",
			    strerror(errno));
	if (oldlib)
		setenv("LD_LIBRARY_PATH", oldlib, 1);
	if (cwd >= 0)
		close(cwd);
	free(oldlib);
	free(real);
	return ret;
}

/* The worker is gone: what now. 1 when the supervisor is done too. */
static int sfs_super_reaped(struct sfs_super *sv, int status, int *ret)
{
	/*
	 * One that could not take over never served, however long that
	 * took (a loaded machine): the next would fail as it did.
	 */
	bool young = sfs_now_ns() - (sv->born.tv_sec * 1000000000LL +
				     sv->born.tv_nsec) < SFS_QUICK_NS ||
		     (WIFEXITED(status) &&
		      WEXITSTATUS(status) == SFS_WORKER_UNFIT);
	int err;

	sv->worker = 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
		*ret = 0;	/* the session ended */
		return 1;
	}
	if (sv->stopping) {
		*ret = 1;
		return 1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == SFS_WORKER_REPLACED) {
		sv->quick = 0;
	} else {
		if (WIFSIGNALED(status))
			strata_err("worker died of signal %d (%s)",
				   WTERMSIG(status), strsignal(WTERMSIG(status)));
		else
			strata_err("worker exited with status %d",
				   WEXITSTATUS(status));
		sv->quick = young ? sv->quick + 1 : 0;
		if (sv->quick >= SFS_MAX_QUICK) {
			strata_err("%d workers in a row died within a second "
				   "or before they served: giving up; the mount "
				   "fails until it is mounted again", sv->quick);
			*ret = 1;
			return 1;
		}
	}
	/* what the dead worker had read, the next one reads again */
	err = sfs_resend(sv->se);
	if (err < 0)
		strata_err("asking the kernel to resend: %s", strerror(-err));
	if (sv->replacing) {
		char spec[96];

		sv->replacing = false;
		snprintf(spec, sizeof(spec), "%d,%d,%d,%p", sfs_shm->memfd,
			 fuse_session_fd(sv->se), sv->exefd, sfs_shm->self);
		sfs_super_exec(sv, sv->exe, -1, spec);
		/* still here: serve on with this binary */
	}
	if (sfs_super_start(sv) < 0) {
		*ret = 1;
		return 1;
	}
	return 0;
}

static int sfs_super_signal(struct sfs_super *sv, int *ret)
{
	struct signalfd_siginfo si;
	int status;
	pid_t pid;

	if ((sv->replacing || sv->stopping) && sv->worker &&
	    poll(&(struct pollfd){ .fd = sv->sigfd, .events = POLLIN }, 1,
		 SFS_STOP_AGAIN_MS) == 0) {
		/*
		 * The signal reached one of the worker's threads, and its
		 * handler ended the session; but threads blocked reading the
		 * device wake only for a request or a signal of their own.
		 * Another one finds one of them, until all have seen the end.
		 */
		kill(sv->worker, sv->replacing ? SIGUSR1 : SIGTERM);
		return 0;
	}
	if (read(sv->sigfd, &si, sizeof(si)) != sizeof(si))
		return errno == EINTR || errno == EAGAIN ? 0 : -errno;
	switch (si.ssi_signo) {
	case SIGTERM:
	case SIGINT:
		sv->stopping = true;
		if (!sv->worker) {
			*ret = 0;
			return 1;
		}
		kill(sv->worker, SIGTERM);
		return 0;
	case SIGHUP:
		if (sv->worker && !sv->replacing && !sv->stopping) {
			strata_info("SIGHUP: replacing the worker, from %s",
				    sv->exe);
			sv->replacing = true;
			kill(sv->worker, SIGUSR1);
		}
		return 0;
	}
	/* SIGCHLD: one signal may stand for several children */
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		if (pid == sv->worker && sfs_super_reaped(sv, status, ret))
			return 1;
	return 0;
}

/*
 * The path to exec for an upgrade: $STRATAFS_BINARY (the CSI plugin's
 * DIR/current/stratafs, which it points at its newest copy), or the
 * binary this process was started from, as it is on disk then.
 */
static char *sfs_super_exe(void)
{
	const char *env = getenv("STRATAFS_BINARY");
	char buf[PATH_MAX];
	ssize_t n;

	if (env && *env)
		return strdup(env);
	n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
	if (n < 0)
		return NULL;
	buf[n] = '\0';
	return strdup(buf);
}

static int sfs_supervise(struct sfs_super *sv)
{
	sigset_t set, usr1;
	int ret = 1, done = 0;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, &sv->mask) < 0)
		return 1;
	/* a supervisor exec'd for an upgrade inherits them blocked */
	sigdelset(&sv->mask, SIGCHLD);
	sigdelset(&sv->mask, SIGTERM);
	sigdelset(&sv->mask, SIGINT);
	sigdelset(&sv->mask, SIGHUP);
	/*
	 * A worker starts with SIGUSR1 blocked, as here, until its handler
	 * is in: a SIGHUP while it still takes over from the worker before
	 * stops it then, instead of killing it.
	 */
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	if (sigprocmask(SIG_BLOCK, &usr1, NULL) < 0)
		goto out_mask;
	sigdelset(&sv->mask, SIGUSR1);
	sv->sigfd = signalfd(-1, &set, SFD_CLOEXEC);
	if (sv->sigfd < 0) {
		strata_err("signalfd: %s", strerror(errno));
		goto out_mask;
	}
	if (!sv->exe && !(sv->exe = sfs_super_exe()))
		goto out_sigfd;
	if (sv->exefd < 0)
		sv->exefd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
	if (sfs_fdset_own(&sv->base) < 0)
		goto out_sigfd;
	if (sfs_super_start(sv) < 0)
		goto out_base;
	while (!done)
		done = sfs_super_signal(sv, &ret);
	if (done < 0)
		strata_err("supervisor: %s", strerror(-done));
	if (sv->worker) {
		kill(sv->worker, SIGKILL);
		waitpid(sv->worker, NULL, 0);
	}
out_base:
	sfs_fdset_free(&sv->base);
out_sigfd:
	close(sv->sigfd);
out_mask:
	sigprocmask(SIG_SETMASK, &sv->mask, NULL);
	return ret;
}

/* One process serves, as before there were workers. */
static int sfs_serve_alone(struct sfs_fs *fs)
{
	int ret;

	if (fuse_set_signal_handlers(fs->se) != 0)
		return 1;
	ret = sfs_serve(fs->se, false, false);
	fuse_remove_signal_handlers(fs->se);
	return ret;
}

/*
 * Whether workers can be replaced here: the kernel must resend what a
 * dead one had read. Asking with nothing outstanding changes nothing.
 */
static bool sfs_can_supervise(struct sfs_fs *fs)
{
	int ret;

	if (fs->params.nosupervisor || !sfs_shm)
		return false;
	ret = sfs_resend(fs->se);
	if (ret == 0)
		return true;
	strata_warn("this kernel cannot resend a dead worker's requests "
		    "(FUSE_NOTIFY_RESEND, Linux 6.9): serving in one process, "
		    "which takes the mount down if it dies (%s)",
		    strerror(-ret));
	return false;
}

/* The state, in shared memory when a supervisor will keep it. */
static struct sfs_fs *sfs_fs_new(const struct sfs_params *p)
{
	struct sfs_fs *fs;
	int ret = 0;

	if (!p->nosupervisor)
		ret = sfs_shm_create(SFS_SHM_SIZE);
	if (ret < 0)
		strata_warn("shared memory for the worker's state: %s: serving "
			    "in one process", strerror(-ret));
	fs = sfs_shm_alloc(sizeof(*fs));
	if (!fs)
		return NULL;
	if (sfs_shm)
		sfs_shm->fs = fs;
	fs->params = *p;
	return fs;
}

/*
 * The binary exec'd by a supervisor for an upgrade: SPEC says where the
 * state is. It takes the state over, or goes back to the binary before.
 */
static int sfs_resume(struct sfs_super *sv, struct fuse_args *args,
		      const struct sfs_params *p, const char *spec)
{
	int memfd, devfd, exefd, tries = 0, ret;
	char again[96];
	void *addr;

	if (sscanf(spec, "%d,%d,%d,%p,%d", &memfd, &devfd, &exefd, &addr,
		   &tries) < 4) {
		fprintf(stderr, "stratafs: %s=%s: not what a supervisor sets\n",
			SFS_RESUME_ENV, spec);
		return 1;
	}
	ret = sfs_shm_attach(memfd, addr);
	if (ret == -EADDRINUSE && tries < SFS_ATTACH_TRIES) {
		/*
		 * Address space layout randomisation put a library or the
		 * heap where the state lives (a few percent of execs): the
		 * same binary exec'd again is laid out anew.
		 */
		snprintf(again, sizeof(again), "%d,%d,%d,%p,%d", memfd, devfd,
			 exefd, addr, tries + 1);
		sfs_super_exec(sv, "/proc/self/exe", -1, again);
	}
	if (ret < 0) {
		strata_err("upgrade: this binary cannot take over the state "
			   "(%s): going back to the binary before",
			   strerror(-ret));
		sfs_super_exec(sv, NULL, exefd, spec);
		return 1;
	}
	unsetenv(SFS_RESUME_ENV);
	/* the binary before detached already; its stderr is ours */
	if (!p->foreground)
		strata_log_detached(-1);
	sv->fs = sfs = sfs_shm->fs;
	/* the binary before's own memory is gone: the rest is shared */
	sfs->params = *p;
	sv->exefd = exefd;
	sv->adopted = true;
	sv->se = sfs_mount(sfs, args, devfd);
	if (!sv->se)
		return 1;
	/* the counters go on from where the binary before left them */
	if (p->statsfile && sfs_stats_open(p->statsfile, false) < 0)
		strata_warn("upgrade: statsfile %s: counting no more",
			    p->statsfile);
	strata_info("upgrade: serving the mount on, from this binary");
	return 0;
}

/*
 * The orderly end: the usage file is marked clean, so the next mount
 * trusts it rather than walk the upper layer. Every worker is gone.
 */
static void sfs_usage_end(struct sfs_fs *fs)
{
	int ret = sfs_usage_save(true);

	if (ret < 0)
		strata_warn("usagefile %s: %s", fs->params.usagefile,
			    strerror(-ret));
}

int sfs_run(const struct sfs_params *p, struct fuse_args *args, char **argv)
{
	struct sfs_super sv = { .argv = argv, .exefd = -1, .sigfd = -1 };
	const char *spec = getenv(SFS_RESUME_ENV);
	struct sfs_fs *fs;
	int errfd, ret = 1;

	sfs_process_init();
	if (spec) {
		if (sfs_resume(&sv, args, p, spec))
			return 1;
		fs = sv.fs;
		goto supervise;
	}
	fs = sv.fs = sfs_fs_new(p);
	if (!fs) {
		fprintf(stderr, "stratafs: out of memory\n");
		return 1;
	}
	if (sfs_setup(fs) < 0)
		goto out_fs;
	if (fs->params.statsfile) {
		int err = sfs_stats_open(fs->params.statsfile, true);

		if (err) {
			fprintf(stderr, "stratafs: statsfile %s: %s\n",
				fs->params.statsfile, strerror(-err));
			goto out_fs;
		}
	}
	sv.se = sfs_mount(fs, args, -1);
	if (!sv.se)
		goto out_fs;
	/* daemonizing points stderr at /dev/null: where messages go after */
	errfd = fs->params.foreground ? -1 : strata_log_prepare_detach();
	if (fuse_daemonize(fs->params.foreground) != 0) {
		if (errfd >= 0)
			close(errfd);
		goto out_unmount;
	}
	if (!fs->params.foreground)
		strata_log_detached(errfd);
	if (!sfs_can_supervise(fs)) {
		ret = sfs_serve_alone(fs);
		goto out_unmount;
	}
supervise:
	ret = sfs_supervise(&sv);
	/*
	 * The nodes and handles are in the shared memory, and go with it;
	 * the kernel closes the descriptors. The supervisor frees none of
	 * it: a worker that died may have left any of it half changed.
	 */
	sfs_unmount(fs, sv.adopted);
	sfs_usage_end(fs);
	sfs_control_close(fs);
	sfs_stats_close();
	free(sv.exe);
	return ret;

out_unmount:
	sfs_unmount(fs, false);
	sfs_usage_end(fs);
out_fs:
	sfs_stats_close();
	sfs_teardown(fs);
	sfs_shm_free(fs);
	return ret;
}
