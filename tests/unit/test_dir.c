// SPDX-License-Identifier: Apache-2.0
/*
 * dir.c: create, mknod, mkdir, symlink, link, unlink, rmdir and rename,
 * driven as the kernel drives them: through their FUSE handlers, on a
 * real instance (fixture.h), with each answer captured instead of sent.
 * Every case checks what lands in the upper and work directories
 * against kernel overlayfs's format, and what a LOOKUP through stratafs
 * answers afterwards.
 */
#include <errno.h>

#include "fixture.h"
#include "unit.h"

/* Every request comes from this caller: not root, so ownership shows. */
#define CALLER_UID 1234
#define CALLER_GID 5678
#define ROOT FUSE_ROOT_ID

/*
 * One request: the caller a handler reads, and the answer it gave. A
 * pointer to one is the fuse_req_t the handlers get. libfuse never sees
 * it: the libfuse functions they reach are defined below, and a
 * definition in the executable takes precedence over the shared one.
 */
struct test_req {
	struct fuse_ctx ctx;
	int replies;		/* answers given: exactly one is right */
	int err;		/* fuse_reply_err's errno, 0 for success */
	bool created;		/* answered by fuse_reply_create */
	struct fuse_entry_param e;	/* ino 0: none, or a negative lookup */
	struct fuse_file_info fi;	/* the file fuse_reply_create opened */
};

/*
 * The lookups the kernel holds: every entry replied counts one, as on a
 * mount, and each case forgets them at its end (test_done). A reference
 * dir.c drops too early then shows as a use after free under ASan, and
 * one it never drops as a node left in the table.
 */
static fuse_ino_t held[512];
static int nheld;

static struct test_req *test_req_of(fuse_req_t req)
{
	return (struct test_req *)req;
}

const struct fuse_ctx *fuse_req_ctx(fuse_req_t req)
{
	return &test_req_of(req)->ctx;
}

int fuse_reply_err(fuse_req_t req, int err)
{
	struct test_req *r = test_req_of(req);

	r->replies++;
	r->err = err;
	return 0;
}

int fuse_reply_entry(fuse_req_t req, const struct fuse_entry_param *e)
{
	struct test_req *r = test_req_of(req);

	r->replies++;
	r->e = *e;
	if (e->ino) {
		CHECK(nheld < (int)(sizeof(held) / sizeof(held[0])));
		if (nheld < (int)(sizeof(held) / sizeof(held[0])))
			held[nheld++] = e->ino;
	}
	return 0;
}

int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param *e,
		      const struct fuse_file_info *fi)
{
	struct test_req *r = test_req_of(req);

	r->created = true;
	r->fi = *fi;
	return fuse_reply_entry(req, e);
}

static struct test_req test_caller(void)
{
	return (struct test_req){ .ctx = { .uid = CALLER_UID,
					   .gid = CALLER_GID } };
}

/* Every request is answered exactly once, or the kernel waits forever. */
static struct test_req test_answered(struct test_req r)
{
	CHECK_EQ_INT(r.replies, 1);
	return r;
}

/*
 * Sends one request to a handler, as the kernel would, and gives back
 * its answer: SEND(sfs_op_mkdir, parent, "name", mode).err
 */
#define SEND(handler, ...)                                               \
	({                                                               \
		struct test_req _r = test_caller();                      \
		handler((fuse_req_t)&_r, __VA_ARGS__);                   \
		test_answered(_r);                                       \
	})

/* The answer to a LOOKUP of PATH's last component, walked from the root. */
static struct test_req lookup(const char *path)
{
	char *dup = strdup(path), *save = NULL;
	struct test_req r = { .e.ino = ROOT };

	for (char *c = strtok_r(dup, "/", &save); c && r.e.ino;
	     c = strtok_r(NULL, "/", &save)) {
		fuse_ino_t dir = r.e.ino;

		r = SEND(sfs_op_lookup, dir, c);
	}
	free(dup);
	return r;
}

/* The node id of PATH in the merged view, 0 when it shows nothing. */
static fuse_ino_t ino_of(const char *path)
{
	return lookup(path).e.ino;
}

