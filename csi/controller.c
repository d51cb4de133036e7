// SPDX-License-Identifier: Apache-2.0
/*
 * The Controller service over the directory store: volumes are created
 * and deleted on this node, so "controller" here means bookkeeping in
 * the store, never a remote storage system.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"


/* A Volume message with its topology, all in one allocation. */
struct csi_volume_msg {
	Csi__V1__Volume vol;
	Csi__V1__VolumeContentSource src;
	Csi__V1__VolumeContentSource__SnapshotSource snap;
	Csi__V1__VolumeContentSource__VolumeSource svol;
	struct csi_topo topo;
	Csi__V1__Topology *topos[1];
	Csi__V1__Volume__VolumeContextEntry ctx;
	Csi__V1__Volume__VolumeContextEntry *ctxs[1];
};

/* The chain as users name its layers: the same as stratactl's inspect */
static char *csi_join_layers(struct csi_reply *r, const struct csi_volume *v)
{
	size_t len = csi_chain_format(NULL, 0, v->layers, v->nlayers) + 1;
	char *s = csi_alloc(r, len);

	if (s)
		csi_chain_format(s, len, v->layers, v->nlayers);
	return s;
}

static Csi__V1__Volume *csi_volume_msg(struct csi_plugin *p,
				       struct csi_reply *r,
				       const struct csi_volume *v)
{
	struct csi_volume_msg *m = csi_alloc(r, sizeof(*m));

	if (!m)
		return NULL;
	csi__v1__volume__init(&m->vol);
	m->vol.volume_id = csi_strdup(r, v->id);
	m->vol.capacity_bytes = v->capacity;
	m->topos[0] = csi_topo_init(&m->topo, p);
	m->vol.n_accessible_topology = 1;
	m->vol.accessible_topology = m->topos;
	csi__v1__volume__volume_context_entry__init(&m->ctx);
	m->ctx.key = "layers";
	m->ctx.value = csi_join_layers(r, v);
	m->ctxs[0] = &m->ctx;
	m->vol.n_volume_context = 1;
	m->vol.volume_context = m->ctxs;
	if (!m->vol.volume_id || !m->ctx.value)
		return NULL;
	/* a clone says what it was made from (the spec's content_source) */
	if (!v->source[0])
		return &m->vol;
	csi__v1__volume_content_source__init(&m->src);
	if (csi_volume_id_valid(v->source)) {
		csi__v1__volume_content_source__volume_source__init(&m->svol);
		m->svol.volume_id = csi_strdup(r, v->source);
		m->src.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME;
		m->src.volume = &m->svol;
		if (!m->svol.volume_id)
			return NULL;
	} else {
		csi__v1__volume_content_source__snapshot_source__init(&m->snap);
		m->snap.snapshot_id = csi_strdup(r, v->source);
		m->src.type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT;
		m->src.snapshot = &m->snap;
		if (!m->snap.snapshot_id)
			return NULL;
	}
	m->vol.content_source = &m->src;
	return &m->vol;
}

/* The spec bans control characters in names, and caps strings at 128 bytes. */
int csi_name_check(const char *name, char *why, size_t size)
{
	if (!name[0]) {
		snprintf(why, size, "name is required");
		return -EINVAL;
	}
	if (strlen(name) > CSI_NAME_MAX) {
		snprintf(why, size, "name is longer than %d bytes", CSI_NAME_MAX);
		return -EINVAL;
	}
	for (const unsigned char *c = (const void *)name; *c; c++) {
		/* U+007F..U+009F: DEL, and C1 controls as UTF-8 (0xC2 0x80..0x9F) */
		if ((*c < 0x20 && *c != '\t' && *c != '\n' && *c != '\r') ||
		    *c == 0x7f || (c[0] == 0xc2 && c[1] >= 0x80 && c[1] <= 0x9f)) {
			snprintf(why, size, "name holds a control character");
			return -EINVAL;
		}
	}
	return 0;
}

