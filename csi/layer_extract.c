// SPDX-License-Identifier: Apache-2.0
/*
 * Layer import, the half that reads the archive (layer.c is the other).
 * It runs in a child process of the plugin (csi_child_run): the plugin is
 * multi-threaded and must never change its working directory, while
 * libarchive's disk writer resolves every name from the working
 * directory. The child enters the new layer's temporary directory,
 * chroots there and extracts; whatever it writes, and however it dies,
 * lands below that directory, which the plugin renames into place only
 * when the child exited 0.
 *
 * Three fences keep each name below the layer, any one of them enough:
 *   - every name, and every hard link's target, is checked here first:
 *     no absolute name, no ".." component;
 *   - libarchive's own checks (ARCHIVE_EXTRACT_SECURE_*), which also
 *     refuse to write through a symlink an earlier entry made;
 *   - the chroot, for whatever both missed.
 * The whiteouts (which libarchive knows nothing of) are made here
 * through openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS).
 *
 * OCI whiteouts become the kernel overlayfs format the daemon reads:
 * ".wh.NAME" a character device 0/0 named NAME, ".wh..wh..opq" the xattr
 * trusted.overlay.opaque=y on its directory.
 *
 * The child says what went wrong on its pipe, one line naming the
 * entry, and exits with the errno: -EINVAL for an entry refused,
 * -EBADMSG for an archive that does not read, -ENOSPC and the like as
 * they come.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "csi.h"

#define CSI_WH_PREFIX ".wh."
#define CSI_WH_OPAQUE ".wh..wh..opq"
/* aufs' own bookkeeping (".wh..wh.plnk" and the like): not layer content */
#define CSI_WH_META ".wh..wh."
#define CSI_OPAQUE_XATTR "trusted.overlay.opaque"
#define CSI_RESOLVE_IN (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | \
			RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)

/* Everything the archive may restore, and the checks that confine it. */
#define CSI_EXTRACT_FLAGS (ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | \
	ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_ACL | ARCHIVE_EXTRACT_XATTR | \
	ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS | \
	ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS)

struct csi_extract {
	int wfd;		/* the pipe to the plugin */
	int root;		/* O_PATH on the layer's root, in the chroot */
	bool root_entry;	/* the archive sets the root's own metadata */
};

/* The message for the plugin, and the errno to exit with. */
static int csi_extract_fail(struct csi_extract *x, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int csi_extract_fail(struct csi_extract *x, int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (len > 0 && write(x->wfd, msg, (size_t)len < sizeof(msg) ?
			     (size_t)len : sizeof(msg) - 1) < 0)
		err = -EIO;
	return err;
}

/*
 * Why `name` may not be written below the layer, or NULL when it may.
 * The checks libarchive makes again, made first so that the answer is
 * the same whatever libarchive's version, and so that whiteouts, which
 * never reach libarchive's writer, are checked alike.
 */
static const char *csi_extract_name_bad(const char *name)
{
	const char *c = name;

	if (!*name)
		return "an empty name";
	if (*name == '/')
		return "an absolute name";
	while (*c) {
		size_t len = strcspn(c, "/");

		if (len == 2 && c[0] == '.' && c[1] == '.')
			return "a '..' component";
		c += len;
		c += *c == '/';
	}
	return NULL;
}

/* Whether `name` ("", ".", "./", ".//.") names the layer's root itself. */
static bool csi_extract_is_root(const char *name)
{
	for (; *name; name++)
		if (*name != '.' && *name != '/')
			return false;
	return true;
}

/*
 * Opens directory `dir` below the root for a whiteout, making the
 * directories it lacks: an archive may name a whiteout before (or
 * without) its directory. Never through a symlink.
 */
static int csi_extract_dir(struct csi_extract *x, const char *dir, int *fd)
{
	char path[PATH_MAX], *comp, *save = NULL;
	int cur, next;

	if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	cur = csi_openat2(x->root, ".", O_RDONLY | O_DIRECTORY, CSI_RESOLVE_IN);
	if (cur < 0)
		return cur;
	for (comp = strtok_r(path, "/", &save); comp;
	     comp = strtok_r(NULL, "/", &save)) {
		if (!strcmp(comp, "."))
			continue;
		if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
			next = -errno;
			goto out;
		}
		next = csi_openat2(cur, comp, O_RDONLY | O_DIRECTORY,
				   CSI_RESOLVE_IN);
out:
		close(cur);
		if (next < 0)
			return next;
		cur = next;
	}
	*fd = cur;
	return 0;
}

