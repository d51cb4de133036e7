// SPDX-License-Identifier: Apache-2.0
/*
 * The merged listing: the upper directory, then each lower one, each
 * name once (the topmost wins), whiteouts and their names left out, the
 * OCI ".wh." markers too. d_ino is computed exactly as lookup computes
 * st_ino, so `ls -i` and `stat` agree.
 *
 * A name's offset is a hash of the name, and a listing is served in
 * offset order: the same name has the same offset in every listing of
 * the directory. So a stream continued from a later listing than the one
 * it started from still shows every name that existed all along exactly
 * once, and the kernel's readdir cache, which it may fill from several
 * streams of one directory, cannot duplicate or lose a name either.
 * That makes one listing per directory (not per open) enough: it is
 * kept on the node while a stream is under way and rebuilt when an
 * entry changed; a stream that starts over (offset 0) always lists
 * again, as POSIX wants rewinddir to.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

#define WH_OPAQUE_NAME ".wh..wh..opq"
/* "." and ".." come first; every other offset is above them */
#define SFS_OFF_DOT 1
#define SFS_OFF_DOTDOT 2
/* listings kept between a stream's requests: at most this many entries */
#define SFS_LISTED_MAX (256 * 1024)

/* An open-addressing set of names, for dedup across layers. */
struct sfs_nameset {
	char **slots;
	size_t size, count;
};

static uint64_t sfs_name_hash(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return h;
}

/* 1 when added, 0 when it was there, <0 on error. Takes no ownership. */
static int sfs_nameset_add(struct sfs_nameset *set, char *name)
{
	size_t i;

	if ((set->count + 1) * 2 > set->size) {
		size_t size = set->size ? set->size * 2 : 64;
		char **slots = calloc(size, sizeof(*slots));

		if (!slots)
			return -ENOMEM;
		for (size_t j = 0; j < set->size; j++) {
			if (!set->slots[j])
				continue;
			i = sfs_name_hash(set->slots[j]) & (size - 1);
			while (slots[i])
				i = (i + 1) & (size - 1);
			slots[i] = set->slots[j];
		}
		free(set->slots);
		set->slots = slots;
		set->size = size;
	}
	i = sfs_name_hash(name) & (set->size - 1);
	for (; set->slots[i]; i = (i + 1) & (set->size - 1))
		if (!strcmp(set->slots[i], name))
			return 0;
	set->slots[i] = name;
	set->count++;
	return 1;
}

/* A name's offset: the same in every listing, above "." and "..". */
static off_t sfs_name_off(const char *name, size_t index)
{
	uint64_t h;

	if (index <= 1)
		return index ? SFS_OFF_DOTDOT : SFS_OFF_DOT;
	/* FNV-1a's high bits mix poorly: finish it as murmur3 does */
	h = sfs_name_hash(name);
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	/* positive as an off_t, with room above for colliding names */
	h >>= 2;
	return h > SFS_OFF_DOTDOT ? (off_t)h : SFS_OFF_DOTDOT + 1;
}

static int sfs_dirent_cmp(const void *a, const void *b)
{
	const struct sfs_dirent *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return strcmp(x->name, y->name);
}

/*
 * Sorts the names after "." and ".." by offset. Names with one hash (a
 * chance of about count^2 / 2^62) get consecutive offsets: only while
 * both exist are those two offsets stable.
 */
static void sfs_dirents_order(struct sfs_dirent *ents, size_t count)
{
	if (count <= 3)
		return;
	qsort(ents + 2, count - 2, sizeof(*ents), sfs_dirent_cmp);
	for (size_t i = 3; i < count; i++)
		if (ents[i].off <= ents[i - 1].off)
			ents[i].off = ents[i - 1].off + 1;
}

struct sfs_lister {
	struct sfs_nameset seen;
	char **owned;		/* hidden names the set points into */
	size_t nowned;
	struct sfs_dirent *ents;
	size_t count, cap;
	bool want_ino;
	bool impure;
};

static int sfs_lister_push(struct sfs_lister *l, const char *name,
			   uint64_t ino, unsigned char type)
{
	char *dup;
	int ret;

	if (l->count == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 32;
		struct sfs_dirent *e = realloc(l->ents, cap * sizeof(*e));

		if (!e)
			return -ENOMEM;
		l->ents = e;
		l->cap = cap;
	}
	dup = strdup(name);
	if (!dup)
		return -ENOMEM;
	ret = sfs_nameset_add(&l->seen, dup);
	if (ret < 0) {
		free(dup);
		return ret;
	}
	l->ents[l->count] = (struct sfs_dirent){ dup, ino, type,
						 sfs_name_off(dup, l->count) };
	l->count++;
	return 0;
}

