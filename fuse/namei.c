// SPDX-License-Identifier: Apache-2.0
/*
 * Lookup through the layers, top down, with the kernel's rules: a
 * whiteout hides everything below it, a non-directory hides everything
 * below it, directories merge until one is opaque, and a moved
 * directory's redirect says where its lower part lives.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

void sfs_found_release(struct sfs_found *f)
{
	if (f->upper >= 0)
		close(f->upper);
	for (int i = 0; i < f->nlower; i++)
		close(f->lower[i].fd);
	sfs_shm_free(f->redirect);
	f->upper = -1;
	f->nlower = 0;
	f->redirect = NULL;
}

/*
 * What a lookup carries down the layers, as the kernel's overlayfs does:
 * the name to find in the next layer (one name, or an absolute path from
 * the layers' roots once a redirect said so), and whether the search
 * ends. Every layer's directories may redirect, not only the upper's:
 * a layer that once was an upper keeps the redirects of its renames.
 */
struct sfs_lookup {
	char name[PATH_MAX];
	bool stop;		/* a whiteout, opaque dir or non-dir ends it */
	bool is_dir;		/* a directory was found: only dirs merge */
	bool opaque;		/* the found directory is opaque */
	char *redirect;		/* the last redirect read, as stored */
};

/* OCI/AUFS: a ".wh.NAME" file in a lower layer hides NAME below it. */
static bool sfs_lower_wh(int dirfd, const char *name)
{
	char wh[NAME_MAX + 8];
	struct stat st;

	if (sfs_wh_name(name, wh, sizeof(wh)) < 0)
		return false;
	return fstatat(dirfd, wh, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/*
 * A directory's redirect changes the name looked up in the layers below:
 * an absolute one replaces the whole path, a relative one the current
 * component. PRELEN is the length of the path before that component and
 * POST what follows it, both kept.
 */
static int sfs_check_redirect(int dirfd, struct sfs_lookup *d, size_t prelen,
			      const char *post)
{
	char buf[PATH_MAX];
	char *r;
	int n, ret;

	ret = sfs_get_redirect(dirfd, &r);
	if (ret < 0 || !r)
		return ret;
	if (r[0] == '/')
		n = snprintf(buf, sizeof(buf), "%s%s", r, post);
	else
		n = snprintf(buf, sizeof(buf), "%.*s%s%s", (int)prelen,
			     d->name, r, post);
	sfs_shm_free(d->redirect);
	d->redirect = r;
	if (n < 0 || (size_t)n >= sizeof(buf)) {
		/*
		 * Longer than a path: the kernel walks it all the same and
		 * finds nothing (a name too long is not there), so it leads
		 * nowhere below; the directory itself stays reachable.
		 */
		strata_warn("redirect '%.64s' gives a path longer than %d "
			    "bytes: nothing below", r, PATH_MAX);
		d->stop = true;
		return 0;
	}
	/*
	 * An ancestor on an absolute path may have been opaque: a redirect
	 * below it starts the search over from the roots all the same.
	 */
	if (r[0] == '/')
		d->stop = false;
	memcpy(d->name, buf, n + 1);
	return 0;
}

/*
 * Looks one name up in one directory of one layer. *out gets the entry
 * (directories open, others O_PATH) or -1; d says whether to go on.
 */
static int sfs_lookup_single(int base, struct sfs_lookup *d, const char *name,
			     size_t prelen, const char *post, bool lower,
			     int *out, struct stat *st)
{
	bool last = !*post;
	int fd, ret;

	*out = -1;
	/* only a redirect asks for these, and the kernel refuses them too */
	if (!strcmp(name, ".") || !strcmp(name, ".."))
		return -EACCES;
	if (lower && sfs_is_wh_name(name))
		return 0;	/* markers, never entries */
	if (fstatat(base, name, st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT && errno != ENOTDIR && errno != ENAMETOOLONG)
			return -errno;
		if (lower && sfs_lower_wh(base, name))
			d->stop = d->opaque = true;
		return 0;
	}
	if (sfs_is_whiteout(st) || sfs_is_xwhiteout(base, name, st) > 0) {
		d->stop = d->opaque = true;
		return 0;
	}
	if (!S_ISDIR(st->st_mode)) {
		/* a non-dir ends the search, and never merges with a dir */
		d->stop = true;
		if (d->is_dir || !last)
			return 0;
		fd = sfs_open_entry(base, name, st->st_mode);
		if (fd < 0)
			return fd;
		*out = fd;
		return 0;
	}
	if (sfs_is_trap(st))
		return -ELOOP;	/* a layer's root seen inside a layer */
	if (last)
		d->is_dir = true;
	fd = sfs_open_entry(base, name, st->st_mode);
	if (fd < 0)
		return fd;
	ret = sfs_dir_is_opaque(fd, lower);
	/*
	 * A ".wh.NAME" marker beside a lower directory hides NAME below its
	 * layer, not there: the layer replaced the directory (the OCI image
	 * spec's rule, as readdir.c applies it), so nothing below merges.
	 */
	if (ret == 0 && lower && sfs_lower_wh(base, name))
		ret = 1;
	if (ret > 0) {
		d->stop = true;
		if (last)
			d->opaque = true;
		ret = 0;
	} else if (ret == 0) {
		ret = sfs_check_redirect(fd, d, prelen, post);
	}
	if (ret < 0) {
		close(fd);
		return ret;
	}
	*out = fd;
	return 0;
}

/*
 * Looks d->name up in one layer below BASE: one name in that directory,
 * or an absolute path walked from the layer's root, in this layer alone,
 * each directory on the way free to redirect what follows it.
 */
static int sfs_lookup_layer(int base, struct sfs_lookup *d, bool lower,
			    int *out, struct stat *st)
{
	char comp[NAME_MAX + 1], post[PATH_MAX];
	int cur = base, fd = -1, ret = 0;
	size_t rem, len;

	*out = -1;
	if (d->name[0] != '/')
		return sfs_lookup_single(base, d, d->name, 0, "", lower, out, st);
	/* counted from the end: a redirect may change what comes before */
	rem = strlen(d->name) - 1;
	for (;;) {
		const char *s = d->name + strlen(d->name) - rem;
		const char *next = strchrnul(s, '/');

		len = next - s;
		if (len == 0 || len > NAME_MAX) {
			if (cur != base)
				close(cur);
			break;	/* no such name in any layer */
		}
		memcpy(comp, s, len);
		comp[len] = '\0';
		strcpy(post, next);
		ret = sfs_lookup_single(cur, d, comp, strlen(d->name) - rem,
					post, lower, &fd, st);
		if (cur != base)
			close(cur);
		cur = base;
		if (ret < 0 || fd < 0)
			break;
		if (!*post) {
			*out = fd;
			return 0;
		}
		cur = fd;
		rem -= len + 1;
	}
	return ret;
}

/*
 * Searches the lower layers, adding to f what merges: first in DIR's own
 * lower directories, from the roots once the name is absolute (a
 * redirect), going on below the layer where that happened.
 */
static int sfs_lookup_lowers(struct sfs_node *dir, struct sfs_lookup *d,
			     struct sfs_found *f)
{
	struct sfs_entry roots[SFS_MAX_LOWERS];
	const struct sfs_entry *stack = sfs_node_lower(dir);
	int n = dir->nlower;

	for (int l = 0; l < sfs->nlower; l++)
		roots[l] = (struct sfs_entry){ .fd = sfs->lower[l].fd,
					       .layer = l + 1 };
	if (d->name[0] == '/') {
		stack = roots;
		n = sfs->nlower;
	}
	for (int i = 0; !d->stop && i < n; i++) {
		/* the topmost entry's number, if it is the view's (f->type) */
		bool top = !f->type && d->name[0] != '/';
		char name[sizeof(d->name)];
		struct stat st;
		int fd, ret;

		/* a redirect found in this layer renames what comes below */
		if (top)
			strcpy(name, d->name);
		ret = sfs_lookup_layer(stack[i].fd, d, true, &fd, &st);
		if (ret < 0)
			return ret;
		if (fd >= 0) {
			if (!f->type) {
				f->type = st.st_mode & S_IFMT;
				f->st = st;
				f->lower_ino = sfs_ino_compose(
					sfs->lower[stack[i].layer - 1].fsid,
					st.st_ino);
				if (top && sfs_lower_was_upper(stack[i].layer))
					f->lower_ino = sfs_lower_ino(
						stack[i].fd, name,
						stack[i].layer, st.st_ino,
						sfs_dir_is_impure(stack[i].fd) > 0);
			}
			f->lower[f->nlower++] = (struct sfs_entry){
				.fd = fd, .layer = stack[i].layer };
		}
		if (d->name[0] == '/' && stack != roots) {
			/* on from the next layer down, from its root */
			i = stack[i].layer - 1;
			stack = roots;
			n = sfs->nlower;
		}
	}
	return 0;
}

static void sfs_lookup_init(struct sfs_lookup *d, const char *name)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->name, sizeof(d->name), "%s", name);
}

