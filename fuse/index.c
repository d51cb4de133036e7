// SPDX-License-Identifier: Apache-2.0
/*
 * Origins and the inodes index, in the kernel overlayfs format (index=on),
 * so that the kernel and stratafs read each other's uppers through every
 * name of a lower hard link.
 *
 * An origin is the lower file's handle as the kernel's overlayfs encodes
 * it: a version byte (0), a magic byte (0xfb), the length of the whole,
 * flags (the byte order of the handle; 0 on little-endian machines), the
 * handle's type, the lower filesystem's uuid (16 bytes), then the handle
 * name_to_handle_at(2) gives. Every copy-up stores it in the "origin"
 * xattr. A lower file with several names is copied up once, into
 * WORKDIR/index, under its origin in lowercase hex; every name of it
 * then finds that copy by computing its own origin. The index entry's
 * "nlink" xattr holds the union's link count as "U%+d": the difference to
 * the index inode's own link count, which the index entry and any name
 * linked into the upper layer are part of.
 *
 * A copy-up through one name puts only the index entry in place: which
 * names reach the upper layer then never depends on which name was
 * looked up first (the kernel, with dentries, links the name it copied up
 * through; both read either form). A name is linked from the index when
 * it is renamed, linked or replaced.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "stratafs.h"

/*
 * FS_IOC_GETFSUUID, Linux 6.8 (include/uapi/linux/fs.h): newer than
 * bookworm's linux-libc-dev. The uuid the kernel's overlayfs puts in an
 * origin is the filesystem's s_uuid, which this returns.
 */
struct sfs_fsuuid2 {
	uint8_t len;
	uint8_t uuid[16];
};
#define SFS_IOC_GETFSUUID _IOR(0x15, 0, struct sfs_fsuuid2)

#define SFS_FH_VERSION 0
#define SFS_FH_MAGIC 0xfb
/* version, magic, len, flags, type: then the uuid, then the handle */
#define SFS_FH_HEADER 5
#define SFS_FH_UUID 16
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define SFS_FH_FLAGS 1	/* the handle's words are big-endian */
#else
#define SFS_FH_FLAGS 0
#endif

void sfs_layer_uuid(struct sfs_layer *l)
{
	struct sfs_fsuuid2 u = { 0 };

	/* a filesystem that has none gives ENOTTY: the kernel's is null too */
	memset(l->uuid, 0, sizeof(l->uuid));
	if (ioctl(l->fd, SFS_IOC_GETFSUUID, &u) == 0 && u.len <= sizeof(l->uuid))
		memcpy(l->uuid, u.uuid, u.len);
}

int sfs_fh_encode(int fd, const struct sfs_layer *l, struct sfs_fh *fh)
{
	unsigned char *bytes = fh->buf + SFS_FH_HEADER + SFS_FH_UUID;
	int len, type;

	/* the index entry's name is twice as long: it must be a name */
	len = sfs_fhandle_get(fd, "", AT_EMPTY_PATH, bytes,
			      NAME_MAX / 2 - SFS_FH_HEADER - SFS_FH_UUID,
			      &type);
	if (len < 0)
		return len;
	fh->len = SFS_FH_HEADER + SFS_FH_UUID + len;
	fh->buf[0] = SFS_FH_VERSION;
	fh->buf[1] = SFS_FH_MAGIC;
	fh->buf[2] = fh->len;
	fh->buf[3] = SFS_FH_FLAGS;
	fh->buf[4] = type;
	memcpy(fh->buf + SFS_FH_HEADER, l->uuid, SFS_FH_UUID);
	return 0;
}

/* The index entry's name: the origin in lowercase hex. */
static void sfs_fh_name(const struct sfs_fh *fh, char *name)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < fh->len; i++) {
		name[2 * i] = hex[fh->buf[i] >> 4];
		name[2 * i + 1] = hex[fh->buf[i] & 15];
	}
	name[2 * fh->len] = '\0';
}

static bool sfs_fh_valid(const struct sfs_fh *fh)
{
	return fh->len > SFS_FH_HEADER + SFS_FH_UUID &&
	       fh->buf[0] == SFS_FH_VERSION && fh->buf[1] == SFS_FH_MAGIC &&
	       fh->buf[2] == fh->len && fh->buf[3] == SFS_FH_FLAGS;
}

