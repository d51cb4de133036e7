// SPDX-License-Identifier: Apache-2.0
/*
 * Layer names (csi/validate.c, csi/store.c, csi/controller.c): the input
 * is the "layers" value of a StorageClass or an inline volume, as a pod
 * author may write it.
 *
 * A scratch store whose layers/ holds real layers, and symlinks and
 * files an admin (or an attacker with a foothold) could have put there:
 * links to /etc, to "..", to the store's volumes, back into layers/ by
 * an absolute path, a loop. For each input:
 *  - the list splits into exactly the names it holds, and joins back;
 *  - a name the checker accepts is one plain component: no '/', no
 *    "..", not hidden, nothing the stratafs option syntax or a shell
 *    reads specially, no control character;
 *  - csi_layer_open opens exactly the real directories in layers/, and
 *    the descriptor it gives is that entry, beneath layers/: never a
 *    symlink's target, never anything outside;
 *  - csi_layers_check accepts a list exactly when all of that holds for
 *    every name, and none is listed twice.
 */
#include <sys/stat.h>

#include "csi.h"
#include "fuzz.h"

static struct csi_plugin fz_p;
static char fz_layers_path[PATH_MAX];

static void fz_populate(int fd, const char *root)
{
	static const char *const dirs[] = { "base", "base-2", "a.b", "x_1",
					    "base/inner" };
	char abs[PATH_MAX];
	int file;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		FZ_CHECK(mkdirat(fd, dirs[i], 0755) == 0);
	snprintf(abs, sizeof(abs), "%s/layers/base", root);
	FZ_CHECK(symlinkat("/etc", fd, "evil") == 0);
	FZ_CHECK(symlinkat("..", fd, "up") == 0);
	FZ_CHECK(symlinkat("../volumes", fd, "vol") == 0);
	FZ_CHECK(symlinkat(abs, fd, "abs") == 0);
	FZ_CHECK(symlinkat("loop", fd, "loop") == 0);
	file = openat(fd, "file", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	FZ_CHECK(file >= 0);
	close(file);
}

/* A name safe to hand to a path, a mount option and a log line. */
static bool fz_plain_name(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > CSI_LAYER_NAME_MAX || name[0] == '.' ||
	    strstr(name, ".."))
		return false;
	for (const char *c = name; *c; c++)
		if ((unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f ||
		    strchr("/,:\\=\"'$`*?[]{}()<>|&;!~#%", *c))
			return false;
	return true;
}

/* fd is the directory layers/NAME itself: no link was followed. */
static void fz_check_beneath(int fd, const char *name)
{
	char link[64], path[PATH_MAX], want[PATH_MAX + 256];
	struct stat got, entry;
	ssize_t n;

	FZ_CHECK(fstat(fd, &got) == 0 && S_ISDIR(got.st_mode));
	FZ_CHECK(fstatat(fz_p.store.layers_fd, name, &entry,
			 AT_SYMLINK_NOFOLLOW) == 0);
	FZ_CHECK(S_ISDIR(entry.st_mode));
	FZ_CHECK(got.st_dev == entry.st_dev && got.st_ino == entry.st_ino);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	FZ_CHECK(n > 0);
	path[n] = '\0';
	snprintf(want, sizeof(want), "%s/%s", fz_layers_path, name);
	FZ_CHECK(!strcmp(path, want));
}

/* Checks one name; true when it is a layer a volume may use. */
static bool fz_check_name(const char *name)
{
	struct stat st;
	bool accepted = csi_layer_name_check(name) == 0, is_dir;
	int fd;

	if (accepted)
		FZ_CHECK(fz_plain_name(name));
	fd = csi_layer_open(&fz_p.store, name);
	if (!accepted) {
		FZ_CHECK(fd == -EINVAL);
		return false;
	}
	is_dir = fstatat(fz_p.store.layers_fd, name, &st,
			 AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
	FZ_CHECK((fd >= 0) == is_dir);
	if (fd < 0)
		return false;
	fz_check_beneath(fd, name);
	close(fd);
	return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char root[PATH_MAX];

	fz_quiet();
	snprintf(root, sizeof(root), "%s/store", fz_scratch());
	FZ_CHECK(csi_store_open(&fz_p.store, root) == 0);
	FZ_CHECK(realpath(root, fz_layers_path) != NULL);
	strncat(fz_layers_path, "/layers",
		sizeof(fz_layers_path) - strlen(fz_layers_path) - 1);
	fz_populate(fz_p.store.layers_fd, root);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *list = fz_strndup(data, size), **names, why[512] = "";
	struct csi_volume v = { 0 };
	bool usable = true;
	int count, ret, commas = 0;
	size_t joined = 0;

	for (const char *c = list; *c; c++)
		commas += *c == ',';
	ret = csi_split_layers(list, &names, &count);
	if (ret == -E2BIG) {
		FZ_CHECK(commas >= CSI_MAX_LAYERS);
		usable = false;
		goto check_all;
	}
	FZ_CHECK(ret == 0);
	if (!*list) {
		FZ_CHECK(count == 0 && names == NULL);
		goto check_all;
	}
	FZ_CHECK(count == commas + 1 && count <= CSI_MAX_LAYERS);
	for (int i = 0; i < count; i++) {
		size_t len = strlen(names[i]);

		/* the names, joined by ',', are the list again */
		FZ_CHECK(!strchr(names[i], ','));
		FZ_CHECK(!strncmp(list + joined, names[i], len));
		joined += len;
		FZ_CHECK(list[joined] == (i + 1 < count ? ',' : '\0'));
		joined++;
		if (!fz_check_name(names[i]))
			usable = false;
		for (int j = 0; j < i; j++)
			if (!strcmp(names[i], names[j]))
				usable = false;
	}
	csi_free_strv(names, count);

check_all:
	ret = csi_layers_check(&fz_p, &v, list, why, sizeof(why));
	FZ_CHECK((ret == 0) == usable);
	if (ret)
		FZ_CHECK(ret == -EINVAL && why[0]);
	csi_volume_free(&v);
	free(list);
	return 0;
}
