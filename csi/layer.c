// SPDX-License-Identifier: Apache-2.0
/*
 * Layers as objects of the store: the Admin service's ImportLayer,
 * ListLayers and DeleteLayer.
 *
 * A layer is layers/<name>/, read-only to the daemons, named as a
 * StorageClass names it (csi_layer_name_check). An import is built under
 * a hidden name, layers/.import-<name>-<random>, by a child process
 * (layer_extract.c), and renamed into place with RENAME_NOREPLACE once
 * whole and synced: a failed or crashed import leaves no layer of that
 * name, only a hidden directory that the next import or the plugin's
 * next start removes. A removal renames the layer to a hidden
 * layers/.delete-<name>-<random> first, so that a crash mid-way leaves
 * no half layer either. No layer name starts with '.', so hidden names
 * never collide with one.
 *
 * Locks: the store's create_lock, then layer_lock, never the reverse,
 * and neither held while an archive is extracted or a tree removed.
 * layer_lock guards layer_busy, the imports and removals in flight: the
 * sweep of hidden leftovers at an import's start runs only when none
 * is, so it never takes a directory that another call is still filling
 * or emptying. Two imports of one name both extract; RENAME_NOREPLACE
 * lets one win and the other answer ALREADY_EXISTS. DeleteLayer holds
 * create_lock from its look at the volumes to the layer's hiding, so no
 * CreateVolume commits a volume over a layer being removed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csi.h"

#define CSI_LAYER_IMPORT_PREFIX ".import-"
#define CSI_LAYER_DELETE_PREFIX ".delete-"

/* Removes the hidden leftovers of imports and removals cut short. */
void csi_layer_sweep(struct csi_store *s)
{
	struct dirent *de;
	DIR *d;

	d = strata_opendir_at(s->layers_fd, ".");
	if (!d)
		return;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, CSI_LAYER_IMPORT_PREFIX,
			     strlen(CSI_LAYER_IMPORT_PREFIX)) ||
		    !strncmp(de->d_name, CSI_LAYER_DELETE_PREFIX,
			     strlen(CSI_LAYER_DELETE_PREFIX))) {
			strata_warn("store: removing the leftover %s/layers/%s",
				    s->root, de->d_name);
			strata_rmtree_at(s->layers_fd, de->d_name);
		}
	closedir(d);
}

/* "<prefix><name>-<16 hex digits>": a hidden name of its own. */
static int csi_layer_hidden(const char *prefix, const char *name, char *buf,
			    size_t size)
{
	uint64_t rnd;

	if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
		return -errno;
	snprintf(buf, size, "%s%s-%016llx", prefix, name,
		 (unsigned long long)rnd);
	return 0;
}

