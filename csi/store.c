// SPDX-License-Identifier: Apache-2.0
/*
 * The directory store under --root:
 *
 *   layers/<name>/            read-only lower layers, placed by the admin
 *                             or imported (layer.c)
 *   volumes/<id>/upper, work  a volume's writable layer and its workdir
 *   volumes/<id>/volume.json  the volume record
 *   node/<id>.json, <id>.log  node state of a staged volume, daemon log
 *   empty/                    the base under a volume without layers
 *   snapshots/                frozen uppers and their records (snapshot.c)
 *
 * A volume appears and disappears atomically: it is built under a hidden
 * name and renamed into place, and deleted by renaming it to a hidden
 * name first. Hidden leftovers of a crash are removed at open.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

static int csi_open_dir(int parent, const char *name, int *fd)
{
	if (mkdirat(parent, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	*fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					   O_CLOEXEC);
	return *fd < 0 ? -errno : 0;
}

static int csi_mkdir_p(const char *path)
{
	char buf[4096];
	size_t len = strlen(path);

	if (len >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Leftovers of a create or delete cut short by a crash. */
static void csi_store_sweep(struct csi_store *s)
{
	int fd = dup(s->volumes_fd);
	struct dirent *de;
	DIR *d;

	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d)))
		if (de->d_name[0] == '.' && strcmp(de->d_name, ".") &&
		    strcmp(de->d_name, "..")) {
			strata_warn("store: removing the leftover %s/volumes/%s",
				    s->root, de->d_name);
			strata_rmtree_at(s->volumes_fd, de->d_name);
		}
	closedir(d);
}

int csi_store_open(struct csi_store *s, const char *root)
{
	int ret;

	memset(s, 0, sizeof(*s));
	s->root_fd = s->layers_fd = s->volumes_fd = s->node_fd = -1;
	s->empty_fd = s->lock_fd = s->snapshots_fd = -1;
	pthread_mutex_init(&s->create_lock, NULL);
	pthread_mutex_init(&s->busy_lock, NULL);
	pthread_mutex_init(&s->layer_lock, NULL);
	ret = csi_mkdir_p(root);
	if (ret)
		goto out;
	/* canonical: paths the plugin builds below it are checked as such */
	s->root = realpath(root, NULL);
	if (!s->root) {
		ret = -errno;
		goto out;
	}
	s->root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->root_fd < 0) {
		ret = -errno;
		goto out;
	}
	/*
	 * Two plugins on one store would undo each other's work. Read-only:
	 * flock needs no more, and a file held open for writing would keep
	 * the store's filesystem from being remounted read-only.
	 */
	ret = strata_lock_file(s->root_fd, CSI_STORE_LOCK);
	if (ret < 0) {
		ret = ret == -EWOULDBLOCK ? -EADDRINUSE : ret;
		goto out;
	}
	s->lock_fd = ret;
	if ((ret = csi_open_dir(s->root_fd, "layers", &s->layers_fd)) ||
	    (ret = csi_open_dir(s->root_fd, "volumes", &s->volumes_fd)) ||
	    (ret = csi_open_dir(s->root_fd, "node", &s->node_fd)) ||
	    (ret = csi_open_dir(s->root_fd, "empty", &s->empty_fd)) ||
	    (ret = csi_open_dir(s->root_fd, "snapshots", &s->snapshots_fd)))
		goto out;
	/* the admin's layers must be readable by the daemons, no more */
	fchmod(s->layers_fd, 0755);
	fchmod(s->empty_fd, 0755);
	/* daemons read the snapshots' layers as they read layers/ */
	fchmod(s->snapshots_fd, 0755);
	csi_store_sweep(s);
	csi_layer_sweep(s);
	/* before any call, and before a heal starts a daemon on a chain */
	csi_snapshot_recover(s, NULL);
	csi_flatten_recover(s);
	csi_snapshot_gc(s);
	return 0;
out:
	csi_store_close(s);
	return ret;
}

void csi_store_close(struct csi_store *s)
{
	int *fds[] = { &s->root_fd,  &s->layers_fd, &s->volumes_fd,
		       &s->node_fd,  &s->empty_fd,  &s->snapshots_fd };

	/* before root_fd goes: the lock file exists while a plugin holds it */
	if (s->root_fd >= 0)
		strata_unlock_file(s->root_fd, CSI_STORE_LOCK, s->lock_fd);
	s->lock_fd = -1;

	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (*fds[i] >= 0) {
			close(*fds[i]);
			*fds[i] = -1;
		}
	csi_busy_clear(s);
	free(s->root);
	s->root = NULL;
}

