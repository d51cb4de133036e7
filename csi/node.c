// SPDX-License-Identifier: Apache-2.0
/*
 * The Node service: staging starts a stratafs daemon on a new FUSE mount
 * and attaches it at the staging path; publishing attaches a bind clone
 * of that mount at a pod's target path. Every handler has the same
 * order: check the request, mark the volume busy, load its records,
 * return early when the work is already done, act, save, reply.
 *
 * What the plugin owns, it owns by record: each mount it attaches is
 * recorded (node/<id>.json) with its unique id before it is attached,
 * and an unstage or unpublish acts only on the mount recorded for that
 * volume at that path, and removes only a directory it made. A path
 * that holds anything else is answered as the spec answers "not staged
 * (published) there", and left alone. The paths themselves pass through
 * csi/path.c, which refuses symlinks, non-canonical forms and the
 * plugin's own directories.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
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
	bool inline_id;		/* named by kubelet's inline-volume id */
	struct csi_path path;	/* staging (stage, unstage) or target */
	struct csi_path staging; /* publish: the staging path */
	char *flags;		/* canonical mount flags of the capability */
	unsigned long mflags;
	int mode;		/* the capability's access mode */
	bool busy;
	struct csi_volume v;	/* the volume's record, once loaded */
	struct csi_node_vol n;	/* its node record, once loaded */
};

static void csi_node_init(struct csi_node_req *nr)
{
	memset(nr, 0, sizeof(*nr));
	csi_path_init(&nr->path);
	csi_path_init(&nr->staging);
}

/* A path field: required, then checked and resolved (csi/path.c). */
static int csi_node_path(struct csi_plugin *p, struct csi_reply *r,
			 const char *field, const char *path,
			 struct csi_path *pp)
{
	char why[512];
	int ret;

	if (!path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s is required", field);
		return -EINVAL;
	}
	ret = csi_path_resolve(p, path, pp, why, sizeof(why));
	if (ret)
		csi_path_reply(r, field, ret, why);
	return ret;
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
	if (cap)
		nr->mode = cap->access_mode->mode;
	return 0;
}

/* After the checks: an id that cannot be ours is no volume; else mark it busy. */
static int csi_node_lock(struct csi_plugin *p, struct csi_reply *r,
			 struct csi_node_req *nr)
{
	if (nr->busy)
		return 0;
	if (!csi_volume_id_valid(nr->id)) {
		csi_reply_set(r, CSI_NOT_FOUND, "volume %.64s: no such volume",
			      nr->id);
		return -ENOENT;
	}
	if (csi_busy_claim(&p->store, nr->id, r))
		return -EBUSY;
	nr->busy = true;
	return 0;
}

static void csi_node_end(struct csi_plugin *p, struct csi_node_req *nr)
{
	csi_state_free(&nr->n);
	csi_volume_free(&nr->v);
	if (nr->busy)
		csi_busy_leave(&p->store, nr->id);
	csi_path_release(&nr->path);
	csi_path_release(&nr->staging);
	free(nr->flags);
}

/*
 * Loads the volume record: NOT_FOUND when there is none. An inline
 * volume is reached only by the id kubelet gave it, never by its store
 * id, so that a call naming a store id can never act on a pod's inline
 * volume.
 */
static int csi_node_volume(struct csi_plugin *p, struct csi_reply *r,
			   struct csi_node_req *nr)
{
	int ret;

	if (nr->v.name)
		return 0;
	ret = csi_volume_load(&p->store, nr->id, &nr->v);
	if (ret == 0 && nr->v.ephemeral && !nr->inline_id) {
		csi_volume_free(&nr->v);
		ret = -ENOENT;
	}
	if (ret)
		csi_reply_load(r, nr->id, ret);
	return ret;
}

/*
 * Loads the node record: 0 staged, 1 not staged, or an error, answered.
 * A record that cannot be read is never taken for "not staged": the
 * call fails, naming it, and nothing is acted on.
 */
static int csi_node_state(struct csi_plugin *p, struct csi_reply *r,
			  struct csi_node_req *nr)
{
	int ret;

	if (nr->n.staging)
		return 0;	/* loaded already (an inline volume's publish) */
	ret = csi_state_load(&p->store, nr->id, &nr->n);

