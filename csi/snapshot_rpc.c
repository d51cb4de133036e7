// SPDX-License-Identifier: Apache-2.0
/*
 * The Controller's snapshot methods over the store's snapshots
 * (snapshot.c): CreateSnapshot, DeleteSnapshot, ListSnapshots and
 * GetSnapshot, with the spec's codes. A hidden snapshot (deleted while
 * a clone or another snapshot still uses its layer, or a clone's own)
 * is not there as far as these methods go.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"

/* A Snapshot message and its time, in one allocation. */
struct csi_snapshot_msg {
	Csi__V1__Snapshot snap;
	Google__Protobuf__Timestamp ts;
};

static Csi__V1__Snapshot *csi_snapshot_msg(struct csi_reply *r,
					   const struct csi_snapshot *ss)
{
	struct csi_snapshot_msg *m = csi_alloc(r, sizeof(*m));

	if (!m)
		return NULL;
	csi__v1__snapshot__init(&m->snap);
	google__protobuf__timestamp__init(&m->ts);
	m->ts.seconds = ss->created_s;
	m->ts.nanos = ss->created_ns;
	m->snap.snapshot_id = csi_strdup(r, ss->id);
	m->snap.source_volume_id = csi_strdup(r, ss->source);
	m->snap.creation_time = &m->ts;
	/* a rename: whole at once */
	m->snap.ready_to_use = true;
	m->snap.size_bytes = ss->size;
	if (!m->snap.snapshot_id || !m->snap.source_volume_id)
		return NULL;
	return &m->snap;
}

/* What csi_snapshot_take's error means to the caller, answered. */
void csi_snapshot_answer(struct csi_reply *r, int err, const char *why)
{
	enum csi_code code;

	switch (err) {
	case -E2BIG:
	case -ENOSPC:
	case -EDQUOT:
		code = CSI_RESOURCE_EXHAUSTED;
		break;
	case -ENOTCONN:
	case -ETIMEDOUT:
		code = CSI_UNAVAILABLE;
		break;
	case -EBUSY:
	case -EREMOTEIO:
		code = CSI_FAILED_PRECONDITION;
		break;
	default:
		code = CSI_INTERNAL;
	}
	csi_reply_set(r, code, "%s", why);
}

static void csi_snapshot_created(struct csi_reply *r,
				 const struct csi_snapshot *ss)
{
	Csi__V1__CreateSnapshotResponse *out = csi_alloc(r, sizeof(*out));

	if (out) {
		csi__v1__create_snapshot_response__init(out);
		out->snapshot = csi_snapshot_msg(r, ss);
	}
	if (!out || !out->snapshot)
		csi_reply_errno(r, -ENOMEM, "CreateSnapshot");
	else
		csi_reply_ok(r, out);
}

static void csi_create_snapshot(struct csi_plugin *p,
				const ProtobufCMessage *msg,
				struct csi_reply *r)
{
	const Csi__V1__CreateSnapshotRequest *req = (const void *)msg;
	struct csi_snapshot have = { 0 }, ss = { 0 };
	struct csi_volume v = { 0 };
	bool kick = false;
	char why[512];
	int ret;