/* Whether layers/<name> exists: 0, -ENOENT, or another -errno. */
static int csi_layer_exists(struct csi_store *s, const char *name)
{
	struct stat st;

	return fstatat(s->layers_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ?
		       -errno : 0;
}

/* Adds ID to the users of each of NAMES that CHAIN holds. */
static int csi_layer_add_users(char **names, int n, char **chain, int nchain,
			       const char *id, char ***users, int *nusers)
{
	int ret = 0;

	for (int i = 0; i < n && !ret; i++)
		for (int l = 0; l < nchain && !ret; l++)
			if (!strcmp(chain[l], names[i]))
				ret = csi_strv_push(&users[i], &nusers[i], id);
	return ret;
}

/*
 * The snapshots (hidden ones too: a clone still reads them) whose chain
 * holds each of NAMES, added to USERS as csi_layer_users does.
 */
static int csi_layer_snapshot_users(struct csi_store *s, char **names, int n,
				    char ***users, int *nusers, bool strict)
{
	char **ids;
	int nids, ret;

	ret = csi_snapshot_list(s, &ids, &nids);
	for (int i = 0; !ret && i < nids; i++) {
		struct csi_snapshot ss;
		int err = csi_snapshot_load(s, ids[i], &ss);

		if (err) {
			ret = err != -ENOENT && strict ? -EIO : 0;
			continue;
		}
		ret = csi_layer_add_users(names, n, ss.chain, ss.nchain, ss.id,
					  users, nusers);
		csi_snapshot_free(&ss);
	}
	if (nids)
		csi_free_strv(ids, nids);
	return ret;
}

/*
 * The volumes and snapshots whose chain holds each of `names`: users[i]
 * is a comma-free list of ids, nusers[i] its length. A record that
 * cannot be read counts as a user of nothing, but makes the answer
 * -EIO when `strict` (a removal must not guess).
 */
static int csi_layer_users(struct csi_store *s, char **names, int n,
			   char ***users, int *nusers, bool strict)
{
	char **ids;
	int nids, ret;

	ret = csi_volume_list(s, &ids, &nids);
	if (ret)
		return ret;
	for (int v = 0; v < nids; v++) {
		struct csi_volume vol = { 0 };

		ret = csi_volume_load(s, ids[v], &vol);
		if (ret == -ENOENT) /* deleted since the scan */
			continue;
		if (ret && strict)
			break;
		if (ret) {
			ret = 0;
			continue;
		}
		ret = csi_layer_add_users(names, n, vol.layers, vol.nlayers,
					  ids[v], users, nusers);
		csi_volume_free(&vol);
		if (ret)
			break;
	}
	csi_free_strv(ids, nids);
	if (ret)
		return ret;
	return csi_layer_snapshot_users(s, names, n, users, nusers, strict);
}

/* A Layer message for layers/<name>, allocated with the reply. */
static Strata__V1__Layer *csi_layer_info(struct csi_plugin *p,
					 struct csi_reply *r, const char *name,
					 char **users, int nusers)
{
	Strata__V1__Layer *l = csi_alloc(r, sizeof(*l));
	char path[PATH_MAX];
	int64_t entries = 0;

	if (!l)
		return NULL;
	strata__v1__layer__init(l);
	l->name = csi_strdup(r, name);
	l->volumes = csi_alloc(r, sizeof(*l->volumes) * (nusers ? nusers : 1));
	if (!l->name || !l->volumes)
		return NULL;
	for (int i = 0; i < nusers; i++) {
		l->volumes[i] = csi_strdup(r, users[i]);
		if (!l->volumes[i])
			return NULL;
	}
	l->n_volumes = nusers;
	snprintf(path, sizeof(path), "%s/layers/%s", p->store.root, name);
	/* a layer that cannot be walked is listed all the same, at 0 */
	if (csi_tree_usage(path, &l->size_bytes, &entries) == 0 && entries > 0)
		l->entries = entries - 1; /* its root */
	return l;
}

/* What a failed extraction answers, from the child's errno and message. */
static void csi_layer_import_reply(struct csi_reply *r,
				   const Strata__V1__ImportLayerRequest *req,
				   int err, const char *msg)
{
	enum csi_code code;

	switch (err) {
	case -EINVAL:
	case -EBADMSG:
		code = CSI_INVALID_ARGUMENT;
		break;
	case -ENOSPC:
	case -EDQUOT:
		code = CSI_RESOURCE_EXHAUSTED;
		break;
	default:
		code = CSI_INTERNAL;
	}
	if (!*msg)
		msg = err == -EIO ? "the extracting process died" : strerror(-err);
	csi_reply_set(r, code, "layer %s from %s: %s; nothing was imported",
		      req->name, req->path, msg);
}

/* One import or removal fewer in flight. */
static void csi_layer_idle(struct csi_store *s, struct csi_import *im)
{
	pthread_mutex_lock(&s->layer_lock);
	s->layer_busy--;
	for (struct csi_import **pp = &s->imports; *pp; pp = &(*pp)->next)
		if (*pp == im) {
			*pp = im->next;
			break;
		}
	pthread_mutex_unlock(&s->layer_lock);
}

/*
 * Makes layers/<tmp>, a new hidden directory, counted in layer_busy (and
 * IM listed in the imports) until csi_layer_idle(); leftovers of calls
 * cut short go first.
 */
static int csi_layer_start(struct csi_store *s, const char *name, char *tmp,
			   size_t size, struct csi_import *im)
{
	int ret;

	pthread_mutex_lock(&s->layer_lock);
	if (!s->layer_busy)
		csi_layer_sweep(s);
	ret = csi_layer_hidden(CSI_LAYER_IMPORT_PREFIX, name, tmp, size);
	/* 0700 until whole: nobody reads a half layer through its name */
	if (!ret && mkdirat(s->layers_fd, tmp, 0700) < 0)
		ret = -errno;
	if (!ret) {
		s->layer_busy++;
		im->next = s->imports;
		s->imports = im;
	}
	pthread_mutex_unlock(&s->layer_lock);
	return ret;
}

/*
 * Extracts into a new hidden directory and renames it to layers/<name>.
 * Returns 0, or -errno with r answered.
 */
static int csi_layer_build(struct csi_plugin *p, struct csi_reply *r,
			   const Strata__V1__ImportLayerRequest *req, int fd,
			   off_t size)
{
	struct csi_store *s = &p->store;
	char tmp[CSI_LAYER_NAME_MAX + 64], msg[600];
	struct csi_layer_job job = { .fd = fd, .path = req->path,
				     .parent = getpid() };
	struct csi_import im = { .name = req->name, .fd = fd, .total = size };
	size_t len = 0;
	int ret;

	ret = csi_layer_start(s, req->name, tmp, sizeof(tmp), &im);
	if (ret) {
		csi_reply_errno(r, ret, "making the new layer's directory");
		return ret;
	}
	job.dir = openat(s->layers_fd, tmp, O_RDONLY | O_DIRECTORY |
					     O_NOFOLLOW | O_CLOEXEC);
	if (job.dir < 0) {
		ret = -errno;
		goto out_remove;
	}
	ret = csi_child_run(csi_layer_extract_child, &job, msg,
			    sizeof(msg) - 1, &len);
	msg[len] = '\0';
	if (ret) {
		csi_layer_import_reply(r, req, ret, msg);
		goto out_close;
	}
	csi_kill_point("layer-import-extracted");
	/* on disk before it has its name: a power cut leaves it whole or hidden */
	if (syncfs(job.dir) < 0) {
		ret = -errno;
		csi_reply_errno(r, ret, "syncing the new layer");
		goto out_close;
	}
	if (renameat2(s->layers_fd, tmp, s->layers_fd, req->name,
		      RENAME_NOREPLACE) < 0) {
		ret = -errno;
		if (ret == -EEXIST)
			csi_reply_set(r, CSI_ALREADY_EXISTS,
				      "layer %s already exists", req->name);
		else
			csi_reply_errno(r, ret, "naming the new layer");
		goto out_close;
	}
	fsync(s->layers_fd);
	close(job.dir);
	csi_layer_idle(s, &im);
	return 0;
out_close:
	close(job.dir);
out_remove:
	strata_rmtree_at(s->layers_fd, tmp);
	csi_layer_idle(s, &im);
	return ret;
}

void csi_admin_import_layer(struct csi_plugin *p, const ProtobufCMessage *msg,
			    struct csi_reply *r)
{
	const Strata__V1__ImportLayerRequest *req = (const void *)msg;
	Strata__V1__ImportLayerResponse *out;
	struct stat st;
	int fd, ret;

	if (csi_layer_name_check(req->name)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "layer name '%.*s' is malformed (a layer is a name of letters, digits, '.', '_' and '-' that starts with a letter or digit, with no '..', at most %d bytes)",
			      CSI_LAYER_NAME_MAX, req->name, CSI_LAYER_NAME_MAX);
		return;
	}
	if (req->path[0] != '/') {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      *req->path ? "path '%.256s' is not absolute: the plugin reads it on the node, from no working directory of yours" :
			      "path is required: the archive to import%.0s",
			      req->path);
		return;
	}
	/* the caller's file, read as it is: no device, no FIFO to block on */
	fd = open(req->path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		ret = errno;
		csi_reply_set(r, ret == ENOENT ? CSI_NOT_FOUND :
				 CSI_INVALID_ARGUMENT,
			      "layer %s: the archive %.256s: %s%s", req->name,
			      req->path, strerror(ret),
			      ret == ENOENT ? " on this node (the plugin reads the path in its own mount namespace)" : "");
		return;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "layer %s: the archive %.256s is not a regular file",
			      req->name, req->path);
		goto out_close;
	}
	if (csi_store_writable(&p->store, r))
		goto out_close;
	/* early, before the work; the rename says it again if one raced us */
	ret = csi_layer_exists(&p->store, req->name);
	if (ret != -ENOENT) {
		if (ret == 0)
			csi_reply_set(r, CSI_ALREADY_EXISTS,
				      "layer %s already exists (remove it first: stratactl layer rm %s)",
				      req->name, req->name);
		else
			csi_reply_errno(r, ret, "looking the layer up");
		goto out_close;
	}
	ret = csi_layer_build(p, r, req, fd, st.st_size);
	if (ret)
		goto out_close;
	strata_info("layer %s imported from %s", req->name, req->path);
	out = csi_alloc(r, sizeof(*out));
	if (!out)
		goto out_oom;
	strata__v1__import_layer_response__init(out);
	out->layer = csi_layer_info(p, r, req->name, NULL, 0);
	if (!out->layer)
		goto out_oom;
	csi_reply_ok(r, out);
	goto out_close;