	if (ret == -ENOENT)
		return 1;
	if (ret)
		csi_reply_set(r, CSI_INTERNAL,
			      "the node record %s/node/%s.json cannot be read (%s): nothing was changed; repair or remove it",
			      p->store.root, nr->id, strerror(-ret));
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
 * Opens the directory a mount is to go on: made when missing (*created
 * says so), never a file, never a symlink, and with nothing mounted on
 * it already.
 */
static int csi_node_mountpoint(struct csi_reply *r, const char *field,
			       const struct csi_path *pp, bool *created)
{
	struct csi_mnt m;
	bool root;
	int fd, ret;

	fd = csi_path_open(pp, true, created);
	if (fd < 0) {
		if (fd == -ENOTDIR || fd == -ELOOP)
			csi_reply_set(r, CSI_INVALID_ARGUMENT,
				      "%s: '%s' is %s: a volume is mounted only on a directory",
				      field, pp->path,
				      fd == -ELOOP ? "a symlink" : "not a directory");
		else
			csi_reply_errno(r, fd, field);
		return fd;
	}
	ret = csi_mnt_of(fd, &m, &root);
	if (ret == 0 && root)
		ret = -EBUSY;
	if (ret) {
		close(fd);
		if (ret == -EBUSY)
			csi_reply_set(r, CSI_FAILED_PRECONDITION,
				      "%s: '%s' already has a mount that is not this volume's: nothing was mounted",
				      field, pp->path);
		else
			csi_reply_errno(r, ret, field);
		return ret;
	}
	return fd;
}

/* Removes a directory the plugin made, if it is still one and empty. */
static void csi_node_rmdir(const struct csi_path *pp, bool created)
{
	if (!created || pp->parent < 0)
		return;
	if (unlinkat(pp->parent, pp->name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		strata_warn("%s: left in place: %s", pp->path, strerror(errno));
}

/*
 * Stages a volume that is not staged: a daemon on a new mount, recorded,
 * then attached at the staging path. Shared by NodeStageVolume and
 * inline volumes.
 */
static int csi_node_start(struct csi_plugin *p, struct csi_reply *r,
			  struct csi_node_req *nr, const struct csi_path *pp,
			  const Csi__V1__VolumeCapability *cap)
{
	const struct csi_volume *v = &nr->v;
	struct csi_node_vol *n = &nr->n;
	int dirfd, mntfd = -1, ret;
	char why[512];
	bool created;

	if (csi_store_writable(&p->store, r))
		return -EROFS;
	if (p->cfg.max_volumes && csi_count_staged(p) >= p->cfg.max_volumes) {
		csi_reply_set(r, CSI_RESOURCE_EXHAUSTED,
			      "this node already has %lld staged volumes (--max-volumes)",
			      (long long)p->cfg.max_volumes);
		return -ENOSPC;
	}
	dirfd = csi_node_mountpoint(r, "staging_target_path", pp, &created);
	if (dirfd < 0)
		return dirfd;
	csi_kill_point("stage.dir");
	ret = csi_mount_group(p, v->id, cap);
	if (ret) {
		csi_reply_errno(r, ret, "volume_mount_group");
		goto out_rmdir;
	}
	csi_state_free(n);
	memcpy(n->id, v->id, sizeof(n->id));
	n->staging = strdup(pp->path);
	n->stage_flags = strdup(nr->flags);
	n->staging_created = created;
	if (!n->staging || !n->stage_flags) {
		ret = -ENOMEM;
		csi_reply_errno(r, ret, "NodeStageVolume");
		goto out_rmdir;
	}
	ret = csi_daemon_start(p, v, n, &mntfd, why, sizeof(why));
	if (ret) {
		csi_reply_set(r, ret == -ENOENT ? CSI_FAILED_PRECONDITION :
			      ret == -ENOSPC ? CSI_RESOURCE_EXHAUSTED :
			      CSI_INTERNAL, "%s", why);
		goto out_rmdir;
	}
	csi_kill_point("stage.daemon");
	/* recorded before it is attached: a crash in between leaves no orphan */
	ret = csi_mnt_of(mntfd, &n->mnt, NULL);
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL, "the new mount's id: %s",
			      csi_mnt_strerror(ret));
		goto out_stop;
	}
	ret = csi_state_save(&p->store, n);
	if (ret) {
		csi_reply_errno(r, ret, "saving the node record");
		goto out_stop;
	}
	csi_kill_point("stage.record");
	ret = csi_mnt_attach(mntfd, dirfd, false);
	if (ret) {
		csi_reply_errno(r, ret, "attaching the mount at staging_target_path");
		csi_state_remove(&p->store, n->id);
		goto out_stop;
	}
	csi_kill_point("stage.attach");
	close(mntfd);
	close(dirfd);
	return 0;

out_stop:
	/* the detached mount goes with its last descriptor, and the daemon with it */
	close(mntfd);
	csi_daemon_stop(p, n);
out_rmdir:
	close(dirfd);
	csi_node_rmdir(pp, created);
	return ret;
}

/*
 * A staged volume about to be used: its mount is ours and on top at the
 * staging path, and it answers; a dead one is healed. Anything mounted
 * over it is not ours to remove: FAILED_PRECONDITION.
 */
static int csi_node_ensure(struct csi_plugin *p, struct csi_reply *r,
			   struct csi_node_req *nr)
{
	struct csi_path pp;
	struct csi_mnt top;
	char why[512];
	int fd, ret;