int sfs_origin_fh_get(int dirfd, const char *name, struct sfs_fh *fh)
{
	struct sfs_xpath x;
	int n;

	fh->len = 0;
	n = sfs_xpath_entry(&x, dirfd, name);
	if (n == 0)
		n = sfs_xattr_get(&x, sfs->xattr_origin, fh->buf,
				  sizeof(fh->buf));
	if (n == -ENODATA || n == -EOPNOTSUPP || n == -ERANGE)
		return 0;
	if (n < 0)
		return n;
	fh->len = n;
	return sfs_fh_valid(fh) ? 1 : 0;
}

int sfs_origin_fh_set(int dirfd, const char *name, const struct sfs_fh *fh)
{
	struct sfs_xpath x;
	int ret = sfs_xpath_entry(&x, dirfd, name);

	return ret < 0 ? ret : sfs_xattr_set(&x, sfs->xattr_origin, fh->buf,
					     fh->len, 0);
}

/*
 * The lower file an origin names, O_PATH, or a negative errno: the
 * layer is the first whose filesystem has the origin's uuid and knows
 * the handle (several layers may share one filesystem).
 */
int sfs_fh_decode(const struct sfs_fh *fh, int *layer)
{
	if (!sfs_fh_valid(fh))
		return -EINVAL;
	for (int l = 0; l < sfs->nlower; l++) {
		int fd;

		if (memcmp(sfs->lower[l].uuid, fh->buf + SFS_FH_HEADER,
			   SFS_FH_UUID))
			continue;
		fd = sfs_fhandle_open(sfs->lower[l].fd,
				      fh->buf + SFS_FH_HEADER + SFS_FH_UUID,
				      fh->len - SFS_FH_HEADER - SFS_FH_UUID,
				      fh->buf[4], O_PATH | O_CLOEXEC);
		if (fd >= 0) {
			*layer = l;
			return fd;
		}
	}
	return -ESTALE;
}

/*
 * The index entry for an origin, O_PATH, or -ENOENT. Like the kernel, an
 * entry of another type than the lower file (a whiteout left for a file
 * whose names are all gone, or damage) is not used.
 */
int sfs_index_open(const struct sfs_fh *fh, mode_t type, struct stat *st)
{
	char name[2 * sizeof(fh->buf) + 1];
	int fd;

	if (sfs->indexfd < 0)
		return -ENOENT;
	sfs_fh_name(fh, name);
	fd = openat(sfs->indexfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (sfs_fstat(fd, st) < 0 || (st->st_mode & S_IFMT) != (type & S_IFMT) ||
	    sfs_is_whiteout(st)) {
		close(fd);
		return -ENOENT;
	}
	return fd;
}

/* Moves the finished copy at work/TMP into the index, under FH's name. */
int sfs_index_install(const char *tmp, const struct sfs_fh *fh)
{
	char name[2 * sizeof(fh->buf) + 1];

	sfs_fh_name(fh, name);
	return sfs_rename(sfs->tmpfd, tmp, sfs->indexfd, name,
			  RENAME_NOREPLACE);
}

/* Drops the index entry of a file no name of which is left. */
void sfs_index_remove(const struct sfs_fh *fh)
{
	char name[2 * sizeof(fh->buf) + 1];

	sfs_fh_name(fh, name);
	sfs_unlinkat(sfs->indexfd, name, 0);
}

/*
 * The union's link count as an indexed inode stores it (BUF, LEN bytes):
 * relative to the inode's own count UPPER ("U"), or to the lower file's
 * LOWER ("L": left only by a kernel stopped half way through linking a
 * name up). The count, or -EINVAL.
 */
int sfs_nlink_parse(const char *buf, size_t len, nlink_t upper, nlink_t lower)
{
	char s[16];
	char *end;
	long diff, n;

	if (len < 3 || len >= sizeof(s))
		return -EINVAL;
	memcpy(s, buf, len);
	s[len] = '\0';
	if ((s[0] != 'U' && s[0] != 'L') || (s[1] != '+' && s[1] != '-'))
		return -EINVAL;
	diff = strtol(s + 1, &end, 10);
	if (*end)
		return -EINVAL;
	n = (s[0] == 'U' ? (long)upper : (long)lower) + diff;
	return n >= 0 && n <= INT32_MAX ? (int)n : -EINVAL;
}

/* NLINK as the kernel stores it, relative to the inode's own count. */
int sfs_nlink_format(char *buf, size_t size, nlink_t nlink, nlink_t upper)
{
	return snprintf(buf, size, "U%+ld", (long)nlink - (long)upper);
}

/*
 * Whether the upper entry dirfd/name (real inode number REAL) is the
 * index entry of its origin FH: the same inode, as the kernel checks.
 */
static bool sfs_is_indexed(int dirfd, const char *name, const struct sfs_fh *fh)
{
	struct stat st, ist;
	int fd;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    S_ISDIR(st.st_mode) || st.st_nlink < 2)
		return false;
	fd = sfs_index_open(fh, st.st_mode, &ist);
	if (fd < 0)
		return false;
	close(fd);
	return ist.st_ino == st.st_ino && ist.st_dev == st.st_dev;
}