out_oom:
	csi_reply_errno(r, -ENOMEM, "ImportLayer");
out_close:
	close(fd);
}

/* A directory with a layer's name. */
static const char *csi_layer_keep(int dirfd, char *name, const void *arg)
{
	struct stat st;

	if (csi_layer_name_check(name) ||
	    fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) ||
	    !S_ISDIR(st.st_mode))
		return NULL;
	return name;
}

/* The names of layers/, sorted: directories with a layer's name only. */
static int csi_layer_names(struct csi_store *s, char ***names, int *count)
{
	int ret = csi_store_names(s->layers_fd, csi_layer_keep, NULL, names,
				  count);

	if (!ret)
		csi_strv_sort(*names, *count);
	return ret;
}

/*
 * The imports in flight into OUT: how far each child has read its
 * archive is the offset of the descriptor it shares with the plugin.
 */
static int csi_layer_importing(struct csi_store *s, struct csi_reply *r,
			       Strata__V1__ListLayersResponse *out)
{
	int ret = 0, n = 0;

	pthread_mutex_lock(&s->layer_lock);
	for (struct csi_import *im = s->imports; im; im = im->next)
		n++;
	out->importing = csi_alloc(r, sizeof(*out->importing) * (n ? n : 1));
	if (!out->importing)
		ret = -ENOMEM;
	/* the list is newest first; the reply, oldest first */
	out->n_importing = n;
	for (struct csi_import *im = s->imports; !ret && im; im = im->next) {
		Strata__V1__LayerImport *li = csi_alloc(r, sizeof(*li));
		off_t done = lseek(im->fd, 0, SEEK_CUR);

		if (li)
			strata__v1__layer_import__init(li);
		if (!li || !(li->name = csi_strdup(r, im->name))) {
			ret = -ENOMEM;
			break;
		}
		li->done_bytes = done < 0 ? 0 : done;
		li->total_bytes = im->total;
		out->importing[--n] = li;
	}
	pthread_mutex_unlock(&s->layer_lock);
	return ret;
}

