// SPDX-License-Identifier: Apache-2.0
/*
 * The stratafs daemons: one per staged volume, started in a session of
 * its own so that it outlives the plugin (a plugin upgrade must not take
 * the pods' volumes down), and, as the options ask, in another mount
 * namespace, cgroups of its own and from a copied binary (host.c), so
 * that it outlives the plugin's container too; told apart from a reused
 * pid by its start time, and stopped by unmounting first, so that it
 * exits on its own with its data flushed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

extern char **environ;

#define CSI_STOP_TIMEOUT_MS 5000

/* Field 22 of /proc/<pid>/stat, in clock ticks since boot; 0 if gone. */
unsigned long long csi_daemon_starttime(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	char state;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (csi_record_read_text(AT_FDCWD, path, buf, sizeof(buf)) <= 0)
		return 0;
	/* the command name may hold spaces and parentheses: skip to the last ')' */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
			 &state, &start) != 2)
		return 0;
	return state == 'Z' || state == 'X' ? 0 : start;
}

bool csi_daemon_alive(const struct csi_node_vol *n)
{
	return n->pid > 0 && n->starttime &&
	       csi_daemon_starttime(n->pid) == n->starttime;
}

static int64_t csi_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The end of this start's log: the daemon's own words on why it failed. */
static void csi_daemon_log_tail(int fd, off_t from, char *why, size_t size,
				const char *prefix)
{
	char buf[1024];
	ssize_t n;
	off_t end = lseek(fd, 0, SEEK_END);

	if (end - from > (off_t)sizeof(buf) - 1)
		from = end - (sizeof(buf) - 1);
	n = pread(fd, buf, sizeof(buf) - 1, from);
	if (n < 0)
		n = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		n--;
	buf[n] = '\0';
	for (char *c = buf; *c; c++)
		if (*c == '\n')
			*c = ' ';
	snprintf(why, size, "%s%s%s", prefix, n ? ": " : "", buf);
}

struct csi_spawn {
	char *argv[8];
	char **envp;		/* the plugin's, and a bundle's library path */
	int logfd;
	int nullfd;
	int nfds;
	int fds[CSI_MAX_LAYERS + 1];
	int nprocs;
	int procs[CSI_MAX_CGROUPS]; /* cgroup.procs of the volume's cgroups */
	int errpipe[2];		/* the child's last words if it never execs */
};

/* What the child reports when it cannot become the daemon. */
struct csi_child_err {
	int step;
	int err;
	int cgroup;		/* CSI_STEP_CGROUP: which one */
};

enum { CSI_STEP_CGROUP = 1, CSI_STEP_MNTNS, CSI_STEP_CHDIR, CSI_STEP_EXEC };

/* Between fork and exec only async-signal-safe calls. */
static void csi_daemon_child(const struct csi_spawn *sp,
			     const struct csi_host *h)
{
	struct csi_child_err e = { 0 };
	sigset_t none;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	/* out of the plugin's cgroup before it is the daemon: no window */
	e.err = csi_cgroup_join(sp->procs, sp->nprocs, &e.cgroup);
	if (e.err) {
		e.step = CSI_STEP_CGROUP;
		goto fail;
	}
	if (h->mntns_fd >= 0 && setns(h->mntns_fd, CLONE_NEWNS) < 0) {
		e.step = CSI_STEP_MNTNS;
		e.err = -errno;
		goto fail;
	}
	/* a bundle's binary names its interpreter relative to the bundle */
	if (h->libdir && chdir(h->libdir) < 0) {
		e.step = CSI_STEP_CHDIR;
		e.err = -errno;
		goto fail;
	}
	for (int i = 0; i < sp->nfds; i++)
		fcntl(sp->fds[i], F_SETFD, 0);
	dup2(sp->nullfd, 0);
	dup2(sp->logfd, 1);
	dup2(sp->logfd, 2);
	execve(h->exec, sp->argv, sp->envp);
	e.step = CSI_STEP_EXEC;
	e.err = -errno;
fail:
	if (write(sp->errpipe[1], &e, sizeof(e)) < 0)
		_exit(126);
	_exit(127);
}

/*
 * The daemon's environment: the plugin's, with a bundle's library path in
 * place of any LD_LIBRARY_PATH of its own, and the newest bundle's binary
 * as the one its supervisor execs for a new worker. Built before the
 * fork: the child may not allocate.
 */
static int csi_daemon_env(const struct csi_host *h, struct csi_spawn *sp)
{
	size_t n = 0, j = 0;

	sp->envp = environ;
	if (!h->ldpath)
		return 0;
	while (environ[n])
		n++;
	sp->envp = calloc(n + 3, sizeof(char *));
	if (!sp->envp)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "LD_LIBRARY_PATH=", 16) &&
		    strncmp(environ[i], "STRATAFS_BINARY=", 16))
			sp->envp[j++] = environ[i];
	sp->envp[j++] = h->ldpath;
	sp->envp[j] = h->binpath;
	return 0;
}