/* Keeps a hidden name; it joins the set when the caller says. */
static int sfs_lister_own(struct sfs_lister *l, const char *name)
{
	char **owned = realloc(l->owned, (l->nowned + 1) * sizeof(*owned));

	if (!owned)
		return -ENOMEM;
	l->owned = owned;
	owned[l->nowned] = strdup(name);
	if (!owned[l->nowned])
		return -ENOMEM;
	l->nowned++;
	return 0;
}

/* Remembers a name as hidden (whiteout) so deeper layers skip it. */
static int sfs_lister_hide(struct sfs_lister *l, const char *name)
{
	int ret = sfs_lister_own(l, name);

	if (ret == 0)
		ret = sfs_nameset_add(&l->seen, l->owned[l->nowned - 1]);
	return ret < 0 ? ret : 0;
}

static bool sfs_lister_has(struct sfs_lister *l, const char *name)
{
	size_t i;

	if (!l->seen.size)
		return false;
	i = sfs_name_hash(name) & (l->seen.size - 1);
	for (; l->seen.slots[i]; i = (i + 1) & (l->seen.size - 1))
		if (!strcmp(l->seen.slots[i], name))
			return true;
	return false;
}

static void sfs_lister_free(struct sfs_lister *l)
{
	for (size_t i = 0; i < l->nowned; i++)
		free(l->owned[i]);
	free(l->owned);
	free(l->seen.slots);
}

static uint64_t sfs_entry_ino(struct sfs_lister *l, int dirfd, int layer,
			      const char *name, ino_t real, bool impure)
{
	uint64_t ino;

	if (layer == 0) {
		sfs_upper_ino(dirfd, name, real, l->impure, &ino, NULL);
		return ino;
	}
	return sfs_lower_ino(dirfd, name, layer, real, impure);
}

static int sfs_list_layer(struct sfs_lister *l, int fd, int layer)
{
	size_t marks = l->nowned;	/* this layer's OCI markers start here */
	struct dirent *de;
	bool xwh = false, impure = false;
	char val[2];
	DIR *d;
	int dfd, ret = 0;

	/* A descriptor of our own: the node's one has a shared offset. */
	dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	/* a lower directory marked to hold xattr whiteouts (whiteout.c) */
	if (layer > 0)
		xwh = fgetxattr(dfd, sfs->xattr_opaque, val, sizeof(val)) == 1 &&
		      val[0] == 'x';
	/* one that was the upper, with entries copied up (sfs_lower_ino) */
	if (layer > 0 && l->want_ino && sfs_lower_was_upper(layer))
		impure = sfs_dir_is_impure(dfd) > 0;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	while ((errno = 0, de = readdir(d))) {
		const char *name = de->d_name;
		unsigned char type = de->d_type;
		struct stat st;

		if (!strcmp(name, ".") || !strcmp(name, ".."))
			continue;
		/*
		 * A ".wh.NAME" marker hides NAME in the layers below its
		 * own, never beside it (the OCI image spec): it joins the
		 * set once the whole layer is listed, whatever the order
		 * readdir gives.
		 */
		if (layer > 0 && sfs_is_wh_name(name)) {
			if (strcmp(name, WH_OPAQUE_NAME)) {
				ret = sfs_lister_own(l, name + 4);
				if (ret < 0)
					break;
			}
			continue;
		}
		if (sfs_lister_has(l, name))
			continue;
		if (type == DT_CHR || type == DT_UNKNOWN ||
		    (type == DT_REG && xwh)) {
			if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
				if (errno == ENOENT)
					continue;
				ret = -errno;
				break;
			}
			if (sfs_is_whiteout(&st) ||
			    (xwh && sfs_is_xwhiteout(dfd, name, &st) > 0)) {
				ret = sfs_lister_hide(l, name);
				if (ret < 0)
					break;
				continue;
			}
			type = IFTODT(st.st_mode);
		}
		ret = sfs_lister_push(l, name,
				      l->want_ino ? sfs_entry_ino(l, dfd, layer,
								  name, de->d_ino,
								  impure)
						  : 0,
				      type);
		if (ret < 0)
			break;
	}
	if (ret == 0 && errno)
		ret = -errno;
	closedir(d);
	for (size_t i = marks; ret == 0 && i < l->nowned; i++) {
		int added = sfs_nameset_add(&l->seen, l->owned[i]);

		if (added < 0)
			ret = added;
	}
	return ret;
}

/* Lists the merged directory; "." and ".." come first. */
static int sfs_dir_list_mode(struct sfs_node *dir, bool want_ino,
			     struct sfs_dirent **out, size_t *count)
{
	struct sfs_lister l = { .want_ino = want_ino };
	int upper = sfs_upper(dir);
	int ret;

	uint64_t parent_ino;