void csi_admin_list_layers(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	Strata__V1__ListLayersResponse *out;
	char **names = NULL, ***users = NULL;
	int n = 0, *nusers = NULL, ret;

	ret = csi_layer_names(&p->store, &names, &n);
	if (ret) {
		csi_reply_errno(r, ret, "reading the store's layers");
		return;
	}
	users = calloc(n ? n : 1, sizeof(*users));
	nusers = calloc(n ? n : 1, sizeof(*nusers));
	out = csi_alloc(r, sizeof(*out));
	if (!users || !nusers || !out) {
		ret = -ENOMEM;
		goto out;
	}
	ret = csi_layer_users(&p->store, names, n, users, nusers, false);
	if (ret)
		goto out;
	strata__v1__list_layers_response__init(out);
	out->layers = csi_alloc(r, sizeof(*out->layers) * (n ? n : 1));
	if (!out->layers) {
		ret = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		out->layers[i] = csi_layer_info(p, r, names[i], users[i],
						nusers[i]);
		if (!out->layers[i]) {
			ret = -ENOMEM;
			goto out;
		}
	}
	out->n_layers = n;
	ret = csi_layer_importing(&p->store, r, out);
	if (ret == 0)
		csi_reply_ok(r, out);
out:
	if (ret)
		csi_reply_errno(r, ret, "listing the layers");
	for (int i = 0; users && i < n; i++)
		csi_free_strv(users[i], nusers[i]);
	free(users);
	free(nusers);
	csi_free_strv(names, n);
}

