// SPDX-License-Identifier: Apache-2.0
/*
 * stratactl's readable output: one printer per reply (`text` in the
 * command table), as `key value` lines a person reads and a script can
 * still split, and the verdicts of the commands whose answer is a yes
 * or a no (probe, validate). --json goes through ctl_json.c instead; the
 * Admin service's volume states are in ctl_volume.c, its layers in
 * ctl_layer.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "csi.h"
#include "ctl.h"

static void ctl_print_map(const char *sep, size_t n, void *const *entries)
{
	for (size_t i = 0; i < n; i++) {
		const struct csi_map_entry *e = entries[i];

		printf("%s%s=%s", sep, e->key, e->value);
	}
}

/* "volume sv-... capacity 1073741824 layers a,b": one line per volume */
static void ctl_print_volume(const Csi__V1__Volume *v)
{
	if (!v) {
		printf("volume (none)");
		return;
	}
	printf("volume %s capacity %" PRId64, v->volume_id, v->capacity_bytes);
	/* "-" for an empty value, which would leave two keys side by side */
	for (size_t i = 0; i < v->n_volume_context; i++)
		printf(" %s %s", v->volume_context[i]->key,
		       *v->volume_context[i]->value ?
			       v->volume_context[i]->value : "-");
	if (v->content_source) {
		const Csi__V1__VolumeContentSource *cs = v->content_source;

		if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT &&
		    cs->snapshot)
			printf(" source snapshot %s", cs->snapshot->snapshot_id);
		else if (cs->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME &&
			 cs->volume)
			printf(" source volume %s", cs->volume->volume_id);
	}
	for (size_t i = 0; i < v->n_accessible_topology; i++)
		ctl_print_map(" topology ",
			      v->accessible_topology[i]->n_segments,
			      (void *const *)v->accessible_topology[i]->segments);
}

static void ctl_print_condition(const Csi__V1__VolumeCondition *c)
{
	if (!c)
		return;
	if (c->abnormal)
		printf("condition abnormal: %s\n", c->message);
	else if (*c->message)
		printf("condition normal: %s\n", c->message);
	else
		printf("condition normal\n");
}

/* The commands whose reply is empty say what was done: "staged ID at P". */
void ctl_text_done(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const struct ctl_cmd *cmd = ctl->cmd;

	printf("%s %s", cmd->done, ctl->a.pos[0]);
	if (cmd->done_prep)
		printf(" %s %s", cmd->done_prep,
		       ctl_opt_value(&ctl->a, cmd->done_opt));
	printf("%s\n", ctl->a.readonly ? " read-only" : "");
}

void ctl_text_info(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__GetPluginInfoResponse *r =
		(const Csi__V1__GetPluginInfoResponse *)reply;

	printf("name %s\n", r->name);
	printf("vendor_version %s\n", r->vendor_version);
	for (size_t i = 0; i < r->n_manifest; i++)
		printf("manifest %s=%s\n", r->manifest[i]->key,
		       r->manifest[i]->value);
}

void ctl_text_plugin_caps(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__GetPluginCapabilitiesResponse *r =
		(const Csi__V1__GetPluginCapabilitiesResponse *)reply;

	for (size_t i = 0; i < r->n_capabilities; i++) {
		const Csi__V1__PluginCapability *c = r->capabilities[i];

		if (c->type_case == CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE &&
		    c->service)
			printf("%s\n", ctl_enum_name(
				&csi__v1__plugin_capability__service__type__descriptor,
				c->service->type));
		else if (c->type_case == CSI__V1__PLUGIN_CAPABILITY__TYPE_VOLUME_EXPANSION &&
			 c->volume_expansion)
			printf("VOLUME_EXPANSION_%s\n", ctl_enum_name(
				&csi__v1__plugin_capability__volume_expansion__type__descriptor,
				c->volume_expansion->type));
		else
			printf("UNKNOWN\n");
	}
}

/*
 * ControllerGetCapabilities and NodeGetCapabilities answer alike: a list
 * of `capabilities`, each a oneof whose `rpc` holds a `type` enum. The
 * descriptors say where each lives, so one printer serves both.
 */
