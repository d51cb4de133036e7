// SPDX-License-Identifier: Apache-2.0
/* acl.c: the xattr format, the mask a new entry gets, inheritance, copy. */
#include <endian.h>
#include <errno.h>
#include <linux/posix_acl.h>
#include <linux/posix_acl_xattr.h>

#include "fixture.h"
#include "unit.h"

struct acl_buf {
	struct posix_acl_xattr_header h;
	struct posix_acl_xattr_entry e[128];
};

/* An ACL from (tag, perm, id) triples; its length in xattr form. */
static size_t acl_make(struct acl_buf *b, int n, const unsigned (*ents)[3])
{
	b->h.a_version = htole32(POSIX_ACL_XATTR_VERSION);
	for (int i = 0; i < n; i++) {
		b->e[i].e_tag = htole16(ents[i][0]);
		b->e[i].e_perm = htole16(ents[i][1]);
		b->e[i].e_id = htole32(ents[i][2]);
	}
	return sizeof(b->h) + n * sizeof(b->e[0]);
}

static unsigned acl_perm(const struct acl_buf *b, int i)
{
	return le16toh(b->e[i].e_perm);
}

static void test_format(void)
{
	struct acl_buf b;
	const unsigned base[][3] = { { ACL_USER_OBJ, 7, -1u },
				     { ACL_GROUP_OBJ, 5, -1u },
				     { ACL_OTHER, 0, -1u } };
	size_t len = acl_make(&b, 3, base);

	CHECK_EQ_INT(sfs_acl_count(&b, len), 3);
	CHECK_EQ_INT(sfs_acl_count(&b, sizeof(b.h)), 0);
	CHECK_EQ_INT(sfs_acl_count(&b, len - 1), -EINVAL);
	CHECK_EQ_INT(sfs_acl_count(&b, 2), -EINVAL);
	b.h.a_version = htole32(1);
	CHECK_EQ_INT(sfs_acl_count(&b, len), -EINVAL);
	CHECK(sfs_acl_is_name("system.posix_acl_access"));
	CHECK(sfs_acl_is_name("system.posix_acl_default"));
	CHECK(!sfs_acl_is_name("system.posix_acl_accessx"));
	CHECK(!sfs_acl_is_name("user.x"));
}

static void test_masq(void)
{
	struct acl_buf b;
	const unsigned named[][3] = { { ACL_USER_OBJ, 7, -1u },
				      { ACL_USER, 6, 1000 },
				      { ACL_GROUP_OBJ, 5, -1u },
				      { ACL_GROUP, 4, 2000 },
				      { ACL_MASK, 7, -1u },
				      { ACL_OTHER, 5, -1u } };
	const unsigned base[][3] = { { ACL_USER_OBJ, 6, -1u },
				     { ACL_GROUP_OBJ, 4, -1u },
				     { ACL_OTHER, 0, -1u } };
	const unsigned nogroup[][3] = { { ACL_USER_OBJ, 6, -1u },
					{ ACL_OTHER, 0, -1u } };
	const unsigned badtag[][3] = { { ACL_USER_OBJ, 6, -1u },
				       { 0x40, 4, -1u } };
	size_t len = acl_make(&b, 6, named);
	mode_t mode = S_IFREG | S_ISGID | 0666;

	/* the mask and others are cut by the mode and cut it; named stay */
	CHECK_EQ_INT(sfs_acl_masq(&b, len, &mode), 1);
	CHECK_EQ_INT(mode, S_IFREG | S_ISGID | 0664);
	CHECK_EQ_INT(acl_perm(&b, 0), 6);	/* owner: rwx & rw- */
	CHECK_EQ_INT(acl_perm(&b, 1), 6);	/* named user as it was */
	CHECK_EQ_INT(acl_perm(&b, 2), 5);	/* group entry: not the class */
	CHECK_EQ_INT(acl_perm(&b, 4), 6);	/* mask: rwx & rw- */
	CHECK_EQ_INT(acl_perm(&b, 5), 4);	/* other: r-x & rw- */

	/* without a mask the owning group's entry is the class */
	len = acl_make(&b, 3, base);
	mode = S_IFDIR | 0777;
	CHECK_EQ_INT(sfs_acl_masq(&b, len, &mode), 0);
	CHECK_EQ_INT(mode, S_IFDIR | 0640);
	CHECK_EQ_INT(acl_perm(&b, 1), 4);

	/* a mode narrower than the ACL narrows the ACL */
	len = acl_make(&b, 6, named);
	mode = S_IFREG | 0600;
	CHECK_EQ_INT(sfs_acl_masq(&b, len, &mode), 1);
	CHECK_EQ_INT(mode, S_IFREG | 0600);
	CHECK_EQ_INT(acl_perm(&b, 4), 0);
	CHECK_EQ_INT(acl_perm(&b, 5), 0);

	/* what the kernel refuses too */
	len = acl_make(&b, 2, nogroup);
	CHECK_EQ_INT(sfs_acl_masq(&b, len, &mode), -EIO);
	len = acl_make(&b, 2, badtag);
	CHECK_EQ_INT(sfs_acl_masq(&b, len, &mode), -EIO);
	CHECK_EQ_INT(sfs_acl_masq(&b, len - 3, &mode), -EIO);
}

/* A default ACL with a named user and a mask. */
static const unsigned default_acl[][3] = { { ACL_USER_OBJ, 7, -1u },
					   { ACL_USER, 6, 1000 },
					   { ACL_GROUP_OBJ, 5, -1u },
					   { ACL_MASK, 7, -1u },
					   { ACL_OTHER, 0, -1u } };