static void test_setup(struct fixture *fx, int nlowers, bool upper)
{
	nheld = 0;
	CHECK_EQ_INT(fixture_setup(fx, nlowers, upper), 0);
}

/*
 * The kernel forgets all it was told of: then no node may be left, and
 * no half-made entry in the workdir.
 */
static void test_done(struct fixture *fx)
{
	while (nheld > 0)
		sfs_node_forget(sfs_node_get(held[--nheld]), 1);
	CHECK_EQ_INT(fx->fs.table_count, 0);
	if (fx->fs.params.upperdir)
		CHECK_EQ_INT(fx_count(fx, "w/work"), 0);
	fixture_done(fx);
}

/* What a layer holds at PATH (relative to the fixture), mode 0 for none. */
static struct stat fx_stat(struct fixture *fx, const char *path)
{
	struct stat st;

	if (fstatat(fx->fd, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
		memset(&st, 0, sizeof(st));
	return st;
}

/* Checked by hand, not by whiteout.c: the kernel's char device 0/0. */
static bool fx_is_whiteout(struct fixture *fx, const char *path)
{
	struct stat st = fx_stat(fx, path);

	return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0);
}

/* An xattr of the directory at PATH as a string, "" when it has none. */
static const char *fx_dir_xattr(struct fixture *fx, const char *path,
				const char *name, char *buf, size_t size)
{
	int fd = openat(fx->fd, path, O_RDONLY | O_DIRECTORY);
	ssize_t n = fd < 0 ? -1 : fgetxattr(fd, name, buf, size - 1);

	if (fd >= 0)
		close(fd);
	buf[n < 0 ? 0 : n] = '\0';
	return buf;
}

/* Names the merged view lists in the directory at PATH, "." and ".." aside. */
static int listed(const char *path)
{
	struct sfs_dirent *ents;
	struct sfs_node *dir;
	size_t count = 0;

	if (sfs_node_get_pinned(ino_of(path), &dir) < 0)
		return -1;
	if (sfs_dir_list(dir, &ents, &count) == 0)
		sfs_dirents_free(ents, count);
	sfs_node_release(dir);
	return (int)count - 2;
}

/*
 * A new entry R made at UPATH in the upper layer, seen at VPATH in the
 * merged view: its type and mode, owned by the caller (GID may be a
 * setgid directory's), the same in the reply and in a later lookup.
 */
static void check_new(struct fixture *fx, const struct test_req *r,
		      const char *upath, const char *vpath, mode_t mode,
		      gid_t gid)
{
	int failures = unit_failures;
	struct stat st = fx_stat(fx, upath);
	struct test_req l = lookup(vpath);

	CHECK_EQ_INT(r->err, 0);
	CHECK_EQ_INT(st.st_mode, mode);
	CHECK_EQ_INT(st.st_uid, CALLER_UID);
	CHECK_EQ_INT(st.st_gid, gid);
	/* the reply is what the kernel caches: it must be the real entry */
	CHECK(r->e.ino != 0);
	CHECK_EQ_INT(r->e.attr.st_mode, mode);
	CHECK_EQ_INT(r->e.attr.st_uid, CALLER_UID);
	CHECK_EQ_INT(r->e.attr.st_gid, gid);
	CHECK_EQ_INT(r->e.attr.st_ino,
		     sfs_ino_compose(fx->fs.upper.fsid, st.st_ino));
	/* and a lookup names the same inode the reply named */
	CHECK_EQ_INT(l.e.ino, r->e.ino);
	CHECK_EQ_INT(l.e.generation, r->e.generation);
	CHECK_EQ_INT(l.e.attr.st_ino, r->e.attr.st_ino);
	CHECK_EQ_INT(l.e.attr.st_mode, mode);
	if (unit_failures > failures)
		fprintf(stderr, "  (the new entry %s)\n", upath);
}

static void test_create_new(void)
{
	struct fuse_file_info fi = { .flags = O_RDWR | O_CREAT };
	struct test_req r;
	struct sfs_file *f;
	struct fixture fx;
	char buf[64];

	test_setup(&fx, 1, true);
	fx_dir(&fx, "l1/d");

	r = SEND(sfs_op_mkdir, ROOT, "dir", 0750);
	check_new(&fx, &r, "u/dir", "dir", S_IFDIR | 0750, CALLER_GID);
	/* in a lower directory: it comes up first */
	r = SEND(sfs_op_mkdir, ino_of("d"), "sub", 0700);
	check_new(&fx, &r, "u/d/sub", "d/sub", S_IFDIR | 0700, CALLER_GID);

	r = SEND(sfs_op_mknod, ROOT, "fifo", S_IFIFO | 0640, 0);
	check_new(&fx, &r, "u/fifo", "fifo", S_IFIFO | 0640, CALLER_GID);
	r = SEND(sfs_op_mknod, ROOT, "null", S_IFCHR | 0600, makedev(1, 3));
	check_new(&fx, &r, "u/null", "null", S_IFCHR | 0600, CALLER_GID);
	CHECK_EQ_INT(fx_stat(&fx, "u/null").st_rdev, makedev(1, 3));
	CHECK_EQ_INT(r.e.attr.st_rdev, makedev(1, 3));

	r = SEND(sfs_op_symlink, "some/target", ROOT, "link");
	check_new(&fx, &r, "u/link", "link", S_IFLNK | 0777, CALLER_GID);
	CHECK_EQ_INT(readlinkat(fx.fd, "u/link", buf, sizeof(buf)), 11);

	/* create answers with the entry and an open file on the upper copy */
	r = SEND(sfs_op_create, ROOT, "file", 0640, &fi);
	check_new(&fx, &r, "u/file", "file", S_IFREG | 0640, CALLER_GID);
	CHECK(r.created);
	f = r.created ? sfs_file_of(&r.fi) : NULL;
	CHECK(f != NULL);
	if (f) {
		CHECK_EQ_INT(sfs_file_handle(f), r.fi.fh);
		CHECK_EQ_INT(sfs_node_id(f->node), r.e.ino);
		CHECK_EQ_INT(pwrite(f->fd, "written", 7, 0), 7);
		CHECK_EQ_INT(fx_read(&fx, "u/file", buf, sizeof(buf)), 7);
		sfs_file_close(f);	/* the kernel's RELEASE */
	}
	/* nothing reached the lower layer */
	CHECK_EQ_INT(fx_count(&fx, "l1"), 1);
	test_done(&fx);
}

/*
 * In a setgid directory, new entries take its group, and directories
 * its setgid bit too (sfs_new_owner), as inode_init_owner does.
 */
static void test_create_setgid(void)
{
	struct fuse_file_info fi = { .flags = O_WRONLY | O_CREAT };
	struct test_req r;
	struct fixture fx;

	test_setup(&fx, 1, true);
	fx_dir(&fx, "l1/sg");
	fchownat(fx.fd, "l1/sg", 0, 777, 0);
	fchmodat(fx.fd, "l1/sg", 02775, 0);

	r = SEND(sfs_op_mkdir, ino_of("sg"), "sub", 0750);
	check_new(&fx, &r, "u/sg/sub", "sg/sub", S_IFDIR | 02750, 777);
	r = SEND(sfs_op_create, ino_of("sg"), "file", 0640, &fi);
	check_new(&fx, &r, "u/sg/file", "sg/file", S_IFREG | 0640, 777);
	if (r.created)
		sfs_file_close(sfs_file_of(&r.fi));
	/* the copied-up directory kept its own bits */
	CHECK_EQ_INT(fx_stat(&fx, "u/sg").st_mode, S_IFDIR | 02775);
	test_done(&fx);
}

static void test_create_refused(void)
{
	struct fuse_file_info fi = { .flags = O_WRONLY | O_CREAT };
	struct fixture fx;

	test_setup(&fx, 1, true);
	fx_file(&fx, "l1/lf", "lower");
	fx_dir(&fx, "l1/ld");
	fx_file(&fx, "l1/ld/x", "lower");

	/* a name a lower layer shows exists, for every kind of creation */
	CHECK_EQ_INT(SEND(sfs_op_mkdir, ROOT, "lf", 0755).err, EEXIST);
	CHECK_EQ_INT(SEND(sfs_op_mknod, ROOT, "lf", S_IFIFO | 0644, 0).err,
		     EEXIST);
	CHECK_EQ_INT(SEND(sfs_op_symlink, "t", ROOT, "lf").err, EEXIST);
	CHECK_EQ_INT(SEND(sfs_op_create, ROOT, "lf", 0644, &fi).err, EEXIST);
	CHECK(!fx_exists(&fx, "u/lf"));
	/* and the refusal copies nothing up */
	CHECK_EQ_INT(SEND(sfs_op_mkdir, ino_of("ld"), "x", 0755).err, EEXIST);
	CHECK(!fx_exists(&fx, "u/ld"));

	/* a whiteout is the overlay's marker, never the user's file */
	CHECK_EQ_INT(SEND(sfs_op_mknod, ROOT, "wh", S_IFCHR, makedev(0, 0)).err,
		     EPERM);
	CHECK(!fx_exists(&fx, "u/wh"));
	CHECK_EQ_INT(ino_of("wh"), 0);
	test_done(&fx);
}

/* Without an upper layer every change is EROFS, and the view stays. */
static void test_readonly(void)
{
	struct fuse_file_info fi = { .flags = O_WRONLY | O_CREAT };
	struct fixture fx;
	fuse_ino_t f;

	test_setup(&fx, 1, false);
	fx_file(&fx, "l1/f", "lower");
	fx_dir(&fx, "l1/d");
	f = ino_of("f");

	CHECK_EQ_INT(SEND(sfs_op_mkdir, ROOT, "n", 0755).err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_mknod, ROOT, "n", S_IFIFO | 0644, 0).err,
		     EROFS);
	CHECK_EQ_INT(SEND(sfs_op_symlink, "t", ROOT, "n").err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_create, ROOT, "n", 0644, &fi).err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_link, f, ROOT, "n").err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "f").err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "d").err, EROFS);
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "f", ROOT, "n", 0).err, EROFS);
	CHECK_EQ_INT(ino_of("f"), f);
	CHECK(ino_of("d") != 0);
	CHECK_EQ_INT(ino_of("n"), 0);
	test_done(&fx);
}