/*
 * The inode number an upper entry reports, and whether it is an indexed
 * lower hard link. Entries in an impure directory may have been copied
 * up: their number is the lower one, kept in our xattr, or decoded from
 * the kernel's origin where only that is there (an upper the kernel
 * wrote). The kernel trusts a decoded origin only where the upper entry
 * cannot be one of several copies of it: a directory, a lower file with
 * one name, or the indexed copy. Returns 1 when the entry has an origin.
 */
int sfs_upper_ino(int dirfd, const char *name, ino_t real, bool impure,
		  uint64_t *ino, bool *indexed)
{
	struct sfs_fh fh;
	struct stat lst;
	bool idx = false;
	int fd, layer, ret;

	*ino = sfs_ino_compose(sfs->upper.fsid, real);
	if (indexed)
		*indexed = false;
	if (!impure)
		return 0;
	ret = sfs_origin_fh_get(dirfd, name, &fh);
	if (ret > 0)
		idx = sfs_is_indexed(dirfd, name, &fh);
	if (indexed)
		*indexed = idx;
	if (sfs_ino_xattr_get(dirfd, name, ino) > 0)
		return 1;
	if (ret <= 0)
		return 0;
	fd = sfs_fh_decode(&fh, &layer);
	if (fd < 0)
		return 1;
	if (sfs_fstat(fd, &lst) == 0 &&
	    (S_ISDIR(lst.st_mode) || lst.st_nlink == 1 || idx))
		*ino = sfs_ino_compose(sfs->lower[layer].fsid, lst.st_ino);
	close(fd);
	return 1;
}

/*
 * The inode number a lower entry NAME in DIRFD (layer LAYER, 1-based)
 * reports. A layer a freeze made (freeze.c) was the upper: the entries
 * copied up into it keep the number they had, in our xattr, in a
 * directory marked impure, as upper entries do (sfs_upper_ino), so that
 * the numbers the kernel holds stay. Such a layer is on the upper's
 * filesystem; no other needs the look.
 */
uint64_t sfs_lower_ino(int dirfd, const char *name, int layer, ino_t real,
		       bool impure)
{
	unsigned fsid = sfs->lower[layer - 1].fsid;
	uint64_t ino = sfs_ino_compose(fsid, real);

	if (impure && sfs_lower_was_upper(layer))
		sfs_ino_xattr_get(dirfd, name, &ino);
	return ino;
}

/*
 * A lower file with several names (fd, in layer LAYER, 1-based) may
 * have its copy in the index: its descriptor, O_PATH, or -ENOENT.
 */
int sfs_index_find(int fd, int layer, mode_t type)
{
	struct sfs_fh fh;
	struct stat st;
	int ret;

	ret = sfs_fh_encode(fd, &sfs->lower[layer - 1], &fh);
	if (ret < 0)
		return ret == -EOVERFLOW || ret == -EOPNOTSUPP ? -ENOENT : ret;
	return sfs_index_open(&fh, type, &st);
}

/*
 * Converting WORKDIR/strata-index, where stratafs kept lower hard links
 * before it wrote the kernel's index: entries named by our inode number
 * (the layer's filesystem index above bit 56), the count of names in view
 * in "strata.nlink" (8 bytes). Each entry is matched to its lower file by
 * a walk of the lower layers, gets its origin and the kernel's count, and
 * moves to WORKDIR/index; the names linked to it stay as they are. Once,
 * at the first mount by this version.
 */
struct sfs_old_entry {
	char name[32];
	uint64_t ino;		/* composed: the lower file's */
	uint64_t nlink;		/* names in view */
	int fd;			/* the lower file, once found */
	int layer;		/* 0-based */
};