static void set_default(struct fixture *fx, const char *path,
			const struct acl_buf *b, size_t len)
{
	int fd = openat(fx->fd, path, O_RDONLY | O_DIRECTORY);

	CHECK_EQ_INT(fsetxattr(fd, STRATA_ACL_DEFAULT, b, len, 0), 0);
	close(fd);
}

static void test_inherit(void)
{
	unsigned bigents[104][3];
	struct acl_buf b, big, got;
	struct sfs_node *n;
	struct fixture fx;
	struct sfs_acl a;
	size_t len, biglen;
	mode_t mode;
	int i;

	CHECK_EQ_INT(fixture_init(&fx, 1, true), 0);
	len = acl_make(&b, 5, default_acl);
	/* the workdir's default ACL must reach nothing built there */
	set_default(&fx, "w", &b, len);
	CHECK_EQ_INT(sfs_setup(&fx.fs), 0);
	CHECK_EQ_INT(fgetxattr(fx.fs.tmpfd, STRATA_ACL_DEFAULT, NULL, 0), -1);
	CHECK_EQ_INT(errno, ENODATA);
	CHECK_EQ_INT(fgetxattr(fx.fs.indexfd, STRATA_ACL_ACCESS, NULL, 0), -1);

	fx_dir(&fx, "l1/plain");
	fx_dir(&fx, "l1/acl");
	fx_dir(&fx, "l1/big");
	set_default(&fx, "l1/acl", &b, len);
	/* bigger than the first read's guess: probed, then read */
	bigents[0][0] = ACL_USER_OBJ;
	for (i = 1; i <= 100; i++) {
		bigents[i][0] = ACL_USER;
		bigents[i][2] = 2000 + i;
	}
	bigents[i++][0] = ACL_GROUP_OBJ;
	bigents[i++][0] = ACL_MASK;
	bigents[i][0] = ACL_OTHER;
	for (int j = 0; j <= i; j++) {
		bigents[j][1] = bigents[j][0] == ACL_OTHER ? 0 : 7;
		if (bigents[j][0] != ACL_USER)
			bigents[j][2] = -1u;
	}
	biglen = acl_make(&big, i + 1, bigents);
	set_default(&fx, "l1/big", &big, biglen);

	/* no default ACL: the umask */
	CHECK_EQ_INT(fx_lookup(&fx, "plain", &n), 0);
	mode = S_IFREG | 0666;
	CHECK_EQ_INT(sfs_acl_inherit(n, &mode, 022, &a), 0);
	CHECK_EQ_INT(mode, S_IFREG | 0644);
	CHECK(!a.def && !a.access);
	sfs_node_release(n);

	/* a default ACL: not the umask; a directory keeps it as default */
	CHECK_EQ_INT(fx_lookup(&fx, "acl", &n), 0);
	mode = S_IFDIR | 0777;
	CHECK_EQ_INT(sfs_acl_inherit(n, &mode, 077, &a), 0);
	CHECK_EQ_INT(mode, S_IFDIR | 0770);
	CHECK(a.def && a.access && a.len == len);
	if (a.def && a.access) {
		CHECK(!memcmp(a.def, &b, len));
		memcpy(&got, a.access, len);
		CHECK_EQ_INT(acl_perm(&got, 4), 0);
	}
	sfs_acl_free(&a);
	/* a symlink gets nothing */
	mode = S_IFLNK | 0777;
	CHECK_EQ_INT(sfs_acl_inherit(n, &mode, 077, &a), 0);
	CHECK_EQ_INT(mode, S_IFLNK | 0777);
	CHECK(!a.def);
	sfs_node_release(n);

	CHECK_EQ_INT(fx_lookup(&fx, "big", &n), 0);
	mode = S_IFREG | 0644;
	CHECK_EQ_INT(sfs_acl_inherit(n, &mode, 0, &a), 0);
	CHECK_EQ_INT(a.len, biglen);
	CHECK_EQ_INT(mode, S_IFREG | 0640);
	sfs_acl_free(&a);
	sfs_node_release(n);
	fixture_done(&fx);
}

/* A directory's ACLs given to another, and nothing the other had. */
static void test_copy(void)
{
	struct acl_buf b, got;
	struct fixture fx;
	int from, to;
	size_t len;

	CHECK_EQ_INT(fixture_init(&fx, 1, false), 0);
	len = acl_make(&b, 5, default_acl);
	fx_dir(&fx, "from");
	fx_dir(&fx, "to");
	from = openat(fx.fd, "from", O_RDONLY | O_DIRECTORY);
	to = openat(fx.fd, "to", O_RDONLY | O_DIRECTORY);
	CHECK_EQ_INT(fsetxattr(from, STRATA_ACL_ACCESS, &b, len, 0), 0);
	CHECK_EQ_INT(fsetxattr(to, STRATA_ACL_DEFAULT, &b, len, 0), 0);
	CHECK_EQ_INT(strata_acl_copy(from, to), 0);
	CHECK_EQ_INT(fgetxattr(to, STRATA_ACL_ACCESS, &got, sizeof(got)),
		     (long long)len);
	CHECK(!memcmp(&got, &b, len));
	CHECK_EQ_INT(fgetxattr(to, STRATA_ACL_DEFAULT, NULL, 0), -1);
	/* and back: none is none */
	CHECK_EQ_INT(fremovexattr(from, STRATA_ACL_ACCESS), 0);
	CHECK_EQ_INT(strata_acl_copy(from, to), 0);
	CHECK_EQ_INT(fgetxattr(to, STRATA_ACL_ACCESS, NULL, 0), -1);
	CHECK_EQ_INT(errno, ENODATA);
	close(from);
	close(to);
	strata_rmtree_at(AT_FDCWD, fx.root);
	close(fx.fd);
	sfs_params_free(&fx.fs.params);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	test_format();
	test_masq();
	test_inherit();
	test_copy();
	return unit_done("acl");
}
