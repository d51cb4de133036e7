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
	free(f->redirect);
	f->upper = -1;
	f->nlower = 0;
	f->redirect = NULL;
}

/* The lower directories to search, and the name to search them for. */
struct sfs_search {
	int n;
	struct sfs_entry dirs[SFS_MAX_LOWERS];
	bool owned;		/* dirs were opened here (redirect) */
	/*
	 * name comes from a redirect xattr, not from the kernel: one too
	 * long for a layer is simply not in it, as in the kernel's lookup.
	 */
	bool redirect;
	const char *name;
};

static void sfs_search_release(struct sfs_search *s)
{
	if (s->owned)
		for (int i = 0; i < s->n; i++)
			close(s->dirs[i].fd);
	s->n = 0;
}

static int sfs_lookup_lowers(struct sfs_search *s, struct sfs_found *f);

/*
 * Walks an absolute redirect's parent path down the lower layers with
 * the lookup rules at every step, so an opaque directory or a whiteout
 * on the way hides the deeper layers there too, as it did before the
 * move.
 */
static int sfs_search_redirect(struct sfs_search *s, char *path)
{
	char *slash = strrchr(path, '/'), *save = NULL, *comp;
	int ret = 0;

	s->owned = true;
	s->redirect = true;
	s->n = 0;
	*slash = '\0';
	for (int l = 0; l < sfs->nlower; l++) {
		int fd = dup(sfs->lower[l].fd);

		if (fd < 0) {
			ret = -errno;
			goto out_err;
		}
		s->dirs[s->n++] = (struct sfs_entry){ fd, l + 1, NULL };
	}
	for (comp = strtok_r(path, "/", &save); comp && s->n;
	     comp = strtok_r(NULL, "/", &save)) {
		struct sfs_found f;

		memset(&f, 0, sizeof(f));
		f.upper = -1;
		s->name = comp;
		ret = sfs_lookup_lowers(s, &f);
		sfs_search_release(s);
		if (ret < 0) {
			sfs_found_release(&f);
			return ret;
		}
		if (S_ISDIR(f.type)) {
			memcpy(s->dirs, f.lower, f.nlower * sizeof(*f.lower));
			s->n = f.nlower;
			f.nlower = 0;
		}
		sfs_found_release(&f);
	}
	s->name = slash + 1;
	return 0;

out_err:
	sfs_search_release(s);
	return ret;
}

