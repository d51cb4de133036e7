/*
 * The Node service: staging starts a stratafs daemon for the volume,
 * publishing bind-mounts that mount into a pod's directory. Every handler
 * has the same order: check the request, mark the volume busy, load its
 * records, return early when the work is already done, act, save, reply.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "csi.h"

static const Csi__V1__NodeStageVolumeResponse csi_stage_out =
	CSI__V1__NODE_STAGE_VOLUME_RESPONSE__INIT;
static const Csi__V1__NodeUnstageVolumeResponse csi_unstage_out =
	CSI__V1__NODE_UNSTAGE_VOLUME_RESPONSE__INIT;
static const Csi__V1__NodePublishVolumeResponse csi_publish_out =
	CSI__V1__NODE_PUBLISH_VOLUME_RESPONSE__INIT;
static const Csi__V1__NodeUnpublishVolumeResponse csi_unpublish_out =
	CSI__V1__NODE_UNPUBLISH_VOLUME_RESPONSE__INIT;

/* What every node handler starts with: the request's volume and paths. */
struct csi_node_req {
	const char *id;
	char own_id[CSI_VOLUME_ID_LEN + 1]; /* an inline volume's, in the store */
	char path[PATH_MAX];	/* staging or target, canonical */
	char staging[PATH_MAX];	/* canonical, where both are given */
	char *flags;		/* canonical mount flags of the capability */
	unsigned long mflags;
	bool busy;
	struct csi_volume v;	/* the volume's record, once loaded */
	struct csi_node_vol n;	/* its node record, once loaded */
};

static int csi_node_path(struct csi_reply *r, const char *field,
			 const char *path, char *out)
{
	char why[256];
	int ret;

	if (!path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s is required", field);
		return -EINVAL;
	}
	if (csi_path_check(path, why, sizeof(why))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s: %s", field, why);
		return -EINVAL;
	}
	ret = csi_path_canon(path, out, PATH_MAX);
	if (ret) {
		csi_reply_set(r, CSI_NOT_FOUND,
			      "%s: the parent of %s: %s", field, path, strerror(-ret));
		return ret;
	}
	return 0;
}

/* The volume id and, where the call needs one, the capability. */
static int csi_node_check(struct csi_reply *r, struct csi_node_req *nr,
			  const char *id, const Csi__V1__VolumeCapability *cap,
			  bool need_cap)
{
	char why[384];

	if (!id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return -EINVAL;
	}
	csi_reply_volume(r, id);
	nr->id = id;
	if (need_cap && !cap) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "volume_capability is required");
		return -EINVAL;
	}
	if (cap && (csi_capability_check(cap, why, sizeof(why)) ||
		    csi_mount_flags(cap, &nr->mflags, &nr->flags, why,
				    sizeof(why)))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return -EINVAL;
	}
	return 0;
}

/* After the checks: an id that cannot be ours is no volume; else mark it busy. */
static int csi_node_lock(struct csi_plugin *p, struct csi_reply *r,
			 struct csi_node_req *nr)
{
	if (nr->busy)
		return 0;
	if (!csi_volume_id_valid(nr->id)) {
		csi_reply_set(r, CSI_NOT_FOUND, "no volume %.64s", nr->id);
		return -ENOENT;
	}
	if (csi_busy_enter(&p->store, nr->id)) {
		csi_reply_set(r, CSI_ABORTED,
			      "another operation on volume %s is in progress",
			      nr->id);
		return -EBUSY;
	}
	nr->busy = true;
	return 0;
}

static void csi_node_end(struct csi_plugin *p, struct csi_node_req *nr)
{
	csi_state_free(&nr->n);
	csi_volume_free(&nr->v);
	if (nr->busy)
		csi_busy_leave(&p->store, nr->id);
	free(nr->flags);
}

