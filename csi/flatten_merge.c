// SPDX-License-Identifier: Apache-2.0
/*
 * The merged view of a run of layers, written out as one layer in the
 * kernel overlayfs format (flatten.c decides which run, and when). What
 * a union over the run and the layers below it shows must not change
 * when the run is replaced by the result, so the result keeps exactly
 * the markers that still have something to act on:
 *
 *  - a name's topmost entry in the run wins; a whiteout there becomes a
 *    whiteout in the result only if the layers below the run show the
 *    name (a whiteout over nothing hides nothing);
 *  - a directory merges down the run as the kernel's lookup does: it
 *    stops at an opaque directory, a whiteout or a non-directory, and
 *    follows redirects. Every lookup of a name in a layer, in the run or
 *    below it, is one walk (csi_flat_walk) with the kernel's rules: an
 *    absolute path is walked a name at a time, and a directory on the
 *    way may rewrite the rest of it (its redirect) or end the search
 *    below its layer (opaque). Where the search stopped inside the run
 *    and the layers below show the name, the result is opaque, so that
 *    it stays hidden; where it did not stop, and its lower part is
 *    elsewhere than its own path, the result carries an absolute
 *    redirect to it;
 *  - the layers' other private markers (origin, impure, nlink, and the
 *    run's own opaque and redirect) describe layers that are gone, and
 *    are dropped; a user's xattr kept escaped in that namespace stays.
 *
 * Owners, modes, times, xattrs, symlinks, devices, FIFOs and sockets are
 * kept. Data is shared with the source where the filesystem can
 * (FICLONE), else copied by copy_file_range over the data ranges only,
 * so sparse files stay sparse. Names of one file within a layer stay
 * hard links of one file in the result.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "csi.h"

/* the plugin starts its daemons without userxattr: the trusted names */
#define CSI_FLAT_OWN "trusted.overlay."
#define CSI_FLAT_ESCAPED "trusted.overlay.overlay."
#define CSI_FLAT_OPAQUE "trusted.overlay.opaque"
#define CSI_FLAT_REDIRECT "trusted.overlay.redirect"
#define CSI_FLAT_XATTR_MAX (64 * 1024)
#define CSI_FLAT_CHUNK (1 << 20)

/* Where one layer of the run holds a directory of the merged view. */
struct csi_flat_src {
	int level;		/* index in the run, top first */
	int fd;			/* the directory, open */
};

/* A directory of the merged view. */
struct csi_flat_dir {
	struct csi_flat_src *src;	/* top first */
	int nsrc;
	bool open;		/* the layers below the run still merge into it */
	char *below;		/* ... at this path */
};

struct csi_flat_name {
	char *name;
	int src;		/* index in the directory's src */
};

/* A file with several names, copied once: the others are linked to it. */
struct csi_flat_link {
	int level;
	dev_t dev;
	ino_t ino;
	char *path;		/* its first name in the result, relative */
};

/*
 * A name looked up down a stack of layers, as the kernel's overlayfs
 * carries it (ovl_lookup_data in fs/overlayfs/namei.c): what the next
 * layer is asked for, one name in the parent's directory there, or an
 * absolute path walked from the layer's root once a redirect said so.
 */
struct csi_flat_walk {
	char *name;		/* malloc'd */
	bool stop;		/* a whiteout, non-dir or opaque dir ended it */
	bool is_dir;		/* a directory was found: only directories merge */
};

static void csi_flat_dir_free(struct csi_flat_dir *d)
{
	for (int i = 0; i < d->nsrc; i++)
		close(d->src[i].fd);
	free(d->src);
	free(d->below);
	memset(d, 0, sizeof(*d));
}