/* A lower file with several names may already have a copy in the index. */
static int sfs_lookup_index(struct sfs_found *f)
{
	int fd = sfs_index_find(f->lower[0].fd, f->lower[0].layer, f->type);

	if (fd < 0)
		return fd == -ENOENT || fd == -ENAMETOOLONG ? 0 : fd;
	f->upper = fd;
	f->indexed = true;
	f->has_origin = true;
	return 0;
}

int sfs_lookup_name(struct sfs_node *dir, const char *name,
		    struct sfs_found *f)
{
	struct sfs_lookup d;
	int upper = sfs_upper(dir);
	int ret = 0;

	memset(f, 0, sizeof(*f));
	f->upper = -1;
	/* no layer can hold it (a redirect's name may be missing, though) */
	if (strlen(name) > NAME_MAX)
		return -ENAMETOOLONG;
	sfs_lookup_init(&d, name);
	if (upper >= 0) {
		ret = sfs_lookup_single(upper, &d, name, 0, "", false,
					&f->upper, &f->st);
		if (ret < 0)
			goto out;
		if (d.opaque && f->upper < 0) {
			ret = -ENOENT;	/* a whiteout */
			goto out;
		}
		if (f->upper >= 0) {
			f->type = f->st.st_mode & S_IFMT;
			f->opaque = d.opaque;
			/* the node keeps its own redirect, as it is stored */
			f->redirect = d.redirect;
			d.redirect = NULL;
		}
		if (S_ISDIR(f->type)) {
			ret = sfs_dir_is_impure(f->upper);
			if (ret < 0)
				goto out;
			f->impure = ret > 0;
		}
	}
	ret = sfs_lookup_lowers(dir, &d, f);
	if (ret == 0 && !f->type)
		ret = -ENOENT;
out:
	sfs_shm_free(d.redirect);
	if (ret < 0)
		sfs_found_release(f);
	return ret;
}