/* Probe's check: the store must still be there and writable. */
int csi_store_check(struct csi_store *s, char *why, size_t size)
{
	const char *dirs[] = { "layers", "volumes", "node", "empty",
			       "snapshots" };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (faccessat(s->root_fd, dirs[i], W_OK | X_OK, 0) < 0) {
			int err = errno;

			snprintf(why, size, "store %s/%s is unusable: %s",
				 s->root, dirs[i], strerror(err));
			return -err;
		}
	return 0;
}

/*
 * Before a call changes anything: a store it cannot write fails the call
 * at once, whole, with a status that names the problem, rather than
 * halfway through (a mount made and its record not saved).
 */
int csi_store_writable(struct csi_store *s, struct csi_reply *r)
{
	const char *dirs[] = { "volumes", "node", "snapshots" };
	struct statvfs st;

	if (fstatvfs(s->root_fd, &st) == 0 && (st.f_flag & ST_RDONLY)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "the store %s is on a read-only filesystem: nothing was changed; retry once it is writable",
			      s->root);
		return -EROFS;
	}
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (faccessat(s->root_fd, dirs[i], W_OK | X_OK, 0) < 0) {
			int err = errno;

			csi_reply_set(r, CSI_FAILED_PRECONDITION,
				      "the store's %s/%s is not writable (%s): nothing was changed",
				      s->root, dirs[i], strerror(err));
			return -err;
		}
	return 0;
}

/* The bytes the store's filesystem has left for us, and its size. */
int csi_store_space(struct csi_store *s, int64_t *avail, int64_t *size)
{
	struct statvfs st;

	if (fstatvfs(s->root_fd, &st) < 0)
		return -errno;
	*avail = (int64_t)st.f_bavail * (int64_t)st.f_frsize;
	*size = (int64_t)st.f_blocks * (int64_t)st.f_frsize;
	return 0;
}

/* Bytes the store's filesystem has left, or a negative errno. */
int64_t csi_store_free(struct csi_store *s)
{
	int64_t avail = 0, size;
	int ret = csi_store_space(s, &avail, &size);

	return ret ? ret : avail;
}

/* Whether the store's filesystem has no block or no inode left for us. */
bool csi_store_full(struct csi_store *s)
{
	struct statvfs st;

	return fstatvfs(s->root_fd, &st) == 0 &&
	       (st.f_bavail == 0 || st.f_favail == 0);
}

/*
 * A new volume or snapshot id: PREFIX (CSI_VOLUME_ID_PREFIX or
 * CSI_SNAPSHOT_ID_PREFIX) and 128 random bits, so that no id is made twice.
 */
int csi_store_new_id(const char *prefix, char id[CSI_VOLUME_ID_LEN + 1])
{
	unsigned char rnd[16];

	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return -EIO;
	memcpy(id, prefix, 3);
	for (int i = 0; i < 16; i++)
		sprintf(id + 3 + 2 * i, "%02x", rnd[i]);
	return 0;
}

void csi_volume_free(struct csi_volume *v)
{
	free(v->name);
	csi_free_strv(v->layers, v->nlayers);
	free(v->created);
	json_object_put(v->parameters);
	memset(v, 0, sizeof(*v));
}

static int csi_volume_parse(json_object *o, struct csi_volume *v)
{
	json_object *layers, *params;
	const char *id = csi_json_str(o, "id"), *name = csi_json_str(o, "name");
	const char *created = csi_json_str(o, "created"), *src;

	if (!id || !csi_volume_id_valid(id) || !name ||
	    !json_object_object_get_ex(o, "layers", &layers) ||
	    !json_object_is_type(layers, json_type_array))
		return -EBADMSG;
	memcpy(v->id, id, sizeof(v->id));
	v->name = strdup(name);
	v->created = strdup(created ? created : "");
	v->capacity = csi_json_int(o, "capacity_bytes");
	v->ephemeral = csi_json_int(o, "ephemeral") != 0;
	v->passthrough = csi_json_int(o, "passthrough") != 0;
	v->nlayers = json_object_array_length(layers);
	v->layers = calloc(v->nlayers + 1, sizeof(char *));
	if (!v->name || !v->created || !v->layers)
		return -ENOMEM;
	for (int i = 0; i < v->nlayers; i++) {
		const char *l = json_object_get_string(
			json_object_array_get_idx(layers, i));

		/* a record edited by hand is checked like a request */
		if (!l || csi_chain_entry_check(l))
			return -EBADMSG;
		v->layers[i] = strdup(l);
		if (!v->layers[i])
			return -ENOMEM;
	}
	if (json_object_object_get_ex(o, "parameters", &params))
		v->parameters = json_object_get(params);
	src = csi_json_str(o, "content_source");
	if (src && !csi_volume_id_valid(src) && !csi_snapshot_id_valid(src))
		return -EBADMSG;
	if (src)
		memcpy(v->source, src, sizeof(v->source));
	return 0;
}

