// SPDX-License-Identifier: Apache-2.0
/*
 * Online expansion. ControllerExpandVolume records a volume's new
 * capacity; NodeExpandVolume tells the volume's running daemon, whose
 * statfs shows it at once and whose writes may go on (fuse/usage.c). A
 * daemon started later reads the capacity from the record anyway.
 *
 * Capacities only grow: a range the volume already satisfies is done
 * (the spec's idempotency), one below what it has is OUT_OF_RANGE. A
 * volume without a capacity is unlimited, which satisfies any
 * required_bytes and no limit_bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "csi.h"

/* The capacity a range asks for, or -1 with the reply set. */
static int64_t csi_expand_want(struct csi_reply *r,
			       const Csi__V1__CapacityRange *cr)
{
	if (cr->required_bytes < 0 || cr->limit_bytes < 0) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "capacity_range must not be negative");
		return -1;
	}
	if (!cr->required_bytes && !cr->limit_bytes) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "capacity_range asks for no size: set required_bytes");
		return -1;
	}
	if (cr->limit_bytes && cr->required_bytes > cr->limit_bytes) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "capacity_range: required_bytes %lld exceeds limit_bytes %lld",
			      (long long)cr->required_bytes,
			      (long long)cr->limit_bytes);
		return -1;
	}
	return cr->required_bytes ? cr->required_bytes : cr->limit_bytes;
}

/* Whether HAVE (0: unlimited) already meets the range. */
static bool csi_expand_done(int64_t have, const Csi__V1__CapacityRange *cr)
{
	if (!have)
		return !cr->limit_bytes;
	return have >= cr->required_bytes &&
	       (!cr->limit_bytes || have <= cr->limit_bytes);
}

/* Whether the store has room for GROW more bytes; -1 with the reply set. */
static int csi_expand_room(struct csi_plugin *p, struct csi_reply *r,
			   const struct csi_volume *v, int64_t want)
{
	int64_t avail = csi_store_free(&p->store);

	if (avail >= 0 && want - v->capacity > avail) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "volume %s: growing to %lld bytes needs %lld more, and the store has %lld bytes free",
			      v->id, (long long)want,
			      (long long)(want - v->capacity), (long long)avail);
		return -1;
	}
	return 0;
}

/*
 * The steps both expansions share once their own fields are checked: the
 * capability (optional), the volume's claim, its record. 0 with V loaded
 * and the claim held; else the reply is set and neither is held.
 */
static int csi_expand_begin(struct csi_plugin *p, struct csi_reply *r,
			    const char *id,
			    const Csi__V1__VolumeCapability *cap,
			    struct csi_volume *v)
{
	char why[384];
	int ret;

	if (cap && csi_capability_check(cap, why, sizeof(why))) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "%s", why);
		return -EINVAL;
	}
	ret = csi_busy_claim(&p->store, id, r);
	if (ret)
		return ret;
	ret = csi_volume_load(&p->store, id, v);
	if (ret)
		goto out_leave;
	/* an inline volume is its pod's own: none to expand */
	if (v->ephemeral) {
		csi_volume_free(v);
		ret = -ENOENT;
		goto out_leave;
	}
	return 0;
out_leave:
	csi_reply_load(r, id, ret);
	csi_busy_leave(&p->store, id);
	return ret;
}

