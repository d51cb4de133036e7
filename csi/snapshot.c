// SPDX-License-Identifier: Apache-2.0
/*
 * Snapshots in the store:
 *
 *   snapshots/<id>/layer           a volume's upper, frozen read-only
 *   snapshots/<id>/snapshot.json   its record: name, source, chain below
 *   snapshots/.new-<id>.json       a snapshot being taken (the intent)
 *   snapshots/.new-<id>/           ... and where its layer goes
 *   snapshots/.del-<id>/           a snapshot being removed
 *
 * Taking one is O(1): the volume's upper is renamed to the new layer
 * (by the plugin, or by the volume's daemon through its control channel
 * when the volume is staged: "freeze"), and the volume continues on a
 * fresh empty upper with the snapshot's layer on top of its chain. A
 * chain entry "@<id>" names a snapshot's layer, a plain name a layer of
 * layers/.
 *
 * Crash safety rests on the intent, written before anything moves, and
 * on one question asked of the disk: is the layer in .new-<id>/ yet? If
 * not, nothing moved and the intent is dropped (the directory removed
 * with rmdir, never recursively: a daemon's late freeze into it makes it
 * non-empty, and then it is rolled forward instead). If so, the data
 * lives there and the snapshot is finished from the intent: a fresh
 * upper and workdir for the volume, the chain recorded, the directory
 * named. Every step of that is idempotent, so the normal path, an error
 * path and recovery (at plugin start, and before any daemon of the
 * volume starts) are the same code.
 *
 * A snapshot's size is what its layer allocates as the volume's daemon
 * counted it (fuse/usage.c), never a walk: a live freeze answers it; an
 * unstaged volume has the count its last daemon saved at its orderly
 * end, read before the intent is written, so that recovery records it
 * too (a live freeze's answer is lost with a crash: 0, unknown). That
 * saved count goes with the old upper and workdir: the next daemon would
 * charge it to the fresh upper, which it counts anew.
 *
 * Users are counted by reading the chains, not kept as counters: the
 * store holds one node's volumes, and a count that is computed cannot
 * drift from the records after a crash. A deleted snapshot that a chain
 * still names is hidden; it goes once nothing names it.
 *
 * Locks: callers hold the store's create_lock (chains change only under
 * it) and, to freeze a volume, its busy claim.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

#define CSI_SNAP_NEW ".new-"
#define CSI_SNAP_DEL ".del-"
/* a daemon syncs its upper before it freezes: give it time to */
#define CSI_FREEZE_TIMEOUT_MS 60000
/* a daemon started for a snapshot opens its control socket within this */
#define CSI_CONTROL_UP_MS 10000

/* A chain entry as records hold it: a layer name, or '@' and a snapshot id. */
int csi_chain_entry_check(const char *entry)
{
	if (entry[0] == CSI_CHAIN_SNAPSHOT)
		return csi_snapshot_id_valid(entry + 1) ? 0 : -EINVAL;
	return csi_layer_name_check(entry);
}

/* O_PATH on a chain entry's directory, resolved beneath the store. */
int csi_chain_open(struct csi_store *s, const char *entry)
{
	char path[64];

	if (entry[0] != CSI_CHAIN_SNAPSHOT)
		return csi_layer_open(s, entry);
	if (!csi_snapshot_id_valid(entry + 1))
		return -EINVAL;
	snprintf(path, sizeof(path), "%s/layer", entry + 1);
	return csi_openat2(s->snapshots_fd, path, O_PATH | O_DIRECTORY,
			   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
				   RESOLVE_NO_MAGICLINKS);
}

void csi_snapshot_free(struct csi_snapshot *ss)
{
	free(ss->name);
	csi_free_strv(ss->chain, ss->nchain);
	memset(ss, 0, sizeof(*ss));
}

static json_object *csi_snapshot_json(const struct csi_snapshot *ss)
{
	json_object *o = json_object_new_object(), *chain;

	if (!o)
		return NULL;
	chain = json_object_new_array();
	json_object_object_add(o, "id", json_object_new_string(ss->id));
	json_object_object_add(o, "name", json_object_new_string(ss->name));
	json_object_object_add(o, "source_volume_id",
			       json_object_new_string(ss->source));
	json_object_object_add(o, "capacity_bytes",
			       json_object_new_int64(ss->capacity));
	json_object_object_add(o, "size_bytes", json_object_new_int64(ss->size));
	json_object_object_add(o, "created_seconds",
			       json_object_new_int64(ss->created_s));
	json_object_object_add(o, "created_nanos",
			       json_object_new_int(ss->created_ns));
	for (int i = 0; chain && i < ss->nchain; i++)
		json_object_array_add(chain, json_object_new_string(ss->chain[i]));
	json_object_object_add(o, "chain", chain);
	json_object_object_add(o, "hidden", json_object_new_boolean(ss->hidden));
	return o;
}

