// SPDX-License-Identifier: Apache-2.0
/*
 * csi/store.c and csi/state.c: the directory store and the node records.
 * A store is one plugin's, volumes appear and go atomically, layers
 * resolve only below layers/, hidden leftovers of layer imports are
 * swept, a served volume is seen as served, and a
 * node record reads back what was saved, or reads as damaged.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "csi.h"
#include "unit.h"

static char root[64];

static void put(const char *rel, const char *text)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd >= 0) {
		if (write(fd, text, strlen(text)) < 0)
			perror(path);
		close(fd);
	}
}

static void test_open(struct csi_store *s)
{
	struct csi_store other;
	struct stat st;
	char path[256];

	CHECK_EQ_INT(csi_store_open(s, root), 0);
	/* canonical, with its directories */
	CHECK_EQ_STR(s->root, root);
	snprintf(path, sizeof(path), "%s/volumes", root);
	CHECK_EQ_INT(stat(path, &st), 0);
	/* one plugin per store */
	CHECK_EQ_INT(csi_store_open(&other, root), -EADDRINUSE);
}

static void test_volumes(struct csi_store *s)
{
	struct csi_volume v = { 0 }, back = { 0 };
	char **ids;
	int n;

	CHECK_EQ_INT(csi_store_new_id(CSI_VOLUME_ID_PREFIX, v.id), 0);
	CHECK(csi_volume_id_valid(v.id));
	v.name = strdup("claim");
	v.capacity = 1 << 20;
	v.parameters = json_object_new_object();
	CHECK_EQ_INT(csi_volume_create(s, &v), 0);
	CHECK_EQ_INT(csi_volume_load(s, v.id, &back), 0);
	CHECK_EQ_STR(back.name, "claim");
	CHECK_EQ_INT(back.capacity, 1 << 20);
	csi_volume_free(&back);
	CHECK_EQ_INT(csi_volume_find(s, "claim", false, &back), 0);
	csi_volume_free(&back);
	/* an inline volume of the same name is another volume */
	CHECK_EQ_INT(csi_volume_find(s, "claim", true, &back), -ENOENT);
	CHECK_EQ_INT(csi_volume_list(s, &ids, &n), 0);
	CHECK_EQ_INT(n, 1);
	csi_free_strv(ids, n);

	/* a daemon holds its workdir locked while it serves */
	{
		char path[256];
		int fd;

		CHECK_EQ_INT(csi_volume_served(s, v.id), 0);
		snprintf(path, sizeof(path), "%s/volumes/%s/work", root, v.id);
		fd = open(path, O_RDONLY | O_DIRECTORY);
		CHECK_EQ_INT(flock(fd, LOCK_EX), 0);
		CHECK_EQ_INT(csi_volume_served(s, v.id), -EBUSY);
		close(fd);
		CHECK_EQ_INT(csi_volume_served(s, v.id), 0);
	}

	CHECK_EQ_INT(csi_volume_delete(s, v.id), 0);
	CHECK_EQ_INT(csi_volume_delete(s, v.id), 0);	/* idempotent */
	CHECK_EQ_INT(csi_volume_load(s, v.id, &back), -ENOENT);
	csi_volume_free(&v);
	/* a malformed id never names a file */
	CHECK_EQ_INT(csi_volume_load(s, "../layers", &back), -ENOENT);
}

static void test_layers(struct csi_store *s)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/layers/base", root);
	mkdir(path, 0755);
	put("layers/file", "x");
	snprintf(path, sizeof(path), "%s/layers/out", root);
	CHECK_EQ_INT(symlink("/etc", path), 0);
	fd = csi_layer_open(s, "base");
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	CHECK_EQ_INT(csi_layer_open(s, "out"), -ELOOP);
	CHECK_EQ_INT(csi_layer_open(s, "file"), -ENOTDIR);
	CHECK_EQ_INT(csi_layer_open(s, "../volumes"), -EINVAL);
	CHECK_EQ_INT(csi_layer_open(s, "missing"), -ENOENT);
}

/* An import or removal cut short leaves a hidden directory: swept, and
 * only those, by csi_layer_sweep (an import's start, the plugin's). */
