// SPDX-License-Identifier: Apache-2.0
/*
 * Every RPC the plugin serves, from arbitrary bytes to the handler's
 * decision, as server.c runs it: the first byte picks a method from the
 * service tables (csi_services), the rest is its request's wire bytes,
 * unpacked by protobuf-c and NUL-checked (csi_wire_strings_check), then
 * handed to the real handler on a scratch store.
 *
 * Only the mount layer is stubbed (this file defines every function
 * csi/mount.c exports, so the linker never takes mount.o): nothing is
 * mounted anywhere, and a new FUSE mount is refused with EPERM, as in a
 * container without /dev/fuse. Everything above it is the plugin's own
 * code: path checks, records, the store. The store holds a layer, a
 * volume with a fixed id (sv-0...01) whose node record says it is staged
 * (by a daemon that is not running) and published once, so that seeds
 * reach the unstage, unpublish, stats and heal checks too, and one that
 * is only created (sv-0...02), which a stage takes as far as the mount
 * and a snapshot or a clone freezes for real.
 * It is put back as it was after every input. Stages and publishes that
 * succeed need a FUSE mount: the suites over real mounts cover those.
 *
 * What must hold, for every input:
 *  - the handler answers with a status code CSI knows, a message when
 *    not OK, and on OK a reply of the method's response type that packs;
 *  - bytes protobuf-c refuses, or a string holding a NUL, never reach a
 *    handler, and the NUL check never calls bytes protobuf-c took
 *    malformed;
 *  - a path named in the request outside the allowed prefix (the
 *    scratch kubelet directory) is neither made nor removed;
 *  - the layer and the fixed volume's upper stay empty: no call writes
 *    into a volume's data.
 */
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "csi.h"
#include "fuzz.h"

#define FZ_MAX_METHODS 64
#define FZ_MAX_PATHS 8
#define FZ_FIXED_ID "sv-00000000000000000000000000000001"
#define FZ_UNSTAGED_ID "sv-00000000000000000000000000000002"

static const struct csi_method *fz_methods[FZ_MAX_METHODS];
static int fz_nmethods;
static struct csi_plugin fz_p;
static char fz_kubelet[PATH_MAX];	/* the allowed prefix */
static char fz_staging[PATH_MAX], fz_target[PATH_MAX];

/* ---- the mount layer: nothing is mounted, and nothing can be ---------- */

int csi_mnt_of(int fd, struct csi_mnt *m, bool *root)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	m->id = 1;		/* every directory is on the one host mount */
	m->dev = st.st_dev;
	if (root)
		*root = false;
	return 0;
}

int csi_mnt_exists(const struct csi_mnt *m)
{
	return -ENOENT;
}

int csi_mnt_fuse(const char *source, bool ro, int *fusefd, int *mntfd)
{
	return -EPERM;
}

int csi_mnt_clone(int fd, unsigned long msflags, int *treefd)
{
	return -EPERM;
}

int csi_mnt_attach(int mntfd, int dirfd, bool beneath)
{
	return -EPERM;
}

int csi_mnt_detach(int fd)
{
	return -EINVAL;		/* not a mount: umount2's answer */
}

int csi_mnt_answers(int fd, int timeout_ms)
{
	return -ENOTCONN;
}

const char *csi_mnt_strerror(int err)
{
	return strerror(-err);
}

/* ---- the scratch store ------------------------------------------------ */

static void fz_volume_make(const char *id, const char *name)
{
	struct csi_volume v = { 0 };

	memcpy(v.id, id, sizeof(v.id));
	v.name = strdup(name);
	v.nlayers = 1;
	v.layers = calloc(1, sizeof(char *));
	FZ_CHECK(v.name && v.layers && (v.layers[0] = strdup("base")));
	FZ_CHECK(csi_volume_create(&fz_p.store, &v) == 0);
	csi_volume_free(&v);
}

/*
 * The fixed volumes: sv-0...01 created, staged (no daemon) and published
 * once; sv-0...02 created only.
 */