	/* a recorded path passed the guards when it was recorded */
	ret = csi_path_resolve(NULL, nr->n.staging, &pp, why, sizeof(why));
	if (ret == 0)
		ret = csi_mnt_at(&pp, &nr->n.mnt, &fd, &top);
	csi_path_release(&pp);
	if (ret == 1) {
		ret = csi_daemon_alive(&nr->n) ?
		      csi_mnt_answers(fd, CSI_STAGE_TIMEOUT_MS) : -ENOTCONN;
		close(fd);
		if (ret == 0)
			return 0;
	} else if (ret == 0 && top.id && !csi_mnt_exists(&nr->n.mnt)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s: its staging path %s is covered by a mount that is not this volume's",
			      nr->id, nr->n.staging);
		return -EBUSY;
	}
	/* a heal writes: a store it cannot write fails the call first */
	ret = csi_store_writable(&p->store, r);
	if (ret)
		return ret;
	ret = csi_heal(p, &nr->v, &nr->n, why, sizeof(why));
	if (ret)
		csi_reply_set(r, CSI_INTERNAL, "%s", why);
	return ret;
}

static void csi_node_stage(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__NodeStageVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr;
	int ret;

	csi_node_init(&nr);
	if (csi_node_check(r, &nr, req->volume_id, req->volume_capability, true) ||
	    csi_node_path(p, r, "staging_target_path", req->staging_target_path,
			  &nr.path) ||
	    csi_node_lock(p, r, &nr) || csi_node_volume(p, r, &nr))
		goto out;
	ret = csi_node_state(p, r, &nr);
	if (ret < 0)
		goto out;
	if (ret == 0) {
		if (strcmp(nr.n.staging, nr.path.path) ||
		    strcmp(nr.n.stage_flags, nr.flags)) {
			csi_reply_set(r, CSI_ALREADY_EXISTS,
				      "volume %s is already staged at %s%s", nr.id,
				      nr.n.staging,
				      strcmp(nr.n.staging, nr.path.path) ? "" :
					      " with another capability");
			goto out;
		}
		if (csi_node_ensure(p, r, &nr) == 0)
			csi_reply_ok(r, (void *)&csi_stage_out);
		goto out;
	}
	if (csi_node_start(p, r, &nr, &nr.path, req->volume_capability))
		goto out;
	strata_info("volume %s staged at %s, stratafs pid %d", nr.id, nr.n.staging,
		    (int)nr.n.pid);
	csi_reply_ok(r, (void *)&csi_stage_out);
out:
	csi_node_end(p, &nr);
}

/*
 * Detaches the recorded mount at pp. 0 when it is gone (detached now,
 * or gone before), 1 when it still exists but something else covers
 * the path (left alone), or an error.
 */
static int csi_node_detach(const struct csi_path *pp, const struct csi_mnt *m)
{
	struct csi_mnt top;
	int fd, ret;

	ret = pp->parent >= 0 ? csi_mnt_at(pp, m, &fd, &top) : -ENOENT;
	if (ret == 1) {
		ret = csi_mnt_detach(fd);
		close(fd);
		return ret;
	}
	if (ret < 0 && ret != -ENOENT && ret != -ENOTDIR && ret != -ELOOP)
		return ret;
	return csi_mnt_exists(m) == 0 ? 1 : 0;
}

