// SPDX-License-Identifier: Apache-2.0
/*
 * The daemon binary on the host (--daemon-binary-dir DIR). A daemon that
 * executes the stratafs of the plugin's container image, or maps its
 * libraries, holds files of that image: the runtime cannot remove the
 * image's root filesystem under it, and an upgrade would have to. So the
 * plugin copies stratafs, with its ELF interpreter and every library
 * the interpreter loads for it, into DIR/stratafs-<version>-<hash>/, so
 * that neither the image's files nor the host's libraries are used.
 *
 * The copy's interpreter (PT_INTERP) is rewritten to the interpreter's
 * bare name, which the kernel resolves against the working directory at
 * exec: the child changes into the bundle, and the kernel loads the
 * bundle's own interpreter, which finds the libraries through
 * LD_LIBRARY_PATH. Running the interpreter as a program instead would
 * make /proc/<pid>/exe the interpreter, put its options in the daemon's
 * command line, and hide the interpreter from tools that find it by
 * AT_BASE (LeakSanitizer then reports its allocations as leaks).
 *
 * The name holds a hash of every copied byte: an upgrade that changes
 * any of them makes a new directory, and a running daemon's files are
 * never written again. A directory is built under a temporary name and
 * renamed into place, so a crash or a full disk leaves no half-made one
 * under the final name. A copy no process runs any more is removed when
 * a newer one is made current.
 */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csi.h"

#define CSI_BUNDLE_MAX 32 /* the binary, its interpreter and libraries */
#define CSI_BUNDLE_CURRENT "current"

struct csi_bundle {
	int n;
	char *src[CSI_BUNDLE_MAX];	/* where the plugin found each file */
	char *name[CSI_BUNDLE_MAX];	/* its name in the bundle */
	int interp;			/* index of the interpreter, or -1 */
	off_t interp_off;		/* where the binary names it, */
	size_t interp_size;		/* and how many bytes, NUL included */
};

/* Adds src, named `name` in the bundle (NULL: its own base name). */
static int csi_bundle_add(struct csi_bundle *b, const char *src,
			  const char *name)
{
	if (b->n == CSI_BUNDLE_MAX)
		return -E2BIG;
	if (!name)
		name = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
	b->src[b->n] = strdup(src);
	b->name[b->n] = strdup(name);
	if (!b->src[b->n] || !b->name[b->n] || strchr(name, '/')) {
		free(b->src[b->n]);
		free(b->name[b->n]);
		return strchr(name, '/') ? -EINVAL : -ENOMEM;
	}
	b->n++;
	return 0;
}

static void csi_bundle_free(struct csi_bundle *b)
{
	for (int i = 0; i < b->n; i++) {
		free(b->src[i]);
		free(b->name[i]);
	}
	b->n = 0;
}

/*
 * The ELF interpreter (PT_INTERP) of a 64-bit binary, "" when static, and
 * where the binary holds its name.
 */
static int csi_elf_interp(const char *path, char *interp, size_t size,
			  struct csi_bundle *b)
{
	Elf64_Ehdr eh;
	Elf64_Phdr ph;
	int fd, ret = -ENOEXEC;

	interp[0] = '\0';
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (pread(fd, &eh, sizeof(eh), 0) != sizeof(eh) ||
	    memcmp(eh.e_ident, ELFMAG, SELFMAG) ||
	    eh.e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh.e_phentsize != sizeof(ph))
		goto out;
	ret = 0;
	for (int i = 0; i < eh.e_phnum; i++) {
		if (pread(fd, &ph, sizeof(ph), eh.e_phoff + i * sizeof(ph)) !=
		    sizeof(ph)) {
			ret = -ENOEXEC;
			break;
		}
		if (ph.p_type != PT_INTERP)
			continue;
		if (ph.p_filesz == 0 || ph.p_filesz >= size ||
		    pread(fd, interp, ph.p_filesz, ph.p_offset) != (ssize_t)ph.p_filesz)
			ret = -ENOEXEC;
		else
			interp[ph.p_filesz - 1] = '\0';
		b->interp_off = ph.p_offset;
		b->interp_size = ph.p_filesz;
		break;
	}
out:
	close(fd);
	return ret;
}