void ctl_text_rpc_caps(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const ProtobufCFieldDescriptor *fcaps, *frpc, *ftype;
	const ProtobufCMessage *const *caps;
	size_t n;

	fcaps = ctl_field(reply, "capabilities", PROTOBUF_C_TYPE_MESSAGE);
	n = CTL_AT(reply, fcaps->quantifier_offset, const size_t);
	caps = CTL_AT(reply, fcaps->offset, const ProtobufCMessage *const *const);
	for (size_t i = 0; i < n; i++) {
		const ProtobufCMessage *c = caps[i], *rpc;
		const char *name = "UNKNOWN";

		frpc = ctl_field(c, "rpc", PROTOBUF_C_TYPE_MESSAGE);
		rpc = CTL_AT(c, frpc->offset, const ProtobufCMessage *const);
		if (CTL_AT(c, frpc->quantifier_offset, const uint32_t) ==
			    frpc->id && rpc) {
			ftype = ctl_field(rpc, "type", PROTOBUF_C_TYPE_ENUM);
			name = ctl_enum_name(ftype->descriptor,
					     CTL_AT(rpc, ftype->offset, const int));
		}
		printf("%s\n", name);
	}
}

/* The spec: an absent `ready` means ready. */
bool ctl_probe_ready(const ProtobufCMessage *reply)
{
	const Csi__V1__ProbeResponse *r = (const Csi__V1__ProbeResponse *)reply;

	return !r->ready || r->ready->value;
}

void ctl_text_probe(struct ctl *ctl, const ProtobufCMessage *reply)
{
	printf("%s\n", ctl_probe_ready(reply) ? "ready" : "not ready");
}

int ctl_verdict_probe(const ProtobufCMessage *reply)
{
	return ctl_probe_ready(reply) ? CTL_EXIT_OK : CTL_EXIT_FAIL;
}

void ctl_text_create_volume(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__CreateVolumeResponse *r =
		(const Csi__V1__CreateVolumeResponse *)reply;

	ctl_print_volume(r->volume);
	printf("\n");
}

static void ctl_print_capability(const Csi__V1__VolumeCapability *c)
{
	const char *mode = "UNKNOWN";

	if (c->access_mode)
		mode = ctl_enum_name(
			&csi__v1__volume_capability__access_mode__mode__descriptor,
			c->access_mode->mode);
	if (c->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK) {
		printf(" %s block", mode);
	} else if (c->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT &&
		   c->mount) {
		printf(" %s mount", mode);
		if (*c->mount->fs_type)
			printf(" fs_type %s", c->mount->fs_type);
		if (*c->mount->volume_mount_group)
			printf(" mount_group %s", c->mount->volume_mount_group);
	} else {
		printf(" %s", mode);
	}
}

void ctl_text_validate(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__ValidateVolumeCapabilitiesResponse *r =
		(const Csi__V1__ValidateVolumeCapabilitiesResponse *)reply;

	if (r->confirmed) {
		printf("confirmed");
		for (size_t i = 0; i < r->confirmed->n_volume_capabilities; i++)
			ctl_print_capability(r->confirmed->volume_capabilities[i]);
		printf("%s%s\n", *r->message ? ": " : "", r->message);
	} else {
		printf("not confirmed%s%s\n", *r->message ? ": " : "",
		       r->message);
	}
}

int ctl_verdict_validate(const ProtobufCMessage *reply)
{
	const Csi__V1__ValidateVolumeCapabilitiesResponse *r =
		(const Csi__V1__ValidateVolumeCapabilitiesResponse *)reply;

	return r->confirmed ? CTL_EXIT_OK : CTL_EXIT_FAIL;
}

static void ctl_print_entry(const Csi__V1__ListVolumesResponse__Entry *e)
{
	ctl_print_volume(e->volume);
	if (e->status) {
		const Csi__V1__ListVolumesResponse__VolumeStatus *st = e->status;

		for (size_t i = 0; i < st->n_published_node_ids; i++)
			printf("%s%s", i ? "," : " published ",
			       st->published_node_ids[i]);
		if (st->volume_condition && st->volume_condition->abnormal)
			printf(" abnormal: %s", st->volume_condition->message);
	}
	printf("\n");
}