static const char *csi_extract_dir_error(int err)
{
	return err == -ELOOP || err == -EXDEV ?
		       "its directory is a symlink, and layers are never written through links" :
		       err == -ENOTDIR ? "its directory is not a directory" :
		       strerror(-err);
}

/* ".wh.NAME" and ".wh..wh..opq": the kernel's form of the OCI markers. */
static int csi_extract_whiteout(struct csi_extract *x, const char *entry,
				const char *dir, const char *base)
{
	const char *name = base + strlen(CSI_WH_PREFIX);
	int dfd, ret;

	if (strcmp(base, CSI_WH_OPAQUE) && !strncmp(base, CSI_WH_META,
						     strlen(CSI_WH_META)))
		return 0;
	if (strcmp(base, CSI_WH_OPAQUE) &&
	    (!*name || !strcmp(name, ".") || !strcmp(name, "..")))
		return csi_extract_fail(x, -EINVAL,
					"entry '%s': a whiteout of no name", entry);
	ret = csi_extract_dir(x, dir, &dfd);
	if (ret)
		return csi_extract_fail(x, ret == -ENOSPC ? ret : -EINVAL,
					"entry '%s': %s", entry,
					csi_extract_dir_error(ret));
	if (!strcmp(base, CSI_WH_OPAQUE)) {
		if (fsetxattr(dfd, CSI_OPAQUE_XATTR, "y", 1, 0) < 0)
			ret = csi_extract_fail(x, -errno,
					       "entry '%s': setting %s on its directory: %s",
					       entry, CSI_OPAQUE_XATTR,
					       strerror(errno));
	} else if (mknodat(dfd, name, S_IFCHR | 0000, makedev(0, 0)) < 0) {
		ret = csi_extract_fail(x, errno == EEXIST ? -EINVAL : -errno,
				       "entry '%s': the whiteout of '%s': %s",
				       entry, name, errno == EEXIST ?
				       "the layer holds that name too" :
				       strerror(errno));
	}
	close(dfd);
	return ret;
}

/*
 * The overlay xattrs tell the daemon where to look (redirect, origin,
 * metacopy): an archive may not set them, or a layer could point at
 * what its author chose. The opaque marker alone is plain content, the
 * same as ".wh..wh..opq" (a tar of a kernel overlay upper carries it).
 */
static const char *csi_extract_xattr_bad(struct archive_entry *e)
{
	const char *name;
	const void *value;
	size_t size;

	archive_entry_xattr_reset(e);
	while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
		const char *ovl = strstr(name, "overlay.");

		if ((!strncmp(name, "trusted.overlay.", 16) ||
		     !strncmp(name, "user.overlay.", 13)) &&
		    strcmp(ovl, "overlay.opaque"))
			return name;
	}
	return NULL;
}

static int csi_extract_data(struct csi_extract *x, struct archive *in,
			    struct archive *out, const char *entry)
{
	const void *buf;
	size_t size;
	la_int64_t off;
	int ret;

	for (;;) {
		ret = archive_read_data_block(in, &buf, &size, &off);
		if (ret == ARCHIVE_EOF)
			return 0;
		if (ret < ARCHIVE_WARN)
			return csi_extract_fail(x, -EBADMSG,
						"entry '%s': the archive is damaged or truncated: %s",
						entry, archive_error_string(in));
		if (archive_write_data_block(out, buf, size, off) < ARCHIVE_WARN)
			return csi_extract_fail(x, -archive_errno(out) ?: -EIO,
						"entry '%s': writing it: %s", entry,
						archive_error_string(out));
	}
}

/* One entry of the archive, checked, then written or made a whiteout. */
static int csi_extract_entry(struct csi_extract *x, struct archive *in,
			     struct archive *out, struct archive_entry *e)
{
	const char *entry = archive_entry_pathname(e);
	const char *link = archive_entry_hardlink(e);
	const char *why, *base;
	char dir[PATH_MAX];
	int ret;