static int csi_caps_check(Csi__V1__VolumeCapability *const *caps, size_t n,
			  char *why, size_t size)
{
	if (!n) {
		snprintf(why, size, "volume_capabilities are required");
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (csi_capability_check(caps[i], why, size))
			return -EINVAL;
	return 0;
}

/* Layers: names checked, each a real directory beneath layers/, no repeats. */
int csi_layers_check(struct csi_plugin *p, struct csi_volume *v,
			    const char *list, char *why, size_t size)
{
	int ret = csi_split_layers(list, &v->layers, &v->nlayers);

	if (ret == -E2BIG) {
		snprintf(why, size, "more than %d layers", CSI_MAX_LAYERS);
		return -EINVAL;
	}
	if (ret)
		return ret;
	for (int i = 0; i < v->nlayers; i++) {
		const char *name = v->layers[i];
		int fd;

		if (csi_layer_name_check(name)) {
			snprintf(why, size, "layer name '%.*s' is malformed (a layer is a name of letters, digits, '.', '_' and '-' that starts with a letter or digit, at most %d bytes)",
				 CSI_LAYER_NAME_MAX, name, CSI_LAYER_NAME_MAX);
			return -EINVAL;
		}
		for (int j = 0; j < i; j++)
			if (!strcmp(v->layers[j], name)) {
				snprintf(why, size, "layer '%s' is listed twice", name);
				return -EINVAL;
			}
		fd = csi_layer_open(&p->store, name);
		if (fd == -ENOENT) {
			snprintf(why, size, "layer '%s': no such layer (no directory %s/layers/%s: place the layer there, or fix the name)",
				 name, p->store.root, name);
			return -EINVAL;
		}
		if (fd < 0) {
			snprintf(why, size, "layer '%s' (%s/layers/%s) %s", name,
				 p->store.root, name,
				 fd == -ELOOP || fd == -EXDEV ? "is a symlink, and layers are never followed through links" :
				 fd == -ENOTDIR ? "is not a directory" : strerror(-fd));
			return -EINVAL;
		}
		close(fd);
	}
	return 0;
}

static int csi_params_check(struct csi_plugin *p, struct csi_volume *v,
			    const Csi__V1__CreateVolumeRequest *req, char *why,
			    size_t size)
{
	const char *layers = CSI_MAP_GET(req, parameters, "layers");
	int ret;

	ret = csi_volume_options_check(req->n_parameters, (void *const *)req->parameters,
				       "parameter", &v->passthrough, why, size);
	if (ret)
		return ret;
	ret = csi_layers_check(p, v, layers ? layers : "", why, size);
	if (ret)
		return ret;
	v->parameters = json_object_new_object();
	if (!v->parameters)
		return -ENOMEM;
	for (size_t i = 0; i < req->n_parameters; i++)
		json_object_object_add(v->parameters, req->parameters[i]->key,
				       json_object_new_string(req->parameters[i]->value));
	return 0;
}

/*
 * An existing volume answers a repeated CreateVolume when it is what the
 * request asks for: the same layers and passthrough, and a capacity
 * inside the requested range (the spec: "compatible with the specified
 * capacity_range"), not necessarily the same number.
 */
static bool csi_volume_compatible(const struct csi_volume *want,
				  const struct csi_volume *have,
				  const Csi__V1__CapacityRange *cr)
{
	if (want->passthrough != have->passthrough ||
	    strcmp(want->source, have->source))
		return false;
	/* a clone's chain grows with every snapshot: its source decides */
	if (!want->source[0] && want->nlayers != have->nlayers)
		return false;
	for (int i = 0; !want->source[0] && i < want->nlayers; i++)
		if (strcmp(want->layers[i], have->layers[i]))
			return false;
	if (!cr)
		return true;
	if (cr->required_bytes && have->capacity &&
	    have->capacity < cr->required_bytes)
		return false;
	/* no capacity means unlimited: more than any limit */
	if (cr->limit_bytes && (!have->capacity || have->capacity > cr->limit_bytes))
		return false;
	return true;
}

/* The request alone: name, capabilities, source, range, topology. */
static int csi_create_check(struct csi_plugin *p, struct csi_reply *r,
			    const Csi__V1__CreateVolumeRequest *req)
{
	const Csi__V1__CapacityRange *cr = req->capacity_range;
	const Csi__V1__TopologyRequirement *t = req->accessibility_requirements;
	char why[384];
	bool ok = false;

	if (csi_name_check(req->name, why, sizeof(why)) ||
	    csi_caps_check(req->volume_capabilities,
			   req->n_volume_capabilities, why, sizeof(why))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return -EINVAL;
	}
	if (cr && (cr->required_bytes < 0 || cr->limit_bytes < 0)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "capacity_range must not be negative");
		return -EINVAL;
	}
	if (cr && cr->limit_bytes && cr->required_bytes > cr->limit_bytes) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "capacity_range: required_bytes %lld exceeds limit_bytes %lld",
			      (long long)cr->required_bytes,
			      (long long)cr->limit_bytes);
		return -ERANGE;
	}
	if (!t || !t->n_requisite)
		return 0;
	for (size_t i = 0; i < t->n_requisite && !ok; i++)
		ok = csi_topo_matches(t->requisite[i], p);
	if (!ok) {
		csi_reply_set(r, CSI_RESOURCE_EXHAUSTED,
			      "no requisite topology names this node (%s=%s)",
			      p->topology_key, p->cfg.node_id);
		return -ENOSPC;
	}
	return 0;
}