/* The copy names its interpreter by its bare name: see the top. */
static int csi_elf_set_interp(int dirfd, const struct csi_bundle *b)
{
	char name[PATH_MAX] = { 0 };
	const char *interp = b->name[b->interp];
	int fd, ret = 0;

	if (strlen(interp) >= b->interp_size)
		return -ENAMETOOLONG;
	memcpy(name, interp, strlen(interp));
	fd = openat(dirfd, b->name[0], O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (pwrite(fd, name, b->interp_size, b->interp_off) != (ssize_t)b->interp_size ||
	    fsync(fd) < 0)
		ret = errno ? -errno : -EIO;
	close(fd);
	return ret;
}

/*
 * The libraries the interpreter loads for the binary, as its --list says:
 * lines "\tNAME => /PATH (0x...)". A library it cannot find is an error.
 */
struct csi_list {
	const char *interp;
	const char *bin;
};

static int csi_bundle_list(void *arg, int wfd)
{
	const struct csi_list *l = arg;
	char *argv[] = { (char *)l->interp, "--list", (char *)l->bin, NULL };

	if (dup2(wfd, 1) < 0)
		return -errno;
	execv(l->interp, argv);
	return -errno;
}

static int csi_bundle_libs(struct csi_bundle *b, const char *interp,
			   const char *bin, char *why, size_t size)
{
	char out[16384], *line, *save = NULL;
	size_t len;
	int ret;

	ret = csi_child_run(csi_bundle_list, &(struct csi_list){ interp, bin },
			    out, sizeof(out) - 1, &len);
	if (ret) {
		snprintf(why, size, "%s --list %s failed: %s", interp, bin,
			 strerror(-ret));
		return ret;
	}
	out[len] = '\0';
	for (line = strtok_r(out, "\n", &save); line && !ret;
	     line = strtok_r(NULL, "\n", &save)) {
		char *arrow = strstr(line, " => "), *end;

		if (!arrow)
			continue;	/* the vdso, or the interpreter itself */
		arrow += 4;
		end = strstr(arrow, " (");
		if (arrow[0] != '/' || !end) {
			snprintf(why, size, "%s needs a library that cannot be found: %s",
				 bin, line + strspn(line, " \t"));
			return -ENOENT;
		}
		*end = '\0';
		*strstr(line, " => ") = '\0';
		/* named as the binary asks for it (its soname), not as on disk */
		ret = csi_bundle_add(b, arrow, line + strspn(line, " \t"));
	}
	return ret;
}

/* FNV-1a, 64 bits, over each file's name and bytes. */
static int csi_bundle_hash(const struct csi_bundle *b, uint64_t *hash)
{
	char buf[65536];
	uint64_t h = 0xcbf29ce484222325ULL;

	for (int i = 0; i < b->n; i++) {
		int fd = open(b->src[i], O_RDONLY | O_CLOEXEC);
		ssize_t n;

		if (fd < 0)
			return -errno;
		for (const char *c = b->name[i]; *c; c++)
			h = (h ^ (unsigned char)*c) * 0x100000001b3ULL;
		while ((n = read(fd, buf, sizeof(buf))) > 0)
			for (ssize_t j = 0; j < n; j++)
				h = (h ^ (unsigned char)buf[j]) * 0x100000001b3ULL;
		close(fd);
		if (n < 0)
			return -errno;
	}
	*hash = h;
	return 0;
}

static int csi_copy_file(const char *src, int dirfd, const char *name)
{
	char buf[65536];
	int in, out, ret = 0;
	ssize_t n;

	in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return -errno;
	out = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
	if (out < 0) {
		ret = -errno;
		close(in);
		return ret;
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (write(out, buf, n) != n) {
			ret = errno ? -errno : -EIO;
			break;
		}
	if (n < 0)
		ret = -errno;
	if (!ret && fsync(out) < 0)
		ret = -errno;
	if (close(out) < 0 && !ret)
		ret = -errno;
	close(in);
	return ret;
}

/* Temp directories of a plugin that died while copying. */
static void csi_bundle_clean(int dirfd)
{
	DIR *d = strata_opendir_at(dirfd, ".");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, ".tmp-", 5))
			strata_rmtree_at(dirfd, e->d_name);
	closedir(d);
}