/* Everything a staged volume holds on the node, gone: mount, daemon, record. */
static int csi_node_teardown(struct csi_plugin *p, struct csi_reply *r,
			     struct csi_node_vol *n, const struct csi_path *pp)
{
	int ret = csi_node_detach(pp, &n->mnt);

	if (ret == 1) {
		strata_warn("volume %s: a mount that is not its own covers %s: left as it is",
			    n->id, n->staging);
		return 1;
	}
	if (ret) {
		csi_reply_errno(r, ret, "unmounting the staging path");
		return ret;
	}
	csi_kill_point("unstage.detach");
	csi_daemon_stop(p, n);
	csi_kill_point("unstage.daemon");
	ret = csi_state_remove(&p->store, n->id);
	if (ret) {
		csi_reply_errno(r, ret, "removing the node record");
		return ret;
	}
	csi_kill_point("unstage.record");
	csi_state_remove_stats(&p->store, n->id);
	csi_node_rmdir(pp, n->staging_created);
	return 0;
}

static void csi_node_unstage(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__NodeUnstageVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr;
	bool kick = false;
	char why[512];
	int ret;

	csi_node_init(&nr);
	if (csi_node_check(r, &nr, req->volume_id, NULL, false))
		goto out;
	if (!req->staging_target_path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "staging_target_path is required");
		goto out;
	}
	/* a missing parent is a path where nothing can be staged: checked below */
	ret = csi_path_resolve(p, req->staging_target_path, &nr.path, why,
			       sizeof(why));
	if (ret && ret != -ENOENT) {
		csi_path_reply(r, "staging_target_path", ret, why);
		goto out;
	}
	if (csi_node_lock(p, r, &nr) || csi_node_volume(p, r, &nr))
		goto out;
	ret = csi_node_state(p, r, &nr);
	if (ret < 0)
		goto out;
	/* CSI v1.12: not staged at this path is OK, whatever is there */
	if (ret == 1 || strcmp(nr.n.staging, req->staging_target_path)) {
		if (ret == 0)
			strata_warn("NodeUnstageVolume: volume %s is staged at %s, not at %s: nothing done",
				    nr.id, nr.n.staging, req->staging_target_path);
		csi_reply_ok(r, (void *)&csi_unstage_out);
		goto out;
	}
	if (nr.n.ntargets) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is still published at %s: unpublish it first",
			      nr.id, nr.n.targets[0].path);
		goto out;
	}
	if (csi_store_writable(&p->store, r))
		goto out;
	ret = csi_node_teardown(p, r, &nr.n, &nr.path);
	if (ret < 0)
		goto out;
	if (ret == 0)
		strata_info("volume %s unstaged from %s", nr.id, nr.n.staging);
	csi_reply_ok(r, (void *)&csi_unstage_out);
	kick = true;
out:
	csi_node_end(p, &nr);
	/*
	 * Its chain may have waited for its daemon to go: a round, once the
	 * claim is gone (a round finding it held skips the volume).
	 */
	if (kick)
		csi_flatten_kick(p);
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

/*
 * Kubelet's ids ("csi-" and a hash) go into records, never into paths.
 * One that looks like a store id is refused: it could be confused with a
 * volume the controller made.
 */