static int csi_snapshot_parse(json_object *o, struct csi_snapshot *ss)
{
	const char *id = csi_json_str(o, "id"), *name = csi_json_str(o, "name");
	const char *src = csi_json_str(o, "source_volume_id");
	json_object *chain, *hidden;

	memset(ss, 0, sizeof(*ss));
	if (!id || !csi_snapshot_id_valid(id) || !name || !src ||
	    !csi_volume_id_valid(src) ||
	    !json_object_object_get_ex(o, "chain", &chain) ||
	    !json_object_is_type(chain, json_type_array))
		return -EBADMSG;
	memcpy(ss->id, id, sizeof(ss->id));
	memcpy(ss->source, src, sizeof(ss->source));
	ss->capacity = csi_json_int(o, "capacity_bytes");
	/* absent in records from before sizes: unknown */
	ss->size = csi_json_int(o, "size_bytes");
	if (ss->size < 0)
		ss->size = 0;
	ss->created_s = csi_json_int(o, "created_seconds");
	ss->created_ns = (int32_t)csi_json_int(o, "created_nanos");
	ss->hidden = json_object_object_get_ex(o, "hidden", &hidden) &&
		     json_object_get_boolean(hidden);
	ss->name = strdup(name);
	ss->nchain = json_object_array_length(chain);
	ss->chain = calloc(ss->nchain + 1, sizeof(char *));
	if (!ss->name || !ss->chain)
		return -ENOMEM;
	for (int i = 0; i < ss->nchain; i++) {
		const char *e = json_object_get_string(
			json_object_array_get_idx(chain, i));

		/* a record edited by hand is checked like a request */
		if (!e || csi_chain_entry_check(e))
			return -EBADMSG;
		ss->chain[i] = strdup(e);
		if (!ss->chain[i])
			return -ENOMEM;
	}
	return 0;
}

/* Reads a record (NAME below snapshots/): 0, -ENOENT, -EBADMSG, ... */
static int csi_snapshot_read(struct csi_store *s, const char *name,
			     struct csi_snapshot *ss)
{
	json_object *o;
	int ret;

	memset(ss, 0, sizeof(*ss));
	ret = csi_record_read(s->snapshots_fd, name, &o);
	if (ret)
		return ret == -ENOTDIR ? -ENOENT : ret;
	ret = csi_snapshot_parse(o, ss);
	json_object_put(o);
	if (ret)
		csi_snapshot_free(ss);
	return ret;
}

/* A named snapshot, hidden ones included: -ENOENT when there is none. */
int csi_snapshot_load(struct csi_store *s, const char *id,
		      struct csi_snapshot *ss)
{
	char path[64];
	int ret;

	memset(ss, 0, sizeof(*ss));
	if (!csi_snapshot_id_valid(id))
		return -ENOENT;
	snprintf(path, sizeof(path), "%s/" CSI_SNAP_RECORD, id);
	ret = csi_snapshot_read(s, path, ss);
	if (!ret && strcmp(ss->id, id)) {
		csi_snapshot_free(ss);
		ret = -EBADMSG;
	}
	return ret;
}

/* What csi_snapshot_scan looks for: "<prefix><id><suffix>". */
struct csi_snapshot_affix {
	const char *prefix;
	const char *suffix;
};

/* A name that is "<prefix><id><suffix>" with a snapshot id, cut to the id. */
static const char *csi_snapshot_keep_id(int dirfd, char *name, const void *arg)
{
	const struct csi_snapshot_affix *a = arg;
	size_t plen = strlen(a->prefix), slen = strlen(a->suffix);

	if (strlen(name) != plen + CSI_SNAPSHOT_ID_LEN + slen ||
	    strncmp(name, a->prefix, plen) ||
	    strcmp(name + plen + CSI_SNAPSHOT_ID_LEN, a->suffix))
		return NULL;
	name[plen + CSI_SNAPSHOT_ID_LEN] = '\0';
	return csi_snapshot_id_valid(name + plen) ? name + plen : NULL;
}

/* The names in snapshots/ that are "<prefix><id><suffix>", as ids. */
static int csi_snapshot_scan(struct csi_store *s, const char *prefix,
			     const char *suffix, char ***ids, int *count)
{
	const struct csi_snapshot_affix a = { prefix, suffix };

	return csi_store_names(s->snapshots_fd, csi_snapshot_keep_id, &a, ids,
			       count);
}

/* The ids of the named snapshots, hidden ones included, unsorted. */
int csi_snapshot_list(struct csi_store *s, char ***ids, int *count)
{
	return csi_snapshot_scan(s, "", "", ids, count);
}

/* A visible snapshot by its CreateSnapshot name. */
int csi_snapshot_find(struct csi_store *s, const char *name,
		      struct csi_snapshot *ss)
{
	char **ids;
	int n, ret;