int csi_volume_load(struct csi_store *s, const char *id, struct csi_volume *v)
{
	char path[64];
	json_object *o;
	int ret;

	memset(v, 0, sizeof(*v));
	if (!csi_volume_id_valid(id))
		return -ENOENT;
	snprintf(path, sizeof(path), "%s/volume.json", id);
	ret = csi_record_read(s->volumes_fd, path, &o);
	if (ret)
		return ret == -ENOTDIR ? -ENOENT : ret;
	ret = csi_volume_parse(o, v);
	json_object_put(o);
	if (!ret && strcmp(v->id, id))
		ret = -EBADMSG;
	if (ret)
		csi_volume_free(v);
	return ret;
}

/*
 * Sorts a listing's ids, and returns the index of the first one after
 * TOKEN ("" for the start). Pages go in id order and a token is the last
 * id a page handed out, so an entry made or removed between pages never
 * shifts the others.
 */
int csi_page_first(char **ids, int n, const char *token)
{
	int first = 0;

	csi_strv_sort(ids, n);
	while (token[0] && first < n && strcmp(ids[first], token) <= 0)
		first++;
	return first;
}

/*
 * The names in directory DIRFD that KEEP takes, in readdir order. KEEP
 * returns the part of NAME to list (it may cut NAME short in place), or
 * NULL to pass over it: the store's listings differ only there.
 */
int csi_store_names(int dirfd, csi_store_keep_fn keep, const void *arg,
		    char ***names, int *count)
{
	struct dirent *de;
	char **v = NULL;
	int n = 0, ret = 0;
	DIR *d;

	*names = NULL;
	*count = 0;
	d = strata_opendir_at(dirfd, ".");
	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		const char *name = keep(dirfd, de->d_name, arg);

		if (!name)
			continue;
		ret = csi_strv_push(&v, &n, name);
		if (ret)
			break;
	}
	closedir(d);
	if (ret) {
		csi_free_strv(v, n);
		return ret;
	}
	*names = v;
	*count = n;
	return 0;
}

/* "<id><suffix>" with a volume id, cut to the id. */
static const char *csi_store_keep_id(int dirfd, char *name, const void *suffix)
{
	size_t slen = strlen(suffix);

	if (strlen(name) != CSI_VOLUME_ID_LEN + slen ||
	    strcmp(name + CSI_VOLUME_ID_LEN, suffix))
		return NULL;
	name[CSI_VOLUME_ID_LEN] = '\0';
	return csi_volume_id_valid(name) ? name : NULL;
}

/* The volume ids named in a directory, as "<id><suffix>". */
int csi_store_scan(int dirfd, const char *suffix, char ***ids, int *count)
{
	return csi_store_names(dirfd, csi_store_keep_id, suffix, ids, count);
}

int csi_volume_list(struct csi_store *s, char ***ids, int *count)
{
	return csi_store_scan(s->volumes_fd, "", ids, count);
}

/* The store is small (volumes of one node): a scan is cheap enough. */
/*
 * Finds a volume by its CreateVolume name, or with `ephemeral` by the id
 * kubelet gave an inline volume; the two never match each other.
 */
int csi_volume_find(struct csi_store *s, const char *name, bool ephemeral,
		    struct csi_volume *v)
{
	char **ids;
	int n, ret;

	ret = csi_volume_list(s, &ids, &n);
	if (ret)
		return ret;
	ret = -ENOENT;
	for (int i = 0; i < n && ret == -ENOENT; i++) {
		if (csi_volume_load(s, ids[i], v))
			continue;
		if (v->ephemeral == ephemeral && !strcmp(v->name, name))
			ret = 0;
		else
			csi_volume_free(v);
	}
	csi_free_strv(ids, n);
	return ret;
}

static json_object *csi_volume_json(const struct csi_volume *v)
{
	json_object *o = json_object_new_object(), *layers;

	if (!o)
		return NULL;
	layers = json_object_new_array();
	json_object_object_add(o, "id", json_object_new_string(v->id));
	json_object_object_add(o, "name", json_object_new_string(v->name));
	json_object_object_add(o, "capacity_bytes",
			       json_object_new_int64(v->capacity));
	if (v->ephemeral)
		json_object_object_add(o, "ephemeral", json_object_new_int(1));
	if (v->passthrough)
		json_object_object_add(o, "passthrough", json_object_new_int(1));
	for (int i = 0; layers && i < v->nlayers; i++)
		json_object_array_add(layers, json_object_new_string(v->layers[i]));
	json_object_object_add(o, "layers", layers);
	json_object_object_add(o, "parameters",
			       json_object_get(v->parameters));
	json_object_object_add(o, "created", json_object_new_string(v->created));
	if (v->source[0])
		json_object_object_add(o, "content_source",
				       json_object_new_string(v->source));
	return o;
}