static bool csi_flat_whiteout(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

/* "" + "/" + "a": "/a". malloc'd, or NULL. */
static char *csi_flat_join(const char *dir, const char *name)
{
	char *p;

	return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

/* An overlay marker of the directory FD: its value's length, 0 or -errno. */
static int csi_flat_marker(int fd, const char *name, char *buf, size_t size)
{
	char proc[64];
	ssize_t n;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	n = getxattr(proc, name, buf, size - 1);
	if (n < 0)
		return errno == ENODATA || errno == ENOTSUP ? 0 : -errno;
	buf[n] = '\0';
	return (int)n;
}

/* Whether the directory FD is opaque: 1, 0 or -errno. */
static int csi_flat_opaque(int fd)
{
	char val[64];
	int ret = csi_flat_marker(fd, CSI_FLAT_OPAQUE, val, sizeof(val));

	return ret < 0 ? ret : ret == 1 && val[0] == 'y';
}

/*
 * Whether a redirect is one the kernel follows: an absolute path of
 * names, or one name. The kernel fails the lookup on anything else (and
 * on "." or "..", which here would also lead out of the layer).
 */
static bool csi_flat_redirect_valid(const char *r)
{
	const char *c = r[0] == '/' ? r + 1 : r;

	if (r[0] != '/' && strchr(r, '/'))
		return false;
	for (;;) {
		size_t len = strcspn(c, "/");

		if (len == 0 || (len == 1 && c[0] == '.') ||
		    (len == 2 && !strncmp(c, "..", 2)))
			return false;
		if (!c[len])
			return true;
		c += len + 1;
	}
}

/*
 * The redirect of the directory FD, met at the name that starts at
 * PRELEN in W->name with POST after it, rewrites what the layers below
 * look up, as ovl_check_redirect: an absolute one the whole path (and
 * the search goes on below, even if an opaque directory on the way had
 * ended it), a relative one that name alone.
 */
static int csi_flat_redirect(struct csi_flat_walk *w, int fd, size_t prelen,
			     const char *post)
{
	char val[PATH_MAX], *name;
	int ret;

	ret = csi_flat_marker(fd, CSI_FLAT_REDIRECT, val, sizeof(val));
	if (ret <= 0)
		return ret;
	if (!csi_flat_redirect_valid(val))
		return -EBADMSG;
	if (val[0] == '/') {
		w->stop = false;
		ret = asprintf(&name, "%s%s", val, post);
	} else {
		ret = asprintf(&name, "%.*s%s%s", (int)prelen, w->name, val,
			       post);
	}
	if (ret < 0)
		return -ENOMEM;
	free(w->name);		/* POST pointed into it: used already */
	w->name = name;
	return 0;
}

/*
 * NAME in the directory BASE of one layer, as ovl_lookup_single, NAME
 * being W->name's component at PRELEN with POST after it: 1 when found
 * (with *st, and *fd when it is a directory, else -1), 0 when not, or
 * -errno. A whiteout or a non-directory ends W's search; so does an
 * opaque directory, below this layer; another directory's redirect
 * rewrites what comes next.
 */
static int csi_flat_single(int base, struct csi_flat_walk *w, const char *name,
			   size_t prelen, const char *post, struct stat *st,
			   int *fd)
{
	bool last = !*post;
	int ret;

	*fd = -1;
	if (fstatat(base, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT || errno == ENAMETOOLONG ? 0 : -errno;
	if (csi_flat_whiteout(st)) {
		w->stop = true;
		return 0;
	}
	if (!S_ISDIR(st->st_mode)) {
		/* a non-directory never merges with a directory */
		w->stop = true;
		return last && !w->is_dir;
	}
	if (last)
		w->is_dir = true;
	*fd = openat(base, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				       O_CLOEXEC);
	if (*fd < 0)
		return -errno;
	ret = csi_flat_opaque(*fd);
	if (ret == 1)
		w->stop = true;
	else if (ret == 0)
		ret = csi_flat_redirect(w, *fd, prelen, post);
	if (ret < 0) {
		close(*fd);
		*fd = -1;
		return ret;
	}
	return 1;
}

/*
 * W->name in one layer, as ovl_lookup_layer: one name in DIR (the
 * parent's directory in that layer), or an absolute path walked from
 * ROOT a name at a time, each directory on the way free to end the
 * search below this layer or to rewrite the rest of the path. Returns
 * as csi_flat_single does for the last name.
 */
static int csi_flat_walk(int root, int dir, struct csi_flat_walk *w,
			 struct stat *st, int *fd)
{
	int base = root, ret;
	size_t rem;

	if (w->name[0] != '/')
		return csi_flat_single(dir, w, w->name, 0, "", st, fd);
	/* counted from the end: a redirect rewrites what comes before */
	rem = strlen(w->name) - 1;
	for (;;) {
		size_t len = strlen(w->name);
		const char *s = w->name + len - rem, *next = strchrnul(s, '/');
		char comp[NAME_MAX + 1];
		bool end = !*next;

		if (next - s > NAME_MAX) {
			ret = 0;	/* no layer has a name that long */
			*fd = -1;
			break;
		}
		memcpy(comp, s, next - s);
		comp[next - s] = '\0';
		ret = csi_flat_single(base, w, comp, len - rem, next, st, fd);
		if (base != root)
			close(base);
		base = root;
		if (ret <= 0 || end)
			return ret;
		base = *fd;	/* a directory on the way: into it */
		*fd = -1;
		rem -= strlen(comp) + 1;
	}
	if (base != root)
		close(base);
	return ret;
}

/* Adds the directory FD, at LEVEL of the run, to D. */
static int csi_flat_add(struct csi_flat_dir *d, int level, int fd)
{
	struct csi_flat_src *v = realloc(d->src, (d->nsrc + 1) * sizeof(*v));

	if (!v) {
		close(fd);
		return -ENOMEM;
	}
	d->src = v;
	v[d->nsrc++] = (struct csi_flat_src){ level, fd };
	return 0;
}

/* The parent's directory at LEVEL, or NULL where it has none. */
static const struct csi_flat_src *csi_flat_at(const struct csi_flat_dir *d,
					       int level)
{
	for (int i = 0; i < d->nsrc; i++)
		if (d->src[i].level == level)
			return &d->src[i];
	return NULL;
}

/*
 * The directory NAME of PARENT, whose topmost entry is in
 * PARENT->src[TOP], merged down the run into CHILD, as the kernel looks
 * it up: in the parent's directory of each layer, or from the layers'
 * roots once a redirect made the name absolute. Where the search did
 * not end in the run, it goes on below the run at CHILD->below.
 */
static int csi_flat_descend(const struct csi_flat_ctx *c,
			    const struct csi_flat_dir *parent, int top,
			    const char *name, struct csi_flat_dir *child)
{
	const struct csi_flat_src *ps = &parent->src[top];
	struct csi_flat_walk w = { .name = strdup(name) };
	struct stat st;
	int fd, ret;

	memset(child, 0, sizeof(*child));
	if (!w.name)
		return -ENOMEM;
	ret = csi_flat_single(ps->fd, &w, name, 0, "", &st, &fd);
	if (ret == 1 && fd >= 0)
		ret = csi_flat_add(child, ps->level, fd);
	else if (ret >= 0)
		ret = -ESTALE;	/* a directory a moment ago: layers are frozen */
	for (int l = ps->level + 1; !ret && !w.stop && l < c->nrange; l++) {
		const struct csi_flat_src *at = csi_flat_at(parent, l);

		if (w.name[0] != '/' && !at)
			continue;	/* no parent there: nothing of it either */
		ret = csi_flat_walk(c->range[l], at ? at->fd : -1, &w, &st, &fd);
		if (ret == 1)
			ret = csi_flat_add(child, l, fd);
		else if (fd >= 0)
			close(fd);
	}
	if (ret)
		goto out;
	child->open = parent->open && !w.stop;
	child->below = w.name[0] == '/' ? strdup(w.name) :
					  csi_flat_join(parent->below, w.name);
	if (!child->below)
		ret = -ENOMEM;
out:
	free(w.name);
	if (ret)
		csi_flat_dir_free(child);
	return ret;
}

/*
 * Whether the layers below the run show NAME in the directory they
 * merge into a directory of the view at BELOW (its path there, or where
 * its redirect leads): 1, 0 or -errno, by the kernel's lookup.
 */
static int csi_flat_below_has(const struct csi_flat_ctx *c, const char *below,
			      const char *name)
{
	struct csi_flat_walk w = { .name = csi_flat_join(below, name) };
	int ret = 0;

	if (!w.name)
		return -ENOMEM;
	for (int i = 0; !ret && !w.stop && i < c->nbelow; i++) {
		struct stat st;
		int fd;

		ret = csi_flat_walk(c->below[i], -1, &w, &st, &fd);
		if (fd >= 0)
			close(fd);
	}
	free(w.name);
	return ret;
}

/* Sets the overlay marker KEY of NAME in DIR. */
static int csi_flat_set(int dir, const char *name, const char *key,
			const char *val)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dir, name);
	return lsetxattr(path, key, val, strlen(val), 0) < 0 ? -errno : 0;
}

static bool csi_flat_private(const char *name)
{
	return !strncmp(name, CSI_FLAT_OWN, strlen(CSI_FLAT_OWN)) &&
	       strncmp(name, CSI_FLAT_ESCAPED, strlen(CSI_FLAT_ESCAPED));
}

/* Every xattr of FROM but the private ones, onto TO (both /proc paths). */
static int csi_flat_xattrs(const char *from, const char *to)
{
	char *names = NULL, *val = NULL;
	ssize_t len;
	int ret = 0;

	len = llistxattr(from, NULL, 0);
	if (len <= 0)
		return len < 0 && errno != ENOTSUP ? -errno : 0;
	names = malloc(len);
	val = malloc(CSI_FLAT_XATTR_MAX);
	if (!names || !val) {
		ret = -ENOMEM;
		goto out;
	}
	len = llistxattr(from, names, len);
	if (len < 0) {
		ret = -errno;	/* grew meanwhile: a layer is read-only, not ours */
		goto out;
	}
	for (char *n = names; !ret && n < names + len; n += strlen(n) + 1) {
		ssize_t vlen;

		if (csi_flat_private(n))
			continue;
		vlen = lgetxattr(from, n, val, CSI_FLAT_XATTR_MAX);
		if (vlen < 0 || lsetxattr(to, n, val, vlen, 0) < 0)
			ret = -errno;
	}
out:
	free(names);
	free(val);
	return ret;
}

/*
 * NAME in OUT takes the owner, xattrs and mode of NAME in SRC (ST): in
 * that order, since a chown drops security.capability and setuid bits.
 */
static int csi_flat_attrs(int src, int out, const char *name,
			  const struct stat *st)
{
	char from[PATH_MAX], to[PATH_MAX];
	int ret;

	if (fchownat(out, name, st->st_uid, st->st_gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	snprintf(from, sizeof(from), "/proc/self/fd/%d/%s", src, name);
	snprintf(to, sizeof(to), "/proc/self/fd/%d/%s", out, name);
	ret = csi_flat_xattrs(from, to);
	if (ret)
		return ret;
	if (!S_ISLNK(st->st_mode) &&
	    fchmodat(out, name, st->st_mode & 07777, 0) < 0)
		return -errno;
	return 0;
}

static int csi_flat_times(int out, const char *name, const struct stat *st)
{
	const struct timespec t[2] = { st->st_atim, st->st_mtim };

	return utimensat(out, name, t, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

/* [off, end) of IN through a buffer: where copy_file_range cannot go. */
static int csi_flat_copy_buf(int in, int out, off_t off, off_t end)
{
	char *buf = malloc(CSI_FLAT_CHUNK);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	while (!ret && off < end) {
		size_t want = end - off < CSI_FLAT_CHUNK ? end - off : CSI_FLAT_CHUNK;
		ssize_t n = pread(in, buf, want, off), w;

		if (n < 0)
			ret = -errno;
		else if (n == 0)
			ret = -ENODATA;	/* it shrank: layers are frozen, not ours */
		else if ((w = pwrite(out, buf, n, off)) != n)
			ret = w < 0 ? -errno : -EIO;
		off += n > 0 ? n : 0;
	}
	free(buf);
	return ret;
}

/*
 * [off, end) of IN onto OUT at the same offsets: copy_file_range lets
 * the filesystem share or offload the blocks.
 */
static int csi_flat_copy_range(int in, int out, off_t off, off_t end)
{
	while (off < end) {
		loff_t ioff = off, ooff = off;
		ssize_t n = copy_file_range(in, &ioff, out, &ooff, end - off, 0);

		if (n < 0 && (errno == EXDEV || errno == EINVAL ||
			      errno == EOPNOTSUPP || errno == ENOSYS))
			return csi_flat_copy_buf(in, out, off, end);
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		off += n;
	}
	return 0;
}

/* A regular file's data: shared if the filesystem can, holes kept. */
static int csi_flat_data(int in, int out, off_t size)
{
	off_t off = 0;

	if (size == 0 || ioctl(out, FICLONE, in) == 0)
		return 0;
	while (off < size) {
		off_t data = lseek(in, off, SEEK_DATA), hole;
		int ret;

		if (data < 0 && errno == ENXIO)
			break;
		/* no SEEK_DATA here: all of it is data */
		hole = data < 0 ? size : lseek(in, data, SEEK_HOLE);
		data = data < 0 ? off : data;
		if (hole < 0 || hole > size)
			hole = size;
		ret = csi_flat_copy_range(in, out, data, hole);
		if (ret)
			return ret;
		off = hole;
	}
	return ftruncate(out, size) < 0 ? -errno : 0;
}

static int csi_flat_link_cmp(const void *a, const void *b)
{
	const struct csi_flat_link *x = a, *y = b;

	if (x->level != y->level)
		return x->level < y->level ? -1 : 1;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/*
 * A name of a file with several names in its layer: linked to the copy
 * made for its first name (1), or remembered as that first name (0).
 */
static int csi_flat_link(struct csi_flat_ctx *c, int level,
			 const struct stat *st, int out, const char *name,
			 const char *path)
{
	struct csi_flat_link key = { level, st->st_dev, st->st_ino, NULL }, *l;
	void *found;

	found = tfind(&key, &c->links, csi_flat_link_cmp);
	if (found) {
		l = *(struct csi_flat_link **)found;
		if (linkat(c->out_root, l->path, out, name, 0) < 0)
			return -errno;
		return 1;
	}
	l = malloc(sizeof(*l));
	if (!l)
		return -ENOMEM;
	*l = key;
	l->path = strdup(path + 1);
	if (!l->path || !tsearch(l, &c->links, csi_flat_link_cmp)) {
		free(l->path);
		free(l);
		return -ENOMEM;
	}
	return 0;
}

/* A non-directory NAME of SRC (ST) made in OUT, data and all. */
static int csi_flat_make(struct csi_flat_ctx *c, int src, int out,
			 const char *name, const struct stat *st)
{
	char target[PATH_MAX];
	ssize_t len;
	int in, fd, ret = 0;

	switch (st->st_mode & S_IFMT) {
	case S_IFREG:
		in = openat(src, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (in < 0)
			return -errno;
		fd = openat(out, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
			    0600);
		ret = fd < 0 ? -errno : csi_flat_data(in, fd, st->st_size);
		if (fd >= 0)
			close(fd);
		close(in);
		c->bytes += st->st_size;
		return ret;
	case S_IFLNK:
		len = readlinkat(src, name, target, sizeof(target));
		if (len < 0)
			return -errno;
		if ((size_t)len >= sizeof(target))
			return -ENAMETOOLONG;
		target[len] = '\0';
		return symlinkat(target, out, name) < 0 ? -errno : 0;
	default:	/* devices, FIFOs, sockets */
		return mknodat(out, name, st->st_mode & S_IFMT, st->st_rdev) < 0 ?
			       -errno : 0;
	}
}

static int csi_flat_name_cmp(const void *a, const void *b)
{
	const struct csi_flat_name *x = a, *y = b;
	int d = strcmp(x->name, y->name);

	return d ? d : x->src - y->src;
}

/* The names of every layer's part of D, sorted, each once per layer. */
static int csi_flat_names(const struct csi_flat_dir *d,
			  struct csi_flat_name **names, size_t *count)
{
	struct csi_flat_name *v = NULL;
	size_t n = 0, cap = 0;
	int ret = 0;

	for (int i = 0; !ret && i < d->nsrc; i++) {
		DIR *dir = strata_opendir_at(d->src[i].fd, ".");
		struct dirent *de;

		if (!dir) {
			ret = -errno;
			break;
		}
		while (!ret && (errno = 0, de = readdir(dir))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (n == cap) {
				struct csi_flat_name *nv;

				cap = cap ? 2 * cap : 64;
				nv = realloc(v, cap * sizeof(*v));
				if (!nv) {
					ret = -ENOMEM;
					break;
				}
				v = nv;
			}
			v[n].src = i;
			v[n].name = strdup(de->d_name);
			if (!v[n++].name)
				ret = -ENOMEM;
		}
		if (!ret && errno)
			ret = -errno;
		closedir(dir);
	}
	if (n)
		qsort(v, n, sizeof(*v), csi_flat_name_cmp);
	*names = v;
	*count = n;
	return ret;
}

static int csi_flat_dir(struct csi_flat_ctx *c, const struct csi_flat_dir *d,
			int out, const char *path);

/* The merged entry NAME of D, whose topmost is in D->src[TOP], into OUT. */
static int csi_flat_entry(struct csi_flat_ctx *c, const struct csi_flat_dir *d,
			  int top, const char *name, int out, const char *dpath)
{
	const struct csi_flat_src *s = &d->src[top];
	char *path = csi_flat_join(dpath, name), *plain = NULL;
	struct csi_flat_dir child;
	struct stat st;
	int fd = -1, ret;

	if (!path)
		return -ENOMEM;
	if (fstatat(s->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		ret = -errno;
		goto out;
	}
	if (csi_flat_whiteout(&st)) {
		ret = d->open ? csi_flat_below_has(c, d->below, name) : 0;
		if (ret == 1)
			ret = mknodat(out, name, S_IFCHR, makedev(0, 0)) < 0 ?
				      -errno : 0;
		goto out;
	}
	c->entries++;
	if (!S_ISDIR(st.st_mode)) {
		ret = st.st_nlink > 1 ? csi_flat_link(c, s->level, &st, out,
						       name, path) : 0;
		if (ret == 0)
			ret = csi_flat_make(c, s->fd, out, name, &st);
		if (ret == 0)
			ret = csi_flat_attrs(s->fd, out, name, &st);
		if (ret == 0)
			ret = csi_flat_times(out, name, &st);
		ret = ret > 0 ? 0 : ret;	/* linked: the copy has it all */
		goto out;
	}
	ret = csi_flat_descend(c, d, top, name, &child);
	if (ret)
		goto out;
	if (mkdirat(out, name, 0700) < 0) {
		ret = -errno;
		goto out_child;
	}
	fd = openat(out, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto out_child;
	}
	ret = csi_flat_dir(c, &child, fd, path);
	close(fd);
	if (!ret)
		ret = csi_flat_attrs(s->fd, out, name, &st);
	plain = csi_flat_join(d->below, name);
	if (!ret && !plain)
		ret = -ENOMEM;
	if (!ret && d->open && !child.open)
		ret = csi_flat_below_has(c, d->below, name);
	if (ret == 1)
		ret = csi_flat_set(out, name, CSI_FLAT_OPAQUE, "y");
	else if (!ret && child.open && strcmp(child.below, plain))
		ret = csi_flat_set(out, name, CSI_FLAT_REDIRECT, child.below);
	if (!ret)
		ret = csi_flat_times(out, name, &st);
out_child:
	csi_flat_dir_free(&child);
out:
	free(plain);
	free(path);
	return ret;
}

/* D's merged entries into OUT, D being the directory PATH of the view. */
static int csi_flat_dir(struct csi_flat_ctx *c, const struct csi_flat_dir *d,
			int out, const char *path)
{
	struct csi_flat_name *names;
	size_t n;
	int ret;

	ret = csi_flat_names(d, &names, &n);
	for (size_t i = 0; !ret && i < n; i++) {
		if (i && !strcmp(names[i].name, names[i - 1].name))
			continue;	/* covered by the topmost, names[i - k] */
		if (atomic_load(c->cancel))
			ret = -ECANCELED;
		else
			ret = csi_flat_entry(c, d, names[i].src, names[i].name,
					     out, path);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i].name);
	free(names);
	return ret;
}

static void csi_flat_link_free(void *l)
{
	free(((struct csi_flat_link *)l)->path);
	free(l);
}

/*
 * The merged view of the run C->range over C->below into C->out_root
 * (an empty directory): its root's attributes are the top layer's, and
 * its root merges down the run as any directory does.
 */
int csi_flatten_merge(struct csi_flat_ctx *c)
{
	struct csi_flat_dir root = { 0 };
	struct stat st;
	bool stop = false;
	int ret = 0;

	c->links = NULL;
	for (int l = 0; !ret && !stop && l < c->nrange; l++) {
		int fd = openat(c->range[l], ".", O_RDONLY | O_DIRECTORY |
							O_CLOEXEC);

		ret = fd < 0 ? -errno : csi_flat_add(&root, l, fd);
		if (!ret)
			ret = csi_flat_opaque(fd);
		stop = ret == 1;
		ret = ret < 0 ? ret : 0;
	}
	/* a root never redirects: the kernel ignores the marker there */
	root.open = c->nbelow > 0 && !stop;
	root.below = strdup("");
	if (!ret && !root.below)
		ret = -ENOMEM;
	if (!ret)
		ret = csi_flat_dir(c, &root, c->out_root, "");
	if (!ret && fstat(root.src[0].fd, &st) < 0)
		ret = -errno;
	if (!ret)
		ret = csi_flat_attrs(root.src[0].fd, c->out_root, ".", &st);
	if (!ret && c->nbelow && stop)
		ret = csi_flat_set(c->out_root, ".", CSI_FLAT_OPAQUE, "y");
	if (!ret)
		ret = csi_flat_times(c->out_root, ".", &st);
	tdestroy(c->links, csi_flat_link_free);
	c->links = NULL;
	csi_flat_dir_free(&root);
	return ret;
}
