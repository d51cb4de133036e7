// SPDX-License-Identifier: Apache-2.0
/*
 * Where the daemons run. In Kubernetes the plugin runs in a container,
 * and whatever it starts shares the container's fate: its mount
 * namespace (which holds the image's root filesystem), its cgroup (which
 * the runtime kills as a whole when the container ends) and its files.
 * Three options take the daemons out of it, each checked here at start
 * so that a mistake is one clear error then, never a daemon that half
 * starts at NodeStageVolume:
 *
 *   --daemon-mount-namespace NS  the forked child enters NS (the host's,
 *                                /proc/1/ns/mnt under hostPID) before it
 *                                executes stratafs;
 *   --daemon-cgroup DIR          it joins DIR/<volume id> (cgroup.c);
 *   --daemon-binary-dir DIR      it executes a copy of stratafs made in
 *                                DIR (bundle.c).
 *
 * The plugin itself keeps its own namespace: it makes the FUSE mount and
 * hands the daemon the connection (/dev/fd/N) and the layers
 * (/proc/self/fd/N) as descriptors, which mean the same in any
 * namespace. The daemon opens only three kinds of paths by name: its
 * upper, work and stats files, below the store, and its binary and
 * libraries. Those must name the same files in NS as in the plugin's
 * namespace, and the start-up check proves that they do.
 *
 * Without the options the daemons run where the plugin runs, as they
 * always did: standalone, and in a test's private namespace.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "csi.h"

/*
 * Runs fn(arg, wfd) in a child process and collects what it writes to
 * wfd into out (up to size bytes; *len says how many). Returns 0 when the
 * child exited 0, else the -errno fn returned. For the start-up work that
 * needs a process of its own: entering a mount namespace, joining a
 * cgroup, executing a program. The plugin has no thread of its own yet.
 */
int csi_child_run(int (*fn)(void *arg, int wfd), void *arg, void *out,
		  size_t size, size_t *len)
{
	int pfd[2], status, ret;
	size_t got = 0;
	ssize_t n;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid == 0)
		_exit(-fn(arg, pfd[1]) & 0xff);
	ret = pid < 0 ? -errno : 0;
	close(pfd[1]);
	while (pid > 0 && got < size &&
	       (n = read(pfd[0], (char *)out + got, size - got)) > 0)
		got += n;
	close(pfd[0]);
	if (len)
		*len = got;
	if (pid < 0)
		return ret;
	if (waitpid(pid, &status, 0) != pid)
		return -ECHILD;
	return !WIFEXITED(status) ? -EIO : -WEXITSTATUS(status);
}

struct csi_host_stat {
	int nsfd;
	const char *path;
};

/* In the child: the device and inode `path` has in the namespace. */
static int csi_host_stat_child(void *arg, int wfd)
{
	const struct csi_host_stat *hs = arg;
	struct stat st;

	if (setns(hs->nsfd, CLONE_NEWNS) < 0 || stat(hs->path, &st) < 0)
		return -errno;
	return write(wfd, &st, sizeof(st)) == sizeof(st) ? 0 : -EIO;
}

/* `path` must be the very same file in the daemons' namespace as here. */
static int csi_host_same(struct csi_host *h, const char *what,
			 const char *path, char *why, size_t size)
{
	struct stat here, there;
	size_t len;
	int ret;

	if (stat(path, &here) < 0) {
		ret = -errno;
		snprintf(why, size, "%s %s: %s", what, path, strerror(errno));
		return ret;
	}
	/* a thread cannot enter a mount namespace: a child does */
	ret = csi_child_run(csi_host_stat_child,
			    &(struct csi_host_stat){ h->mntns_fd, path }, &there,
			    sizeof(there), &len);
	if (ret == 0 && len != sizeof(there))
		ret = -EIO;
	if (ret == 0 && (here.st_dev != there.st_dev || here.st_ino != there.st_ino))
		ret = -EXDEV;
	if (ret)
		snprintf(why, size, "%s %s is %s in the daemons' mount namespace: mount it at the same path inside the plugin's container as on the host",
			 what, path, ret == -EXDEV ? "another directory" :
			 strerror(-ret));
	return ret;
}

static int csi_host_mntns(struct csi_host *h, const char *ns, char *why,
			  size_t size)
{
	int type;

	h->mntns_fd = open(ns, O_RDONLY | O_CLOEXEC);
	if (h->mntns_fd < 0) {
		snprintf(why, size, "%s", strerror(errno));
		return -errno;
	}
	type = ioctl(h->mntns_fd, NS_GET_NSTYPE);
	if (type != CLONE_NEWNS) {
		snprintf(why, size, "not a mount namespace (%s)",
			 type < 0 ? strerror(errno) : "a namespace of another kind");
		return -EINVAL;
	}
	return 0;
}

/*
 * Sets up where daemons run, from the three options. Logs what is wrong
 * and returns -errno; the plugin does not start then.
 */
int csi_host_init(struct csi_plugin *p)
{
	struct csi_host *h = &p->host;
	const struct csi_config *c = &p->cfg;
	char why[768] = "";
	int ret = 0;

	h->mntns_fd = -1;
	if (c->daemon_mntns) {
		ret = csi_host_mntns(h, c->daemon_mntns, why, sizeof(why));
		if (ret) {
			strata_err("--daemon-mount-namespace %s: %s", c->daemon_mntns,
				   why);
			return ret;
		}
	}
	if (c->daemon_bindir) {
		ret = csi_bundle_prepare(p, why, sizeof(why));
		if (ret) {
			strata_err("--daemon-binary-dir %s: %s", c->daemon_bindir,
				   why);
			return ret;
		}
	} else {
		h->exec = strdup(c->stratafs);
		if (!h->exec)
			return -ENOMEM;
	}
	if (c->daemon_mntns) {
		ret = csi_host_same(h, "the store", p->store.root, why, sizeof(why));
		if (!ret)
			ret = csi_host_same(h, "the daemon binary", h->exec, why,
					    sizeof(why));
		if (ret) {
			strata_err("--daemon-mount-namespace %s: %s%s", c->daemon_mntns,
				   why, c->daemon_bindir ? "" :
				   " (or give --daemon-binary-dir)");
			return ret;
		}
	}
	if (c->daemon_cgroup) {
		ret = csi_cgroup_init(p, why, sizeof(why));
		if (ret) {
			strata_err("--daemon-cgroup %s: %s", c->daemon_cgroup, why);
			return ret;
		}
	}
	if (c->daemon_mntns || c->daemon_cgroup || c->daemon_bindir)
		strata_info("daemons run %s, %s, from %s",
			    c->daemon_mntns ? "in the mount namespace given" :
			    "in the plugin's mount namespace",
			    c->daemon_cgroup ? "in cgroups of their own" :
			    "in the plugin's cgroup", h->exec);
	return 0;
}

void csi_host_free(struct csi_host *h)
{
	if (h->mntns_fd >= 0)
		close(h->mntns_fd);
	h->mntns_fd = -1;
	csi_cgroup_free(h);
	free(h->exec);
	free(h->libdir);
	free(h->ldpath);
	free(h->binpath);
	h->exec = h->libdir = h->ldpath = h->binpath = NULL;
}