/* A new volume in the store; the caller holds create_lock. */
static int csi_create_new(struct csi_plugin *p, struct csi_reply *r,
			  const char *name, struct csi_volume *want)
{
	int64_t avail = csi_store_free(&p->store);
	int ret;

	if (avail >= 0 && want->capacity > avail) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "capacity %lld bytes exceeds the %lld bytes free in the store",
			      (long long)want->capacity, (long long)avail);
		return -ERANGE;
	}
	want->name = strdup(name);
	ret = want->name ? csi_store_new_id(CSI_VOLUME_ID_PREFIX, want->id) :
			   -ENOMEM;
	if (!ret)
		ret = csi_volume_create(&p->store, want);
	if (ret) {
		csi_reply_errno(r, ret, "creating the volume");
		return ret;
	}
	strata_info("volume %s created for '%s'", want->id, name);
	return 0;
}

static void csi_create_reply(struct csi_plugin *p, struct csi_reply *r,
			     const struct csi_volume *v)
{
	Csi__V1__CreateVolumeResponse *out = csi_alloc(r, sizeof(*out));

	csi_reply_volume(r, v->id);
	if (out) {
		csi__v1__create_volume_response__init(out);
		out->volume = csi_volume_msg(p, r, v);
	}
	if (!out || !out->volume)
		csi_reply_errno(r, -ENOMEM, "CreateVolume");
	else
		csi_reply_ok(r, out);
}

static void csi_create_volume(struct csi_plugin *p, const ProtobufCMessage *msg,
			      struct csi_reply *r)
{
	const Csi__V1__CreateVolumeRequest *req = (const void *)msg;
	const Csi__V1__CapacityRange *cr = req->capacity_range;
	struct csi_volume want = { 0 }, have = { 0 };
	char why[384];
	int ret;

	if (csi_create_check(p, r, req))
		return;
	want.capacity = cr ? (cr->required_bytes ? cr->required_bytes : cr->limit_bytes) : 0;
	/*
	 * From the layers' check to the commit: DeleteLayer takes this lock
	 * too, so a layer found here is still there when the volume names it.
	 */
	pthread_mutex_lock(&p->store.create_lock);
	ret = csi_params_check(p, &want, req, why, sizeof(why));
	/*
	 * The daemon keeps a capacity by seeing every write; passthrough
	 * files are written by the kernel alone, past any limit.
	 */
	if (ret == 0 && want.passthrough && want.capacity > 0) {
		snprintf(why, sizeof(why),
			 "parameter passthrough=true and a capacity_range do not go together: with passthrough the kernel writes files without the daemon, so the capacity could not be enforced; leave out one of them");
		ret = -EINVAL;
	}
	if (ret) {
		if (ret == -EINVAL)
			csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		else
			csi_reply_errno(r, ret, "parameters");
		goto out_unlock;
	}
	/*
	 * A clone is looked up by name before its source: a retry finds it
	 * even once the snapshot it was made from is deleted.
	 */
	if (req->volume_content_source &&
	    csi_clone_source_id(req->volume_content_source, want.source)) {
		csi_clone_source(p, r, req, &want); /* answers why */
		goto out_unlock;
	}
	ret = csi_volume_find(&p->store, req->name, false, &have);
	if (ret == 0 && csi_volume_compatible(&want, &have, cr)) {
		csi_create_reply(p, r, &have);
	} else if (ret == 0) {
		csi_reply_volume(r, have.id);
		csi_reply_set(r, CSI_ALREADY_EXISTS,
			      "volume '%.128s' exists as %s with other layers, content source, passthrough, or a capacity outside the range asked for",
			      req->name, have.id);
	} else if (ret != -ENOENT) {
		csi_reply_errno(r, ret, "store");
	} else if (req->volume_content_source &&
		   csi_clone_source(p, r, req, &want)) {
		/* answered: the source is missing or does not fit */
	} else if (csi_store_writable(&p->store, r) == 0 &&
		   csi_clone_freeze(p, r, req->name, &want) == 0 &&
		   csi_create_new(p, r, req->name, &want) == 0) {
		csi_create_reply(p, r, &want);
		csi_flatten_kick(p);	/* a clone may start too deep */
	}
out_unlock:
	pthread_mutex_unlock(&p->store.create_lock);
	csi_volume_free(&want);
	csi_volume_free(&have);
}

