// SPDX-License-Identifier: Apache-2.0
/*
 * The daemons' cgroups (--daemon-cgroup DIR). A container runtime ends a
 * container by killing every process in the container's cgroup, so a
 * daemon that stayed in the plugin's cgroup would die with the plugin's
 * container and take its volume down. Each daemon therefore runs in a
 * cgroup of its volume, DIR/<volume id>, which the plugin makes, which
 * the forked child joins before it executes stratafs (so no moment
 * exists in which the daemon runs in the plugin's cgroup), and which the
 * plugin removes once the daemon is gone.
 *
 * DIR names one hierarchy when its parent is a cgroup filesystem (cgroup
 * v2, or a single v1 hierarchy). When its parent is instead a directory
 * of hierarchies, as /sys/fs/cgroup is on a v1 or hybrid host, the same
 * name is used below every hierarchy found there: a daemon must leave
 * the container's cgroup in each of them (the memory hierarchy above
 * all, where the container's limit would otherwise kill it).
 *
 * Everything here works on descriptors the plugin opened in its own mount
 * namespace; the kernel checks a move against the namespaces of whoever
 * opened cgroup.procs, which is the plugin.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "csi.h"

static bool csi_cgroup_fs(int fd)
{
	struct statfs st;

	return fstatfs(fd, &st) == 0 && (st.f_type == CGROUP2_SUPER_MAGIC ||
					 st.f_type == CGROUP_SUPER_MAGIC);
}

/*
 * A v1 cpuset cgroup starts with no CPU and no memory node, and refuses
 * every process until it has them: it gets its parent's. Elsewhere the
 * files do not exist and there is nothing to do.
 */
static int csi_cgroup_cpuset(int parent, const char *name)
{
	static const char *const files[] = { "cpuset.cpus", "cpuset.mems" };
	char path[PATH_MAX], buf[4096];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		int from, to, ret = 0;
		ssize_t n;

		from = openat(parent, files[i], O_RDONLY | O_CLOEXEC);
		if (from < 0)
			return errno == ENOENT ? 0 : -errno;
		n = read(from, buf, sizeof(buf));
		close(from);
		if (n < 0)
			return -errno;
		snprintf(path, sizeof(path), "%s/%s", name, files[i]);
		to = openat(parent, path, O_WRONLY | O_CLOEXEC);
		if (to < 0)
			return -errno;
		/* an empty value ("\n") is what a fresh cgroup already has */
		if (n > 1 && write(to, buf, n) != n)
			ret = -errno;
		close(to);
		if (ret)
			return ret;
	}
	return 0;
}

/* Makes dirfd/name a cgroup, if it is not one already. */
static int csi_cgroup_mkdir(int dirfd, const char *name)
{
	if (mkdirat(dirfd, name, 0755) < 0)
		return errno == EEXIST ? 0 : -errno;
	return csi_cgroup_cpuset(dirfd, name);
}

static int csi_cgroup_add(struct csi_host *h, int hierfd, const char *hier,
			  const char *name, char *why, size_t size)
{
	int fd, ret;

	if (h->ncgroups == CSI_MAX_CGROUPS) {
		snprintf(why, size, "more than %d cgroup hierarchies",
			 CSI_MAX_CGROUPS);
		return -E2BIG;
	}
	ret = csi_cgroup_mkdir(hierfd, name);
	if (ret) {
		snprintf(why, size, "cannot make the cgroup %s/%s: %s%s", hier,
			 name, strerror(-ret), ret == -EROFS ?
			 " (the cgroup filesystem is mounted read-only here)" : "");
		return ret;
	}
	fd = openat(hierfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || asprintf(&h->cgroups[h->ncgroups], "%s/%s", hier, name) < 0) {
		ret = fd < 0 ? -errno : -ENOMEM;
		if (fd >= 0)
			close(fd);
		snprintf(why, size, "the cgroup %s/%s: %s", hier, name,
			 strerror(-ret));
		return ret;
	}
	h->cgroup_fds[h->ncgroups++] = fd;
	return 0;
}