/* 1 when a lower layer shows NAME in DIR, so removing it needs a whiteout. */
int sfs_lower_positive(struct sfs_node *dir, const char *name)
{
	struct sfs_lookup d;
	struct sfs_found f;
	int ret;

	memset(&f, 0, sizeof(f));
	f.upper = -1;
	sfs_lookup_init(&d, name);
	ret = sfs_lookup_lowers(dir, &d, &f);
	ret = ret < 0 ? ret : f.type != 0;
	sfs_shm_free(d.redirect);
	sfs_found_release(&f);
	return ret;
}

/*
 * An origin is only ever placed in a directory already marked impure,
 * so other directories need no xattr read per lookup; readdir's d_ino
 * follows the same rule, and the two always agree.
 */
static int sfs_found_ino(struct sfs_found *f, int dirfd, const char *name,
			 bool impure, uint64_t *ino)
{
	if (f->upper >= 0) {
		int ret = sfs_upper_ino(dirfd, name, f->st.st_ino, impure, ino,
					&f->indexed);

		f->has_origin = ret > 0;
		return ret < 0 ? ret : 0;
	}
	*ino = f->lower_ino;
	if (!S_ISDIR(f->type) && f->st.st_nlink > 1 && sfs_has_upper())
		return sfs_lookup_index(f);
	return 0;
}

int sfs_lookup_node(struct sfs_node *dir, const char *name,
		    struct sfs_node **out)
{
	struct sfs_found f;
	bool impure;
	uint64_t ino;
	int ret;

