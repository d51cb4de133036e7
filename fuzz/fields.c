// SPDX-License-Identifier: Apache-2.0
/*
 * Request fields checked before they can name a path or an option
 * (csi/validate.c, csi/store.c): volume ids, kubelet's paths, and the
 * volume options of a StorageClass or an inline volume.
 *
 * The input is NUL-separated strings: the first is tried as a volume id
 * and as a path, the rest are key/value pairs of the options map. On a
 * scratch store holding one real volume:
 *  - an id the checker accepts is "sv-" and 32 lowercase hex digits, so
 *    it can never be a path; the store loads, sizes and deletes nothing
 *    for any other, and the real volume survives every input (its size
 *    comes from the usage file its daemon would have left);
 *  - an accepted path is absolute, short enough, free of control
 *    characters and of ".." components;
 *  - the options are accepted exactly when every key is ours (layers,
 *    passthrough) or the CO's (csi.storage.k8s.io/...), and the last
 *    passthrough, if any, says true or false; passthrough is then on
 *    exactly when it says true.
 */
#include <limits.h>
#include <sys/stat.h>

#include "csi.h"
#include "fuzz.h"

#define FZ_MAX_STRS 33

static struct csi_store fz_store;
static char fz_id[CSI_VOLUME_ID_LEN + 1];	/* the store's one volume */

static bool fz_id_form(const char *id)
{
	if (strlen(id) != CSI_VOLUME_ID_LEN || strncmp(id, "sv-", 3))
		return false;
	for (const char *c = id + 3; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return false;
	return true;
}

static void fz_check_id(const char *id)
{
	bool valid = csi_volume_id_valid(id), known = !strcmp(id, fz_id);
	struct csi_volume v;
	struct csi_usage u;
	struct stat st;
	int ret;

	FZ_CHECK(valid == fz_id_form(id));
	ret = csi_volume_load(&fz_store, id, &v);
	FZ_CHECK(ret == (known ? 0 : -ENOENT));
	if (ret == 0) {
		FZ_CHECK(!strcmp(v.id, id));
		csi_volume_free(&v);
	}
	ret = csi_usage_get(&fz_store, id, &u);
	FZ_CHECK(known ? ret == 0 && !u.live && u.bytes == 4096 : ret == -ENOENT);
	if (!known)
		FZ_CHECK(csi_volume_delete(&fz_store, id) == 0);
	FZ_CHECK(fstatat(fz_store.volumes_fd, fz_id, &st, 0) == 0);
}

static void fz_check_path(const char *path)
{
	char why[256] = "";
	size_t len = strlen(path);

	if (csi_path_check(path, why, sizeof(why))) {
		FZ_CHECK(why[0]);
		return;
	}
	FZ_CHECK(path[0] == '/' && len < PATH_MAX - 64);
	for (size_t i = 0; i < len; i++) {
		FZ_CHECK((unsigned char)path[i] >= 0x20);
		if (path[i] == '/')
			FZ_CHECK(strncmp(path + i, "/..", 3) ||
				 (path[i + 3] != '/' && path[i + 3] != '\0'));
	}
}

static bool fz_key_ours(const char *k)
{
	return !strcmp(k, "layers") || !strcmp(k, "passthrough") ||
	       !strncmp(k, "csi.storage.k8s.io/", 19);
}

static void fz_check_options(char **strs, int n)
{
	struct csi_map_entry ents[FZ_MAX_STRS / 2];
	void *ptrs[FZ_MAX_STRS / 2];
	const char *pt = NULL;
	bool ok = true, passthrough = false;
	char why[256] = "";
	int count = 0, ret;

	for (int i = 0; i + 1 < n; i += 2) {
		memset(&ents[count], 0, sizeof(ents[count]));
		ents[count].key = strs[i];
		ents[count].value = strs[i + 1];
		ptrs[count] = &ents[count];
		count++;
		ok = ok && fz_key_ours(strs[i]);
		if (!strcmp(strs[i], "passthrough"))
			pt = strs[i + 1];
	}
	if (pt && strcmp(pt, "true") && strcmp(pt, "false"))
		ok = false;
	ret = csi_volume_options_check(count, ptrs, "parameter", &passthrough,
				       why, sizeof(why));
	FZ_CHECK((ret == 0) == ok);
	if (ret)
		FZ_CHECK(ret == -EINVAL && why[0]);
	else
		FZ_CHECK(passthrough == (pt && !strcmp(pt, "true")));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct csi_volume v = { 0 };
	char root[PATH_MAX];
	FILE *usage;

	fz_quiet();
	snprintf(root, sizeof(root), "%s/store", fz_scratch());
	FZ_CHECK(csi_store_open(&fz_store, root) == 0);
	FZ_CHECK(csi_store_new_id(CSI_VOLUME_ID_PREFIX, v.id) == 0);
	v.name = strdup("fuzz");
	FZ_CHECK(v.name && csi_volume_create(&fz_store, &v) == 0);
	memcpy(fz_id, v.id, sizeof(fz_id));
	csi_volume_free(&v);
	/* fz_scratch() makes a new directory: the store's is fz_scratch_path() */
	snprintf(root, sizeof(root), "%s/store/volumes/%s/usage",
		 fz_scratch_path(), fz_id);
	usage = fopen(root, "w");
	FZ_CHECK(usage && fputs("strata-usage 1\nbytes=4096\ninodes=1\nclean=1\n",
				usage) >= 0 && fclose(usage) == 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *strs[FZ_MAX_STRS];
	int n = fz_split(data, size, strs, FZ_MAX_STRS);

	fz_check_id(strs[0]);
	fz_check_path(strs[0]);
	fz_check_options(strs + 1, n - 1);
	fz_split_free(strs, n);
	return 0;
}