/*
 * Where a lower entry was removed, a new one replaces the whiteout; a
 * directory there is opaque, or the removed lower entries would show
 * through it again.
 */
static void test_create_over_whiteout(void)
{
	struct test_req r;
	struct fixture fx;
	char buf[16];

	test_setup(&fx, 1, true);
	fx_dir(&fx, "l1/d");
	fx_file(&fx, "l1/d/a", "a");
	fx_file(&fx, "l1/d/b", "b");
	fx_file(&fx, "l1/f", "f");

	CHECK_EQ_INT(SEND(sfs_op_unlink, ino_of("d"), "a").err, 0);
	CHECK_EQ_INT(SEND(sfs_op_unlink, ino_of("d"), "b").err, 0);
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "d").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/d"));
	CHECK_EQ_INT(ino_of("d"), 0);

	r = SEND(sfs_op_mkdir, ROOT, "d", 0700);
	check_new(&fx, &r, "u/d", "d", S_IFDIR | 0700, CALLER_GID);
	CHECK_EQ_STR(fx_dir_xattr(&fx, "u/d", "trusted.overlay.opaque", buf,
				  sizeof(buf)), "y");
	/* the old upper dir's whiteouts went with it */
	CHECK_EQ_INT(fx_count(&fx, "u/d"), 0);
	CHECK_EQ_INT(ino_of("d/a"), 0);
	CHECK_EQ_INT(ino_of("d/b"), 0);
	CHECK_EQ_INT(listed("d"), 0);

	/* anything else simply takes the whiteout's place */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "f").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/f"));
	r = SEND(sfs_op_symlink, "target", ROOT, "f");
	check_new(&fx, &r, "u/f", "f", S_IFLNK | 0777, CALLER_GID);
	test_done(&fx);
}