/* Every hierarchy mounted right below the directory dirfd (v1, hybrid). */
static int csi_cgroup_scan(struct csi_host *h, int dirfd, const char *dir,
			   const char *name, char *why, size_t size)
{
	dev_t seen[CSI_MAX_CGROUPS];
	int nseen = 0, ret = 0;
	struct dirent *e;
	struct stat st;
	DIR *d;

	d = strata_opendir_at(dirfd, ".");
	if (!d) {
		ret = -errno;
		snprintf(why, size, "%s: %s", dir, strerror(-ret));
		return ret;
	}
	while (!ret && (e = readdir(d))) {
		char path[PATH_MAX];
		int hfd;

		/* cpu and cpuacct are often symlinks to cpu,cpuacct: seen once */
		if (e->d_name[0] == '.' || e->d_type != DT_DIR)
			continue;
		hfd = openat(dirfd, e->d_name,
			     O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (hfd < 0)
			continue;
		if (csi_cgroup_fs(hfd) && fstat(hfd, &st) == 0) {
			bool dup = false;

			for (int i = 0; i < nseen; i++)
				dup |= seen[i] == st.st_dev;
			if (!dup && nseen < CSI_MAX_CGROUPS) {
				seen[nseen++] = st.st_dev;
				snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
				ret = csi_cgroup_add(h, hfd, path, name, why, size);
			}
		}
		close(hfd);
	}
	closedir(d);
	return ret;
}

/*
 * Moves the calling process into the cgroups whose cgroup.procs are open
 * as fds. Between fork and exec: async-signal-safe only. -errno and the
 * index of the one that refused it.
 */
int csi_cgroup_join(const int *fds, int n, int *failed)
{
	for (int i = 0; i < n; i++)
		if (write(fds[i], "0", 1) != 1) {
			*failed = i;
			return -errno;
		}
	return 0;
}

/* Opens cgroup.procs of DIR/<name> in every hierarchy, made if missing. */
int csi_cgroup_open(struct csi_plugin *p, const char *name, int *fds,
		    char *why, size_t size)
{
	struct csi_host *h = &p->host;
	char path[PATH_MAX];
	int i, ret = 0;

	for (i = 0; i < h->ncgroups; i++) {
		ret = csi_cgroup_mkdir(h->cgroup_fds[i], name);
		snprintf(path, sizeof(path), "%s/cgroup.procs", name);
		if (!ret) {
			fds[i] = openat(h->cgroup_fds[i], path, O_WRONLY | O_CLOEXEC);
			ret = fds[i] < 0 ? -errno : 0;
		}
		if (ret) {
			snprintf(why, size, "the daemon's cgroup %s/%s: %s",
				 h->cgroups[i], name, strerror(-ret));
			break;
		}
	}
	if (!ret)
		return 0;
	while (i-- > 0)
		close(fds[i]);
	csi_cgroup_remove(p, name);
	return ret;
}

/*
 * Removes DIR/<name> everywhere, once its daemon is gone. A cgroup that
 * still holds a process is left, and found again by the sweep.
 */
void csi_cgroup_remove(struct csi_plugin *p, const char *name)
{
	struct csi_host *h = &p->host;

	for (int i = 0; i < h->ncgroups; i++)
		if (unlinkat(h->cgroup_fds[i], name, AT_REMOVEDIR) < 0 &&
		    errno != ENOENT)
			strata_debug("cgroup %s/%s not removed: %s",
				     h->cgroups[i], name, strerror(errno));
}

/*
 * A process moved into a throwaway cgroup and out again by its exit: the
 * start-up proof that daemons can be moved, so that a cgroup filesystem
 * mounted read-only, or a cgroup namespace that hides DIR, is an error
 * at start rather than at each NodeStageVolume.
 */
struct csi_probe_fds {
	const int *fds;
	int n;
};

static int csi_cgroup_probe_child(void *arg, int wfd)
{
	const struct csi_probe_fds *pf = arg;
	int failed;

	(void)wfd;
	return csi_cgroup_join(pf->fds, pf->n, &failed);
}

static int csi_cgroup_probe(struct csi_plugin *p, char *why, size_t size)
{
	int fds[CSI_MAX_CGROUPS], ret;
	char name[32];

	snprintf(name, sizeof(name), "probe-%d", (int)getpid());
	ret = csi_cgroup_open(p, name, fds, why, size);
	if (ret)
		return ret;
	ret = csi_child_run(csi_cgroup_probe_child,
			    &(struct csi_probe_fds){ fds, p->host.ncgroups },
			    NULL, 0, NULL);
	for (int i = 0; i < p->host.ncgroups; i++)
		close(fds[i]);
	csi_cgroup_remove(p, name);
	if (ret)
		snprintf(why, size, "no process can be moved into %s/%s: %s (a cgroup namespace of the plugin's own may hide it: see docs/kubernetes.md)",
			 p->host.cgroups[0], name, strerror(-ret));
	return ret;
}

int csi_cgroup_init(struct csi_plugin *p, char *why, size_t size)
{
	const char *want = p->cfg.daemon_cgroup;
	char *dcopy = strdup(want), *bcopy = strdup(want), *dir, *name;
	int fd = -1, ret;

	if (!dcopy || !bcopy) {
		ret = -ENOMEM;
		snprintf(why, size, "%s", strerror(ENOMEM));
		goto out;
	}
	dir = dirname(dcopy);
	name = basename(bcopy);
	if (want[0] != '/' || !strcmp(name, "..") || !strcmp(name, ".") ||
	    !strcmp(name, "/") || strlen(name) > NAME_MAX) {
		ret = -EINVAL;
		snprintf(why, size, "'%s' is not an absolute path to a cgroup directory",
			 want);
		goto out;
	}
	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		snprintf(why, size, "%s: %s", dir, strerror(errno));
		goto out;
	}
	if (csi_cgroup_fs(fd))
		ret = csi_cgroup_add(&p->host, fd, dir, name, why, size);
	else
		ret = csi_cgroup_scan(&p->host, fd, dir, name, why, size);
	if (!ret && !p->host.ncgroups) {
		ret = -ENOENT;
		snprintf(why, size, "%s is neither a cgroup filesystem nor a directory of cgroup hierarchies",
			 dir);
	}
	if (!ret)
		ret = csi_cgroup_probe(p, why, size);
out:
	if (fd >= 0)
		close(fd);
	free(dcopy);
	free(bcopy);
	return ret;
}