/*
 * Forks the child and waits until it has executed the daemon, or told
 * why it could not: nothing is half started. Returns the pid, or -errno
 * with `why` set.
 */
static pid_t csi_daemon_fork(struct csi_plugin *p, struct csi_spawn *sp,
			     const char *id, char *why, size_t size)
{
	const struct csi_host *h = &p->host;
	struct csi_child_err e;
	ssize_t n;
	pid_t pid;
	int err;

	if (pipe2(sp->errpipe, O_CLOEXEC) < 0) {
		err = errno;
		snprintf(why, size, "pipe: %s", strerror(err));
		return -err;
	}
	pid = fork();
	err = errno;
	if (pid == 0)
		csi_daemon_child(sp, h);
	close(sp->errpipe[1]);
	if (pid < 0) {
		snprintf(why, size, "fork: %s", strerror(err));
		close(sp->errpipe[0]);
		return -err;
	}
	do
		n = read(sp->errpipe[0], &e, sizeof(e));
	while (n < 0 && errno == EINTR);
	close(sp->errpipe[0]);
	if (n != sizeof(e))
		return pid;	/* the pipe closed on exec */
	waitpid(pid, NULL, 0);
	if (e.step == CSI_STEP_CGROUP)
		snprintf(why, size, "stratafs for volume %s could not join the cgroup %s/%s: %s",
			 id, h->cgroups[e.cgroup], id, strerror(-e.err));
	else if (e.step == CSI_STEP_MNTNS)
		snprintf(why, size, "stratafs for volume %s could not enter the mount namespace %s: %s",
			 id, p->cfg.daemon_mntns, strerror(-e.err));
	else if (e.step == CSI_STEP_CHDIR)
		snprintf(why, size, "stratafs for volume %s could not enter its binary directory %s: %s",
			 id, h->libdir, strerror(-e.err));
	else
		snprintf(why, size, "stratafs for volume %s could not be executed (%s): %s",
			 id, h->exec, strerror(-e.err));
	return -EIO;
}

/*
 * A path as stratafs's -o list takes it: "\," for a comma (fuse_opt's
 * escape), "\:" and "\\" for a colon and a backslash (the kernel's
 * lowerdir escapes, which stratafs takes in every path option). The
 * store root is the operator's to choose, and may hold any of them.
 */
static char *csi_opt_escape(const char *path)
{
	char *out = malloc(2 * strlen(path) + 1), *w = out;

	if (!out)
		return NULL;
	for (; *path; path++) {
		if (*path == ',' || *path == ':' || *path == '\\')
			*w++ = '\\';
		*w++ = *path;
	}
	*w = '\0';
	return out;
}

/*
 * The chain the daemon starts on is the one recorded now, after the
 * snapshots of the volume cut short are settled: one that was taken
 * while the caller's copy of the record was loaded, or finished by that
 * recovery, moved the data it must serve.
 */
static int csi_daemon_chain(struct csi_plugin *p, const struct csi_volume *v,
			    struct csi_volume *cur, char *why, size_t size)
{
	int ret = csi_snapshot_recover(&p->store, v->id);

	if (ret) {
		snprintf(why, size, "volume %s has a snapshot cut short that cannot be settled (%s): see the plugin's log; its daemon was not started",
			 v->id, strerror(-ret));
		return ret;
	}
	ret = csi_volume_load(&p->store, v->id, cur);
	if (ret)
		snprintf(why, size, "volume %s: its record: %s", v->id,
			 strerror(-ret));
	return ret;
}