	if (!entry)
		return csi_extract_fail(x, -EINVAL,
					"an entry whose name cannot be read");
	why = csi_extract_name_bad(entry);
	if (why)
		return csi_extract_fail(x, -EINVAL,
					"entry '%s': %s, and every entry must stay below the layer",
					entry, why);
	if (link && (why = csi_extract_name_bad(link)))
		return csi_extract_fail(x, -EINVAL,
					"entry '%s': a hard link to '%s', %s, and every link must stay below the layer",
					entry, link, why);
	why = csi_extract_xattr_bad(e);
	if (why)
		return csi_extract_fail(x, -EINVAL,
					"entry '%s': carries the xattr %s, which only the plugin sets",
					entry, why);
	base = strrchr(entry, '/');
	base = base ? base + 1 : entry;
	if (!strncmp(base, CSI_WH_PREFIX, strlen(CSI_WH_PREFIX))) {
		snprintf(dir, sizeof(dir), "%.*s", (int)(base - entry), entry);
		return csi_extract_whiteout(x, entry, dir, base);
	}
	if (csi_extract_is_root(entry))
		x->root_entry = true;
	ret = archive_write_header(out, e);
	if (ret < ARCHIVE_WARN) {
		int err = archive_errno(out);

		return csi_extract_fail(x, err == ENOSPC || err == EDQUOT ?
					-err : -EINVAL, "entry '%s': %s", entry,
					archive_error_string(out));
	}
	if (archive_entry_size(e) > 0) {
		ret = csi_extract_data(x, in, out, entry);
		if (ret)
			return ret;
	}
	if (archive_write_finish_entry(out) < ARCHIVE_WARN)
		return csi_extract_fail(x, -archive_errno(out) ?: -EIO,
					"entry '%s': %s", entry,
					archive_error_string(out));
	return 0;
}

static int csi_extract_all(struct csi_extract *x, struct archive *in,
			   struct archive *out, const char *path)
{
	struct archive_entry *e;
	int ret;

	for (;;) {
		ret = archive_read_next_header(in, &e);
		if (ret == ARCHIVE_EOF)
			return 0;
		if (ret < ARCHIVE_WARN)
			return csi_extract_fail(x, -EBADMSG,
						"%s is not a tar archive (plain, gzip, zstd, xz or bzip2), or is damaged or truncated: %s",
						path, archive_error_string(in));
		ret = csi_extract_entry(x, in, out, e);
		if (ret)
			return ret;
	}
}

/*
 * In the child: extracts the archive open at `arg->fd` into the
 * directory open at `arg->dir`, which becomes its working directory and
 * root. Returns 0 or the -errno to exit with, its message on `wfd`.
 */
int csi_layer_extract_child(void *arg, int wfd)
{
	const struct csi_layer_job *job = arg;
	struct csi_extract x = { .wfd = wfd, .root = -1 };
	struct archive *in = NULL, *out = NULL;
	int ret;

	/*
	 * The child holds what the plugin held at fork, the store's lock
	 * among it: a plugin killed mid-import must not leave it extracting
	 * into a directory the next plugin sweeps, nor keep that plugin out.
	 */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != job->parent)
		return -ECHILD;
	if (fchdir(job->dir) < 0)
		return csi_extract_fail(&x, -errno, "entering the new layer: %s",
					strerror(errno));
	/* the last fence; a plugin without CAP_SYS_CHROOT keeps the other two */
	if (chroot(".") < 0 && errno != EPERM)
		return csi_extract_fail(&x, -errno, "chroot into the new layer: %s",
					strerror(errno));
	/* modes as the archive gives them, not as the plugin's umask cuts them */
	umask(0);
	x.root = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	in = archive_read_new();
	out = archive_write_disk_new();
	if (x.root < 0 || !in || !out) {
		ret = csi_extract_fail(&x, -ENOMEM, "setting up the extraction");
		goto out;
	}
	archive_read_support_format_tar(in);
	archive_read_support_filter_gzip(in);
	archive_read_support_filter_zstd(in);
	archive_read_support_filter_xz(in);
	archive_read_support_filter_bzip2(in);
	/* numeric owners, as OCI layers mean them: no lookup by name */
	archive_write_disk_set_options(out, CSI_EXTRACT_FLAGS);
	if (archive_read_open_fd(in, job->fd, 64 * 1024) != ARCHIVE_OK) {
		ret = csi_extract_fail(&x, -EBADMSG,
				       "%s is not a tar archive (plain, gzip, zstd, xz or bzip2): %s",
				       job->path, archive_error_string(in));
		goto out;
	}
	ret = csi_extract_all(&x, in, out, job->path);
	if (!ret && archive_write_close(out) != ARCHIVE_OK)
		ret = csi_extract_fail(&x, -archive_errno(out) ?: -EIO,
				       "finishing the layer: %s",
				       archive_error_string(out));
	/* the daemons read the layer: its root is theirs to enter */
	if (!ret && !x.root_entry && chmod(".", 0755) < 0)
		ret = csi_extract_fail(&x, -errno, "chmod of the layer's root: %s",
				       strerror(errno));
out:
	if (out)
		archive_write_free(out);
	if (in)
		archive_read_free(in);
	if (x.root >= 0)
		close(x.root);
	return ret;
}