static bool csi_ephemeral_id_valid(const char *id)
{
	size_t len = strlen(id);

	if (len == 0 || len > CSI_NAME_MAX || csi_volume_id_valid(id))
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
	ret = csi_store_writable(&p->store, r);
	if (ret)
		goto out_unlock;
	v->passthrough = passthrough;
	v->ephemeral = true;
	v->name = strdup(req->volume_id);
	v->parameters = json_object_new_object();
	if (!v->name || !v->parameters)
		ret = -ENOMEM;
	if (!ret)
		ret = csi_store_new_id(CSI_VOLUME_ID_PREFIX, v->id);
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

/* <root>/ephemeral/<id>: the plugin's own, so no guard applies to it. */
static int csi_ephemeral_staging(struct csi_plugin *p, struct csi_reply *r,
				 const char *id, struct csi_path *pp)
{
	char path[PATH_MAX], why[512];
	int ret;

	if (mkdirat(p->store.root_fd, "ephemeral", 0700) < 0 && errno != EEXIST) {
		ret = -errno;
		csi_reply_errno(r, ret, "the store's ephemeral directory");
		return ret;
	}
	snprintf(path, sizeof(path), "%s/ephemeral/%s", p->store.root, id);
	ret = csi_path_resolve(NULL, path, pp, why, sizeof(why));
	if (ret)
		csi_reply_set(r, CSI_INTERNAL, "inline volume staging path: %s", why);
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
	int ret;

	nr->inline_id = true;
	ret = csi_ephemeral_volume(p, r, req, &nr->v);
	if (ret)
		return ret;
	memcpy(nr->own_id, nr->v.id, sizeof(nr->own_id));
	nr->id = nr->own_id;
	csi_kill_point("inline.create");
	ret = csi_node_lock(p, r, nr);
	if (!ret)
		ret = csi_ephemeral_staging(p, r, nr->id, &nr->staging);
	if (ret)
		return ret;
	ret = csi_node_state(p, r, nr);
	if (ret != 1)
		return ret;
	return csi_node_start(p, r, nr, &nr->staging, req->volume_capability);
}

/* The inline volume goes once no pod uses it: unstaged and deleted. */
static int csi_ephemeral_remove(struct csi_plugin *p, struct csi_reply *r,
				struct csi_node_req *nr, bool staged)
{
	struct csi_path pp;
	int ret;

	if (staged && nr->n.ntargets)
		return 0;
	if (staged) {
		ret = csi_ephemeral_staging(p, r, nr->id, &pp);
		if (ret)
			return ret;
		ret = csi_node_teardown(p, r, &nr->n, &pp);
		csi_path_release(&pp);
		if (ret < 0)
			return ret;
		if (ret == 1) {
			csi_reply_set(r, CSI_INTERNAL,
				      "inline volume %s: its staging path is covered by another mount",
				      nr->id);
			return -EBUSY;
		}
	}
	ret = csi_volume_delete(&p->store, nr->id);
	if (ret)
		csi_reply_errno(r, ret, "deleting the inline volume");
	return ret;
}

static bool csi_mode_multi(int mode)
{
	return mode == CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER;
}

/*
 * A second publish of the volume on this node, at another target: CSI
 * v1.12's second table (the plugin has SINGLE_NODE_MULTI_WRITER). Only
 * SINGLE_NODE_MULTI_WRITER may be published at several targets, and
 * never with another capability than the first.
 */
static int csi_publish_another(struct csi_reply *r, struct csi_node_req *nr)
{
	const struct csi_target *t = &nr->n.targets[0];

	if (t->mode != nr->mode || strcmp(t->flags, nr->flags)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is published at %s with another capability",
			      nr->id, t->path);
		return -EBUSY;
	}
	if (!csi_mode_multi(nr->mode)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is already published at %s, and its access mode allows one target on a node (SINGLE_NODE_MULTI_WRITER allows several)",
			      nr->id, t->path);
		return -EBUSY;
	}
	return 0;
}

/*
 * Already published at this target: OK when the request agrees and the
 * recorded bind is still there (1), ALREADY_EXISTS when it does not
 * agree, and 0 when the bind is gone and must be made again.
 */
static int csi_publish_again(struct csi_reply *r, struct csi_node_req *nr,
			     const struct csi_target *t, bool ro)
{
	struct csi_mnt top;
	int fd, ret;

	if (t->readonly != ro || t->mode != nr->mode || strcmp(t->flags, nr->flags)) {
		csi_reply_set(r, CSI_ALREADY_EXISTS,
			      "volume %s is already published at %s with other options",
			      nr->id, nr->path.path);
		return -EEXIST;
	}
	ret = csi_mnt_at(&nr->path, &t->mnt, &fd, &top);
	if (ret == 1) {
		close(fd);
		return 1;
	}
	if (csi_mnt_exists(&t->mnt) == 0) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "%s: the volume's bind mount there is covered by another mount",
			      nr->path.path);
		return -EBUSY;
	}
	return 0;
}

/* Binds the staged volume at nr->path, recording the bind before it is made. */
static int csi_publish_bind(struct csi_plugin *p, struct csi_reply *r,
			    struct csi_node_req *nr, bool ro, bool made_before)
{
	struct csi_target *t;
	int dirfd, stagefd = -1, treefd = -1, ret;
	struct csi_mnt top;
	bool created;