/* OCI/AUFS: a ".wh.NAME" file in a lower layer hides NAME below it. */
static bool sfs_lower_wh(int dirfd, const char *name)
{
	char wh[NAME_MAX + 8];
	struct stat st;

	if (sfs_wh_name(name, wh, sizeof(wh)) < 0)
		return false;
	return fstatat(dirfd, wh, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

static int sfs_found_add(struct sfs_found *f, int dirfd, const char *name,
			 int layer, const struct stat *st)
{
	int fd = sfs_open_entry(dirfd, name, st->st_mode);

	if (fd < 0)
		return fd;
	f->lower[f->nlower++] = (struct sfs_entry){ fd, layer, NULL };
	return 0;
}

/*
 * Searches the lower directories for s->name, adding what merges to f.
 * Returns 1 when a whiteout or an opaque directory ended the search.
 */
static int sfs_lookup_lowers(struct sfs_search *s, struct sfs_found *f)
{
	if (sfs_is_wh_name(s->name))
		return 0;	/* markers, never entries */
	for (int i = 0; i < s->n; i++) {
		struct stat st;
		int ret;

		if (fstatat(s->dirs[i].fd, s->name, &st,
			    AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT && errno != ENOTDIR &&
			    !(s->redirect && errno == ENAMETOOLONG))
				return -errno;
			if (i + 1 < s->n && sfs_lower_wh(s->dirs[i].fd, s->name))
				return 1;
			continue;
		}
		if (sfs_is_whiteout(&st))
			return 1;
		if (f->type && (!S_ISDIR(f->type) || !S_ISDIR(st.st_mode)))
			return 1;	/* a non-dir ends the merge */
		if (!f->type) {
			f->type = st.st_mode & S_IFMT;
			f->st = st;
		}
		ret = sfs_found_add(f, s->dirs[i].fd, s->name,
				    s->dirs[i].layer, &st);
		if (ret < 0)
			return ret;
		if (!S_ISDIR(st.st_mode))
			return 1;
		ret = sfs_dir_is_opaque(f->lower[f->nlower - 1].fd, true);
		if (ret != 0)
			return ret;
		/*
		 * A ".wh.NAME" beside the directory hides NAME below this
		 * layer but not here: the layer replaced the directory (the
		 * OCI image spec's rule, as readdir applies it).
		 */
		if (i + 1 < s->n && sfs_lower_wh(s->dirs[i].fd, s->name))
			return 1;
	}
	return 0;
}

static void sfs_search_dir(struct sfs_search *s, struct sfs_node *dir,
			   const char *name)
{
	s->owned = false;
	s->redirect = false;
	s->n = dir->nlower;
	if (dir->nlower)
		memcpy(s->dirs, dir->lower, dir->nlower * sizeof(*dir->lower));
	s->name = name;
}

/* A lower file with several names may already have an upper copy. */
static int sfs_lookup_index(struct sfs_found *f, uint64_t ino)
{
	char key[32];
	int fd;

	if (sfs->indexfd < 0)
		return 0;
	snprintf(key, sizeof(key), "%016llx", (unsigned long long)ino);
	fd = openat(sfs->indexfd, key, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	f->upper = fd;
	f->indexed = true;
	f->has_origin = true;
	return 0;
}

int sfs_lookup_name(struct sfs_node *dir, const char *name,
		    struct sfs_found *f)
{
	struct sfs_search s;
	int upper = sfs_upper(dir);
	int ret;

	memset(f, 0, sizeof(*f));
	f->upper = -1;
	if (upper >= 0) {
		struct stat st;

		if (fstatat(upper, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (sfs_is_whiteout(&st))
				return -ENOENT;
			f->type = st.st_mode & S_IFMT;
			f->st = st;
			f->upper = sfs_open_entry(upper, name, st.st_mode);
			if (f->upper < 0) {
				ret = f->upper;
				f->upper = -1;
				return ret;
			}
			if (!S_ISDIR(st.st_mode))
				return 0;
			ret = sfs_dir_is_opaque(f->upper, false);
			if (ret > 0) {
				f->opaque = true;
				ret = sfs_dir_is_impure(f->upper);
				if (ret < 0)
					goto out_err;
				f->impure = ret > 0;
				return 0;
			}
			if (ret < 0)
				goto out_err;
			ret = sfs_get_redirect(f->upper, &f->redirect);
			if (ret == 0)
				ret = sfs_dir_is_impure(f->upper);
			if (ret < 0)
				goto out_err;
			f->impure = ret > 0;
		} else if (errno != ENOENT) {
			return -errno;
		}
	}

	if (f->redirect && f->redirect[0] == '/') {
		char *path = strdup(f->redirect);

		if (!path) {
			ret = -ENOMEM;
			goto out_err;
		}
		ret = sfs_search_redirect(&s, path);
		if (ret == 0)
			ret = sfs_lookup_lowers(&s, f);
		sfs_search_release(&s);
		free(path);
	} else {
		/* A relative redirect (the kernel's, same parent) names the lower entry. */
		sfs_search_dir(&s, dir, f->redirect ? f->redirect : name);
		s.redirect = f->redirect != NULL;
		ret = sfs_lookup_lowers(&s, f);
	}
	if (ret < 0)
		goto out_err;
	if (!f->type)
		return -ENOENT;
	return 0;

out_err:
	sfs_found_release(f);
	return ret;
}

/* 1 when a lower layer shows NAME in DIR, so removing it needs a whiteout. */
int sfs_lower_positive(struct sfs_node *dir, const char *name)
{
	struct sfs_search s;
	struct sfs_found f;
	int ret;

	memset(&f, 0, sizeof(f));
	f.upper = -1;
	sfs_search_dir(&s, dir, name);
	ret = sfs_lookup_lowers(&s, &f);
	ret = ret < 0 ? ret : f.type != 0;
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
		if (impure && sfs_origin_get(dirfd, name, ino) > 0) {
			struct sfs_xpath x;
			uint64_t count;

			f->has_origin = true;
			/* one of the names of an indexed lower hard link */
			if (!S_ISDIR(f->type) && f->st.st_nlink > 1 &&
			    sfs_xpath_entry(&x, dirfd, name) == 0 &&
			    sfs_xattr_get(&x, sfs->xattr_nlink, &count,
					  sizeof(count)) == sizeof(count))
				f->indexed = true;
			return 0;
		}
		*ino = sfs_ino_compose(sfs->upper.fsid, f->st.st_ino);
		return 0;
	}
	*ino = sfs_ino_compose(sfs->lower[f->lower[0].layer - 1].fsid,
			       f->st.st_ino);
	if (!S_ISDIR(f->type) && f->st.st_nlink > 1 && sfs_has_upper())
		return sfs_lookup_index(f, *ino);
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
	impure = dir->di->impure;
	sfs_unlock(&dir->lock);
	ret = sfs_found_ino(&f, sfs_upper(dir), name, impure, &ino);
	if (ret < 0) {
		sfs_found_release(&f);
		return ret;
	}
	*out = sfs_node_from_found(dir, name, &f, ino, &ret);
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
	if (sfs_is_whiteout(st))
		return -ENOENT;
	*state = 2;
	sfs_lock(&dir->lock);
	impure = dir->di->impure;
	sfs_unlock(&dir->lock);
	/* the inode number exactly as sfs_found_ino makes it */
	if (!impure || sfs_origin_get(upper, name, &ino) <= 0)
		ino = sfs_ino_compose(sfs->upper.fsid, st->st_ino);
	*out = sfs_node_find(ino, st->st_mode);
	return *out ? 1 : 0;
}

/* Replies with the node's entry; the kernel's reference is counted first. */
int sfs_fill_entry(struct sfs_node *n, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = sfs_node_id(n);
	e->attr_timeout = sfs->timeout;
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

void sfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	sfs_count(STRATA_ST_LOOKUP, 1);
	struct sfs_node *dir, *n;
	int ret;

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
