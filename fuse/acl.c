// SPDX-License-Identifier: Apache-2.0
/*
 * acl.c: POSIX ACLs of the merged view.
 *
 * The kernel checks every permission itself (default_permissions). With
 * FUSE_POSIX_ACL agreed at INIT (super.c) it reads a file's access ACL
 * through GETXATTR system.posix_acl_access and obeys it, as kernel
 * overlayfs obeys the real file's; without it ACLs would be shown but
 * ignored. What the kernel leaves to the daemon, and overlayfs gets from
 * the upper filesystem or does itself, is here:
 *
 *  - Inheritance. A new entry takes its parent's default ACL, cut by the
 *    mode asked for, as the upper filesystem's posix_acl_create does; a
 *    new directory keeps it as its own default too. The umask counts only
 *    where the parent has no default ACL, which is why FUSE_DONT_MASK goes
 *    with FUSE_POSIX_ACL: the kernel then passes the mode unmasked and the
 *    umask beside it. Entries built in the workdir (over a whiteout) would
 *    inherit nothing there, so the ACL is set on every new entry.
 *  - Layers without ACLs. Their EOPNOTSUPP becomes ENODATA: the kernel
 *    takes any other error as the answer to every permission check.
 *  - setgid. Setting or removing the access ACL of a setgid entry drops
 *    setgid for a caller outside its group without CAP_FSETID, as
 *    overlayfs does (ovl_set_acl). The kernel would pass that on as
 *    FUSE_SETXATTR_ACL_KILL_SGID, which libfuse 3.14 cannot take.
 *  - The workdir. Entries are built there, so it must hold no default
 *    ACL for them to inherit (ovl_workdir_create removes both of its
 *    own); super.c clears them with lib/acl.c, which also gives a
 *    freeze's new upper root the old one's ACLs (freeze.c).
 *
 * The xattr format is the kernel's: struct posix_acl_xattr_header, then
 * struct posix_acl_xattr_entry per entry, little-endian.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <linux/capability.h>
#include <linux/posix_acl.h>
#include <linux/posix_acl_xattr.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "stratafs.h"

/* Reads of a default ACL that keeps changing size give up after this. */
#define SFS_ACL_TRIES 4
/* The first read's buffer: an ACL of 62 entries fits. */
#define SFS_ACL_GUESS 500

bool sfs_acl_is_name(const char *name)
{
	return !strcmp(name, STRATA_ACL_ACCESS) || !strcmp(name, STRATA_ACL_DEFAULT);
}

/* The number of entries of an ACL in xattr form, or -EINVAL. */
int sfs_acl_count(const void *buf, size_t len)
{
	const struct posix_acl_xattr_header *h = buf;

	if (len < sizeof(*h) ||
	    (len - sizeof(*h)) % sizeof(struct posix_acl_xattr_entry) ||
	    le32toh(h->a_version) != POSIX_ACL_XATTR_VERSION)
		return -EINVAL;
	return (int)((len - sizeof(*h)) / sizeof(struct posix_acl_xattr_entry));
}

/*
 * Cuts the ACL in BUF (a copy of the parent's default ACL) and *MODE by
 * each other, as a new entry's: the owner's and others' entries and the
 * mode's bits keep what both allow, and the group class (the mask entry,
 * or the owning group's without one) likewise. 1 when the ACL says more
 * than the mode (named entries or a mask), 0 when the mode says it all,
 * -EIO for an ACL the kernel would refuse as well.
 */
int sfs_acl_masq(void *buf, size_t len, mode_t *mode)
{
	struct posix_acl_xattr_entry *e, *group = NULL, *mask = NULL;
	mode_t m = *mode & 0777;
	int count = sfs_acl_count(buf, len);
	bool extended = false;

	if (count < 0)
		return -EIO;
	e = (struct posix_acl_xattr_entry *)
		((struct posix_acl_xattr_header *)buf + 1);
	for (int i = 0; i < count; i++, e++) {
		unsigned perm = le16toh(e->e_perm);

		switch (le16toh(e->e_tag)) {
		case ACL_USER_OBJ:
			perm &= m >> 6;
			e->e_perm = htole16(perm);
			m &= (perm << 6) | 077;
			break;
		case ACL_OTHER:
			perm &= m & 07;
			e->e_perm = htole16(perm);
			m &= perm | 0770;
			break;
		case ACL_GROUP_OBJ:
			group = e;
			break;
		case ACL_MASK:
			mask = e;
			extended = true;
			break;
		case ACL_USER:
		case ACL_GROUP:
			extended = true;
			break;
		default:
			return -EIO;
		}
	}
	if (!mask)
		mask = group;
	if (!mask)
		return -EIO;
	mask->e_perm = htole16(le16toh(mask->e_perm) & (m >> 3) & 07);
	m &= (le16toh(mask->e_perm) << 3) | 0707;
	*mode = (*mode & ~0777) | m;
	return extended;
}