/* Loads the volume record: NOT_FOUND when there is none. */
static int csi_node_volume(struct csi_plugin *p, struct csi_reply *r,
			   const char *id, struct csi_volume *v)
{
	int ret = csi_volume_load(&p->store, id, v);

	if (ret)
		csi_reply_set(r, ret == -ENOENT ? CSI_NOT_FOUND :
			      CSI_INTERNAL, "volume %s: %s", id,
			      ret == -ENOENT ? "no such volume" : strerror(-ret));
	return ret;
}

/* A pod with fsGroup gets the volume root in its group, setgid. */
static int csi_mount_group(struct csi_plugin *p, const char *id,
			   const Csi__V1__VolumeCapability *cap)
{
	char path[64];
	long gid;

	if (!cap->mount->volume_mount_group[0])
		return 0;
	gid = strtol(cap->mount->volume_mount_group, NULL, 10);
	snprintf(path, sizeof(path), "%s/upper", id);
	if (fchownat(p->store.volumes_fd, path, (uid_t)-1, (gid_t)gid, 0) < 0 ||
	    fchmodat(p->store.volumes_fd, path, 02775, 0) < 0)
		return -errno;
	return 0;
}

static int csi_count_staged(struct csi_plugin *p)
{
	char **ids;
	int n;

	if (csi_state_list(&p->store, &ids, &n))
		return 0;
	csi_free_strv(ids, n);
	return n;
}

/*
 * Stages a volume that is not staged: starts its daemon on nr->staging and
 * records it. Shared by NodeStageVolume and inline volumes.
 */
static int csi_node_start(struct csi_plugin *p, struct csi_reply *r,
			  struct csi_node_req *nr, const struct csi_volume *v,
			  struct csi_node_vol *n,
			  const Csi__V1__VolumeCapability *cap)
{
	char why[512];
	int ret;

	if (p->cfg.max_volumes && csi_count_staged(p) >= p->cfg.max_volumes) {
		csi_reply_set(r, CSI_RESOURCE_EXHAUSTED,
			      "this node already has %lld staged volumes (--max-volumes)",
			      (long long)p->cfg.max_volumes);
		return -ENOSPC;
	}
	if (mkdir(nr->staging, 0750) < 0 && errno != EEXIST) {
		ret = -errno;
		csi_reply_errno(r, ret, "staging_target_path");
		return ret;
	}
	ret = csi_mount_group(p, nr->id, cap);
	if (ret) {
		csi_reply_errno(r, ret, "volume_mount_group");
		return ret;
	}
	memcpy(n->id, nr->id, sizeof(n->id));
	n->staging = strdup(nr->staging);
	n->stage_flags = strdup(nr->flags);
	if (!n->staging || !n->stage_flags) {
		csi_reply_errno(r, -ENOMEM, "NodeStageVolume");
		return -ENOMEM;
	}
	ret = csi_daemon_start(p, v, n->staging, n, why, sizeof(why));
	if (ret) {
		csi_reply_set(r, ret == -ENOENT ? CSI_FAILED_PRECONDITION :
			      ret == -ENOSPC ? CSI_RESOURCE_EXHAUSTED :
			      CSI_INTERNAL, "%s", why);
		return ret;
	}
	ret = csi_state_save(&p->store, n);
	if (ret) {
		csi_daemon_stop(p, n);
		csi_reply_errno(r, ret, "saving the node record");
		return ret;
	}
	return 0;
}