	sfs_lock(&dir->lock);
	l.impure = sfs_node_di(dir)->impure;
	/*
	 * d_ino 0 would make readdir(3) skip the entry. dir->lock keeps the
	 * parent: a rename swaps it, and drops the old one, under that lock.
	 */
	parent_ino = dir->parent ? dir->parent->ino : dir->ino;
	sfs_unlock(&dir->lock);
	ret = sfs_lister_push(&l, ".", dir->ino, DT_DIR);
	if (ret == 0)
		ret = sfs_lister_push(&l, "..", parent_ino, DT_DIR);
	if (ret == 0 && upper >= 0)
		ret = sfs_list_layer(&l, upper, 0);
	for (int i = 0; ret == 0 && i < dir->nlower; i++)
		ret = sfs_list_layer(&l, sfs_node_lower(dir)[i].fd,
				     sfs_node_lower(dir)[i].layer);
	sfs_lister_free(&l);
	if (ret < 0) {
		sfs_dirents_free(l.ents, l.count);
		return ret;
	}
	*out = l.ents;
	*count = l.count;
	return 0;
}

int sfs_dir_list(struct sfs_node *dir, struct sfs_dirent **out,
		 size_t *count)
{
	return sfs_dir_list_mode(dir, true, out, count);
}

void sfs_dirents_free(struct sfs_dirent *ents, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(ents[i].name);
	free(ents);
}

int sfs_dir_count_subdirs(struct sfs_node *dir, int64_t *out)
{
	struct sfs_dirent *ents;
	size_t count;
	int64_t n = 0;
	int ret = sfs_dir_list_mode(dir, false, &ents, &count);

	if (ret < 0)
		return ret;
	for (size_t i = 2; i < count; i++)
		n += ents[i].type == DT_DIR;
	sfs_dirents_free(ents, count);
	*out = n;
	return 0;
}

int sfs_dir_check_empty(struct sfs_node *dir)
{
	struct sfs_dirent *ents;
	size_t count;
	int ret = sfs_dir_list_mode(dir, false, &ents, &count);

	if (ret < 0)
		return ret;
	sfs_dirents_free(ents, count);
	return count > 2 ? -ENOTEMPTY : 0;
}

/* The kernel lists and caches directories itself between changes. */
void sfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_OPENDIR, 1);
	if (sfs->dir_cache == SFS_DIR_CACHE_NO_OPENDIR) {
		/* from now on the kernel opens directories itself, cached */
		fuse_reply_err(req, ENOSYS);
		return;
	}
	if (sfs->dir_cache == SFS_DIR_CACHE_ON) {
		fi->cache_readdir = 1;
		fi->keep_cache = 1;
	}
	fuse_reply_open(req, fi);
}

static void sfs_listing_put(struct sfs_listing *l)
{
	if (atomic_fetch_sub(&l->refs, 1) == 1) {
		sfs_dirents_free(l->ents, l->count);
		free(l);
	}
}

static int sfs_listing_build(struct sfs_node *dir, struct sfs_listing **out)
{
	struct sfs_listing *l = calloc(1, sizeof(*l));
	int ret;

	if (!l)
		return -ENOMEM;
	atomic_init(&l->refs, 1);
	/* read before listing: a change racing the listing makes it stale */
	l->gen = atomic_load(&sfs_node_di(dir)->gen);
	ret = sfs_dir_list(dir, &l->ents, &l->count);
	if (ret < 0) {
		free(l);
		return ret;
	}
	sfs_dirents_order(l->ents, l->count);
	*out = l;
	return 0;
}

/* The listing the node keeps, referenced, if no entry changed since. */
static struct sfs_listing *sfs_listing_kept(struct sfs_node *dir)
{
	struct sfs_dirinfo *di = sfs_node_di(dir);
	struct sfs_listing *l;

	sfs_lock(&dir->lock);
	l = di->listing;
	if (l && l->gen == atomic_load(&di->gen))
		atomic_fetch_add(&l->refs, 1);
	else
		l = NULL;
	sfs_unlock(&dir->lock);
	return l;
}

static void sfs_listing_detach(struct sfs_node *dir, struct sfs_listing *l)
{
	sfs_node_di(dir)->listing = NULL;
	atomic_fetch_sub(&sfs->listed, (long)l->count);
}

/*
 * After a request served from l: a stream that goes on keeps l on the
 * node for its next request (unless the kept listings would grow past
 * their bound: then it lists again); one that has reached its end lets
 * it go, so a listing lives only while a stream is under way.
 */
static void sfs_listing_keep(struct sfs_node *dir, struct sfs_listing *l,
			     bool more)
{
	struct sfs_dirinfo *di = sfs_node_di(dir);
	struct sfs_listing *drop = NULL;

	sfs_lock(&dir->lock);
	if (more && di->listing != l) {
		drop = di->listing;
		if (drop)
			sfs_listing_detach(dir, drop);
		if (atomic_load(&sfs->listed) + (long)l->count <=
		    SFS_LISTED_MAX) {
			atomic_fetch_add(&l->refs, 1);
			atomic_fetch_add(&sfs->listed, (long)l->count);
			di->listing = l;
		}
	} else if (!more && di->listing == l) {
		drop = l;
		sfs_listing_detach(dir, l);
	}
	sfs_unlock(&dir->lock);
	if (drop)
		sfs_listing_put(drop);
}