static void fz_fixed_make(void)
{
	struct csi_node_vol n = { 0 };
	struct csi_target t = { 0 };

	fz_volume_make(FZ_FIXED_ID, "fixed");
	fz_volume_make(FZ_UNSTAGED_ID, "unstaged");

	memcpy(n.id, FZ_FIXED_ID, sizeof(n.id));
	n.staging = fz_staging;
	n.stage_flags = "";
	n.mnt.id = 7;		/* a mount that is gone */
	t.path = fz_target;
	t.flags = "";
	t.mode = CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER;
	t.mnt.id = 8;
	n.ntargets = 1;
	n.targets = &t;
	FZ_CHECK(csi_state_save(&fz_p.store, &n) == 0);
}

/* Every layer but base goes: ImportLayer makes them (and temporaries). */
static void fz_layers_reset(void)
{
	DIR *d = strata_opendir_at(fz_p.store.layers_fd, ".");
	struct dirent *e;

	FZ_CHECK(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
		    strcmp(e->d_name, "base"))
			strata_rmtree_at(fz_p.store.layers_fd, e->d_name);
	closedir(d);
}

/* Every snapshot goes: CreateSnapshot and clones of a volume make them. */
static void fz_snapshots_reset(void)
{
	DIR *d = strata_opendir_at(fz_p.store.snapshots_fd, ".");
	struct dirent *e;

	FZ_CHECK(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			strata_rmtree_at(fz_p.store.snapshots_fd, e->d_name);
	closedir(d);
}

/* Puts the store and the kubelet directory back as they were. */
static void fz_reset(void)
{
	char path[PATH_MAX], **ids = NULL;
	int n = 0;

	FZ_CHECK(csi_state_list(&fz_p.store, &ids, &n) == 0);
	for (int i = 0; i < n; i++)
		csi_state_remove(&fz_p.store, ids[i]);
	csi_free_strv(ids, n);
	FZ_CHECK(csi_volume_list(&fz_p.store, &ids, &n) == 0);
	for (int i = 0; i < n; i++)
		FZ_CHECK(csi_volume_delete(&fz_p.store, ids[i]) == 0);
	csi_free_strv(ids, n);
	snprintf(path, sizeof(path), "%s/ephemeral", fz_p.store.root);
	strata_rmtree_at(AT_FDCWD, path);	/* made by inline publishes */
	fz_layers_reset();
	fz_snapshots_reset();
	strata_rmtree_at(AT_FDCWD, fz_kubelet);
	FZ_CHECK(mkdir(fz_kubelet, 0750) == 0);
	FZ_CHECK(mkdir(fz_staging, 0750) == 0);
	FZ_CHECK(mkdir(fz_target, 0750) == 0);
	fz_fixed_make();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *scratch;
	char path[PATH_MAX];

	fz_quiet();
	scratch = fz_scratch();
	snprintf(path, sizeof(path), "%s/store", scratch);
	FZ_CHECK(csi_store_open(&fz_p.store, path) == 0);
	snprintf(path, sizeof(path), "%s/store/layers/base", scratch);
	FZ_CHECK(mkdir(path, 0755) == 0);
	snprintf(fz_kubelet, sizeof(fz_kubelet), "%s/kubelet", scratch);
	snprintf(fz_staging, sizeof(fz_staging), "%s/staging", fz_kubelet);
	snprintf(fz_target, sizeof(fz_target), "%s/target", fz_kubelet);

	fz_p.cfg.node_id = "node-1";
	fz_p.cfg.driver_name = CSI_DEFAULT_DRIVER;
	fz_p.cfg.root = fz_p.store.root;
	fz_p.cfg.stratafs = "/nonexistent/stratafs";
	fz_p.cfg.modes = CSI_MODE_NODE | CSI_MODE_CONTROLLER;
	fz_p.cfg.prefixes[fz_p.cfg.nprefixes++] = fz_kubelet;
	fz_p.topology_key = CSI_DEFAULT_DRIVER "/node";
	fz_p.ready = 1;
	fz_p.host.mntns_fd = -1;
	fz_p.host.exec = fz_p.cfg.stratafs;
	FZ_CHECK(csi_guard_add(&fz_p, fz_p.store.root) == 0);
	fz_reset();

	for (int t = 0; csi_services[t]; t++)
		for (const struct csi_method *m = csi_services[t];
		     m->path && fz_nmethods < FZ_MAX_METHODS; m++)
			fz_methods[fz_nmethods++] = m;
	return 0;
}

/* ---- the request's paths ---------------------------------------------- */

struct fz_path {
	const char *path;
	bool existed;
};

/*
 * The request's top-level string fields that name paths on the node. A
 * path written "@REST" becomes the kubelet directory followed by REST,
 * so that seeds, which cannot know the scratch directory's name, reach
 * paths the plugin allows (the seeds' comment in fuzz/README.md).
 */
static int fz_paths(ProtobufCMessage *req, struct fz_path *out)
{
	const ProtobufCMessageDescriptor *d = req->descriptor;
	int n = 0;

	for (unsigned i = 0; i < d->n_fields && n < FZ_MAX_PATHS; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char **field, *s;
		struct stat st;

		if (f->type != PROTOBUF_C_TYPE_STRING ||
		    f->label == PROTOBUF_C_LABEL_REPEATED ||
		    !strstr(f->name, "path"))
			continue;
		field = (char **)((char *)req + f->offset);
		s = *field;
		if (s && s[0] == '@') {
			/* protobuf-c allocated it: free() is its allocator's */
			FZ_CHECK(asprintf(field, "%s%s", fz_kubelet, s + 1) > 0);
			free(s);
			s = *field;
		}
		if (!s || s[0] != '/')
			continue;
		out[n].path = s;
		out[n].existed = lstat(s, &st) == 0;
		n++;
	}
	return n;
}

/* Whether path lies below the kubelet directory (or is it). */
static bool fz_allowed(const char *path)
{
	size_t len = strlen(fz_kubelet);

	return !strncmp(path, fz_kubelet, len) &&
	       (path[len] == '/' || path[len] == '\0');
}

/* ---- one input -------------------------------------------------------- */

static void fz_check_reply(const struct csi_method *m, struct csi_reply *r)
{
	const char *req = m->input->name, *resp;
	size_t stem = strlen(req) - strlen("Request"), len;
	uint8_t *buf;

	FZ_CHECK(r->code >= CSI_OK && r->code < CSI_CODE_COUNT);
	if (r->code != CSI_OK) {
		FZ_CHECK(r->msg[0] != '\0');
		FZ_CHECK(r->msg_out == NULL);
		return;
	}
	FZ_CHECK(r->msg_out != NULL);
	/* the response type: the request's name with Response for Request */
	resp = r->msg_out->descriptor->name;
	FZ_CHECK(!strcmp(req + stem, "Request"));
	FZ_CHECK(!strncmp(req, resp, stem) && !strcmp(resp + stem, "Response"));
	len = protobuf_c_message_get_packed_size(r->msg_out);
	buf = malloc(len ? len : 1);
	FZ_CHECK(buf);
	FZ_CHECK(protobuf_c_message_pack(r->msg_out, buf) == len);
	free(buf);
}

/* Whether the store's directory DIR holds no entry. */
static bool fz_empty(const char *dir)
{
	char path[PATH_MAX];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "%s/%s", fz_p.store.root, dir);
	d = opendir(path);
	FZ_CHECK(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct csi_method *m;
	struct csi_reply r = { 0 };
	struct fz_path paths[FZ_MAX_PATHS];
	ProtobufCMessage *req;
	struct stat st;
	int npaths, ret;

	if (size < 1)
		return 0;
	m = fz_methods[data[0] % fz_nmethods];
	req = protobuf_c_message_unpack(m->input, NULL, size - 1, data + 1);
	ret = csi_wire_strings_check(m->input, data + 1, size - 1, 0);
	/*
	 * Refused bytes never reach a handler: the server answers for them.
	 * The check never refuses framing protobuf-c took (fuzz/wire.c
	 * holds it to more).
	 */
	if (!req)
		return 0;
	FZ_CHECK(ret == 0 || ret == -EINVAL);
	if (ret) {
		protobuf_c_message_free_unpacked(req, NULL);
		return 0;
	}
	npaths = fz_paths(req, paths);
	m->handler(&fz_p, req, &r);
	fz_check_reply(m, &r);
	for (int i = 0; i < npaths; i++)
		if (!fz_allowed(paths[i].path))
			FZ_CHECK((lstat(paths[i].path, &st) == 0) ==
				 paths[i].existed);
	csi_reply_free(&r);
	protobuf_c_message_free_unpacked(req, NULL);
	FZ_CHECK(fz_empty("layers/base"));
	FZ_CHECK(fz_empty("volumes/" FZ_FIXED_ID "/upper"));
	fz_reset();
	return 0;
}