static void csi_node_stage(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__NodeStageVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr = { 0 };
	char why[512];
	int ret;

	if (csi_node_check(r, &nr, req->volume_id, req->volume_capability, true) ||
	    csi_node_path(r, "staging_target_path", req->staging_target_path,
			  nr.staging) ||
	    csi_node_lock(p, r, &nr) || csi_node_volume(p, r, nr.id, &nr.v))
		goto out;
	ret = csi_state_load(&p->store, nr.id, &nr.n);
	if (ret == 0) {
		if (strcmp(nr.n.staging, nr.staging) || strcmp(nr.n.stage_flags, nr.flags)) {
			csi_reply_set(r, CSI_ALREADY_EXISTS,
				      "volume %s is already staged at %s%s", nr.id,
				      nr.n.staging,
				      strcmp(nr.n.staging, nr.staging) ? "" :
					      " with another capability");
			goto out;
		}
		/* staged already: make sure it still answers */
		if (!csi_daemon_alive(&nr.n) || csi_mount_alive(nr.n.staging)) {
			ret = csi_heal(p, &nr.v, &nr.n, why, sizeof(why));
			if (ret) {
				csi_reply_set(r, CSI_INTERNAL, "%s", why);
				goto out;
			}
		}
		csi_reply_ok(r, (void *)&csi_stage_out);
		goto out;
	}
	if (ret != -ENOENT) {
		csi_reply_errno(r, ret, "node record");
		goto out;
	}
	if (csi_node_start(p, r, &nr, &nr.v, &nr.n, req->volume_capability))
		goto out;
	strata_info("volume %s staged at %s, stratafs pid %d", nr.id, nr.n.staging,
		    (int)nr.n.pid);
	csi_reply_ok(r, (void *)&csi_stage_out);
out:
	csi_node_end(p, &nr);
}

/* The staged volume's record; FAILED_PRECONDITION when it is not staged here. */
static int csi_node_staged(struct csi_plugin *p, struct csi_reply *r,
			   const char *id, const char *staging,
			   struct csi_node_vol *n)
{
	int ret = csi_state_load(&p->store, id, n);

	if (ret == -ENOENT) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is not staged on this node", id);
		return ret;
	}
	if (ret) {
		csi_reply_errno(r, ret, "node record");
		return ret;
	}
	if (staging && strcmp(n->staging, staging)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is staged at %s, not at %s", id,
			      n->staging, staging);
		csi_state_free(n);
		return -EINVAL;
	}
	return 0;
}

static void csi_node_unstage(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__NodeUnstageVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr = { 0 };
	int ret;

	if (csi_node_check(r, &nr, req->volume_id, NULL, false) ||
	    csi_node_path(r, "staging_target_path", req->staging_target_path,
			  nr.staging) ||
	    csi_node_lock(p, r, &nr))
		goto out;
	ret = csi_state_load(&p->store, nr.id, &nr.n);
	if (ret == -ENOENT) {
		/* unstaged already; a volume that never existed is NOT_FOUND */
		if (!csi_node_volume(p, r, nr.id, &nr.v))
			csi_reply_ok(r, (void *)&csi_unstage_out);
		goto out;
	}
	if (ret) {
		csi_reply_errno(r, ret, "node record");
		goto out;
	}
	if (strcmp(nr.n.staging, nr.staging)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is staged at %s, not at %s", nr.id,
			      nr.n.staging, nr.staging);
		goto out;
	}
	if (nr.n.ntargets) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is still published at %s: unpublish it first",
			      nr.id, nr.n.targets[0].path);
		goto out;
	}
	ret = csi_daemon_stop(p, &nr.n);
	if (ret) {
		csi_reply_errno(r, ret, "unmounting the staging path");
		goto out;
	}
	ret = csi_state_remove(&p->store, nr.id);
	if (ret) {
		csi_reply_errno(r, ret, "removing the node record");
		goto out;
	}
	csi_state_remove_stats(&p->store, nr.id);
	strata_info("volume %s unstaged from %s", nr.id, nr.n.staging);
	csi_reply_ok(r, (void *)&csi_unstage_out);
out:
	csi_node_end(p, &nr);
}

/*
 * Inline (ephemeral) volumes: kubelet skips CreateVolume and
 * NodeStageVolume, calls NodePublishVolume with its own volume id and
 * volume_context["csi.storage.k8s.io/ephemeral"] = "true", and expects the
 * volume to live exactly as long as the pod. They become store volumes
 * marked ephemeral, named by kubelet's id and staged beneath
 * <root>/ephemeral/, so that restarts, healing and metrics treat them as
 * any other volume.
 */
#define CSI_EPHEMERAL_KEY "csi.storage.k8s.io/ephemeral"

static bool csi_is_ephemeral(const Csi__V1__NodePublishVolumeRequest *req)
{
	const char *e = CSI_MAP_GET(req, volume_context, CSI_EPHEMERAL_KEY);

	return e && !strcmp(e, "true");
}