static void csi_delete_volume(struct csi_plugin *p, const ProtobufCMessage *msg,
			      struct csi_reply *r)
{
	const Csi__V1__DeleteVolumeRequest *req = (const void *)msg;
	static Csi__V1__DeleteVolumeResponse out = CSI__V1__DELETE_VOLUME_RESPONSE__INIT;
	struct csi_node_vol n;
	int ret;

	if (!req->volume_id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return;
	}
	csi_reply_volume(r, req->volume_id);
	/* an id that cannot be ours names no volume: deleting it is done */
	if (!csi_volume_id_valid(req->volume_id)) {
		csi_reply_ok(r, &out);
		return;
	}
	if (csi_busy_claim(&p->store, req->volume_id, r))
		return;
	ret = csi_state_load(&p->store, req->volume_id, &n);
	if (ret == 0) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is staged on this node at %s: unstage it first",
			      req->volume_id, n.staging);
		csi_state_free(&n);
		goto out;
	}
	/* a record that cannot be read may say "staged": delete nothing */
	if (ret != -ENOENT) {
		csi_reply_set(r, CSI_INTERNAL,
			      "the node record %s/node/%s.json cannot be read (%s): the volume was not deleted; repair or remove the record",
			      p->store.root, req->volume_id, strerror(-ret));
		goto out;
	}
	ret = csi_volume_served(&p->store, req->volume_id);
	if (ret) {
		if (ret == -EBUSY)
			csi_reply_set(r, CSI_FAILED_PRECONDITION,
				      "volume %s is still served by a stratafs daemon (its workdir is locked): unstage it first",
				      req->volume_id);
		else
			csi_reply_errno(r, ret, "checking the volume's workdir");
		goto out;
	}
	/* deleting what is not there writes nothing, and is done */
	if (faccessat(p->store.volumes_fd, req->volume_id, F_OK, 0) < 0 &&
	    errno == ENOENT) {
		csi_reply_ok(r, &out);
		goto out;
	}
	if (csi_store_writable(&p->store, r))
		goto out;
	ret = csi_volume_delete(&p->store, req->volume_id);
	if (ret) {
		csi_reply_errno(r, ret, "deleting the volume");
		goto out;
	}
	/* the deleted snapshots only this volume still used go with it */
	pthread_mutex_lock(&p->store.create_lock);
	csi_snapshot_gc(&p->store);
	pthread_mutex_unlock(&p->store.create_lock);
	csi_reply_ok(r, &out);
out:
	csi_busy_leave(&p->store, req->volume_id);
}

static void csi_validate_caps(struct csi_plugin *p, const ProtobufCMessage *msg,
			      struct csi_reply *r)
{
	const Csi__V1__ValidateVolumeCapabilitiesRequest *req = (const void *)msg;
	Csi__V1__ValidateVolumeCapabilitiesResponse *out;
	Csi__V1__ValidateVolumeCapabilitiesResponse__Confirmed *conf;
	struct csi_volume v;
	char why[384];
	int ret;

	if (!req->volume_id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return;
	}
	csi_reply_volume(r, req->volume_id);
	if (!req->n_volume_capabilities) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "volume_capabilities are required");
		return;
	}
	ret = csi_volume_load(&p->store, req->volume_id, &v);
	if (ret) {
		csi_reply_load(r, req->volume_id, ret);
		return;
	}
	csi_volume_free(&v);
	out = csi_alloc(r, sizeof(*out));
	conf = csi_alloc(r, sizeof(*conf));
	if (!out || !conf) {
		csi_reply_errno(r, -ENOMEM, "ValidateVolumeCapabilities");
		return;
	}
	csi__v1__validate_volume_capabilities_response__init(out);
	if (csi_caps_check(req->volume_capabilities, req->n_volume_capabilities,
			   why, sizeof(why))) {
		out->message = csi_strdup(r, why);
		if (!out->message)
			out->message = "";
	} else {
		/* confirm what was asked: the same capabilities, echoed */
		csi__v1__validate_volume_capabilities_response__confirmed__init(conf);
		conf->n_volume_capabilities = req->n_volume_capabilities;
		conf->volume_capabilities = req->volume_capabilities;
		conf->n_volume_context = req->n_volume_context;
		conf->volume_context = (void *)req->volume_context;
		conf->n_parameters = req->n_parameters;
		conf->parameters = (void *)req->parameters;
		out->confirmed = conf;
	}
	csi_reply_ok(r, out);
}