void sfs_acl_free(struct sfs_acl *a)
{
	free(a->def);
	a->def = NULL;
	a->access = NULL;
}

/*
 * The default ACL of DIR into a->def (NULL when it has none), with room
 * behind it for a->access. A size probe and the read are two steps, and
 * the ACL may change between them: a read that finds it grown probes
 * again, a bounded number of times.
 */
static int sfs_acl_read_default(struct sfs_node *dir, struct sfs_acl *a)
{
	size_t size = SFS_ACL_GUESS;
	int n = -ERANGE;

	for (int i = 0; i < SFS_ACL_TRIES && n == -ERANGE; i++) {
		a->def = malloc(2 * size);
		if (!a->def)
			return -ENOMEM;
		n = sfs_node_xattr_get(dir, STRATA_ACL_DEFAULT, a->def, size);
		if (n > 0) {
			a->len = (size_t)n;
			return 0;
		}
		sfs_acl_free(a);
		if (n == -ERANGE)
			n = sfs_node_xattr_get(dir, STRATA_ACL_DEFAULT, NULL, 0);
		if (n > 0) {
			size = (size_t)n;
			n = -ERANGE;
		}
	}
	/* no ACL, or a layer that keeps none */
	if (n == 0 || n == -ENODATA || n == -EOPNOTSUPP)
		return 0;
	return n == -ERANGE ? -EAGAIN : n;
}

/*
 * What an entry of *MODE made in DIR (copied up) gets: its mode cut by
 * the directory's default ACL, or by UMASK when there is none, and in *A
 * the ACLs to set on it (sfs_acl_set_new). Symlinks get neither.
 */
int sfs_acl_inherit(struct sfs_node *dir, mode_t *mode, mode_t umask,
		    struct sfs_acl *a)
{
	int ret;

	memset(a, 0, sizeof(*a));
	if (S_ISLNK(*mode))
		return 0;
	ret = sfs_acl_read_default(dir, a);
	if (ret < 0 || !a->def || sfs_acl_count(a->def, a->len) == 0) {
		/* an empty ACL is none, as the kernel reads it */
		sfs_acl_free(a);
		if (ret == 0)
			*mode &= ~(umask & 0777);
		return ret;
	}
	a->access = (char *)a->def + a->len;
	memcpy(a->access, a->def, a->len);
	ret = sfs_acl_masq(a->access, a->len, mode);
	if (ret < 0) {
		sfs_acl_free(a);
		return ret;
	}
	if (ret == 0)
		a->access = NULL;	/* the mode says it all */
	return 0;
}

/*
 * Sets what sfs_acl_inherit gave on the new entry at X, of type TYPE. An
 * upper filesystem without ACLs takes none: the mode stands alone then.
 */
int sfs_acl_set_new(const struct sfs_xpath *x, mode_t type,
		    const struct sfs_acl *a)
{
	int ret = 0;

	if (a->access)
		ret = sfs_xattr_set(x, STRATA_ACL_ACCESS, a->access, a->len, 0);
	if (ret == 0 && a->def && S_ISDIR(type))
		ret = sfs_xattr_set(x, STRATA_ACL_DEFAULT, a->def, a->len, 0);
	return ret == -EOPNOTSUPP ? 0 : ret;
}

/*
 * Before the access ACL of N is set or removed by NAME: drops setgid if
 * the caller is outside N's group and lacks CAP_FSETID. Copies N up
 * first, as the change itself will. The mode is read and changed on the
 * upper entry's descriptor, never by a name a rename could move, and the
 * kernel holds N's inode lock over the whole request: no other change of
 * its mode comes between the two.
 */
int sfs_acl_kill_sgid(fuse_req_t req, struct sfs_node *n, const char *name)
{
	struct stat st;
	int ret;

	if (strcmp(name, STRATA_ACL_ACCESS) || S_ISLNK(n->type))
		return 0;
	ret = sfs_node_stat(n, &st);
	if (ret < 0 || !(st.st_mode & S_ISGID) ||
	    sfs_req_in_group(req, st.st_gid) || sfs_req_capable(req, CAP_FSETID))
		return ret;
	ret = sfs_copy_up(n);
	if (ret == 0)
		ret = sfs_fstat(sfs_upper(n), &st);
	if (ret == 0 && (st.st_mode & S_ISGID))
		ret = sfs_fd_chmod(sfs_upper(n), st.st_mode & 07777 & ~S_ISGID);
	return ret;
}