/* kubelet's ids ("csi-" and a hash) go into records, never into paths */
static bool csi_ephemeral_id_valid(const char *id)
{
	size_t len = strlen(id);

	if (len == 0 || len > CSI_NAME_MAX)
		return false;
	for (const char *c = id; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' &&
		    *c != '.')
			return false;
	return true;
}

/* Finds or creates the store volume behind an inline volume. */
static int csi_ephemeral_volume(struct csi_plugin *p, struct csi_reply *r,
				const Csi__V1__NodePublishVolumeRequest *req,
				struct csi_volume *v)
{
	const char *layers = CSI_MAP_GET(req, volume_context, "layers");
	bool passthrough;
	char why[384];
	int ret;

	if (!csi_ephemeral_id_valid(req->volume_id)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "inline volume id '%.64s' is malformed", req->volume_id);
		return -EINVAL;
	}
	ret = csi_volume_options_check(req->n_volume_context,
				       (void *const *)req->volume_context,
				       "volume attribute", &passthrough, why,
				       sizeof(why));
	if (ret) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return ret;
	}
	pthread_mutex_lock(&p->store.create_lock);
	ret = csi_volume_find(&p->store, req->volume_id, true, v);
	if (ret != -ENOENT)
		goto out;
	memset(v, 0, sizeof(*v));
	ret = csi_layers_check(p, v, layers ? layers : "", why, sizeof(why));
	if (ret == -EINVAL) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		goto out_unlock;
	}
	if (ret)
		goto out;
	v->passthrough = passthrough;
	v->ephemeral = true;
	v->name = strdup(req->volume_id);
	v->parameters = json_object_new_object();
	if (!v->name || !v->parameters)
		ret = -ENOMEM;
	if (!ret)
		ret = csi_volume_new_id(v->id);
	if (!ret)
		ret = csi_volume_create(&p->store, v);
out:
	if (ret)
		csi_reply_errno(r, ret, "creating the inline volume");
out_unlock:
	pthread_mutex_unlock(&p->store.create_lock);
	if (ret)
		csi_volume_free(v);
	return ret;
}

/*
 * Makes an inline volume ready for the ordinary publish path: created,
 * marked busy under its store id, and staged.
 */
static int csi_ephemeral_prepare(struct csi_plugin *p, struct csi_reply *r,
				 const Csi__V1__NodePublishVolumeRequest *req,
				 struct csi_node_req *nr)
{
	struct csi_node_vol n = { 0 };
	struct csi_volume v = { 0 };
	int ret;

	ret = csi_ephemeral_volume(p, r, req, &v);
	if (ret)
		return ret;
	memcpy(nr->own_id, v.id, sizeof(nr->own_id));
	nr->id = nr->own_id;
	snprintf(nr->staging, sizeof(nr->staging), "%s/ephemeral/%s",
		 p->store.root, v.id);
	ret = csi_node_lock(p, r, nr);
	if (ret)
		goto out;
	ret = csi_state_load(&p->store, nr->id, &n);
	if (ret == -ENOENT) {
		if (mkdirat(p->store.root_fd, "ephemeral", 0700) < 0 &&
		    errno != EEXIST) {
			ret = -errno;
			csi_reply_errno(r, ret, "the store's ephemeral directory");
			goto out;
		}
		ret = csi_node_start(p, r, nr, &v, &n, req->volume_capability);
	} else if (ret) {
		csi_reply_errno(r, ret, "node record");
	}
out:
	csi_state_free(&n);
	csi_volume_free(&v);
	return ret;
}

/* The pod is gone: the inline volume goes with its last target. */
static int csi_ephemeral_remove(struct csi_plugin *p, struct csi_reply *r,
				struct csi_node_vol *n)
{
	int ret;