	ret = csi_snapshot_list(s, &ids, &n);
	if (ret)
		return ret;
	ret = -ENOENT;
	for (int i = 0; i < n && ret == -ENOENT; i++) {
		if (csi_snapshot_load(s, ids[i], ss))
			continue;
		if (!ss->hidden && !strcmp(ss->name, name))
			ret = 0;
		else
			csi_snapshot_free(ss);
	}
	csi_free_strv(ids, n);
	return ret;
}

/* Writes the record of SS as NAME below snapshots/DIR ("." for beside). */
int csi_snapshot_write(struct csi_store *s, const char *dir,
		       const char *name, const struct csi_snapshot *ss)
{
	json_object *o = csi_snapshot_json(ss);
	int fd, ret;

	if (!o)
		return -ENOMEM;
	fd = openat(s->snapshots_fd, dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
						  O_CLOEXEC);
	ret = fd < 0 ? -errno : csi_record_write(fd, name, o);
	if (fd >= 0)
		close(fd);
	json_object_put(o);
	return ret;
}

int csi_snapshot_hide(struct csi_store *s, struct csi_snapshot *ss)
{
	ss->hidden = true;
	return csi_snapshot_write(s, ss->id, CSI_SNAP_RECORD, ss);
}

/*
 * A fresh upper for VID with the owner, mode, times and ACLs of the root
 * of the one frozen, made whole under a hidden name and renamed into
 * place: a crash leaves no upper (made again) or a whole one, never one
 * of the wrong mode. One that exists (a daemon's, after a live freeze)
 * is left as it is, also one made while this one was.
 */