static int csi_daemon_opts(struct csi_plugin *p, const struct csi_volume *v,
			   struct csi_spawn *sp, char **opts, char *why,
			   size_t size)
{
	struct csi_store *s = &p->store;
	char *root = csi_opt_escape(s->root);
	size_t cap = 440 + (root ? 6 * strlen(root) : 0) +
		     32 * (v->nlayers + 1);
	char *o = malloc(cap);
	size_t len;

	if (!o || !root) {
		free(o);
		free(root);
		return -ENOMEM;
	}
	len = snprintf(o, cap, "lowerdir=");
	/*
	 * The daemon gets the layers as descriptors opened beneath layers/
	 * and snapshots/, so a symlink swapped in after the check cannot
	 * redirect it.
	 */
	for (int i = 0; i < v->nlayers; i++) {
		int fd = csi_chain_open(s, v->layers[i]);

		if (fd < 0) {
			snprintf(why, size, "layer '%s' of volume %s: %s",
				 v->layers[i], v->id,
				 fd == -ELOOP ? "is a symlink" : strerror(-fd));
			free(o);
			free(root);
			return fd == -ENOENT || fd == -ELOOP ? -ENOENT : fd;
		}
		sp->fds[sp->nfds++] = fd;
		len += snprintf(o + len, cap - len, "%s/proc/self/fd/%d",
				i ? ":" : "", fd);
	}
	if (!v->nlayers)
		len += snprintf(o + len, cap - len, "%s/empty", root);
	/*
	 * The capacity is the daemon's to keep, except with passthrough
	 * (the kernel writes past the daemon; CreateVolume refuses the mix,
	 * and a record from before keeps its capacity as a number only).
	 * The daemon's own default is passthrough: every other volume says
	 * no, because a live snapshot cannot move a passthrough handle and
	 * an expansion gives a capacity the daemon could not keep.
	 */
	len += snprintf(o + len, cap - len,
			",upperdir=%s/volumes/%s/upper,workdir=%s/volumes/%s/work,allow_other,statsfile=%s/node/%s.stats,control=%s/node/%s.ctl,usagefile=%s/volumes/%s/usage",
			root, v->id, root, v->id, root, v->id, root, v->id,
			root, v->id);
	if (v->passthrough)
		snprintf(o + len, cap - len, ",passthrough");
	else if (v->capacity > 0)
		snprintf(o + len, cap - len, ",nopassthrough,capacity=%lld",
			 (long long)v->capacity);
	else
		snprintf(o + len, cap - len, ",nopassthrough");
	free(root);
	*opts = o;
	return 0;
}

/*
 * Waits until the daemon answers on its new mount. A daemon that dies
 * closes the last descriptor on the connection, which fails the wait at
 * once; one that hangs is killed at the deadline.
 */
static int csi_daemon_ready(struct csi_plugin *p, int mntfd, pid_t pid,
			    int logfd, off_t from, char *why, size_t size)
{
	int ret = csi_mnt_answers(mntfd, CSI_STAGE_TIMEOUT_MS);

	if (ret == -ETIMEDOUT) {
		kill(pid, SIGKILL);
		csi_daemon_log_tail(logfd, from, why, size,
				    "stratafs did not answer in time");
		return ret;
	}
	if (ret) {
		/* the daemon's own words say why, unless the disk was full */
		ret = csi_store_full(&p->store) ? -ENOSPC : -EIO;
		csi_daemon_log_tail(logfd, from, why, size,
				    ret == -ENOSPC ?
				    "stratafs failed to start (the store's filesystem is full)" :
				    "stratafs failed to start");
	}
	return ret;
}

/*
 * Starts stratafs for the volume on a new FUSE mount, detached, and
 * returns once the mount answers: *mntfd is that mount, for the caller
 * to attach where it belongs. Nothing is ever mounted on a path before
 * its daemon serves it. On failure nothing is left mounted or running,
 * and `why` holds the daemon's own error message.
 */