	if (n->ntargets)
		return 0;
	ret = csi_daemon_stop(p, n);
	if (!ret)
		ret = csi_state_remove(&p->store, n->id);
	if (ret) {
		csi_reply_errno(r, ret, "removing the inline volume");
		return ret;
	}
	csi_state_remove_stats(&p->store, n->id);
	rmdir(n->staging);
	ret = csi_volume_delete(&p->store, n->id);
	if (ret)
		csi_reply_errno(r, ret, "deleting the inline volume");
	return ret;
}

static void csi_node_publish(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__NodePublishVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr = { 0 };
	struct csi_target *t;
	bool ro, created = false;
	char why[512];
	int ret;

	if (csi_node_check(r, &nr, req->volume_id, req->volume_capability, true) ||
	    csi_node_path(r, "target_path", req->target_path, nr.path))
		goto out;
	if (csi_is_ephemeral(req)) {
		if (csi_ephemeral_prepare(p, r, req, &nr))
			goto out;
	} else if (csi_node_path(r, "staging_target_path",
				 req->staging_target_path, nr.staging)) {
		goto out;
	}
	if (csi_node_lock(p, r, &nr) || csi_node_volume(p, r, nr.id, &nr.v) ||
	    csi_node_staged(p, r, nr.id, nr.staging, &nr.n))
		goto out;
	ro = req->readonly || (nr.mflags & MS_RDONLY) ||
	     csi_capability_readonly(req->volume_capability);
	t = csi_state_target(&nr.n, nr.path);
	if (t) {
		if (t->readonly != ro || strcmp(t->flags, nr.flags)) {
			csi_reply_set(r, CSI_ALREADY_EXISTS,
				      "volume %s is already published at %s with other options",
				      nr.id, nr.path);
			goto out;
		}
		if (!csi_mount_same(nr.n.staging, nr.path)) {
			csi_reply_ok(r, (void *)&csi_publish_out);
			goto out;
		}
		/* recorded but its mount is gone: bind it again below */
		csi_state_drop_target(&nr.n, nr.path);
	}
	if (!csi_daemon_alive(&nr.n) || csi_mount_alive(nr.n.staging)) {
		ret = csi_heal(p, &nr.v, &nr.n, why, sizeof(why));
		if (ret) {
			csi_reply_set(r, CSI_INTERNAL, "%s", why);
			goto out;
		}
	}
	if (!csi_mount_find(nr.path, NULL, 0, NULL, 0)) {
		csi_reply_set(r, CSI_ALREADY_EXISTS,
			      "%s already has a mount that is not this volume's",
			      nr.path);
		goto out;
	}
	if (mkdir(nr.path, 0750) == 0)
		created = true;
	else if (errno != EEXIST) {
		csi_reply_errno(r, -errno, "target_path");
		goto out;
	}
	ret = csi_mount_bind(nr.n.staging, nr.path, nr.mflags | (ro ? MS_RDONLY : 0));
	if (ret) {
		csi_reply_errno(r, ret, "bind mount");
		goto out_rmdir;
	}
	ret = csi_state_add_target(&nr.n, nr.path, ro, nr.flags);
	if (!ret)
		ret = csi_state_save(&p->store, &nr.n);
	if (ret) {
		csi_mount_umount(nr.path);
		csi_reply_errno(r, ret, "saving the node record");
		goto out_rmdir;
	}
	csi_reply_ok(r, (void *)&csi_publish_out);
	goto out;
out_rmdir:
	if (created)
		rmdir(nr.path);
out:
	csi_node_end(p, &nr);
}

/*
 * Unmounts the target even when the daemon under it is dead: the mount
 * table, not a stat of the path, says whether something is mounted.
 */
static void csi_node_unpublish(struct csi_plugin *p, const ProtobufCMessage *msg,
			       struct csi_reply *r)
{
	const Csi__V1__NodeUnpublishVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr = { 0 };
	char fstype[64];
	bool staged;
	int ret;