	ret = sfs_lookup_name(dir, name, &f);
	if (ret < 0)
		return ret;
	sfs_lock(&dir->lock);
	impure = sfs_node_di(dir)->impure;
	sfs_unlock(&dir->lock);
	ret = sfs_found_ino(&f, sfs_upper(dir), name, impure, &ino);
	if (ret < 0) {
		sfs_found_release(&f);
		return ret;
	}
	*out = sfs_node_from_found(dir, name, &f, ino, &ret);
	if (*out && atomic_load(&(*out)->indexed)) {
		int count = sfs_index_nlink_get(*out);

		if (count < 0) {
			sfs_node_release(*out);
			*out = NULL;
			return count;
		}
	}
	return ret;
}

/*
 * The node behind NAME when NAME is in DIR's upper layer and the node is
 * in the table: one fstatat, where a lookup through the layers opens the
 * entry and reads its markers. A name the kernel removes or renames, it
 * holds, so this is the common case there. *state says what the upper
 * layer has at NAME: 0 nothing, 2 an entry (in *st), -1 not known (DIR
 * has no upper directory). Returns 1 with *out pinned and referenced, 0
 * when the caller must look NAME up, -ENOENT at a whiteout.
 */
int sfs_lookup_held(struct sfs_node *dir, const char *name, struct stat *st,
		    int *state, struct sfs_node **out)
{
	int upper = sfs_upper(dir);
	bool impure;
	uint64_t ino;

	*state = -1;
	*out = NULL;
	if (upper < 0)
		return 0;
	if (fstatat(upper, name, st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT)
			return -errno;
		*state = 0;
		return 0;
	}
	if (sfs_is_whiteout(st) || sfs_is_xwhiteout(upper, name, st) > 0)
		return -ENOENT;
	*state = 2;
	sfs_lock(&dir->lock);
	impure = sfs_node_di(dir)->impure;
	sfs_unlock(&dir->lock);
	/* the inode number exactly as sfs_found_ino makes it */
	sfs_upper_ino(upper, name, st->st_ino, impure, &ino, NULL);
	*out = sfs_node_find(ino, st->st_mode);
	return *out ? 1 : 0;
}

/* Replies with the node's entry; the kernel's reference is counted first. */
int sfs_fill_entry(struct sfs_node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = sfs_node_id(n);
	e->attr_timeout = sfs_attr_timeout(n);
	e->entry_timeout = sfs->timeout;
	return sfs_node_stat(n, &e->attr);
}

int sfs_entry_reply(fuse_req_t req, struct sfs_node *n)
{
	struct fuse_entry_param e;
	int ret;

	ret = sfs_fill_entry(n, &e);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return ret;
	}
	sfs_node_lookup_inc(n);
	if (fuse_reply_entry(req, &e) != 0)
		sfs_node_lookup_dec(n);
	return 0;
}

/*
 * A lookup of this name ($STRATAFS_CRASH_NAME) aborts the worker: how
 * tests make a request that kills every worker it reaches (supervisor.c).
 */
const char *sfs_crash_name;

/*
 * Once per mount, a worker aborts right after the work of a request on
 * this name ($STRATAFS_CRASH_AFTER) reached the disk, before its reply:
 * how tests prove that such a request, sent again, is not done twice.
 */
const char *sfs_crash_after_name;

void sfs_crash_after(const char *name)
{
	if (sfs_crash_after_name && !strcmp(name, sfs_crash_after_name) &&
	    !atomic_exchange(&sfs->crashed_after, true))
		abort();
}

void sfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct sfs_node *dir, *n;
	int ret;

	sfs_count(STRATA_ST_LOOKUP, 1);
	if (sfs_crash_name && !strcmp(name, sfs_crash_name))
		abort();
	ret = sfs_node_get_pinned(parent, &dir);
	if (ret < 0) {
		sfs_reply_err(req, ret);
		return;
	}
	ret = sfs_lookup_node(dir, name, &n);
	if (ret == -ENOENT) {
		/* A negative entry the kernel may cache. */
		struct fuse_entry_param e = { .ino = 0,
					      .entry_timeout = sfs->timeout };

		fuse_reply_entry(req, &e);
	} else if (ret < 0) {
		sfs_reply_err(req, ret);
	} else {
		sfs_entry_reply(req, n);
		sfs_node_release(n);
	}
	sfs_node_release(dir);
}