static int csi_snapshot_fresh_upper(struct csi_store *s, const char *vid,
				    const char *layer)
{
	char upper[64], tmp[64];
	struct stat st;
	int fd = -1, from, ret = 0;

	snprintf(upper, sizeof(upper), "%s/upper", vid);
	snprintf(tmp, sizeof(tmp), "%s/.upper.new", vid);
	if (faccessat(s->volumes_fd, upper, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	/* open for reading: its ACLs are xattrs, which O_PATH cannot read */
	from = openat(s->snapshots_fd, layer, O_RDONLY | O_DIRECTORY |
						 O_NOFOLLOW | O_CLOEXEC);
	if (from < 0)
		return -errno;
	if (fstat(from, &st) < 0)
		goto out_errno;
	ret = strata_rmtree_at(s->volumes_fd, tmp);
	if (ret && ret != -ENOENT)
		goto out;
	if (mkdirat(s->volumes_fd, tmp, 0700) < 0)
		goto out_errno;
	/*
	 * The upper is the merged root: pods see its mode, owner, times and
	 * ACLs, and new entries inherit its default ACL.
	 */
	fd = openat(s->volumes_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
						O_CLOEXEC);
	if (fd < 0 || fchown(fd, st.st_uid, st.st_gid) < 0 ||
	    fchmod(fd, st.st_mode & 07777) < 0 ||
	    futimens(fd, (struct timespec[]){ st.st_atim, st.st_mtim }) < 0)
		goto out_errno;
	ret = strata_acl_copy(from, fd);
	if (ret)
		goto out;
	/*
	 * Never over one that appeared meanwhile: a rename would replace an
	 * empty directory, and a daemon finishing a freeze its worker died
	 * in makes the new upper itself and serves it at once (fuse/freeze.c).
	 */
	if (renameat2(s->volumes_fd, tmp, s->volumes_fd, upper,
		      RENAME_NOREPLACE) == 0 ||
	    (errno == EEXIST && unlinkat(s->volumes_fd, tmp, AT_REMOVEDIR) == 0))
		goto out;
out_errno:
	ret = -errno;
out:
	if (fd >= 0)
		close(fd);
	close(from);
	return ret;
}

/*
 * An empty workdir and no usage file for an upper that is not served:
 * what the old workdir held (copy-ups under way, the kernel's work/ and
 * index/) belongs to the upper that was frozen, and overlayfs wants none
 * of it; the count the last daemon saved is the frozen upper's.
 */
static int csi_snapshot_fresh_work(struct csi_store *s, const char *vid)
{
	char work[64];
	int fd, ret;

	ret = csi_volume_served(s, vid);
	if (ret)
		return ret == -EBUSY ? 0 : ret; /* its daemon keeps its own */
	snprintf(work, sizeof(work), "%s/work", vid);
	ret = strata_rmtree_at(s->volumes_fd, work);
	if (ret && ret != -ENOENT)
		return ret;
	if (mkdirat(s->volumes_fd, work, 0700) < 0 && errno != EEXIST)
		return -errno;
	fd = openat(s->volumes_fd, vid, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
						O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* and the volume's directory synced: the workdir's change stays too */
	ret = csi_record_remove(fd, "usage");
	close(fd);
	return ret;
}

/* The snapshot's layer on top of the volume's recorded chain, once. */
static int csi_snapshot_record_chain(struct csi_store *s,
				     const struct csi_snapshot *ss)
{
	struct csi_volume v;
	char entry[CSI_SNAPSHOT_ID_LEN + 2], **chain;
	int ret;

	ret = csi_volume_load(s, ss->source, &v);
	if (ret)
		return ret;
	snprintf(entry, sizeof(entry), "%c%s", CSI_CHAIN_SNAPSHOT, ss->id);
	if (v.nlayers && !strcmp(v.layers[0], entry))
		goto out;
	chain = calloc(v.nlayers + 2, sizeof(*chain));
	if (!chain) {
		ret = -ENOMEM;
		goto out;
	}
	chain[0] = strdup(entry);
	if (!chain[0]) {
		free(chain);
		ret = -ENOMEM;
		goto out;
	}
	memcpy(chain + 1, v.layers, v.nlayers * sizeof(*chain));
	free(v.layers);
	v.layers = chain;
	v.nlayers++;
	ret = csi_volume_save(s, &v);
	csi_kill_point("snapshot.record");
out:
	csi_volume_free(&v);
	return ret;
}

/*
 * Finishes a snapshot whose layer is in .new-<id>/: the volume on a
 * fresh upper over it, the record, the name. Each step may have been
 * done already by a run that crashed.
 */
static int csi_snapshot_finish(struct csi_store *s, struct csi_snapshot *ss)
{
	char dir[64], layer[64], intent[64];
	int ret;

	snprintf(dir, sizeof(dir), CSI_SNAP_NEW "%s", ss->id);
	snprintf(layer, sizeof(layer), CSI_SNAP_NEW "%s/layer", ss->id);
	snprintf(intent, sizeof(intent), CSI_SNAP_NEW "%s.json", ss->id);
	/* a volume deleted since keeps no chain: the snapshot stands alone */
	if (faccessat(s->volumes_fd, ss->source, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		ret = csi_snapshot_fresh_upper(s, ss->source, layer);
		if (!ret)
			ret = csi_snapshot_fresh_work(s, ss->source);
		if (ret)
			return ret;
		csi_kill_point("snapshot.fresh");
		ret = csi_snapshot_record_chain(s, ss);
		if (ret && ret != -ENOENT)
			return ret;
	}
	ret = csi_snapshot_write(s, dir, CSI_SNAP_RECORD, ss);
	if (ret)
		return ret;
	/* read-only from here on: nothing writes a layer */
	fchmodat(s->snapshots_fd, dir, 0755, 0);
	if (renameat(s->snapshots_fd, dir, s->snapshots_fd, ss->id) < 0)
		return -errno;
	if (fsync(s->snapshots_fd) < 0)
		return -errno;
	csi_kill_point("snapshot.named");
	return csi_record_remove(s->snapshots_fd, intent);
}

/*
 * Settles the intent of snapshot ID: finished when its layer was moved,
 * dropped when not. 0 when settled either way; *done says which.
 */
static int csi_snapshot_settle(struct csi_store *s, const char *id, bool *done)
{
	char dir[64], layer[64], intent[64];
	struct csi_snapshot ss;
	int ret;

	*done = false;
	snprintf(dir, sizeof(dir), CSI_SNAP_NEW "%s", id);
	snprintf(layer, sizeof(layer), CSI_SNAP_NEW "%s/layer", id);
	snprintf(intent, sizeof(intent), CSI_SNAP_NEW "%s.json", id);
	if (faccessat(s->snapshots_fd, id, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		*done = true; /* named already: only the intent was left */
		return csi_record_remove(s->snapshots_fd, intent);
	}
	ret = csi_snapshot_read(s, intent, &ss);
	if (ret == -ENOENT) {
		/* no intent: nothing can have moved into the directory */
		if (unlinkat(s->snapshots_fd, dir, AT_REMOVEDIR) < 0 &&
		    errno != ENOENT)
			return -errno;
		return 0;
	}
	if (ret)
		return ret;
	/* rmdir, not a tree: a daemon's freeze into it fails it, or fails */
	if (unlinkat(s->snapshots_fd, dir, AT_REMOVEDIR) == 0 || errno == ENOENT) {
		ret = csi_record_remove(s->snapshots_fd, intent);
		goto out;
	}
	if (errno != ENOTEMPTY && errno != EEXIST) {
		ret = -errno;
		goto out;
	}
	if (faccessat(s->snapshots_fd, layer, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		/* something else in there: not ours to judge or remove */
		ret = -ENOTEMPTY;
		goto out;
	}
	ret = csi_snapshot_finish(s, &ss);
	*done = ret == 0;
out:
	csi_snapshot_free(&ss);
	return ret;
}

/*
 * Settles the snapshots cut short for volume VID (NULL: for every
 * volume), and removes removals cut short. Before a daemon of the volume
 * starts: it must start on the chain that holds its data.
 */
int csi_snapshot_recover(struct csi_store *s, const char *vid)
{
	char **ids;
	int n, ret, first = 0;
	bool done;

	ret = csi_snapshot_scan(s, CSI_SNAP_NEW, ".json", &ids, &n);
	if (ret)
		return ret;
	for (int i = 0; i < n; i++) {
		struct csi_snapshot ss;
		char intent[64];

		snprintf(intent, sizeof(intent), CSI_SNAP_NEW "%s.json", ids[i]);
		if (vid) {
			bool other;

			/* one that cannot be read is settled at the next start */
			if (csi_snapshot_read(s, intent, &ss))
				continue;
			other = strcmp(ss.source, vid) != 0;
			csi_snapshot_free(&ss);
			if (other)
				continue;
		}
		ret = csi_snapshot_settle(s, ids[i], &done);
		if (ret) {
			strata_warn("store: the snapshot %s cut short cannot be settled: %s",
				    ids[i], strerror(-ret));
			first = first ? first : ret;
		} else {
			strata_info("store: the snapshot %s cut short was %s",
				    ids[i], done ? "finished" : "dropped");
		}
	}
	csi_free_strv(ids, n);
	if (vid)
		return first;
	/* directories without an intent: a crash before the intent's rename */
	ret = csi_snapshot_scan(s, CSI_SNAP_NEW, "", &ids, &n);
	for (int i = 0; !ret && i < n; i++)
		csi_snapshot_settle(s, ids[i], &done);
	if (!ret)
		csi_free_strv(ids, n);
	ret = csi_snapshot_scan(s, CSI_SNAP_DEL, "", &ids, &n);
	for (int i = 0; !ret && i < n; i++) {
		char del[64];

		snprintf(del, sizeof(del), CSI_SNAP_DEL "%s", ids[i]);
		strata_warn("store: removing the leftover %s/snapshots/%s",
			    s->root, del);
		strata_rmtree_at(s->snapshots_fd, del);
	}
	if (!ret)
		csi_free_strv(ids, n);
	return first;
}

/*
 * One record's part in csi_chain_users: ERR is what loading it gave, and
 * without an error ID joins USERS when CHAIN (N entries) names ENTRY.
 */
static int csi_chain_user(int err, bool strict, const char *id, char **chain,
			  int n, const char *entry, char ***users, int *count)
{
	if (err)
		return err != -ENOENT && strict ? -EIO : 0;
	for (int i = 0; i < n; i++)
		if (!strcmp(chain[i], entry))
			return csi_strv_push(users, count, id);
	return 0;
}

/*
 * Who names ENTRY in a chain: volume and snapshot ids (hidden snapshots
 * and snapshots being taken included). A record that cannot be read
 * counts as no user, but fails the answer with -EIO when STRICT: a
 * removal must not guess.
 */
int csi_chain_users(struct csi_store *s, const char *entry, char ***users,
		    int *count, bool strict)
{
	char **ids = NULL;
	int n = 0, ret;

	*users = NULL;
	*count = 0;
	ret = csi_volume_list(s, &ids, &n);
	for (int i = 0; !ret && i < n; i++) {
		struct csi_volume v;
		int err = csi_volume_load(s, ids[i], &v);

		/* a failed load leaves V empty: safe to pass on and to free */
		ret = csi_chain_user(err, strict, v.id, v.layers, v.nlayers,
				     entry, users, count);
		csi_volume_free(&v);
	}
	csi_free_strv(ids, n);
	ids = NULL;
	n = 0;
	for (int pass = 0; !ret && pass < 2; pass++) {
		ret = pass ? csi_snapshot_scan(s, CSI_SNAP_NEW, ".json", &ids, &n) :
			     csi_snapshot_list(s, &ids, &n);
		for (int i = 0; !ret && i < n; i++) {
			struct csi_snapshot ss;
			char name[64];
			int err;

			snprintf(name, sizeof(name), "%s%s%s",
				 pass ? CSI_SNAP_NEW : "", ids[i],
				 pass ? ".json" : "/" CSI_SNAP_RECORD);
			err = csi_snapshot_read(s, name, &ss);
			ret = csi_chain_user(err, strict, ss.id, ss.chain,
					     ss.nchain, entry, users, count);
			csi_snapshot_free(&ss);
		}
		csi_free_strv(ids, n);
		ids = NULL;
		n = 0;
	}
	if (ret) {
		csi_free_strv(*users, *count);
		*users = NULL;
		*count = 0;
	}
	return ret;
}

/* Removes a snapshot by name first, so that a crash leaves it whole or hidden. */
static int csi_snapshot_remove(struct csi_store *s, const char *id)
{
	char del[64];
	int ret;

	snprintf(del, sizeof(del), CSI_SNAP_DEL "%s", id);
	if (renameat(s->snapshots_fd, id, s->snapshots_fd, del) < 0)
		return -errno;
	fsync(s->snapshots_fd);
	csi_kill_point("snapshot.remove");
	ret = strata_rmtree_at(s->snapshots_fd, del);
	if (ret)
		strata_warn("store: %s/snapshots/%s: %s (removed at next start)",
			    s->root, del, strerror(-ret));
	strata_info("snapshot %s removed: nothing uses it any more", id);
	return 0;
}

/*
 * Removes the hidden snapshots nothing uses, until none is left: each
 * removal may leave the snapshots of its own chain unused. The caller
 * holds create_lock.
 */
void csi_snapshot_gc(struct csi_store *s)
{
	bool again = true;

	while (again) {
		char **ids;
		int n;

		again = false;
		if (csi_snapshot_list(s, &ids, &n))
			return;
		for (int i = 0; i < n; i++) {
			struct csi_snapshot ss;
			char entry[CSI_SNAPSHOT_ID_LEN + 2], **users;
			int nusers;

			if (csi_snapshot_load(s, ids[i], &ss))
				continue;
			if (!ss.hidden) {
				csi_snapshot_free(&ss);
				continue;
			}
			snprintf(entry, sizeof(entry), "%c%s",
				 CSI_CHAIN_SNAPSHOT, ss.id);
			csi_snapshot_free(&ss);
			if (csi_chain_users(s, entry, &users, &nusers, true))
				continue;
			csi_free_strv(users, nusers);
			if (!nusers && csi_snapshot_remove(s, ids[i]) == 0)
				again = true;
		}
		csi_free_strv(ids, n);
	}
}

/*
 * The daemon's answer to a freeze, "layer=PATH bytes=N" with PATH as
 * asked (matched whole: it may hold spaces): N, the bytes its count gave
 * the frozen layer, in *BYTES. -EPROTO for another answer (a daemon from
 * before the count answers "layer=PATH" alone).
 */
static int csi_snapshot_frozen_bytes(const char *text, const char *path,
				     int64_t *bytes)
{
	size_t len = strlen(path);
	long long n;
	int end = 0;

	if (strncmp(text, "layer=", 6) || strncmp(text + 6, path, len))
		return -EPROTO;
	text += 6 + len;
	if (strncmp(text, " bytes=", 7) || text[7] < '0' || text[7] > '9' ||
	    sscanf(text + 7, "%lld%n", &n, &end) != 1 || text[7 + end])
		return -EPROTO;
	*bytes = n;
	return 0;
}

/*
 * The volume's upper moved to the new layer by its daemon, live: the
 * daemon syncs, holds writers for a moment, renames its upper there and
 * carries on over it on a fresh upper. What it answers is in WHY, the
 * frozen layer's size in SS (0 when it does not say).
 */
static int csi_snapshot_freeze_live(struct csi_store *s, const char *vid,
				    struct csi_snapshot *ss, const char *layer,
				    char *why, size_t size)
{
	char path[PATH_MAX], out[PATH_MAX + 64];
	const char *argv[] = { "freeze", path };
	int ret;

	snprintf(path, sizeof(path), "%s/snapshots/%s", s->root, layer);
	ret = csi_control_call(s, vid, argv, 2, out, sizeof(out),
			       CSI_FREEZE_TIMEOUT_MS);
	/* no socket to reach, unless the daemon answered with that errno */
	if ((ret == -ENOENT || ret == -ECONNREFUSED) && !out[0]) {
		snprintf(why, size, "volume %s is staged but its daemon does not answer (%s): retry once it is healed",
			 vid, strerror(-ret));
		return -ENOTCONN;
	}
	if (ret == -ETIMEDOUT || ret == -EIO || ret == -EPROTO) {
		snprintf(why, size, "volume %s: its daemon did not answer the freeze (%s)",
			 vid, strerror(-ret));
		return -ETIMEDOUT;
	}
	if (ret) {
		snprintf(why, size, "volume %s: its daemon could not freeze it: %s%s%s",
			 vid, strerror(-ret), out[0] ? ": " : "", out);
		return -EREMOTEIO;
	}
	/* frozen all the same: the size is only unknown */
	if (csi_snapshot_frozen_bytes(out, path, &ss->size))
		strata_warn("volume %s: its daemon froze it but answered '%.200s': the size of snapshot %s is unknown",
			    vid, out, ss->id);
	return 0;
}

/*
 * Whether the workdir's hard-link index (the kernel's "index", or the
 * "strata-index" of older daemons) names anything: its entries are files
 * of the upper, and a fresh upper would lose the link between a copied-up
 * hard link and its other names, which would show the old data again.
 * A live freeze has the volume's daemon link those names into the upper
 * first (fuse/linkup.c): an unstaged volume gets a daemon for it
 * (csi_snapshot_unstaged_start).
 */
static int csi_snapshot_index_used(struct csi_store *s, const char *vid)
{
	const char *names[] = { "index", "strata-index" };
	int used = 0;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !used; i++) {
		char path[64];
		struct dirent *de;
		DIR *d;

		snprintf(path, sizeof(path), "%s/work/%s", vid, names[i]);
		d = strata_opendir_at(s->volumes_fd, path);
		if (!d) {
			if (errno == ENOENT)
				continue;
			return -errno;
		}
		while (!used && (de = readdir(d)))
			used = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
		closedir(d);
	}
	return used;
}

/*
 * What the upper of unstaged volume VID allocates, by the count its last
 * daemon saved at its orderly end, which holds its workdir too: that one
 * is walked (a few directories: the daemon emptied it) and taken off.
 * 0, unknown, without a clean count: the layer is never walked.
 */
static int64_t csi_snapshot_saved_size(struct csi_store *s, const char *vid)
{
	int64_t bytes, work = 0, inodes;
	char path[PATH_MAX];
	int ret;

	if (csi_usage_saved(s, vid, &bytes))
		return 0;
	if (snprintf(path, sizeof(path), "%s/volumes/%s/work", s->root, vid) >=
	    (int)sizeof(path))
		return 0;
	ret = csi_tree_usage(path, &work, &inodes);
	if (ret && ret != -ENOENT)
		return 0;
	return bytes > work ? bytes - work : 0;
}

/*
 * Waits for a daemon just started for VID to listen on its control
 * socket, which it opens after its mount first answered.
 */
static int csi_snapshot_control_up(struct csi_store *s, const char *vid,
				   char *why, size_t size)
{
	const char *argv[] = { "status" };
	char out[512];
	int ret;

	for (int waited = 0; waited < CSI_CONTROL_UP_MS; waited += 10) {
		ret = csi_control_call(s, vid, argv, 1, out, sizeof(out),
				       CSI_CONTROL_UP_MS);
		if ((ret != -ENOENT && ret != -ECONNREFUSED) || out[0])
			break;
		usleep(10 * 1000);
	}
	if (ret)
		snprintf(why, size, "volume %s: the daemon started to link its hard links up does not answer on its control socket: %s",
			 vid, strerror(-ret));
	return ret;
}

/* Closing its mount's only reference ends the connection, and the daemon. */
static void csi_snapshot_linkup_stop(struct csi_plugin *p,
				     struct csi_node_vol *n, int *mntfd)
{
	if (*mntfd < 0)
		return;
	close(*mntfd);
	*mntfd = -1;
	csi_daemon_stop(p, n);
}

/*
 * How unstaged volume V is frozen, decided before the snapshot's intent
 * is written: by a rename of its upper (0, *MNTFD -1), or, when its
 * workdir's index names copied-up hard links, by a daemon, since only a
 * daemon links their other names into the upper first (fuse/linkup.c):
 * one is started on a mount never attached anywhere, for the freeze
 * alone (0, *MNTFD its mount's only reference, N its daemon). Before
 * the intent, because a daemon's start settles the snapshots of its
 * volume cut short. -errno with WHY when neither can be, and nothing
 * changed.
 */
static int csi_snapshot_unstaged_start(struct csi_plugin *p,
				       const struct csi_volume *v,
				       struct csi_node_vol *n, int *mntfd,
				       char *why, size_t size)
{
	int ret = csi_volume_served(&p->store, v->id);

	*mntfd = -1;
	if (ret == -EBUSY) {
		snprintf(why, size, "volume %s is served by a stratafs daemon that no node record names: nothing was changed; unstage it first",
			 v->id);
		return ret;
	}
	if (!ret)
		ret = csi_snapshot_index_used(&p->store, v->id);
	if (ret < 0)
		snprintf(why, size, "volume %s: whether a daemon serves it or its workdir's index names hard links: %s",
			 v->id, strerror(-ret));
	if (ret <= 0)
		return ret;
	memcpy(n->id, v->id, sizeof(n->id));
	ret = csi_daemon_start(p, v, n, mntfd, why, size);
	if (ret)
		return ret;	/* WHY has the daemon's own words */
	ret = csi_snapshot_control_up(&p->store, v->id, why, size);
	if (ret)
		csi_snapshot_linkup_stop(p, n, mntfd);
	return ret;
}

/*
 * The upper of an unstaged volume, renamed: no daemon holds it, and no
 * copied-up hard link needs one (csi_snapshot_unstaged_start).
 */
static int csi_snapshot_freeze_here(struct csi_store *s, const char *vid,
				    const char *layer, char *why, size_t size)
{
	char upper[64];
	int ret = 0;

	snprintf(upper, sizeof(upper), "%s/upper", vid);
	if (renameat(s->volumes_fd, upper, s->snapshots_fd, layer) < 0)
		ret = -errno;
	if (ret)
		snprintf(why, size, "volume %s: moving its upper to the snapshot: %s",
			 vid, strerror(-ret));
	else
		fsync(s->volumes_fd);
	return ret;
}

/*
 * Takes the snapshot SS (its name and hidden flag set) of volume V: on
 * return SS is whole and V's record has it on top of its chain, or, on
 * an error (-E2BIG: the chain would be too deep; -ENOTCONN, -ETIMEDOUT,
 * -EREMOTEIO: the daemon's; -EBUSY), nothing changed unless the error
 * came after the layer moved, and then the next recovery finishes it.
 * The caller holds create_lock and V's busy claim.
 */
int csi_snapshot_take(struct csi_plugin *p, struct csi_volume *v,
		      struct csi_snapshot *ss, char *why, size_t size)
{
	struct csi_store *s = &p->store;
	char dir[64], layer[64], intent[64];
	char staging[] = "(none: a daemon to freeze an unstaged volume)";
	struct csi_node_vol n, ln = { .staging = staging };
	struct timespec now;
	bool staged, done;
	int ret, mntfd = -1;

	if (v->nlayers + 1 > CSI_MAX_LAYERS) {
		snprintf(why, size, "volume %s already sits on %d layers: a snapshot would make its chain deeper than the limit of %d; clone it from a snapshot less deep, or copy its data into a new volume",
			 v->id, v->nlayers, CSI_MAX_LAYERS);
		return -E2BIG;
	}
	ret = csi_state_load(s, v->id, &n);
	if (ret && ret != -ENOENT) {
		snprintf(why, size, "the node record %s/node/%s.json cannot be read: %s",
			 s->root, v->id, strerror(-ret));
		return ret;
	}
	staged = ret == 0;
	if (staged)
		csi_state_free(&n);
	else if ((ret = csi_snapshot_unstaged_start(p, v, &ln, &mntfd, why,
						    size)))
		return ret;
	ret = csi_store_new_id(CSI_SNAPSHOT_ID_PREFIX, ss->id);
	if (ret)
		goto out_why;
	memcpy(ss->source, v->id, sizeof(ss->source));
	ss->capacity = v->capacity;
	/* in the intent: a recovery that finishes the snapshot keeps it */
	if (!staged && mntfd < 0)	/* a daemon that freezes says it */
		ss->size = csi_snapshot_saved_size(s, v->id);
	clock_gettime(CLOCK_REALTIME, &now);
	ss->created_s = now.tv_sec;
	ss->created_ns = now.tv_nsec;
	for (int i = 0; i < v->nlayers && !ret; i++)
		ret = csi_strv_push(&ss->chain, &ss->nchain, v->layers[i]);
	if (ret)
		goto out_why;
	snprintf(dir, sizeof(dir), CSI_SNAP_NEW "%s", ss->id);
	snprintf(layer, sizeof(layer), CSI_SNAP_NEW "%s/layer", ss->id);
	snprintf(intent, sizeof(intent), CSI_SNAP_NEW "%s.json", ss->id);
	/* the intent first: whatever moves after it can be found again */
	ret = csi_snapshot_write(s, ".", intent, ss);
	if (ret)
		goto out_why;
	if (mkdirat(s->snapshots_fd, dir, 0700) < 0 ||
	    fsync(s->snapshots_fd) < 0) {
		ret = -errno;
		csi_snapshot_settle(s, ss->id, &done);
		goto out_why;
	}
	csi_kill_point("snapshot.intent");
	ret = staged || mntfd >= 0 ?
		      csi_snapshot_freeze_live(s, v->id, ss, layer, why, size) :
		      csi_snapshot_freeze_here(s, v->id, layer, why, size);
	/* its daemon's work is done: a fresh upper and workdir, stopped */
	csi_snapshot_linkup_stop(p, &ln, &mntfd);
	if (!ret) {
		csi_kill_point("snapshot.upper");
		ret = csi_snapshot_finish(s, ss);
		if (ret)
			snprintf(why, size, "volume %s: finishing snapshot %s: %s (the next start of the plugin or of the volume's daemon finishes it)",
				 v->id, ss->id, strerror(-ret));
		return ret;
	}
	/* whether the layer moved or not, the disk says: settle by it */
	if (csi_snapshot_settle(s, ss->id, &done) == 0 && done)
		ret = 0;
	return ret;
out_why:
	csi_snapshot_linkup_stop(p, &ln, &mntfd);
	snprintf(why, size, "volume %s: starting the snapshot: %s", v->id,
		 strerror(-ret));
	return ret;
}
