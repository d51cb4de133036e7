// SPDX-License-Identifier: Apache-2.0
/*
 * linkup.c: the hard-link index before a freeze (freeze.c).
 *
 * A lower file with several names is copied up once, into the index
 * (index.c), and a name of it reaches the upper only when it is renamed,
 * linked or replaced: the others find the copy through their origin. A
 * frozen layer is a lower layer, and a lower layer has no index, so a
 * freeze that left such a name out would show the lower file's old data
 * there. So before the upper moves, every name the view still shows
 * through the index is linked into the upper from its entry, as a rename
 * would (sfs_copy_up_name: its parents are copied up as needed). The
 * merged listings say which names the view shows: a whited-out name, or
 * one hidden by an opaque directory, is not listed, and one under a
 * moved directory is listed where the redirect puts it.
 *
 * An entry is settled when the union's count of names (the nlink xattr)
 * is no more than the names linked to it in the upper, its real count
 * less the entry itself: no name comes through the index any more. Only
 * unsettled entries are searched for, by the inode number their names
 * show (the one the copy-up kept, or the lower file's), in a walk of the
 * merged tree. The freeze does it twice: once while requests flow, the
 * bulk, and once more with the gate closed for what is still unsettled,
 * which is what was copied up or moved since, or an entry whose count
 * was too high from the start (a name of the lower file hidden before
 * its copy-up, counted by the lower file's count as the kernel does):
 * the walk under the gate is the last word for that one.
 *
 * Once the upper moved, every entry but a whiteout (which stands for a
 * file whose names are all gone, and names no upper file) refers to a
 * file of the frozen layer, all of whose names are there: the entries go
 * (sfs_linkup_drop), so the frozen layer is self-contained, its files'
 * real link counts are the names they have, and the workdir holds
 * nothing of it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stratafs.h"

struct sfs_linkup {
	uint64_t *inos;		/* what the names of unsettled entries show */
	size_t count, cap;
	size_t entries;		/* unsettled entries */
	char *out;		/* the refusal's message */
	size_t size;
};

static int sfs_linkup_add(struct sfs_linkup *lu, uint64_t ino)
{
	if (lu->count == lu->cap) {
		size_t cap = lu->cap ? lu->cap * 2 : 16;
		uint64_t *inos = realloc(lu->inos, cap * sizeof(*inos));

		if (!inos)
			return -ENOMEM;
		lu->inos = inos;
		lu->cap = cap;
	}
	lu->inos[lu->count++] = ino;
	return 0;
}

/*
 * An entry whose names cannot be found: refused, saying what to do. A
 * name's lookup finds the entry by the origin it computes from its lower
 * file: when no layer holds the file the entry names (the layers were
 * replaced), no name reaches it now, but which did cannot be told.
 */
static int sfs_linkup_unresolved(struct sfs_linkup *lu, const char *name,
				 const char *why, bool lower_gone)
{
	snprintf(lu->out, lu->size, "the hard-link index entry %s/%s/%.200s "
		 "%s, so the names to link into the upper before the freeze "
		 "cannot be found: %sremove that entry (names linked in the "
		 "upper keep its data) and freeze again",
		 sfs->params.workdir, SFS_WORK_INDEX, name, why, lower_gone ?
		 "mount the lower layers it was made on and freeze again, or, "
		 "if they are gone for good, " : "");
	return -ESTALE;
}

/* The union's count of names, or -EINVAL when the entry stores none. */
static int sfs_linkup_nlink(const char *name, const struct stat *st,
			    const struct stat *lst)
{
	struct sfs_xpath x;
	char buf[16];
	int len = sfs_xpath_entry(&x, sfs->indexfd, name);

	if (len == 0)
		len = sfs_xattr_get(&x, sfs->xattr_nlink, buf, sizeof(buf));
	return len < 0 ? -EINVAL : sfs_nlink_parse(buf, len, st->st_nlink,
						   lst->st_nlink);
}