/* The node is being freed: nothing else can reach it. */
void sfs_dir_drop_listing(struct sfs_node *dir)
{
	struct sfs_listing *l = sfs_node_di(dir)->listing;

	if (l) {
		sfs_listing_detach(dir, l);
		sfs_listing_put(l);
	}
}

/* The index of the first entry after offset OFF. */
static size_t sfs_listing_seek(const struct sfs_listing *l, off_t off)
{
	size_t lo = 0, hi = l->count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (l->ents[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* One readdirplus entry: a full lookup, counted only if it fits. */
static size_t sfs_add_plus(fuse_req_t req, struct sfs_node *dir,
			   const struct sfs_listing *l, char *p, size_t rem,
			   const struct sfs_dirent *de, bool *skip)
{
	struct fuse_entry_param e;
	struct sfs_node *n;
	size_t len;

	*skip = false;
	if (de->off <= SFS_OFF_DOTDOT) {
		memset(&e, 0, sizeof(e));
		e.attr.st_ino = de->ino;
		e.attr.st_mode = DTTOIF(de->type);
		return fuse_add_direntry_plus(req, p, rem, de->name, &e,
					      de->off);
	}
	/*
	 * While no entry of the directory has changed since the listing,
	 * its d_ino names the very node behind each name: one the kernel
	 * already holds needs no lookup through the layers.
	 */
	n = atomic_load(&sfs_node_di(dir)->gen) == l->gen ?
		    sfs_node_find(de->ino, DTTOIF(de->type)) : NULL;
	if (!n && sfs_lookup_node(dir, de->name, &n) < 0) {
		*skip = true;	/* gone since the listing */
		return 0;
	}
	if (sfs_fill_entry(n, &e) < 0) {
		sfs_node_release(n);
		*skip = true;
		return 0;
	}
	len = fuse_add_direntry_plus(req, p, rem, de->name, &e, de->off);
	if (len <= rem)
		sfs_node_lookup_inc(n);
	sfs_node_release(n);
	return len;
}

static void sfs_do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, bool plus)
{
	struct sfs_listing *l = NULL;
	struct sfs_node *dir;
	char *buf = NULL, *p;
	size_t rem = size, i;
	int ret = sfs_node_get_pinned(ino, &dir);

	if (ret < 0)
		goto out_err;
	buf = malloc(size);
	if (!buf) {
		ret = -ENOMEM;
		goto out_unpin;
	}
	/* a stream that starts over lists again */
	l = off ? sfs_listing_kept(dir) : NULL;
	if (!l)
		ret = sfs_listing_build(dir, &l);
	if (ret < 0)
		goto out_unpin;
	p = buf;
	for (i = sfs_listing_seek(l, off); i < l->count; i++) {
		const struct sfs_dirent *de = &l->ents[i];
		struct stat st = { .st_ino = de->ino,
				   .st_mode = DTTOIF(de->type) };
		bool skip = false;
		size_t len;

		if (plus)
			len = sfs_add_plus(req, dir, l, p, rem, de, &skip);
		else
			len = fuse_add_direntry(req, p, rem, de->name, &st,
						de->off);
		if (skip)
			continue;
		if (len > rem)
			break;
		p += len;
		rem -= len;
	}
	/* the stream ends with an empty reply: keep the listing until then */
	sfs_listing_keep(dir, l, rem < size);
	sfs_listing_put(l);
	sfs_node_release(dir);
	fuse_reply_buf(req, buf, size - rem);
	free(buf);
	return;

out_unpin:
	sfs_node_release(dir);
out_err:
	free(buf);
	sfs_reply_err(req, ret);
}

void sfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_READDIR, 1);
	sfs_do_readdir(req, ino, size, off, false);
}

void sfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			off_t off, struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_READDIRPLUS, 1);
	sfs_do_readdir(req, ino, size, off, true);
}

void sfs_op_releasedir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	sfs_count(STRATA_ST_RELEASEDIR, 1);
	fuse_reply_err(req, 0);
}

void sfs_op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	struct sfs_node *n;
	int upper, ret = sfs_node_get_pinned(ino, &n);

	sfs_count(STRATA_ST_FSYNCDIR, 1);
	if (ret == 0) {
		upper = sfs_upper(n);
		if (upper >= 0 &&
		    (datasync ? fdatasync(upper) : fsync(upper)) < 0)
			ret = -errno;
		sfs_node_release(n);
	}
	sfs_reply_err(req, ret);
}