	if (csi_node_check(r, &nr, req->volume_id, NULL, false) ||
	    csi_node_path(r, "target_path", req->target_path, nr.path))
		goto out;
	/* kubelet names an inline volume by its own id */
	if (!csi_volume_id_valid(nr.id) && csi_ephemeral_id_valid(nr.id)) {
		if (csi_volume_find(&p->store, nr.id, true, &nr.v) == 0) {
			memcpy(nr.own_id, nr.v.id, sizeof(nr.own_id));
			nr.id = nr.own_id;
		} else if (csi_mount_find(nr.path, NULL, 0, NULL, 0)) {
			/* a retry after the last unpublish removed it: done */
			if (rmdir(nr.path) < 0 && errno != ENOENT)
				csi_reply_errno(r, -errno, "removing the target");
			else
				csi_reply_ok(r, (void *)&csi_unpublish_out);
			goto out;
		}
	}
	if (csi_node_lock(p, r, &nr))
		goto out;
	staged = csi_state_load(&p->store, nr.id, &nr.n) == 0;
	if (!staged && !nr.v.name && csi_node_volume(p, r, nr.id, &nr.v))
		goto out;
	/*
	 * Only this volume's bind mounts are undone: one it recorded, or any
	 * stratafs mount left from a record that was lost; never another's.
	 */
	if (!csi_mount_find(nr.path, fstype, sizeof(fstype), NULL, 0) &&
	    !(staged && csi_state_target(&nr.n, nr.path)) &&
	    strcmp(fstype, "fuse.stratafs")) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "%s has a %s mount that is not this volume's",
			      nr.path, fstype);
		goto out;
	}
	while (!csi_mount_find(nr.path, NULL, 0, NULL, 0)) {
		ret = csi_mount_umount(nr.path);
		if (ret) {
			csi_reply_errno(r, ret, "unmounting the target");
			goto out;
		}
	}
	if (rmdir(nr.path) < 0 && errno != ENOENT) {
		csi_reply_errno(r, -errno, "removing the target");
		goto out;
	}
	if (staged && csi_state_target(&nr.n, nr.path)) {
		csi_state_drop_target(&nr.n, nr.path);
		ret = csi_state_save(&p->store, &nr.n);
		if (ret) {
			csi_reply_errno(r, ret, "saving the node record");
			goto out;
		}
	}
	if (staged && nr.v.ephemeral && csi_ephemeral_remove(p, r, &nr.n))
		goto out;
	/* a publish whose daemon never started left the volume unstaged */
	if (!staged && nr.v.ephemeral) {
		ret = csi_volume_delete(&p->store, nr.id);
		if (ret) {
			csi_reply_errno(r, ret, "deleting the inline volume");
			goto out;
		}
	}
	csi_reply_ok(r, (void *)&csi_unpublish_out);
out:
	csi_node_end(p, &nr);
}

static Csi__V1__VolumeUsage *csi_usage(struct csi_reply *r, int unit,
				       int64_t used, int64_t total,
				       int64_t avail)
{
	Csi__V1__VolumeUsage *u = csi_alloc(r, sizeof(*u));

	if (!u)
		return NULL;
	csi__v1__volume_usage__init(u);
	u->unit = unit;
	u->used = used;
	u->total = total;
	u->available = avail < 0 ? 0 : avail;
	return u;
}

/*
 * The volume's usage is its upper layer: what it wrote, against its
 * capacity when it has one, else against the store's filesystem.
 */