	dirfd = csi_node_mountpoint(r, "target_path", &nr->path, &created);
	if (dirfd < 0)
		return dirfd;
	csi_kill_point("publish.dir");
	ret = csi_mnt_at(&nr->staging, &nr->n.mnt, &stagefd, &top);
	if (ret != 1) {
		csi_reply_set(r, CSI_INTERNAL,
			      "volume %s: its staging mount is not at %s",
			      nr->id, nr->n.staging);
		ret = -ESTALE;
		goto out;
	}
	ret = csi_mnt_clone(stagefd, nr->mflags | (ro ? MS_RDONLY : 0), &treefd);
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL, "bind mount: %s",
			      csi_mnt_strerror(ret));
		goto out;
	}
	ret = csi_state_add_target(&nr->n, nr->path.path, ro, nr->flags);
	if (ret) {
		csi_reply_errno(r, ret, "NodePublishVolume");
		goto out;
	}
	t = &nr->n.targets[nr->n.ntargets - 1];
	t->mode = nr->mode;
	t->created = created || made_before;
	ret = csi_mnt_of(treefd, &t->mnt, NULL);
	if (!ret)
		ret = csi_state_save(&p->store, &nr->n);
	if (ret) {
		csi_reply_errno(r, ret, "saving the node record");
		goto out;
	}
	csi_kill_point("publish.record");
	ret = csi_mnt_attach(treefd, dirfd, false);
	csi_kill_point("publish.attach");
	if (ret) {
		csi_reply_errno(r, ret, "attaching the bind mount at target_path");
		csi_state_drop_target(&nr->n, nr->path.path);
		csi_state_save(&p->store, &nr->n);
	}
out:
	if (treefd >= 0)
		close(treefd);
	if (stagefd >= 0)
		close(stagefd);
	close(dirfd);
	if (ret)
		csi_node_rmdir(&nr->path, created);
	return ret;
}

/*
 * What can be said of a target before anything is made for it: it may be
 * missing, or a directory, never a file or a symlink.
 */
static int csi_publish_precheck(struct csi_reply *r, const struct csi_path *pp)
{
	struct stat st;

	if (fstatat(pp->parent, pp->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;
	if (S_ISDIR(st.st_mode))
		return 0;
	csi_reply_set(r, CSI_INVALID_ARGUMENT,
		      "target_path: '%s' is %s: a volume is mounted only on a directory",
		      pp->path, S_ISLNK(st.st_mode) ? "a symlink" : "not a directory");
	return -ENOTDIR;
}

static void csi_node_publish(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__NodePublishVolumeRequest *req = (const void *)msg;
	bool eph = csi_is_ephemeral(req);
	bool ro, made_before = false;
	struct csi_node_req nr;
	struct csi_target *t;
	int ret;

	csi_node_init(&nr);
	if (csi_node_check(r, &nr, req->volume_id, req->volume_capability, true) ||
	    csi_node_path(p, r, "target_path", req->target_path, &nr.path) ||
	    csi_publish_precheck(r, &nr.path))
		goto out;
	if (eph) {
		if (!csi_ephemeral_id_valid(req->volume_id)) {
			csi_reply_set(r, CSI_INVALID_ARGUMENT,
				      "inline volume id '%.64s' is malformed, or looks like a store volume's id",
				      req->volume_id);
			goto out;
		}
		if (csi_ephemeral_prepare(p, r, req, &nr))
			goto out_eph;
	} else if (!req->staging_target_path[0]) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "staging_target_path is required: this plugin stages volumes (STAGE_UNSTAGE_VOLUME)");
		goto out;
	} else if (csi_node_path(p, r, "staging_target_path",
				 req->staging_target_path, &nr.staging)) {
		goto out;
	}
	if (csi_node_lock(p, r, &nr) || csi_node_volume(p, r, &nr))
		goto out_eph;
	ret = csi_node_state(p, r, &nr);
	if (ret < 0)
		goto out_eph;
	if (ret == 1 || strcmp(nr.n.staging, nr.staging.path)) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is not staged at %s", nr.id, nr.staging.path);
		goto out_eph;
	}
	ro = req->readonly || (nr.mflags & MS_RDONLY) ||
	     csi_capability_readonly(req->volume_capability);
	t = csi_state_target(&nr.n, nr.path.path);
	if (t) {
		ret = csi_publish_again(r, &nr, t, ro);
		/* published already: make sure it still answers */
		if (ret == 1 && csi_node_ensure(p, r, &nr) == 0)
			csi_reply_ok(r, (void *)&csi_publish_out);
		if (ret)
			goto out_eph;
		/* recorded, but its bind is gone: made again below */
		made_before = t->created;
		csi_state_drop_target(&nr.n, nr.path.path);
	}
	if (nr.n.ntargets && csi_publish_another(r, &nr))
		goto out_eph;
	if (csi_store_writable(&p->store, r) || csi_node_ensure(p, r, &nr) ||
	    csi_publish_bind(p, r, &nr, ro, made_before))
		goto out_eph;
	csi_reply_ok(r, (void *)&csi_publish_out);
	goto out;
