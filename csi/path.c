// SPDX-License-Identifier: Apache-2.0
/*
 * Paths from the Node service's callers: kubelet's staging and target
 * paths, and anything else that reaches the socket. A path is a claim,
 * never trusted as given:
 *
 * - it must be absolute and canonical (no "." or "..", no repeated or
 *   trailing '/'), so that what is checked is what is used;
 * - with --allowed-path-prefix, it must lie below one of the prefixes;
 * - no component may be a symlink: the parent is opened with openat2
 *   and RESOLVE_NO_SYMLINKS, and everything after that goes through the
 *   descriptor, so a component swapped for a symlink after the check
 *   changes nothing;
 * - it must not be, lie in, or lie above the store or the socket's
 *   directory. "In" is decided by walking the parent's ancestors and
 *   comparing device and inode, which also sees through a bind mount of
 *   the store elsewhere.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "csi.h"

/* No symlinks at all, and no /proc magic links either. */
#define CSI_RESOLVE (RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

/*
 * What openat2 does for the resolve flags used here, one component at a
 * time, where openat2 is missing (ENOSYS: before Linux 5.6, under
 * valgrind, behind a seccomp filter that does not know it). The paths
 * are canonical by then, so no component is "." or "..".
 */
static int csi_openat_walk(int dirfd, const char *path, int flags)
{
	char buf[PATH_MAX], *comp, *save = NULL, *next;
	int fd, nfd;
	struct stat st;

	if ((size_t)snprintf(buf, sizeof(buf), "%s", path) >= sizeof(buf))
		return -ENAMETOOLONG;
	fd = openat(path[0] == '/' ? AT_FDCWD : dirfd,
		    path[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (comp = strtok_r(buf, "/", &save); comp; comp = next) {
		next = strtok_r(NULL, "/", &save);
		nfd = openat(fd, comp, (next ? O_PATH : flags) | O_NOFOLLOW |
					       O_CLOEXEC);
		close(fd);
		if (nfd < 0)
			return -errno;
		fd = nfd;
		if (fstat(fd, &st) < 0 || S_ISLNK(st.st_mode) ||
		    (next && !S_ISDIR(st.st_mode))) {
			nfd = S_ISLNK(st.st_mode) ? -ELOOP : -ENOTDIR;
			close(fd);
			return nfd;
		}
	}
	return fd;
}

int csi_openat2(int dirfd, const char *path, int flags, unsigned long long resolve)
{
	struct open_how how = { .flags = (unsigned)flags | O_CLOEXEC,
				.resolve = resolve };
	int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	struct stat st;

	if (fd < 0 && errno == ENOSYS)
		fd = csi_openat_walk(dirfd, path, flags);
	else if (fd < 0)
		fd = -errno;
	/*
	 * O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR: say what it is.
	 * Only the last component can be the symlink here; one before it
	 * failed with ELOOP already.
	 */
	if (fd == -ENOTDIR && fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    S_ISLNK(st.st_mode))
		fd = -ELOOP;
	return fd;
}

static bool csi_path_below(const char *path, const char *dir)
{
	size_t len = strlen(dir);

	if (len == 1 && dir[0] == '/')
		return true;
	return !strncmp(path, dir, len) && (path[len] == '/' || !path[len]);
}

/*
 * A directory the Node service must never mount on, in or above: its
 * canonical path (for "above" and for messages) and its identity.
 */
int csi_guard_add(struct csi_plugin *p, const char *path)
{
	struct csi_guard *g;
	struct stat st;
	char *real;

	if (p->nguards == CSI_MAX_GUARDS)
		return -E2BIG;
	real = realpath(path, NULL);
	if (!real)
		return -errno;
	if (stat(real, &st) < 0) {
		free(real);
		return -errno;
	}
	g = &p->guards[p->nguards++];
	g->path = real;
	g->dev = st.st_dev;
	g->ino = st.st_ino;
	return 0;
}

void csi_guards_free(struct csi_plugin *p)
{
	for (int i = 0; i < p->nguards; i++)
		free(p->guards[i].path);
	p->nguards = 0;
}

static const struct csi_guard *csi_guard_match(const struct csi_plugin *p,
					       const struct stat *st)
{
	for (int i = 0; i < p->nguards; i++)
		if (p->guards[i].dev == st->st_dev &&
		    p->guards[i].ino == st->st_ino)
			return &p->guards[i];
	return NULL;
}

/* Walks from dirfd up to "/", looking for a guarded directory. */
static const struct csi_guard *csi_guard_ancestor(const struct csi_plugin *p,
						  int dirfd)
{
	const struct csi_guard *g = NULL;
	struct stat st, up;
	int fd = dup(dirfd), next;

	while (fd >= 0 && !g) {
		if (fstat(fd, &st) < 0)
			break;
		g = csi_guard_match(p, &st);
		next = openat(fd, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
		close(fd);
		fd = next;
		/* ".." of "/" is "/" itself */
		if (fd >= 0 && fstat(fd, &up) == 0 && up.st_dev == st.st_dev &&
		    up.st_ino == st.st_ino)
			break;
	}
	if (fd >= 0)
		close(fd);
	return g;
}

static int csi_path_allowed(const struct csi_plugin *p, const char *path,
			    char *why, size_t size)
{
	for (int i = 0; i < p->cfg.nprefixes; i++)
		if (csi_path_below(path, p->cfg.prefixes[i]))
			return 0;
	if (!p->cfg.nprefixes)
		return 0;
	snprintf(why, size, "'%.200s' is not below an allowed path prefix (--allowed-path-prefix %s%s)",
		 path, p->cfg.prefixes[0], p->cfg.nprefixes > 1 ? ", ..." : "");
	return -EPERM;
}

void csi_path_init(struct csi_path *pp)
{
	pp->path[0] = '\0';
	pp->parent = -1;
	pp->name = NULL;
}

void csi_path_release(struct csi_path *pp)
{
	if (pp->parent >= 0)
		close(pp->parent);
	csi_path_init(pp);
}

/*
 * Checks `path` and opens its parent. p NULL: a path the plugin itself
 * chose or recorded, which needs no prefix or guard check but still no
 * symlink. Errors, with `why` said for the caller: -EINVAL malformed, -EPERM outside the allowed prefixes or on a
 * guarded directory, -ELOOP a symlink on the way, -ENOTDIR a component
 * that is no directory, -ENOENT a missing parent.
 */
int csi_path_resolve(const struct csi_plugin *p, const char *path,
		     struct csi_path *pp, char *why, size_t size)
{
	const struct csi_guard *g;
	char *slash;
	int ret;

	csi_path_init(pp);
	ret = csi_path_check(path, why, size);
	if (!ret && p)
		ret = csi_path_allowed(p, path, why, size);
	if (ret)
		return ret;
	for (int i = 0; p && i < p->nguards; i++) {
		if (csi_path_below(path, p->guards[i].path)) {
			snprintf(why, size, "'%.200s' lies in %s: the plugin never mounts there",
				 path, p->guards[i].path);
			return -EPERM;
		}
		if (csi_path_below(p->guards[i].path, path)) {
			snprintf(why, size, "'%.200s' holds %s: the plugin never mounts there",
				 path, p->guards[i].path);
			return -EPERM;
		}
	}
	strcpy(pp->path, path);
	slash = strrchr(pp->path, '/');
	pp->name = slash + 1;
	*slash = '\0';
	ret = csi_openat2(AT_FDCWD, pp->path[0] ? pp->path : "/",
			  O_PATH | O_DIRECTORY, CSI_RESOLVE);
	*slash = '/';
	if (ret < 0) {
		snprintf(why, size, "the parent of '%.200s': %s", path,
			 ret == -ELOOP ? "a component is a symlink, and no path is followed through one" :
			 ret == -EXDEV ? "a component is a /proc magic link" :
			 strerror(-ret));
		csi_path_release(pp);
		return ret == -EXDEV ? -ELOOP : ret;
	}
	pp->parent = ret;
	g = p ? csi_guard_ancestor(p, pp->parent) : NULL;
	if (g) {
		snprintf(why, size, "'%.200s' lies in %s: the plugin never mounts there",
			 path, g->path);
		csi_path_release(pp);
		return -EPERM;
	}
	return 0;
}

/*
 * Opens the last component, a directory, without following a symlink:
 * O_PATH on the topmost mount there. With `create`, a missing directory
 * is made first and *created says so. -ENOTDIR for anything that is not
 * a directory (a filesystem volume never goes onto a file).
 */
int csi_path_open(const struct csi_path *pp, bool create, bool *created)
{
	if (created)
		*created = false;
	if (create) {
		if (mkdirat(pp->parent, pp->name, 0750) == 0) {
			if (created)
				*created = true;
		} else if (errno != EEXIST) {
			return -errno;
		}
	}
	return csi_openat2(pp->parent, pp->name,
			   O_PATH | O_DIRECTORY | O_NOFOLLOW,
			   CSI_RESOLVE | RESOLVE_BENEATH);
}

/* The error a bad path gets, in the caller's words. */
void csi_path_reply(struct csi_reply *r, const char *field, int err,
		    const char *why)
{
	switch (err) {
	case -ENOENT:
		/* the CO makes the parent (and a staging dir) itself */
		csi_reply_set(r, CSI_FAILED_PRECONDITION, "%s: %s", field, why);
		break;
	case -ENOMEM:
		csi_reply_errno(r, err, field);
		break;
	default:
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s: %s", field, why);
	}
}

/*
 * The recorded mount, if it is the one on top at the directory pp names:
 * its descriptor in *fd (the caller closes it). 1 when it is, 0 when the
 * path shows something else (*fd -1), or a negative errno. *top says what
 * is on top there (id 0 when nothing is mounted at the path itself).
 */
int csi_mnt_at(const struct csi_path *pp, const struct csi_mnt *want, int *fd,
	       struct csi_mnt *top)
{
	bool root;
	int ret;

	*fd = csi_path_open(pp, false, NULL);
	top->id = 0;
	top->dev = 0;
	if (*fd < 0)
		return *fd;
	ret = csi_mnt_of(*fd, top, &root);
	if (ret == 0 && !root)
		top->id = 0;
	if (ret == 0 && top->id && top->id == want->id && top->dev == want->dev)
		return 1;
	close(*fd);
	*fd = -1;
	return ret;
}