static void test_unlink(void)
{
	struct fixture fx;
	fuse_ino_t lower;

	test_setup(&fx, 1, true);
	fx_file(&fx, "l1/lower", "lower");
	fx_file(&fx, "u/upper", "upper");
	fx_file(&fx, "l1/both", "lower");
	fx_file(&fx, "u/both", "upper copy");
	fx_dir(&fx, "l1/ld");

	/* a lower file stays in its layer, hidden by a whiteout */
	lower = ino_of("lower");
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "lower").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/lower"));
	CHECK(fx_exists(&fx, "l1/lower"));
	CHECK_EQ_INT(ino_of("lower"), 0);
	/* the node the kernel still holds is gone from the view */
	CHECK(atomic_load(&sfs_node_get(lower)->unlinked));

	/* an upper-only file just goes: nothing below to hide */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "upper").err, 0);
	CHECK(!fx_exists(&fx, "u/upper"));
	CHECK_EQ_INT(ino_of("upper"), 0);

	/* an upper copy over a lower file gives way to a whiteout */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "both").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/both"));
	CHECK_EQ_INT(ino_of("both"), 0);

	/* gone is gone, and a file is not a directory nor the reverse */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "lower").err, ENOENT);
	CHECK_EQ_INT(SEND(sfs_op_unlink, ROOT, "ld").err, EISDIR);
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "both").err, ENOENT);
	fx_file(&fx, "l1/f", "f");
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "f").err, ENOTDIR);
	CHECK(!fx_exists(&fx, "u/ld"));
	CHECK(!fx_exists(&fx, "u/f"));
	test_done(&fx);
}