static void test_layer_sweep(struct csi_store *s)
{
	char path[256];
	struct stat st;

	snprintf(path, sizeof(path), "%s/layers/.import-app-0123456789abcdef", root);
	CHECK_EQ_INT(mkdir(path, 0700), 0);
	put("layers/.import-app-0123456789abcdef/half", "x");
	snprintf(path, sizeof(path), "%s/layers/.delete-old-0123456789abcdef", root);
	CHECK_EQ_INT(mkdir(path, 0700), 0);
	put("layers/.keep", "an admin's file");
	csi_layer_sweep(s);
	snprintf(path, sizeof(path), "%s/layers/.import-app-0123456789abcdef", root);
	CHECK_EQ_INT(lstat(path, &st), -1);
	snprintf(path, sizeof(path), "%s/layers/.delete-old-0123456789abcdef", root);
	CHECK_EQ_INT(lstat(path, &st), -1);
	snprintf(path, sizeof(path), "%s/layers/.keep", root);
	CHECK_EQ_INT(lstat(path, &st), 0);
	snprintf(path, sizeof(path), "%s/layers/base", root);
	CHECK_EQ_INT(lstat(path, &st), 0);
}

static void test_node_records(struct csi_store *s)
{
	struct csi_node_vol n = { 0 }, back;
	char id[CSI_VOLUME_ID_LEN + 1], name[128];

	CHECK_EQ_INT(csi_store_new_id(CSI_VOLUME_ID_PREFIX, id), 0);
	memcpy(n.id, id, sizeof(n.id));
	n.staging = strdup("/k/plugins/x/globalmount");
	n.stage_flags = strdup("noatime");
	n.staging_created = true;
	n.mnt = (struct csi_mnt){ 1ULL << 40, makedev(0, 55) };
	n.pid = 1234;
	n.starttime = 99;
	CHECK_EQ_INT(csi_state_add_target(&n, "/k/pods/a/mount", true, "ro"), 0);
	n.targets[0].mode = 5;
	n.targets[0].created = true;
	n.targets[0].mnt = (struct csi_mnt){ (1ULL << 40) + 1, makedev(0, 55) };
	CHECK_EQ_INT(csi_state_save(s, &n), 0);
	CHECK_EQ_INT(csi_state_load(s, id, &back), 0);
	CHECK_EQ_STR(back.staging, n.staging);
	CHECK(back.staging_created);
	CHECK(back.mnt.id == n.mnt.id && back.mnt.dev == n.mnt.dev);
	CHECK(back.prev.id == 0);
	CHECK_EQ_INT(back.ntargets, 1);
	if (back.ntargets == 1) {
		CHECK_EQ_STR(back.targets[0].path, "/k/pods/a/mount");
		CHECK(back.targets[0].readonly && back.targets[0].created);
		CHECK_EQ_INT(back.targets[0].mode, 5);
		CHECK(back.targets[0].mnt.id == n.targets[0].mnt.id);
	}
	csi_state_free(&back);

	/* records that must never be acted on */
	snprintf(name, sizeof(name), "node/%s.json", id);
	put(name, "{\"volume_id\": \"x\"");
	CHECK_EQ_INT(csi_state_load(s, id, &back), -EBADMSG);
	snprintf(name, sizeof(name), "node/%s.json", id);
	{
		char text[512];

		snprintf(text, sizeof(text),
			 "{\"volume_id\": \"%s\", \"staging_path\": \"/a/../etc\"}", id);
		put(name, text);
		CHECK_EQ_INT(csi_state_load(s, id, &back), -EBADMSG);
		snprintf(text, sizeof(text),
			 "{\"volume_id\": \"%s\", \"staging_path\": \"/a\", \"targets\": [{\"path\": \"rel\"}]}",
			 id);
		put(name, text);
		CHECK_EQ_INT(csi_state_load(s, id, &back), -EBADMSG);
		snprintf(text, sizeof(text),
			 "{\"volume_id\": \"%s\", \"staging_path\": \"/a\", \"mount\": {\"id\": 5}}",
			 id);
		put(name, text);
		CHECK_EQ_INT(csi_state_load(s, id, &back), -EBADMSG);
	}
	CHECK_EQ_INT(csi_state_remove(s, id), 0);
	CHECK_EQ_INT(csi_state_load(s, id, &back), -ENOENT);
	csi_state_free(&n);
}

int main(void)
{
	struct csi_store s;

	UNIT_REQUIRE_ROOT();
	strcpy(root, "/tmp/strata-unit-XXXXXX");
	if (!mkdtemp(root))
		return 1;
	test_open(&s);
	test_volumes(&s);
	test_layers(&s);
	test_layer_sweep(&s);
	test_node_records(&s);
	csi_store_close(&s);
	strata_rmtree_at(AT_FDCWD, root);
	return unit_done("test_csi_store");
}