	if (csi_name_check(req->name, why, sizeof(why))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return;
	}
	if (!req->source_volume_id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "source_volume_id is required");
		return;
	}
	csi_reply_volume(r, req->source_volume_id);
	if (!csi_volume_id_valid(req->source_volume_id)) {
		csi_reply_set(r, CSI_NOT_FOUND, "volume %.64s: no such volume",
			      req->source_volume_id);
		return;
	}
	if (csi_busy_claim(&p->store, req->source_volume_id, r))
		return;
	pthread_mutex_lock(&p->store.create_lock);
	ret = csi_snapshot_find(&p->store, req->name, &have);
	if (ret == 0 && !strcmp(have.source, req->source_volume_id)) {
		csi_snapshot_created(r, &have);
		goto out;
	}
	if (ret == 0) {
		csi_reply_set(r, CSI_ALREADY_EXISTS,
			      "snapshot '%.128s' exists as %s of another volume, %s",
			      req->name, have.id, have.source);
		goto out;
	}
	if (ret != -ENOENT) {
		csi_reply_errno(r, ret, "reading the snapshots");
		goto out;
	}
	ret = csi_volume_load(&p->store, req->source_volume_id, &v);
	if (ret == 0 && v.ephemeral)
		ret = -ENOENT; /* an inline volume is its pod's, not the CO's */
	if (ret) {
		csi_reply_load(r, req->source_volume_id, ret);
		goto out;
	}
	if (csi_store_writable(&p->store, r))
		goto out;
	ss.name = strdup(req->name);
	if (!ss.name) {
		csi_reply_errno(r, -ENOMEM, "CreateSnapshot");
		goto out;
	}
	ret = csi_snapshot_take(p, &v, &ss, why, sizeof(why));
	if (ret) {
		csi_snapshot_answer(r, ret, why);
		goto out;
	}
	strata_info("snapshot %s '%s' taken of volume %s", ss.id, ss.name,
		    v.id);
	csi_snapshot_created(r, &ss);
	kick = true;
out:
	pthread_mutex_unlock(&p->store.create_lock);
	csi_busy_leave(&p->store, req->source_volume_id);
	/* the chains just got deeper: a round, once the volume is unclaimed */
	if (kick)
		csi_flatten_kick(p);
	csi_volume_free(&v);
	csi_snapshot_free(&have);
	csi_snapshot_free(&ss);
}

static void csi_delete_snapshot(struct csi_plugin *p,
				const ProtobufCMessage *msg,
				struct csi_reply *r)
{
	const Csi__V1__DeleteSnapshotRequest *req = (const void *)msg;
	static Csi__V1__DeleteSnapshotResponse out =
		CSI__V1__DELETE_SNAPSHOT_RESPONSE__INIT;
	struct csi_snapshot ss;
	int ret;

	if (!req->snapshot_id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "snapshot_id is required");
		return;
	}
	/* an id that cannot be ours names no snapshot: deleting it is done */
	if (!csi_snapshot_id_valid(req->snapshot_id)) {
		csi_reply_ok(r, &out);
		return;
	}
	pthread_mutex_lock(&p->store.create_lock);
	ret = csi_snapshot_load(&p->store, req->snapshot_id, &ss);
	if (ret == -ENOENT) {
		csi_reply_ok(r, &out);
		goto out_unlock;
	}
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL,
			      "snapshot %s: its record %s/snapshots/%s/snapshot.json cannot be read (%s): nothing was deleted",
			      req->snapshot_id, p->store.root, req->snapshot_id,
			      strerror(-ret));
		goto out_unlock;
	}
	/* hidden first: the removal goes only if nothing uses its layer */
	if (!ss.hidden) {
		if (csi_store_writable(&p->store, r))
			goto out_free;
		ret = csi_snapshot_hide(&p->store, &ss);
		if (ret) {
			csi_reply_errno(r, ret, "deleting the snapshot");
			goto out_free;
		}
	}
	csi_snapshot_gc(&p->store);
	csi_reply_ok(r, &out);
out_free:
	csi_snapshot_free(&ss);
out_unlock:
	pthread_mutex_unlock(&p->store.create_lock);
}

static void csi_get_snapshot(struct csi_plugin *p, const ProtobufCMessage *msg,
			     struct csi_reply *r)
{
	const Csi__V1__GetSnapshotRequest *req = (const void *)msg;
	Csi__V1__GetSnapshotResponse *out;
	struct csi_snapshot ss;
	int ret;

	if (!req->snapshot_id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "snapshot_id is required");
		return;
	}
	ret = csi_snapshot_load(&p->store, req->snapshot_id, &ss);
	if (ret == 0 && ss.hidden) {
		csi_snapshot_free(&ss);
		ret = -ENOENT;
	}
	if (ret) {
		csi_reply_set(r, ret == -ENOENT ? CSI_NOT_FOUND : CSI_INTERNAL,
			      "snapshot %.64s: %s", req->snapshot_id,
			      ret == -ENOENT ? "no such snapshot" : strerror(-ret));
		return;
	}
	out = csi_alloc(r, sizeof(*out));
	if (out) {
		csi__v1__get_snapshot_response__init(out);
		out->snapshot = csi_snapshot_msg(r, &ss);
	}
	csi_snapshot_free(&ss);
	if (!out || !out->snapshot)
		csi_reply_errno(r, -ENOMEM, "GetSnapshot");
	else
		csi_reply_ok(r, out);
}