static void test_rmdir(void)
{
	struct fixture fx;

	test_setup(&fx, 1, true);
	fx_dir(&fx, "l1/empty");
	fx_dir(&fx, "l1/full");
	fx_file(&fx, "l1/full/x", "x");
	/* merged: a lower part and an upper part */
	fx_dir(&fx, "l1/m");
	fx_file(&fx, "l1/m/x", "x");
	fx_dir(&fx, "u/m");
	fx_file(&fx, "u/m/y", "y");

	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "full").err, ENOTEMPTY);
	CHECK(!fx_exists(&fx, "u/full"));	/* checked before copy-up */
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "m").err, ENOTEMPTY);
	CHECK(ino_of("m/x") != 0);
	CHECK(ino_of("m/y") != 0);

	/* an empty lower directory is hidden by a whiteout */
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "empty").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/empty"));
	CHECK_EQ_INT(ino_of("empty"), 0);

	/*
	 * A merged directory empty in view (its upper part holds only a
	 * whiteout) goes too: its upper part leaves through the workdir.
	 */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ino_of("m"), "x").err, 0);
	CHECK_EQ_INT(SEND(sfs_op_unlink, ino_of("m"), "y").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/m/x"));
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "m").err, 0);
	CHECK(fx_is_whiteout(&fx, "u/m"));
	CHECK_EQ_INT(ino_of("m"), 0);

	/* an upper-only one leaves nothing behind */
	CHECK_EQ_INT(SEND(sfs_op_mkdir, ROOT, "new", 0755).err, 0);
	CHECK_EQ_INT(SEND(sfs_op_rmdir, ROOT, "new").err, 0);
	CHECK(!fx_exists(&fx, "u/new"));
	CHECK_EQ_INT(ino_of("new"), 0);
	test_done(&fx);
}