/*
 * Cgroups of volumes that are not staged any more: left by a daemon that
 * exited while no plugin ran, or by a plugin killed between a daemon's
 * exit and the removal. A volume with a call in flight is left to it.
 */
void csi_cgroup_sweep(struct csi_plugin *p)
{
	struct csi_host *h = &p->host;

	for (int i = 0; i < h->ncgroups; i++) {
		DIR *d = strata_opendir_at(h->cgroup_fds[i], ".");
		struct dirent *e;

		if (!d)
			continue;
		while ((e = readdir(d))) {
			char rec[NAME_MAX + 8];

			if (!strncmp(e->d_name, "probe-", 6) &&
			    atoi(e->d_name + 6) != (int)getpid()) {
				unlinkat(h->cgroup_fds[i], e->d_name, AT_REMOVEDIR);
				continue;
			}
			if (!csi_volume_id_valid(e->d_name) ||
			    csi_busy_enter(&p->store, e->d_name))
				continue;
			snprintf(rec, sizeof(rec), "%s.json", e->d_name);
			if (faccessat(p->store.node_fd, rec, F_OK, 0) < 0 &&
			    errno == ENOENT)
				csi_cgroup_remove(p, e->d_name);
			csi_busy_leave(&p->store, e->d_name);
		}
		closedir(d);
	}
}

void csi_cgroup_free(struct csi_host *h)
{
	for (int i = 0; i < h->ncgroups; i++) {
		close(h->cgroup_fds[i]);
		free(h->cgroups[i]);
	}
	h->ncgroups = 0;
}