/* Pages in id order (csi_page_first). */
static void csi_list_volumes(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__ListVolumesRequest *req = (const void *)msg;
	Csi__V1__ListVolumesResponse *out;
	char **ids = NULL;
	int n = 0, first = 0, ret;

	if (req->max_entries < 0) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "max_entries must not be negative");
		return;
	}
	if (req->starting_token[0] && !csi_volume_id_valid(req->starting_token)) {
		csi_reply_set(r, CSI_ABORTED,
			      "starting_token '%.64s' was not handed out by this plugin",
			      req->starting_token);
		return;
	}
	ret = csi_volume_list(&p->store, &ids, &n);
	if (ret) {
		csi_reply_errno(r, ret, "listing the store");
		return;
	}
	first = csi_page_first(ids, n, req->starting_token);
	out = csi_alloc(r, sizeof(*out));
	if (!out)
		goto out_nomem;
	csi__v1__list_volumes_response__init(out);
	out->entries = csi_alloc(r, sizeof(*out->entries) * (n + 1));
	if (!out->entries)
		goto out_nomem;
	for (int i = first; i < n; i++) {
		Csi__V1__ListVolumesResponse__Entry *e;
		struct csi_volume v;

		if (req->max_entries && out->n_entries == (size_t)req->max_entries) {
			out->next_token = csi_strdup(r, ids[i - 1]);
			if (!out->next_token)
				goto out_nomem;
			break;
		}
		/* deleted meanwhile, or a record half-written by a crash */
		if (csi_volume_load(&p->store, ids[i], &v))
			continue;
		/* inline volumes belong to their pods, not to the CO's list */
		if (v.ephemeral) {
			csi_volume_free(&v);
			continue;
		}
		e = csi_alloc(r, sizeof(*e));
		if (e) {
			csi__v1__list_volumes_response__entry__init(e);
			e->volume = csi_volume_msg(p, r, &v);
		}
		csi_volume_free(&v);
		if (!e || !e->volume)
			goto out_nomem;
		out->entries[out->n_entries++] = e;
	}
	csi_free_strv(ids, n);
	csi_reply_ok(r, out);
	return;
out_nomem:
	csi_free_strv(ids, n);
	csi_reply_errno(r, -ENOMEM, "ListVolumes");
}

/*
 * A volume of this node's store, and its condition: staged here or not,
 * and what is wrong with it (VOLUME_CONDITION). Inline volumes belong to
 * their pods and are not the CO's to look up, as in ListVolumes.
 */
static void csi_get_volume(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__ControllerGetVolumeRequest *req = (const void *)msg;
	Csi__V1__ControllerGetVolumeResponse__VolumeStatus *st;
	Csi__V1__ControllerGetVolumeResponse *out;
	struct csi_node_vol n = { 0 };
	struct csi_volume v = { 0 };
	int ret, staged;

	if (csi_reply_id_check(r, req->volume_id))
		return;
	ret = csi_volume_load(&p->store, req->volume_id, &v);
	if (!ret && v.ephemeral)
		ret = -ENOENT;
	if (ret) {
		csi_reply_load(r, req->volume_id, ret);
		goto out;
	}
	staged = csi_state_load(&p->store, v.id, &n);
	if (staged && staged != -ENOENT) {
		csi_reply_set(r, CSI_INTERNAL,
			      "the node record %s/node/%s.json cannot be read (%s)",
			      p->store.root, v.id, strerror(-staged));
		goto out;
	}
	out = csi_alloc(r, sizeof(*out));
	st = csi_alloc(r, sizeof(*st));
	if (!out || !st)
		goto out_nomem;
	csi__v1__controller_get_volume_response__init(out);
	csi__v1__controller_get_volume_response__volume_status__init(st);
	out->volume = csi_volume_msg(p, r, &v);
	st->volume_condition = csi_condition_msg(p, r, &v,
						 staged ? NULL : &n, NULL);
	out->status = st;
	if (!out->volume || !st->volume_condition)
		goto out_nomem;
	csi_reply_ok(r, out);
	goto out;
out_nomem:
	csi_reply_errno(r, -ENOMEM, "ControllerGetVolume");
out:
	csi_state_free(&n);
	csi_volume_free(&v);
}