/* A link copies its file up; both names then show one inode. */
static void test_link(void)
{
	struct test_req r, a, b;
	struct fixture fx;
	fuse_ino_t f;

	test_setup(&fx, 1, true);
	fx_file(&fx, "l1/f", "data");
	fx_dir(&fx, "l1/d");

	f = ino_of("f");
	r = SEND(sfs_op_link, f, ROOT, "g");
	CHECK_EQ_INT(r.err, 0);
	CHECK_EQ_INT(r.e.ino, f);
	CHECK_EQ_INT(r.e.attr.st_nlink, 2);
	CHECK(fx_exists(&fx, "u/f"));
	CHECK_EQ_INT(fx_stat(&fx, "u/g").st_ino, fx_stat(&fx, "u/f").st_ino);
	CHECK_EQ_INT(fx_stat(&fx, "u/g").st_nlink, 2);
	a = lookup("f");
	b = lookup("g");
	CHECK_EQ_INT(a.e.ino, f);
	CHECK_EQ_INT(b.e.ino, f);
	CHECK_EQ_INT(b.e.attr.st_ino, a.e.attr.st_ino);
	CHECK_EQ_INT(a.e.attr.st_nlink, 2);
	CHECK_EQ_INT(b.e.attr.st_nlink, 2);

	/* into a lower directory, which comes up for it */
	r = SEND(sfs_op_link, f, ino_of("d"), "h");
	CHECK_EQ_INT(r.err, 0);
	CHECK_EQ_INT(fx_stat(&fx, "u/d/h").st_ino, fx_stat(&fx, "u/f").st_ino);
	CHECK_EQ_INT(lookup("d/h").e.ino, f);
	CHECK_EQ_INT(lookup("f").e.attr.st_nlink, 3);

	/* a name the view shows already is not replaced */
	fx_file(&fx, "l1/taken", "t");
	CHECK_EQ_INT(SEND(sfs_op_link, f, ROOT, "taken").err, EEXIST);
	CHECK(!fx_exists(&fx, "u/taken"));
	test_done(&fx);
}

static void test_rename_files(void)
{
	fuse_ino_t a, e, n, p, x;
	struct fixture fx;
	char buf[16];

	test_setup(&fx, 1, true);
	fx_file(&fx, "u/a", "A");
	fx_file(&fx, "l1/c", "C");
	fx_file(&fx, "l1/x", "X");
	fx_file(&fx, "u/e", "E");
	fx_file(&fx, "l1/n", "N");
	fx_file(&fx, "l1/p", "P");
	a = ino_of("a");
	e = ino_of("e");
	n = ino_of("n");
	p = ino_of("p");
	x = ino_of("x");

	/* an upper file: no lower name to hide, so no whiteout */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "a", ROOT, "b", 0).err, 0);
	CHECK(!fx_exists(&fx, "u/a"));
	CHECK_EQ_INT(fx_read(&fx, "u/b", buf, sizeof(buf)), 1);
	CHECK_EQ_STR(buf, "A");
	CHECK_EQ_INT(ino_of("a"), 0);
	CHECK_EQ_INT(ino_of("b"), a);

	/* over a lower name: the moved file covers it */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "b", ROOT, "c", 0).err, 0);
	CHECK(!fx_exists(&fx, "u/b"));
	CHECK_EQ_INT(fx_read(&fx, "u/c", buf, sizeof(buf)), 1);
	CHECK_EQ_STR(buf, "A");
	CHECK_EQ_INT(ino_of("c"), a);

	/* a lower file: copied up, and its old name whited out */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "x", ROOT, "y", 0).err, 0);
	CHECK(fx_is_whiteout(&fx, "u/x"));
	CHECK_EQ_INT(fx_read(&fx, "u/y", buf, sizeof(buf)), 1);
	CHECK_EQ_STR(buf, "X");
	CHECK_EQ_INT(ino_of("x"), 0);
	CHECK_EQ_INT(ino_of("y"), x);

	/* NOREPLACE sees the lower name, though the upper has none */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "e", ROOT, "n",
			  RENAME_NOREPLACE).err, EEXIST);
	CHECK(fx_exists(&fx, "u/e"));
	CHECK(!fx_exists(&fx, "u/n"));
	CHECK_EQ_INT(ino_of("e"), e);
	CHECK_EQ_INT(ino_of("n"), n);

	/* EXCHANGE swaps an upper and a lower file */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "e", ROOT, "p",
			  RENAME_EXCHANGE).err, 0);
	CHECK_EQ_INT(fx_read(&fx, "u/e", buf, sizeof(buf)), 1);
	CHECK_EQ_STR(buf, "P");
	CHECK_EQ_INT(fx_read(&fx, "u/p", buf, sizeof(buf)), 1);
	CHECK_EQ_STR(buf, "E");
	CHECK_EQ_INT(ino_of("e"), p);
	CHECK_EQ_INT(ino_of("p"), e);
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "e", ROOT, "none",
			  RENAME_EXCHANGE).err, ENOENT);

	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "gone", ROOT, "z", 0).err,
		     ENOENT);
	/* RENAME_WHITEOUT is the overlay's own, never the caller's */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "e", ROOT, "z",
			  RENAME_WHITEOUT).err, EINVAL);
	test_done(&fx);
}