/* Rewrites an existing volume's record, atomically (record.c): a new chain or capacity. */
int csi_volume_save(struct csi_store *s, const struct csi_volume *v)
{
	json_object *o = csi_volume_json(v);
	int fd, ret;

	if (!o)
		return -ENOMEM;
	fd = openat(s->volumes_fd, v->id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
						  O_CLOEXEC);
	ret = fd < 0 ? -errno : csi_record_write(fd, "volume.json", o);
	if (fd >= 0)
		close(fd);
	json_object_put(o);
	return ret;
}

/* Builds the volume under a hidden name, then renames it into place. */
int csi_volume_create(struct csi_store *s, struct csi_volume *v)
{
	char tmp[64];
	json_object *o = NULL;
	struct timespec now;
	struct tm tm;
	int fd = -1, ret;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	free(v->created);
	v->created = malloc(32);
	if (!v->created)
		return -ENOMEM;
	strftime(v->created, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
	snprintf(tmp, sizeof(tmp), ".%s.creating", v->id);
	if (mkdirat(s->volumes_fd, tmp, 0700) < 0)
		return -errno;
	fd = openat(s->volumes_fd, tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		goto out_remove;
	}
	/* the upper is the merged root: pods see its mode and owner */
	if (mkdirat(fd, "upper", 0755) < 0 || mkdirat(fd, "work", 0700) < 0) {
		ret = -errno;
		goto out_remove;
	}
	o = csi_volume_json(v);
	if (!o) {
		ret = -ENOMEM;
		goto out_remove;
	}
	ret = csi_record_write(fd, "volume.json", o);
	if (ret)
		goto out_remove;
	csi_kill_point("create.build");
	if (renameat(s->volumes_fd, tmp, s->volumes_fd, v->id) < 0) {
		ret = -errno;
		goto out_remove;
	}
	ret = fsync(s->volumes_fd) < 0 ? -errno : 0;
	csi_kill_point("create.done");
	goto out;
out_remove:
	strata_rmtree_at(s->volumes_fd, tmp);
out:
	json_object_put(o);
	if (fd >= 0)
		close(fd);
	return ret;
}

/*
 * -EBUSY while a daemon serves the volume, whatever the node records
 * say: a mounted stratafs holds an exclusive flock on its workdir. 0 when
 * none does (or the volume has no workdir any more).
 */
int csi_volume_served(struct csi_store *s, const char *id)
{
	char path[64];
	int fd, ret = 0;

	snprintf(path, sizeof(path), "%s/work", id);
	fd = openat(s->volumes_fd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
					     O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0)
		ret = errno == EWOULDBLOCK ? -EBUSY : -errno;
	close(fd);
	return ret;
}

int csi_volume_delete(struct csi_store *s, const char *id)
{
	char tmp[64];
	int ret;

	if (!csi_volume_id_valid(id))
		return 0;
	snprintf(tmp, sizeof(tmp), ".%s.deleting", id);
	if (renameat(s->volumes_fd, id, s->volumes_fd, tmp) < 0)
		return errno == ENOENT ? 0 : -errno;
	fsync(s->volumes_fd);
	csi_kill_point("delete.rename");
	/* the daemon log outlives unstaging, for post-mortems; not the volume */
	snprintf(tmp, sizeof(tmp), "%s.log", id);
	unlinkat(s->node_fd, tmp, 0);
	snprintf(tmp, sizeof(tmp), ".%s.deleting", id);
	ret = strata_rmtree_at(s->volumes_fd, tmp);
	if (ret)
		strata_warn("store: %s/volumes/%s: %s (removed at next start)",
			    s->root, tmp, strerror(-ret));
	return 0;
}

/*
 * Layers resolve only below layers/: no "..", no symlink anywhere on the
 * way, no magic links. The name was checked already; this is the kernel
 * enforcing the same rule, so a symlink placed in layers/ never leads out.
 */
int csi_layer_open(struct csi_store *s, const char *name)
{
	if (csi_layer_name_check(name))
		return -EINVAL;
	return csi_openat2(s->layers_fd, name, O_PATH | O_DIRECTORY,
			   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
				   RESOLVE_NO_MAGICLINKS);
}

static __thread int64_t csi_du_bytes, csi_du_inodes;

static int csi_du_visit(const char *path, const struct stat *st, int flag,
			struct FTW *ftw)
{
	csi_du_bytes += (int64_t)st->st_blocks * 512;
	csi_du_inodes++;
	return 0;
}

/* What the tree at `path` holds on disk, and its names, its root one. */
int csi_tree_usage(const char *path, int64_t *bytes, int64_t *inodes)
{
	csi_du_bytes = csi_du_inodes = 0;
	if (nftw(path, csi_du_visit, 32, FTW_PHYS | FTW_MOUNT) < 0)
		return -errno;
	*bytes = csi_du_bytes;
	*inodes = csi_du_inodes;
	return 0;
}