/* "sv-a, sv-b" of the first few users, for a message. */
static void csi_layer_user_list(char **users, int n, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && len < size; i++)
		len += snprintf(buf + len, size - len, "%s%s", i ? ", " : "",
				users[i]);
}

/* What the users are: "volume", "snapshot", or both. */
static const char *csi_layer_user_kind(char **users, int n)
{
	int nvol = 0;

	for (int i = 0; i < n; i++)
		nvol += csi_volume_id_valid(users[i]);
	return nvol == n ? "volume" : nvol ? "volume or snapshot" : "snapshot";
}

void csi_admin_delete_layer(struct csi_plugin *p, const ProtobufCMessage *msg,
			    struct csi_reply *r)
{
	const Strata__V1__DeleteLayerRequest *req = (const void *)msg;
	struct csi_store *s = &p->store;
	Strata__V1__DeleteLayerResponse *out;
	char hidden[CSI_LAYER_NAME_MAX + 64], list[384];
	char **users = NULL, *name = req->name;
	int nusers = 0, ret;

	if (csi_layer_name_check(req->name)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "layer name '%.*s' is malformed (a layer is a name of letters, digits, '.', '_' and '-' that starts with a letter or digit, with no '..', at most %d bytes)",
			      CSI_LAYER_NAME_MAX, req->name, CSI_LAYER_NAME_MAX);
		return;
	}
	if (csi_store_writable(s, r))
		return;
	pthread_mutex_lock(&s->create_lock);
	ret = csi_layer_exists(s, req->name);
	if (ret) {
		if (ret == -ENOENT)
			csi_reply_set(r, CSI_NOT_FOUND, "layer %s: no such layer",
				      req->name);
		else
			csi_reply_errno(r, ret, "looking the layer up");
		goto out;
	}
	ret = csi_layer_users(s, &name, 1, &users, &nusers, true);
	if (ret) {
		csi_reply_errno(r, ret, "reading the volume records");
		goto out;
	}
	if (nusers) {
		csi_layer_user_list(users, nusers, list, sizeof(list));
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "layer %s is used by %d %s%s (%s): delete %s first",
			      req->name, nusers, csi_layer_user_kind(users, nusers),
			      nusers == 1 ? "" : "s", list,
			      nusers == 1 ? "it" : "them");
		goto out;
	}
	pthread_mutex_lock(&s->layer_lock);
	ret = csi_layer_hidden(CSI_LAYER_DELETE_PREFIX, req->name, hidden,
			       sizeof(hidden));
	if (!ret && renameat(s->layers_fd, req->name, s->layers_fd, hidden) < 0)
		ret = -errno;
	if (!ret)
		s->layer_busy++;
	pthread_mutex_unlock(&s->layer_lock);
	if (ret) {
		csi_reply_errno(r, ret, "hiding the layer before its removal");
		goto out;
	}
	fsync(s->layers_fd);
	/* gone by name now: the tree goes with no lock held */
	pthread_mutex_unlock(&s->create_lock);
	ret = strata_rmtree_at(s->layers_fd, hidden);
	csi_layer_idle(s, NULL);
	if (ret)
		strata_warn("layer %s: removing %s/layers/%s: %s; the next import or start removes it",
			    req->name, s->root, hidden, strerror(-ret));
	strata_info("layer %s removed", req->name);
	out = csi_alloc(r, sizeof(*out));
	if (out) {
		strata__v1__delete_layer_response__init(out);
		csi_reply_ok(r, out);
	} else {
		csi_reply_errno(r, -ENOMEM, "DeleteLayer");
	}
	csi_free_strv(users, nusers);
	return;
out:
	pthread_mutex_unlock(&s->create_lock);
	csi_free_strv(users, nusers);
}