static void test_rename_dirs(void)
{
	fuse_ino_t dst;
	struct fixture fx;
	char buf[64];

	test_setup(&fx, 1, true);
	fx_dir(&fx, "l1/src");
	fx_dir(&fx, "l1/src/dir");
	fx_file(&fx, "l1/src/dir/inner", "I");
	fx_dir(&fx, "l1/src/dir2");
	fx_file(&fx, "l1/src/dir2/z", "Z");
	fx_file(&fx, "l1/file", "F");
	fx_dir(&fx, "l1/full");
	fx_file(&fx, "l1/full/x", "x");
	CHECK_EQ_INT(SEND(sfs_op_mkdir, ROOT, "dst", 0755).err, 0);
	dst = ino_of("dst");

	/*
	 * A lower directory moved elsewhere finds its lower content by an
	 * absolute redirect; its old name is whited out.
	 */
	CHECK_EQ_INT(SEND(sfs_op_rename, ino_of("src"), "dir", dst, "moved",
			  0).err, 0);
	CHECK_EQ_STR(fx_dir_xattr(&fx, "u/dst/moved",
				  "trusted.overlay.redirect", buf, sizeof(buf)),
		     "/src/dir");
	CHECK(fx_is_whiteout(&fx, "u/src/dir"));
	CHECK_EQ_INT(ino_of("src/dir"), 0);
	CHECK_EQ_INT(lookup("dst/moved/inner").e.attr.st_size, 1);
	CHECK_EQ_INT(listed("dst/moved"), 1);
	/* moved on again, it still names where its lower content is */
	CHECK_EQ_INT(SEND(sfs_op_rename, dst, "moved", ROOT, "top", 0).err, 0);
	CHECK_EQ_STR(fx_dir_xattr(&fx, "u/top", "trusted.overlay.redirect",
				  buf, sizeof(buf)), "/src/dir");
	CHECK(!fx_exists(&fx, "u/dst/moved"));	/* no lower name there */
	CHECK(ino_of("top/inner") != 0);

	/* within its directory, by its old name alone */
	CHECK_EQ_INT(SEND(sfs_op_rename, ino_of("src"), "dir2", ino_of("src"),
			  "dir3", 0).err, 0);
	CHECK_EQ_STR(fx_dir_xattr(&fx, "u/src/dir3", "trusted.overlay.redirect",
				  buf, sizeof(buf)), "dir2");
	CHECK(fx_is_whiteout(&fx, "u/src/dir2"));
	CHECK(ino_of("src/dir3/z") != 0);

	/* the types must match, and a directory replaced must be empty */
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "dst", ROOT, "file", 0).err,
		     ENOTDIR);
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "file", ROOT, "dst", 0).err,
		     EISDIR);
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "dst", ROOT, "full", 0).err,
		     ENOTEMPTY);

	/*
	 * An upper directory put where a lower one is empty in view is
	 * opaque, or the lower entries hidden by whiteouts in the upper
	 * part it replaces would show through it.
	 */
	CHECK_EQ_INT(SEND(sfs_op_unlink, ino_of("full"), "x").err, 0);
	CHECK_EQ_INT(SEND(sfs_op_rename, ROOT, "dst", ROOT, "full", 0).err, 0);
	CHECK_EQ_STR(fx_dir_xattr(&fx, "u/full", "trusted.overlay.opaque", buf,
				  sizeof(buf)), "y");
	CHECK(!fx_exists(&fx, "u/dst"));
	CHECK_EQ_INT(ino_of("full"), dst);
	CHECK_EQ_INT(ino_of("full/x"), 0);
	CHECK_EQ_INT(listed("full"), 0);
	test_done(&fx);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	/* as the daemon: the kernel masked the modes already */
	sfs_process_init();
	test_create_new();
	test_create_setgid();
	test_create_refused();
	test_readonly();
	test_create_over_whiteout();
	test_unlink();
	test_rmdir();
	test_link();
	test_rename_files();
	test_rename_dirs();
	return unit_done("test_dir");
}