/* Pages in id order (csi_page_first). */
static void csi_list_snapshots(struct csi_plugin *p,
			       const ProtobufCMessage *msg,
			       struct csi_reply *r)
{
	const Csi__V1__ListSnapshotsRequest *req = (const void *)msg;
	Csi__V1__ListSnapshotsResponse *out;
	char **ids = NULL;
	int n = 0, first = 0, ret;

	if (req->max_entries < 0) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "max_entries must not be negative");
		return;
	}
	if (req->starting_token[0] &&
	    !csi_snapshot_id_valid(req->starting_token)) {
		csi_reply_set(r, CSI_ABORTED,
			      "starting_token '%.64s' was not handed out by this plugin: list again from the start",
			      req->starting_token);
		return;
	}
	ret = csi_snapshot_list(&p->store, &ids, &n);
	if (ret) {
		csi_reply_errno(r, ret, "listing the snapshots");
		return;
	}
	first = csi_page_first(ids, n, req->starting_token);
	out = csi_alloc(r, sizeof(*out));
	if (!out)
		goto out_nomem;
	csi__v1__list_snapshots_response__init(out);
	out->entries = csi_alloc(r, sizeof(*out->entries) * (n + 1));
	if (!out->entries)
		goto out_nomem;
	for (int i = first; i < n; i++) {
		Csi__V1__ListSnapshotsResponse__Entry *e;
		struct csi_snapshot ss;

		/* filters: an unknown id or volume simply matches nothing */
		if (req->snapshot_id[0] && strcmp(ids[i], req->snapshot_id))
			continue;
		/* deleted meanwhile, or a record half-written by hand */
		if (csi_snapshot_load(&p->store, ids[i], &ss))
			continue;
		if (ss.hidden || (req->source_volume_id[0] &&
				  strcmp(ss.source, req->source_volume_id))) {
			csi_snapshot_free(&ss);
			continue;
		}
		if (req->max_entries &&
		    out->n_entries == (size_t)req->max_entries) {
			csi_snapshot_free(&ss);
			out->next_token = csi_strdup(
				r, out->entries[out->n_entries - 1]->snapshot->snapshot_id);
			if (!out->next_token)
				goto out_nomem;
			break;
		}
		e = csi_alloc(r, sizeof(*e));
		if (e) {
			csi__v1__list_snapshots_response__entry__init(e);
			e->snapshot = csi_snapshot_msg(r, &ss);
		}
		csi_snapshot_free(&ss);
		if (!e || !e->snapshot)
			goto out_nomem;
		out->entries[out->n_entries++] = e;
	}
	csi_free_strv(ids, n);
	csi_reply_ok(r, out);
	return;
out_nomem:
	csi_free_strv(ids, n);
	csi_reply_errno(r, -ENOMEM, "ListSnapshots");
}

const struct csi_method csi_snapshot_methods[] = {
	{ "/csi.v1.Controller/CreateSnapshot",
	  &csi__v1__create_snapshot_request__descriptor, csi_create_snapshot,
	  CSI_MODE_CONTROLLER, true },
	{ "/csi.v1.Controller/DeleteSnapshot",
	  &csi__v1__delete_snapshot_request__descriptor, csi_delete_snapshot,
	  CSI_MODE_CONTROLLER, true },
	{ "/csi.v1.Controller/ListSnapshots",
	  &csi__v1__list_snapshots_request__descriptor, csi_list_snapshots,
	  CSI_MODE_CONTROLLER, false },
	{ "/csi.v1.Controller/GetSnapshot",
	  &csi__v1__get_snapshot_request__descriptor, csi_get_snapshot,
	  CSI_MODE_CONTROLLER, false },
	{ NULL },
};