static void csi_node_stats(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__NodeGetVolumeStatsRequest *req = (const void *)msg;
	Csi__V1__NodeGetVolumeStatsResponse *out;
	struct csi_node_req nr = { 0 };
	int64_t bytes, inodes, fs_avail, total;
	struct statvfs st;
	int ret;

	if (csi_node_check(r, &nr, req->volume_id, NULL, false))
		goto out;
	if (!req->volume_path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_path is required");
		goto out;
	}
	if (csi_node_path(r, "volume_path", req->volume_path, nr.path) ||
	    csi_node_volume(p, r, nr.id, &nr.v))
		goto out;
	if (csi_state_load(&p->store, nr.id, &nr.n) ||
	    (strcmp(nr.n.staging, nr.path) && !csi_state_target(&nr.n, nr.path))) {
		csi_reply_set(r, CSI_NOT_FOUND,
			      "%s is neither the staging path nor a target of volume %s",
			      req->volume_path, nr.id);
		goto out;
	}
	ret = csi_volume_usage(&p->store, nr.id, &bytes, &inodes);
	if (!ret && fstatvfs(p->store.volumes_fd, &st) < 0)
		ret = -errno;
	if (ret) {
		csi_reply_errno(r, ret, "usage of the upper layer");
		goto out;
	}
	fs_avail = (int64_t)st.f_bavail * (int64_t)st.f_frsize;
	total = nr.v.capacity ? nr.v.capacity : (int64_t)st.f_blocks * (int64_t)st.f_frsize;
	out = csi_alloc(r, sizeof(*out));
	if (!out)
		goto out_nomem;
	csi__v1__node_get_volume_stats_response__init(out);
	out->usage = csi_alloc(r, 2 * sizeof(void *));
	if (!out->usage)
		goto out_nomem;
	out->usage[0] = csi_usage(r, CSI__V1__VOLUME_USAGE__UNIT__BYTES, bytes,
				  total,
				  total - bytes < fs_avail ? total - bytes : fs_avail);
	out->usage[1] = csi_usage(r, CSI__V1__VOLUME_USAGE__UNIT__INODES, inodes,
				  inodes + (int64_t)st.f_favail,
				  (int64_t)st.f_favail);
	if (!out->usage[0] || !out->usage[1])
		goto out_nomem;
	out->n_usage = 2;
	csi_reply_ok(r, out);
	goto out;
out_nomem:
	csi_reply_errno(r, -ENOMEM, "NodeGetVolumeStats");
out:
	csi_node_end(p, &nr);
}

static void csi_node_caps(struct csi_plugin *p, const ProtobufCMessage *msg,
			  struct csi_reply *r)
{
	static const int types[] = {
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__STAGE_UNSTAGE_VOLUME,
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME_STATS,
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__SINGLE_NODE_MULTI_WRITER,
		/* kubelet must not chown a whole lower layer into the upper */
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_MOUNT_GROUP,
	};

	csi_reply_caps(r, &csi__v1__node_get_capabilities_response__descriptor,
		       &csi__v1__node_service_capability__descriptor,
		       &csi__v1__node_service_capability__rpc__descriptor, types,
		       sizeof(types) / sizeof(types[0]));
}

static void csi_node_info(struct csi_plugin *p, const ProtobufCMessage *msg,
			  struct csi_reply *r)
{
	Csi__V1__NodeGetInfoResponse *out = csi_alloc(r, sizeof(*out));
	struct csi_topo *t = csi_alloc(r, sizeof(*t));

	if (!out || !t) {
		csi_reply_errno(r, -ENOMEM, "NodeGetInfo");
		return;
	}
	csi__v1__node_get_info_response__init(out);
	out->node_id = p->cfg.node_id;
	out->max_volumes_per_node = p->cfg.max_volumes;
	out->accessible_topology = csi_topo_init(t, p);
	csi_reply_ok(r, out);
}

const struct csi_method csi_node_methods[] = {
	{ "/csi.v1.Node/NodeStageVolume",
	  &csi__v1__node_stage_volume_request__descriptor, csi_node_stage,
	  CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodeUnstageVolume",
	  &csi__v1__node_unstage_volume_request__descriptor, csi_node_unstage,
	  CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodePublishVolume",
	  &csi__v1__node_publish_volume_request__descriptor, csi_node_publish,
	  CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodeUnpublishVolume",
	  &csi__v1__node_unpublish_volume_request__descriptor,
	  csi_node_unpublish, CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodeGetVolumeStats",
	  &csi__v1__node_get_volume_stats_request__descriptor, csi_node_stats,
	  CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodeGetCapabilities",
	  &csi__v1__node_get_capabilities_request__descriptor, csi_node_caps,
	  CSI_MODE_NODE, false },
	{ "/csi.v1.Node/NodeGetInfo", &csi__v1__node_get_info_request__descriptor,
	  csi_node_info, CSI_MODE_NODE, false },
	{ NULL },
};