void csi_controller_expand(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r)
{
	const Csi__V1__ControllerExpandVolumeRequest *req = (const void *)msg;
	const Csi__V1__CapacityRange *cr = req->capacity_range;
	Csi__V1__ControllerExpandVolumeResponse *out;
	struct csi_volume v = { 0 };
	struct csi_node_vol n = { 0 };
	int64_t want;
	int ret;

	if (csi_reply_id_check(r, req->volume_id))
		return;
	if (!cr) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "capacity_range is required");
		return;
	}
	want = csi_expand_want(r, cr);
	if (want < 0)
		return;
	if (csi_expand_begin(p, r, req->volume_id, req->volume_capability, &v))
		return;
	if (!csi_expand_done(v.capacity, cr)) {
		if (!v.capacity || v.capacity > want) {
			csi_reply_set(r, CSI_OUT_OF_RANGE,
				      "volume %s has %s; it can grow, never shrink, and limit_bytes %lld is below that",
				      v.id, v.capacity ? "a larger capacity" :
							 "no capacity limit",
				      (long long)cr->limit_bytes);
			goto out;
		}
		if (v.passthrough) {
			csi_reply_set(r, CSI_INVALID_ARGUMENT,
				      "volume %s uses passthrough, where the kernel writes without the daemon: it cannot be given a capacity",
				      v.id);
			goto out;
		}
		if (csi_store_writable(&p->store, r) ||
		    csi_expand_room(p, r, &v, want))
			goto out;
		v.capacity = want;
		ret = csi_volume_save(&p->store, &v);
		if (ret) {
			csi_reply_errno(r, ret, "saving the volume record");
			goto out;
		}
	}
	out = csi_alloc(r, sizeof(*out));
	if (!out) {
		csi_reply_errno(r, -ENOMEM, "ControllerExpandVolume");
		goto out;
	}
	csi__v1__controller_expand_volume_response__init(out);
	out->capacity_bytes = v.capacity;
	/* staged here: kubelet's NodeExpandVolume tells the running daemon */
	out->node_expansion_required =
		csi_state_load(&p->store, v.id, &n) == 0;
	csi_reply_ok(r, out);
out:
	csi_state_free(&n);
	csi_volume_free(&v);
	csi_busy_leave(&p->store, req->volume_id);
}

void csi_node_expand(struct csi_plugin *p, const ProtobufCMessage *msg,
		     struct csi_reply *r)
{
	const Csi__V1__NodeExpandVolumeRequest *req = (const void *)msg;
	const Csi__V1__CapacityRange *cr = req->capacity_range;
	Csi__V1__NodeExpandVolumeResponse *out;
	struct csi_volume v = { 0 };
	struct csi_node_vol n = { 0 };
	char why[384];
	int ret;

	if (csi_reply_id_check(r, req->volume_id))
		return;
	if (!req->volume_path[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_path is required");
		return;
	}
	if (cr && csi_expand_want(r, cr) < 0)
		return;
	if (csi_expand_begin(p, r, req->volume_id, req->volume_capability, &v))
		return;
	/* the spec's NOT_FOUND: a path where the volume is neither staged nor published */
	ret = csi_state_load(&p->store, v.id, &n);
	if (ret == -ENOENT || (ret == 0 && strcmp(n.staging, req->volume_path) &&
			       !csi_state_target(&n, req->volume_path))) {
		csi_reply_set(r, CSI_NOT_FOUND,
			      "volume %s: not published or staged at %.256s",
			      v.id, req->volume_path);
		goto out;
	}
	if (ret) {
		csi_reply_errno(r, ret, "the node record");
		goto out;
	}
	/* the record is the controller's word: a range past it was not granted */
	if (cr && !csi_expand_done(v.capacity, cr)) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "volume %s has a capacity of %lld bytes, outside the range asked for: ControllerExpandVolume first",
			      v.id, (long long)v.capacity);
		goto out;
	}
	if (!v.passthrough) {
		ret = csi_usage_set_capacity(&p->store, v.id, v.capacity, why,
					     sizeof(why));
		if (ret) {
			csi_reply_set(r, CSI_UNAVAILABLE,
				      "volume %s: its daemon did not take the capacity %lld: %s; it takes it at its next start",
				      v.id, (long long)v.capacity, why);
			goto out;
		}
	}
	out = csi_alloc(r, sizeof(*out));
	if (!out) {
		csi_reply_errno(r, -ENOMEM, "NodeExpandVolume");
		goto out;
	}
	csi__v1__node_expand_volume_response__init(out);
	out->capacity_bytes = v.capacity;
	csi_reply_ok(r, out);
out:
	csi_state_free(&n);
	csi_volume_free(&v);
	csi_busy_leave(&p->store, req->volume_id);
}