/* One index entry: its names' number goes in LU when it is unsettled. */
static int sfs_linkup_entry(struct sfs_linkup *lu, const char *name)
{
	struct sfs_xpath x;
	struct sfs_fh fh;
	struct stat st, lst;
	uint64_t ino;
	int fd, layer, nlink, ret;

	if (fstatat(sfs->indexfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;	/* its last name went */
	if (sfs_is_whiteout(&st))
		return 0;
	if (S_ISDIR(st.st_mode))
		return sfs_linkup_unresolved(lu, name, "is a directory's (the "
					     "kernel's nfs_export=on), which "
					     "stratafs does not keep", false);
	ret = sfs_origin_fh_get(sfs->indexfd, name, &fh);
	if (ret < 0)
		return ret;
	if (ret == 0)
		return sfs_linkup_unresolved(lu, name, "has no origin", false);
	fd = sfs_fh_decode(&fh, &layer);
	if (fd < 0)
		return sfs_linkup_unresolved(lu, name, "names a lower file that "
					     "no lower layer holds", true);
	ret = sfs_fstat(fd, &lst);
	if (ret < 0)
		goto out;
	/* no usable count reads as the real one, as the kernel falls back */
	nlink = sfs_linkup_nlink(name, &st, &lst);
	if (nlink < 0)
		nlink = st.st_nlink;
	if ((nlink_t)nlink < st.st_nlink)
		goto out;
	/*
	 * The numbers its names show: the lower file's, or, in a layer a
	 * freeze made, the one a copy-up kept on it (sfs_lower_ino); and
	 * the one the node that copied it up had.
	 */
	lu->entries++;
	ret = sfs_linkup_add(lu, sfs_ino_compose(sfs->lower[layer].fsid,
						 lst.st_ino));
	if (ret == 0 && !S_ISLNK(lst.st_mode) && sfs_xpath_fd(&x, fd) == 0 &&
	    sfs_xattr_get(&x, sfs->xattr_ino, &ino, sizeof(ino)) ==
		    sizeof(ino))
		ret = sfs_linkup_add(lu, ino);
	if (ret == 0 && sfs_ino_xattr_get(sfs->indexfd, name, &ino) > 0)
		ret = sfs_linkup_add(lu, ino);
out:
	close(fd);
	return ret;
}

static int sfs_linkup_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The numbers the names of unsettled entries show, sorted, in LU. */
static int sfs_linkup_scan(struct sfs_linkup *lu)
{
	struct dirent *de;
	int ret = 0;
	DIR *d;

	d = strata_opendir_at(sfs->indexfd, ".");
	if (!d)
		return -errno;
	while (ret == 0 && (errno = 0, de = readdir(d))) {
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			ret = sfs_linkup_entry(lu, de->d_name);
	}
	if (ret == 0 && errno)
		ret = -errno;
	closedir(d);
	if (ret < 0 && !lu->out[0])
		snprintf(lu->out, lu->size, "reading the workdir's hard-link "
			 "index: %s", strerror(-ret));
	if (lu->count)
		qsort(lu->inos, lu->count, sizeof(*lu->inos), sfs_linkup_cmp);
	return ret;
}

/*
 * NAME in DIR, listed with a number an unsettled entry's names show:
 * linked up if the view shows it through the index. Requests may run
 * meanwhile: a name a request removed, renamed or replaced since the
 * listing has an upper entry or none at all, and is left to it.
 */
static int sfs_linkup_name(struct sfs_linkup *lu, struct sfs_node *dir,
			   const char *name)
{
	int upper = sfs_upper(dir), ret;
	struct sfs_node *n;
	struct stat st;

	if (upper >= 0 && fstatat(upper, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	ret = sfs_lookup_node(dir, name, &n);
	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		goto out_msg;
	if (atomic_load(&n->indexed))
		ret = sfs_copy_up_name(dir, name, n);
	sfs_node_release(n);
	if (ret == 0 || ret == -EEXIST)
		return 0;
out_msg:
	snprintf(lu->out, lu->size, "linking '%.200s' into the upper from the "
		 "hard-link index: %s", name, strerror(-ret));
	return ret;
}

static bool sfs_linkup_wanted(const struct sfs_linkup *lu, uint64_t ino)
{
	return bsearch(&ino, lu->inos, lu->count, sizeof(ino),
		       sfs_linkup_cmp) != NULL;
}

/* The walk of the merged tree below DIR, pinned. */
static int sfs_linkup_dir(struct sfs_linkup *lu, struct sfs_node *dir)
{
	struct sfs_dirent *ents;
	struct sfs_node *sub;
	size_t count;
	int ret;

	ret = sfs_dir_list(dir, &ents, &count);
	if (ret < 0) {
		snprintf(lu->out, lu->size, "listing a directory to link "
			 "hard-linked files up: %s", strerror(-ret));
		return ret;
	}
	for (size_t i = 2; ret == 0 && i < count; i++) {
		if (ents[i].type != DT_DIR) {
			if (sfs_linkup_wanted(lu, ents[i].ino))
				ret = sfs_linkup_name(lu, dir, ents[i].name);
			continue;
		}
		ret = sfs_lookup_node(dir, ents[i].name, &sub);
		/* gone since the listing, or a layer's root seen inside */
		if (ret == -ENOENT || ret == -ELOOP) {
			ret = 0;
			continue;
		}
		if (ret < 0) {
			snprintf(lu->out, lu->size, "looking '%.200s' up to "
				 "link hard-linked files up: %s", ents[i].name,
				 strerror(-ret));
			break;
		}
		if (S_ISDIR(sub->type))
			ret = sfs_linkup_dir(lu, sub);
		sfs_node_release(sub);
	}
	sfs_dirents_free(ents, count);
	return ret;
}

int sfs_linkup(char *out, size_t size)
{
	struct sfs_linkup lu = { .out = out, .size = size };
	struct sfs_node *root;
	int ret;

	if (sfs->indexfd < 0)
		return 0;
	ret = sfs_linkup_scan(&lu);
	if (ret < 0 || !lu.entries)
		goto out;
	ret = sfs_node_get_pinned(FUSE_ROOT_ID, &root);
	if (ret == 0) {
		ret = sfs_linkup_dir(&lu, root);
		sfs_node_release(root);
	}
	if (ret == 0)
		strata_info("freeze: the names of %zu hard-linked file%s "
			    "linked into the upper", lu.entries,
			    lu.entries > 1 ? "s are" : " is");
out:
	free(lu.inos);
	return ret;
}

void sfs_linkup_drop(void)
{
	struct dirent *de;
	struct stat st;
	DIR *d;

	if (sfs->indexfd < 0)
		return;
	d = strata_opendir_at(sfs->indexfd, ".");
	if (!d) {
		strata_warn("freeze: reading the hard-link index: %s",
			    strerror(errno));
		return;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(sfs->indexfd, de->d_name, &st,
			    AT_SYMLINK_NOFOLLOW) < 0 ||
		    sfs_is_whiteout(&st) || S_ISDIR(st.st_mode))
			continue;
		if (unlinkat(sfs->indexfd, de->d_name, 0) < 0)
			strata_warn("freeze: index/%s stays: %s", de->d_name,
				    strerror(errno));
	}
	closedir(d);
}