static bool csi_capacity_layers_here(struct csi_plugin *p,
				     const Csi__V1__GetCapacityRequest *req)
{
	const char *list = CSI_MAP_GET(req, parameters, "layers");
	struct csi_volume v = { 0 };
	char why[384];
	bool ok;

	if (!list)
		return true;
	ok = csi_layers_check(p, &v, list, why, sizeof(why)) == 0;
	csi_volume_free(&v);
	return ok;
}

static void csi_get_capacity(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__GetCapacityRequest *req = (const void *)msg;
	Csi__V1__GetCapacityResponse *out = csi_alloc(r, sizeof(*out));
	char why[384];
	int64_t avail;

	if (req->n_volume_capabilities &&
	    csi_caps_check(req->volume_capabilities, req->n_volume_capabilities,
			   why, sizeof(why))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return;
	}
	if (!out) {
		csi_reply_errno(r, -ENOMEM, "GetCapacity");
		return;
	}
	csi__v1__get_capacity_response__init(out);
	/*
	 * Another node's topology has none of this node's space, and neither
	 * has a class whose layers this node lacks: a 0 steers the scheduler
	 * to nodes that can serve the claim.
	 */
	if ((!req->accessible_topology ||
	     csi_topo_matches(req->accessible_topology, p)) &&
	    csi_capacity_layers_here(p, req)) {
		avail = csi_store_free(&p->store);
		if (avail < 0) {
			csi_reply_errno(r, (int)avail, "statvfs of the store");
			return;
		}
		out->available_capacity = avail;
	}
	csi_reply_ok(r, out);
}

static void csi_controller_caps(struct csi_plugin *p, const ProtobufCMessage *msg,
				struct csi_reply *r)
{
	static const int types[] = {
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_VOLUME,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_VOLUMES,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_CAPACITY,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__SINGLE_NODE_MULTI_WRITER,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_VOLUME,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__VOLUME_CONDITION,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__EXPAND_VOLUME,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CREATE_DELETE_SNAPSHOT,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__LIST_SNAPSHOTS,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__GET_SNAPSHOT,
		CSI__V1__CONTROLLER_SERVICE_CAPABILITY__RPC__TYPE__CLONE_VOLUME,
	};

	csi_reply_caps(r, &csi__v1__controller_get_capabilities_response__descriptor,
		       &csi__v1__controller_service_capability__descriptor,
		       &csi__v1__controller_service_capability__rpc__descriptor, types,
		       sizeof(types) / sizeof(types[0]));
}

const struct csi_method csi_controller_methods[] = {
	{ "/csi.v1.Controller/CreateVolume",
	  &csi__v1__create_volume_request__descriptor, csi_create_volume,
	  CSI_MODE_CONTROLLER, true },
	{ "/csi.v1.Controller/DeleteVolume",
	  &csi__v1__delete_volume_request__descriptor, csi_delete_volume,
	  CSI_MODE_CONTROLLER, true },
	{ "/csi.v1.Controller/ValidateVolumeCapabilities",
	  &csi__v1__validate_volume_capabilities_request__descriptor,
	  csi_validate_caps, CSI_MODE_CONTROLLER, false },
	{ "/csi.v1.Controller/ListVolumes",
	  &csi__v1__list_volumes_request__descriptor, csi_list_volumes,
	  CSI_MODE_CONTROLLER, false },
	{ "/csi.v1.Controller/GetCapacity",
	  &csi__v1__get_capacity_request__descriptor, csi_get_capacity,
	  CSI_MODE_CONTROLLER, false },
	{ "/csi.v1.Controller/ControllerGetVolume",
	  &csi__v1__controller_get_volume_request__descriptor, csi_get_volume,
	  CSI_MODE_CONTROLLER, true },
	{ "/csi.v1.Controller/ControllerGetCapabilities",
	  &csi__v1__controller_get_capabilities_request__descriptor,
	  csi_controller_caps, CSI_MODE_CONTROLLER, false },
	{ "/csi.v1.Controller/ControllerExpandVolume",
	  &csi__v1__controller_expand_volume_request__descriptor,
	  csi_controller_expand, CSI_MODE_CONTROLLER, true },
	{ NULL },
};