void ctl_text_list_volumes(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__ListVolumesResponse *r =
		(const Csi__V1__ListVolumesResponse *)reply;

	for (size_t i = 0; i < r->n_entries; i++)
		ctl_print_entry(r->entries[i]);
	if (!ctl->a.all && *r->next_token)
		printf("next_token %s\n", r->next_token);
}

void ctl_text_capacity(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__GetCapacityResponse *r =
		(const Csi__V1__GetCapacityResponse *)reply;

	printf("available_capacity %" PRId64 "\n", r->available_capacity);
	if (r->maximum_volume_size)
		printf("maximum_volume_size %" PRId64 "\n",
		       r->maximum_volume_size->value);
	if (r->minimum_volume_size)
		printf("minimum_volume_size %" PRId64 "\n",
		       r->minimum_volume_size->value);
}

void ctl_text_stats(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__NodeGetVolumeStatsResponse *r =
		(const Csi__V1__NodeGetVolumeStatsResponse *)reply;

	printf("%-8s %20s %20s %20s\n", "UNIT", "TOTAL", "USED",
	       "AVAILABLE");
	for (size_t i = 0; i < r->n_usage; i++) {
		const Csi__V1__VolumeUsage *u = r->usage[i];

		printf("%-8s %20" PRId64 " %20" PRId64 " %20" PRId64 "\n",
		       ctl_enum_name(&csi__v1__volume_usage__unit__descriptor,
				     u->unit),
		       u->total, u->used, u->available);
	}
	ctl_print_condition(r->volume_condition);
}

void ctl_text_expand(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__ControllerExpandVolumeResponse *r =
		(const Csi__V1__ControllerExpandVolumeResponse *)reply;

	printf("expanded %s to %" PRId64 " bytes\n", ctl->a.pos[0],
	       r->capacity_bytes);
	if (r->node_expansion_required)
		printf("staged: its daemon takes the capacity with "
		       "`node-expand %s --path P`\n", ctl->a.pos[0]);
}

void ctl_text_node_expand(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__NodeExpandVolumeResponse *r =
		(const Csi__V1__NodeExpandVolumeResponse *)reply;

	printf("%s serves %" PRId64 " bytes at %s\n", ctl->a.pos[0],
	       r->capacity_bytes, ctl->a.path);
}

void ctl_text_replace_worker(struct ctl *ctl,
				    const ProtobufCMessage *reply)
{
	const Strata__V1__ReplaceWorkerResponse *r =
		(const Strata__V1__ReplaceWorkerResponse *)reply;

	printf("replaced the worker of %s\n", ctl->a.pos[0]);
	printf("supervisor_pid %d\n", (int)r->supervisor_pid);
	printf("old_worker_pid %d\n", (int)r->old_worker_pid);
	printf("new_worker_pid %d\n", (int)r->new_worker_pid);
	printf("binary %s\n", r->binary);
}

void ctl_text_node_info(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Csi__V1__NodeGetInfoResponse *r =
		(const Csi__V1__NodeGetInfoResponse *)reply;

	printf("node_id %s\n", r->node_id);
	printf("max_volumes_per_node %" PRId64 "\n",
	       r->max_volumes_per_node);
	if (r->accessible_topology)
		for (size_t i = 0; i < r->accessible_topology->n_segments; i++)
			printf("topology %s=%s\n",
			       r->accessible_topology->segments[i]->key,
			       r->accessible_topology->segments[i]->value);
}

/* "deleted ID", or what DeleteVolume's idempotent OK does not say. */
void ctl_text_delete(struct ctl *ctl, const ProtobufCMessage *reply)
{
	if (ctl->no_such_volume)
		printf("volume %s: no such volume, nothing deleted\n",
		       ctl->a.pos[0]);
	else
		printf("deleted %s\n", ctl->a.pos[0]);
}

void ctl_text_volume_list(struct ctl *ctl, const ProtobufCMessage *reply)
{
	ctl_print_volume_states((const Strata__V1__ListVolumeStatesResponse *)reply);
}

void ctl_text_volume_inspect(struct ctl *ctl,
				    const ProtobufCMessage *reply)
{
	const Strata__V1__InspectVolumeResponse *r =
		(const Strata__V1__InspectVolumeResponse *)reply;

	if (r->volume)
		ctl_print_volume_state(r->volume);
}