out_eph:
	/* an inline volume no pod got leaves nothing behind */
	if (eph && r->code != CSI_OK && nr.busy && nr.v.name &&
	    !nr.n.ntargets) {
		struct csi_reply undo = { 0 };

		if (csi_ephemeral_remove(p, &undo, &nr, nr.n.staging != NULL))
			strata_warn("inline volume %s: cleaning up after a failed publish: %s",
				    nr.id, undo.msg);
		csi_reply_free(&undo);
	}
out:
	csi_node_end(p, &nr);
}

/*
 * Kubelet names an inline volume by its own id after the publish too:
 * the store volume behind it, or -ENOENT when there is none (any more).
 * Never a volume the controller made: those are found by store id only.
 */
static int csi_node_inline(struct csi_plugin *p, struct csi_reply *r,
			   struct csi_node_req *nr)
{
	int ret = csi_volume_find(&p->store, nr->id, true, &nr->v);

	if (ret == -ENOENT)
		return ret;
	if (ret) {
		csi_reply_errno(r, ret, "store");
		return ret;
	}
	nr->inline_id = true;
	memcpy(nr->own_id, nr->v.id, sizeof(nr->own_id));
	nr->id = nr->own_id;
	return 0;
}

static void csi_node_unpublish(struct csi_plugin *p, const ProtobufCMessage *msg,
			       struct csi_reply *r)
{
	const Csi__V1__NodeUnpublishVolumeRequest *req = (const void *)msg;
	struct csi_node_req nr;
	struct csi_target *t;
	char why[512];
	bool created;
	int ret, staged;

	csi_node_init(&nr);
	if (csi_node_check(r, &nr, req->volume_id, NULL, false))
		goto out;
	if (!req->target_path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "target_path is required");
		goto out;
	}
	/* a missing parent is a path where nothing can be published */
	ret = csi_path_resolve(p, req->target_path, &nr.path, why, sizeof(why));
	if (ret && ret != -ENOENT) {
		csi_path_reply(r, "target_path", ret, why);
		goto out;
	}
	if (!csi_volume_id_valid(nr.id) && csi_ephemeral_id_valid(nr.id)) {
		ret = csi_node_inline(p, r, &nr);
		/* gone already: a retry after the last unpublish removed it */
		if (ret == -ENOENT)
			csi_reply_ok(r, (void *)&csi_unpublish_out);
		if (ret)
			goto out;
	}
	if (csi_node_lock(p, r, &nr) || csi_node_volume(p, r, &nr))
		goto out;
	staged = csi_node_state(p, r, &nr);
	if (staged < 0)
		goto out;
	t = staged == 0 ? csi_state_target(&nr.n, req->target_path) : NULL;
	if (!t) {
		/* CSI v1.12: not published there is OK; a mount there is not ours */
		if (staged == 1 && nr.v.ephemeral &&
		    csi_ephemeral_remove(p, r, &nr, false))
			goto out;
		csi_reply_ok(r, (void *)&csi_unpublish_out);
		goto out;
	}
	if (csi_store_writable(&p->store, r))
		goto out;
	ret = csi_node_detach(&nr.path, &t->mnt);
	if (ret < 0) {
		csi_reply_errno(r, ret, "unmounting the target");
		goto out;
	}
	if (ret == 1) {
		strata_warn("volume %s: a mount that is not its own covers %s: left as it is",
			    nr.id, req->target_path);
		csi_reply_ok(r, (void *)&csi_unpublish_out);
		goto out;
	}
	csi_kill_point("unpublish.detach");
	created = t->created;
	csi_state_drop_target(&nr.n, req->target_path);
	ret = csi_state_save(&p->store, &nr.n);
	if (ret) {
		csi_reply_errno(r, ret, "saving the node record");
		goto out;
	}
	csi_kill_point("unpublish.record");
	csi_node_rmdir(&nr.path, created);
	if (nr.v.ephemeral && csi_ephemeral_remove(p, r, &nr, true))
		goto out;
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
 * The volume's usage is its upper layer: what it allocated, as its
 * daemon counts it (csi/usage.c, no walk), against its capacity when it
 * has one, else against the store's filesystem. A daemon that does not
 * answer leaves the numbers it last saved, and the volume's condition
 * says so.
 */