int csi_daemon_start(struct csi_plugin *p, const struct csi_volume *v,
		     struct csi_node_vol *n, int *mntfd, char *why,
		     size_t size)
{
	struct csi_spawn sp = { .logfd = -1, .nullfd = -1 };
	char logname[64], source[64], fuse_arg[32], *opts = NULL;
	struct csi_volume cur = { 0 };
	int fusefd = -1, ret;
	off_t from;
	pid_t pid;

	*mntfd = -1;
	ret = csi_daemon_chain(p, v, &cur, why, size);
	if (ret)
		goto out;
	ret = csi_daemon_opts(p, &cur, &sp, &opts, why, size);
	if (ret)
		goto out;
	snprintf(logname, sizeof(logname), "%s.log", v->id);
	sp.logfd = openat(p->store.node_fd, logname,
			  O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	sp.nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (sp.logfd < 0 || sp.nullfd < 0) {
		ret = -errno;
		snprintf(why, size, "daemon log %s/node/%s: %s", p->store.root,
			 logname, strerror(errno));
		goto out;
	}
	if (p->host.ncgroups) {
		ret = csi_cgroup_open(p, v->id, sp.procs, why, size);
		if (ret)
			goto out;
		sp.nprocs = p->host.ncgroups;
	}
	snprintf(source, sizeof(source), "strata:%s", v->id);
	ret = csi_mnt_fuse(source, csi_flags_from_canon(n->stage_flags) & MS_RDONLY, &fusefd,
			   mntfd);
	if (ret) {
		snprintf(why, size, "a FUSE mount for volume %s: %s", v->id,
			 csi_mnt_strerror(ret));
		goto out;
	}
	sp.fds[sp.nfds++] = fusefd;
	snprintf(fuse_arg, sizeof(fuse_arg), "/dev/fd/%d", fusefd);
	ret = csi_daemon_env(&p->host, &sp);
	if (ret) {
		snprintf(why, size, "%s", strerror(-ret));
		goto out;
	}
	/*
	 * mount.fuse3's form, SOURCE first: `ps` then names the volume a
	 * daemon serves, where its options only show /proc/self/fd paths.
	 */
	sp.argv[0] = "stratafs";
	sp.argv[1] = source;
	sp.argv[2] = fuse_arg;
	sp.argv[3] = "-f";
	sp.argv[4] = "-o";
	sp.argv[5] = opts;
	sp.argv[6] = NULL;
	dprintf(sp.logfd, "strata-csi: starting stratafs for %s\n", n->staging);
	from = lseek(sp.logfd, 0, SEEK_END);
	pid = csi_daemon_fork(p, &sp, v->id, why, size);
	/* the daemon's copy must be the connection's last: see csi_daemon_ready */
	close(fusefd);
	sp.nfds--;
	if (pid < 0) {
		ret = pid;
		goto out;
	}
	ret = csi_daemon_ready(p, *mntfd, pid, sp.logfd, from, why, size);
	if (ret) {
		waitpid(pid, NULL, 0);
		goto out;
	}
	n->pid = pid;
	n->starttime = csi_daemon_starttime(pid);
	csi_metrics_event(CSI_EV_DAEMON_START);
out:
	if (ret && *mntfd >= 0) {
		close(*mntfd);
		*mntfd = -1;
	}
	for (int i = 0; i < sp.nfds; i++)
		close(sp.fds[i]);
	for (int i = 0; i < sp.nprocs; i++)
		close(sp.procs[i]);
	if (ret && sp.nprocs)
		csi_cgroup_remove(p, v->id);
	if (sp.logfd >= 0)
		close(sp.logfd);
	if (sp.nullfd >= 0)
		close(sp.nullfd);
	if (sp.envp != environ)
		free(sp.envp);
	free(opts);
	csi_volume_free(&cur);
	return ret;
}

/*
 * Waits for the daemon to exit: on its pidfd, or where there is none
 * (valgrind, seccomp) by watching its start time; -1 waits for ever.
 */
static int csi_daemon_wait(const struct csi_node_vol *n, int pidfd,
			   int timeout_ms)
{
	struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
	int64_t deadline = csi_now_ms() + timeout_ms;

	if (pidfd >= 0)
		return poll(&pfd, 1, timeout_ms) == 1 ? 0 : -ETIMEDOUT;
	while (csi_daemon_alive(n)) {
		if (timeout_ms >= 0 && csi_now_ms() > deadline)
			return -ETIMEDOUT;
		/* our own child stays a zombie, and so alive, until reaped */
		waitpid(n->pid, NULL, WNOHANG);
		poll(NULL, 0, 10);
	}
	return 0;
}

static void csi_daemon_signal(const struct csi_node_vol *n, int pidfd, int sig)
{
	if (pidfd >= 0)
		syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
	else if (csi_daemon_alive(n))
		kill(n->pid, sig);
}

/*
 * Ends the daemon: once its mounts are gone it exits by itself, so it
 * gets `grace_ms` to do so; then SIGTERM, then SIGKILL. A daemon whose
 * mount is dead serves nobody and gets no grace.
 */
static void csi_daemon_end(struct csi_node_vol *n, int grace_ms)
{
	int pidfd = -1;

	if (!csi_daemon_alive(n))
		goto out_reap;
	pidfd = syscall(SYS_pidfd_open, n->pid, 0);
	/* recheck: the pid may have been reused before the open */
	if (pidfd >= 0 && !csi_daemon_alive(n))
		goto out_close;
	if (grace_ms && csi_daemon_wait(n, pidfd, grace_ms) == 0)
		goto out_exited;
	if (grace_ms) {
		strata_warn("volume %s: stratafs %d still runs after the unmount: SIGTERM",
			    n->id, (int)n->pid);
		csi_daemon_signal(n, pidfd, SIGTERM);
		if (csi_daemon_wait(n, pidfd, CSI_STOP_TIMEOUT_MS) == 0)
			goto out_exited;
	}
	csi_daemon_signal(n, pidfd, SIGKILL);
	csi_daemon_wait(n, pidfd, -1);
out_exited:
	csi_metrics_event(CSI_EV_DAEMON_EXIT);
out_close:
	if (pidfd >= 0)
		close(pidfd);
out_reap:
	/* our own child is reaped here; an adopted one by its parent */
	waitpid(n->pid, NULL, WNOHANG);
}

/* After the daemon's mounts were detached. */
int csi_daemon_stop(struct csi_plugin *p, struct csi_node_vol *n)
{
	csi_daemon_end(n, CSI_STOP_TIMEOUT_MS);
	if (p->host.ncgroups)
		csi_cgroup_remove(p, n->id);
	return 0;
}

/* A daemon whose mount is dead, or that does not answer. */
void csi_daemon_kill(struct csi_node_vol *n)
{
	csi_daemon_end(n, 0);
}