static int csi_bundle_write(const struct csi_bundle *b, int dirfd,
			    const char *final, char *why, size_t size)
{
	char tmp[NAME_MAX + 8];
	int fd, ret = 0;

	snprintf(tmp, sizeof(tmp), ".tmp-%s", final);
	if (mkdirat(dirfd, tmp, 0755) < 0) {
		ret = -errno;
		snprintf(why, size, "%s: %s", tmp, strerror(errno));
		return ret;
	}
	fd = openat(dirfd, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		ret = -errno;
	for (int i = 0; !ret && i < b->n; i++) {
		ret = csi_copy_file(b->src[i], fd, b->name[i]);
		if (ret)
			snprintf(why, size, "copying %s: %s", b->src[i],
				 strerror(-ret));
	}
	if (!ret && b->interp >= 0) {
		ret = csi_elf_set_interp(fd, b);
		if (ret)
			snprintf(why, size, "naming the interpreter in the copy of %s: %s",
				 b->src[0], strerror(-ret));
	}
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (!ret && renameat(dirfd, tmp, dirfd, final) < 0) {
		/* another plugin made the same one meanwhile: the same bytes */
		ret = errno == EEXIST || errno == ENOTEMPTY ? 0 : -errno;
		strata_rmtree_at(dirfd, tmp);
		return ret;
	}
	if (ret) {
		if (!why[0])
			snprintf(why, size, "%s: %s", tmp, strerror(-ret));
		strata_rmtree_at(dirfd, tmp);
		return ret;
	}
	return fsync(dirfd) < 0 ? -errno : 0;
}

/*
 * DIR/current names the newest copy: the daemons' supervisors exec
 * DIR/current/stratafs when asked for a new worker (admin.c), which is
 * how a plugin upgrade reaches daemons that run on. Replaced by a rename,
 * so that it always names a whole copy.
 */
static int csi_bundle_point(int dirfd, const char *final)
{
	static const char tmp[] = ".tmp-" CSI_BUNDLE_CURRENT;

	unlinkat(dirfd, tmp, 0);
	if (symlinkat(final, dirfd, tmp) < 0)
		return -errno;
	if (renameat(dirfd, tmp, dirfd, CSI_BUNDLE_CURRENT) < 0) {
		int ret = -errno;

		unlinkat(dirfd, tmp, 0);
		return ret;
	}
	return fsync(dirfd) < 0 ? -errno : 0;
}

/* Whether a process on the host runs a program from DIR/name. */
static bool csi_bundle_used(const char *dir, const char *name)
{
	char prefix[PATH_MAX], path[NAME_MAX + 16], exe[PATH_MAX];
	DIR *proc = opendir("/proc");
	struct dirent *e;
	bool used = false;
	size_t len;

	if (!proc)
		return true;	/* cannot tell: keep it */
	len = (size_t)snprintf(prefix, sizeof(prefix), "%s/%s/", dir, name);
	while (!used && (e = readdir(proc))) {
		ssize_t n;

		if (e->d_name[0] < '1' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/exe", e->d_name);
		n = readlink(path, exe, sizeof(exe) - 1);
		if (n < 0)
			continue;
		exe[n] = '\0';
		used = !strncmp(exe, prefix, len);
	}
	closedir(proc);
	return used;
}

/*
 * Copies no daemon runs any more: an older plugin's, once its daemons
 * were replaced or stopped. The one being pointed at stays, whatever.
 */
static void csi_bundle_sweep(int dirfd, const char *final)
{
	char dir[PATH_MAX], path[64];
	DIR *d;
	struct dirent *e;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", dirfd);
	n = readlink(path, dir, sizeof(dir) - 1);
	if (n < 0)
		return;
	dir[n] = '\0';
	d = strata_opendir_at(dirfd, ".");
	if (!d)
		return;
	while ((e = readdir(d)))
		if (!strncmp(e->d_name, "stratafs-", 9) &&
		    strcmp(e->d_name, final) &&
		    !csi_bundle_used(dir, e->d_name)) {
			strata_info("removing %s/%s: no daemon runs it",
				    dir, e->d_name);
			strata_rmtree_at(dirfd, e->d_name);
		}
	closedir(d);
}

/*
 * Copies the daemon binary into the binary directory (once per content)
 * and points the host at it: h->exec is what the child executes, from
 * h->libdir, with h->ldpath and h->binpath in its environment.
 */
int csi_bundle_prepare(struct csi_plugin *p, char *why, size_t size)
{
	struct csi_host *h = &p->host;
	const char *dir = p->cfg.daemon_bindir;
	struct csi_bundle b = { .interp = -1 };
	char interp[PATH_MAX], final[NAME_MAX + 1];
	int dirfd = -1, ret;
	uint64_t hash;

	why[0] = '\0';
	if (mkdir(dir, 0755) == 0 || errno == EEXIST)
		dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		ret = -errno;
		snprintf(why, size, "%s: %s", dir, strerror(errno));
		return ret;
	}
	csi_bundle_clean(dirfd);
	ret = csi_elf_interp(p->cfg.stratafs, interp, sizeof(interp), &b);
	if (ret) {
		snprintf(why, size, "%s: %s", p->cfg.stratafs,
			 ret == -ENOEXEC ? "not a 64-bit ELF program" : strerror(-ret));
		goto out;
	}
	ret = csi_bundle_add(&b, p->cfg.stratafs, "stratafs");
	if (!ret && interp[0]) {
		b.interp = b.n;
		ret = csi_bundle_add(&b, interp, NULL);
		if (!ret)
			ret = csi_bundle_libs(&b, interp, p->cfg.stratafs, why, size);
	}
	if (!ret)
		ret = csi_bundle_hash(&b, &hash);
	if (ret) {
		if (!why[0])
			snprintf(why, size, "reading %s: %s", p->cfg.stratafs,
				 strerror(-ret));
		goto out;
	}
	snprintf(final, sizeof(final), "stratafs-%s-%016llx", STRATA_VERSION,
		 (unsigned long long)hash);
	if (faccessat(dirfd, final, F_OK, 0) < 0) {
		ret = csi_bundle_write(&b, dirfd, final, why, size);
		if (ret) {
			char msg[512];

			snprintf(msg, sizeof(msg), "copying the daemon into %s: %s",
				 dir, why[0] ? why : strerror(-ret));
			snprintf(why, size, "%s", msg);
			goto out;
		}
		strata_info("stratafs copied to %s/%s", dir, final);
	}
	ret = csi_bundle_point(dirfd, final);
	if (ret) {
		snprintf(why, size, "pointing %s/%s at %s: %s", dir,
			 CSI_BUNDLE_CURRENT, final, strerror(-ret));
		goto out;
	}
	csi_bundle_sweep(dirfd, final);
	if (asprintf(&h->libdir, "%s/%s", dir, final) < 0 ||
	    asprintf(&h->exec, "%s/%s/stratafs", dir, final) < 0 ||
	    asprintf(&h->ldpath, "LD_LIBRARY_PATH=%s/%s", dir, final) < 0 ||
	    asprintf(&h->binpath, "STRATAFS_BINARY=%s/%s/stratafs", dir,
		     CSI_BUNDLE_CURRENT) < 0) {
		ret = -ENOMEM;
		snprintf(why, size, "%s", strerror(ENOMEM));
	}
out:
	csi_bundle_free(&b);
	close(dirfd);
	return ret;
}