static void csi_node_stats(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__NodeGetVolumeStatsRequest *req = (const void *)msg;
	Csi__V1__NodeGetVolumeStatsResponse *out;
	struct csi_node_req nr;
	int64_t bytes, inodes, fs_avail, total, cap;
	struct csi_usage use;
	struct statvfs st;
	int ret;

	csi_node_init(&nr);
	if (csi_node_check(r, &nr, req->volume_id, NULL, false))
		goto out;
	if (!req->volume_path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_path is required");
		goto out;
	}
	if (!csi_volume_id_valid(nr.id) && csi_ephemeral_id_valid(nr.id)) {
		ret = csi_node_inline(p, r, &nr);
		if (ret == -ENOENT)
			goto out_notfound;
		if (ret)
			goto out;
	}
	if (!csi_volume_id_valid(nr.id) || csi_node_volume(p, r, &nr))
		goto out_notfound;
	/* any path that is not where the volume is: the spec's NOT_FOUND */
	if (csi_state_load(&p->store, nr.id, &nr.n) ||
	    (strcmp(nr.n.staging, req->volume_path) &&
	     !csi_state_target(&nr.n, req->volume_path)))
		goto out_notfound;
	ret = csi_usage_get(&p->store, nr.id, &use);
	if (ret) {
		csi_reply_set(r, CSI_UNAVAILABLE,
			      "volume %s: no usage to report: %s, and its usage file %s/volumes/%s/usage %s",
			      nr.id, use.why, p->store.root, nr.id,
			      ret == -ENOENT ? "is missing" :
			      ret == -EBADMSG ? "is damaged" : strerror(-ret));
		goto out;
	}
	if (fstatvfs(p->store.volumes_fd, &st) < 0) {
		csi_reply_errno(r, -errno, "statfs of the store");
		goto out;
	}
	bytes = use.bytes;
	inodes = use.inodes;
	/* the daemon's limit is the one in force (NodeExpandVolume moves it) */
	cap = use.live ? use.capacity : nr.v.capacity;
	fs_avail = (int64_t)st.f_bavail * (int64_t)st.f_frsize;
	total = cap ? cap : (int64_t)st.f_blocks * (int64_t)st.f_frsize;
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
	out->volume_condition = csi_condition_msg(p, r, &nr.v, &nr.n, &use);
	if (!out->volume_condition)
		goto out_nomem;
	csi_reply_ok(r, out);
	goto out;
out_notfound:
	csi_reply_set(r, CSI_NOT_FOUND, "volume %.64s: not published or staged at %.256s",
		      req->volume_id, req->volume_path);
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
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_CONDITION,
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__SINGLE_NODE_MULTI_WRITER,
		/* kubelet must not chown a whole lower layer into the upper */
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_MOUNT_GROUP,
		/* a new capacity reaches the running daemon */
		CSI__V1__NODE_SERVICE_CAPABILITY__RPC__TYPE__EXPAND_VOLUME,
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
	{ "/csi.v1.Node/NodeExpandVolume",
	  &csi__v1__node_expand_volume_request__descriptor, csi_node_expand,
	  CSI_MODE_NODE, true },
	{ "/csi.v1.Node/NodeGetCapabilities",
	  &csi__v1__node_get_capabilities_request__descriptor, csi_node_caps,
	  CSI_MODE_NODE, false },
	{ "/csi.v1.Node/NodeGetInfo", &csi__v1__node_get_info_request__descriptor,
	  csi_node_info, CSI_MODE_NODE, false },
	{ NULL },
};