static void sfs_convert_walk(int dirfd, int layer, struct sfs_old_entry *e,
			     size_t count, size_t *left)
{
	int dfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (dfd < 0)
		return;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return;
	}
	while (*left && (de = readdir(d))) {
		struct stat st;
		uint64_t ino;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			int sub = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY |
						  O_NOFOLLOW | O_CLOEXEC);

			if (sub >= 0) {
				sfs_convert_walk(sub, layer, e, count, left);
				close(sub);
			}
			continue;
		}
		if (st.st_nlink < 2)
			continue;
		ino = sfs_ino_compose(sfs->lower[layer].fsid, st.st_ino);
		for (size_t i = 0; i < count; i++) {
			if (e[i].fd >= 0 || e[i].ino != ino)
				continue;
			e[i].fd = sfs_open_entry(dfd, de->d_name, st.st_mode);
			e[i].layer = layer;
			if (e[i].fd >= 0)
				(*left)--;
		}
	}
	closedir(d);
}

static int sfs_convert_one(int old, struct sfs_old_entry *e,
			   const char *old_nlink)
{
	struct sfs_xpath x;
	struct sfs_fh fh;
	struct stat st;
	char val[16];
	int len, ret;

	ret = sfs_xpath_entry(&x, old, e->name);
	if (ret == 0 && e->fd < 0)
		ret = -ENOENT;
	if (ret == 0)
		ret = sfs_fh_encode(e->fd, &sfs->lower[e->layer], &fh);
	if (ret == 0 && fstatat(old, e->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	if (ret == 0)
		ret = sfs_origin_fh_set(old, e->name, &fh);
	if (ret == 0) {
		len = sfs_nlink_format(val, sizeof(val), e->nlink, st.st_nlink);
		ret = sfs_xattr_set(&x, sfs->xattr_nlink, val, len, 0);
	}
	/* the old count goes either way; its names read as upper files then */
	lremovexattr(x.path, old_nlink);
	if (ret == 0) {
		char name[2 * sizeof(fh.buf) + 1];

		sfs_fh_name(&fh, name);
		ret = sfs_rename(old, e->name, sfs->indexfd, name,
				 RENAME_NOREPLACE);
	}
	if (ret < 0) {
		/* its names keep the data, as separate upper files */
		strata_warn("strata-index/%s: %s: its names are no longer linked",
			    e->name, strerror(-ret));
		sfs_unlinkat(old, e->name, 0);
	}
	return ret;
}

int sfs_index_convert(struct sfs_fs *fs)
{
	struct sfs_old_entry *e = NULL;
	char old_nlink[64];
	size_t count = 0, left;
	struct dirent *de;
	int old, ret = 0;
	DIR *d;

	old = openat(fs->workfd, SFS_WORK_OLD_INDEX,
		     O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (old < 0)
		return errno == ENOENT ? 0 : -errno;
	snprintf(old_nlink, sizeof(old_nlink), "%sstrata.nlink",
		 fs->xattr_prefix);
	d = fdopendir(dup(old));
	if (!d) {
		ret = -errno;
		goto out;
	}
	while ((de = readdir(d))) {
		struct sfs_old_entry *more;
		struct sfs_xpath x;

		if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(e->name))
			continue;
		more = realloc(e, (count + 1) * sizeof(*e));
		if (!more) {
			ret = -ENOMEM;
			break;
		}
		e = more;
		memset(&e[count], 0, sizeof(*e));
		strcpy(e[count].name, de->d_name);
		e[count].fd = -1;
		if (sfs_ino_xattr_get(old, de->d_name, &e[count].ino) <= 0 ||
		    sfs_xpath_entry(&x, old, de->d_name) < 0 ||
		    sfs_xattr_get(&x, old_nlink, &e[count].nlink,
				  sizeof(e[count].nlink)) != sizeof(uint64_t))
			e[count].ino = 0;	/* not ours: matches nothing */
		count++;
	}
	closedir(d);
	if (ret < 0)
		goto out;
	left = count;
	for (int l = 0; l < fs->nlower && left; l++)
		sfs_convert_walk(fs->lower[l].fd, l, e, count, &left);
	for (size_t i = 0; i < count; i++) {
		if (sfs_convert_one(old, &e[i], old_nlink) == 0)
			strata_info("strata-index/%s: moved to the kernel's index",
				    e[i].name);
		if (e[i].fd >= 0)
			close(e[i].fd);
	}
	if (unlinkat(fs->workfd, SFS_WORK_OLD_INDEX, AT_REMOVEDIR) < 0)
		strata_warn("workdir: %s stays: %s", SFS_WORK_OLD_INDEX,
			    strerror(errno));
out:
	free(e);
	close(old);
	return ret;
}
