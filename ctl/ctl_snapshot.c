// SPDX-License-Identifier: Apache-2.0
/*
 * `stratactl snapshot create|list|rm` (CreateSnapshot, ListSnapshots,
 * DeleteSnapshot) and create-volume's --from-snapshot / --from-volume
 * (a VolumeContentSource): their table entries, requests and readable
 * replies. A table of its own, which stratactl.c looks commands up in
 * after its own.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "csi.h"
#include "ctl.h"

/* create-volume NAME --from-snapshot ID | --from-volume ID */
int ctl_build_content_source(struct ctl *ctl, Csi__V1__CreateVolumeRequest *r)
{
	const struct ctl_args *a = &ctl->a;
	Csi__V1__VolumeContentSource *src;

	if (!a->from_snapshot && !a->from_volume)
		return 0;
	if (a->from_snapshot && a->from_volume)
		return ctl_usage_error(ctl, "give one source: --from-snapshot or --from-volume");
	src = ctl_alloc(ctl, sizeof(*src));
	csi__v1__volume_content_source__init(src);
	if (a->from_snapshot) {
		Csi__V1__VolumeContentSource__SnapshotSource *s =
			ctl_alloc(ctl, sizeof(*s));

		csi__v1__volume_content_source__snapshot_source__init(s);
		s->snapshot_id = (char *)a->from_snapshot;
		src->type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT;
		src->snapshot = s;
	} else {
		Csi__V1__VolumeContentSource__VolumeSource *v =
			ctl_alloc(ctl, sizeof(*v));

		csi__v1__volume_content_source__volume_source__init(v);
		v->volume_id = (char *)a->from_volume;
		src->type_case = CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME;
		src->volume = v;
	}
	r->volume_content_source = src;
	return 0;
}

/* snapshot create NAME VOLUME_ID: the second argument is the source. */
static int ctl_build_create_snapshot(struct ctl *ctl, ProtobufCMessage *req)
{
	Csi__V1__CreateSnapshotRequest *r = (Csi__V1__CreateSnapshotRequest *)req;

	r->source_volume_id = ctl->a.pos[1];
	return 0;
}

static int ctl_build_list_snapshots(struct ctl *ctl, ProtobufCMessage *req)
{
	Csi__V1__ListSnapshotsRequest *r = (Csi__V1__ListSnapshotsRequest *)req;

	r->max_entries = ctl->a.max_entries;
	if (ctl->a.starting_token)
		r->starting_token = (char *)ctl->a.starting_token;
	return 0;
}

/* "ss-...  sv-...  2026-11-26T17:42:22Z  ready" */
static void ctl_print_snapshot(const Csi__V1__Snapshot *s)
{
	char when[32] = "-";
	struct tm tm;

	if (s->creation_time) {
		time_t t = (time_t)s->creation_time->seconds;

		gmtime_r(&t, &tm);
		strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	}
	printf("%-36s %-36s %-21s %s\n", s->snapshot_id, s->source_volume_id,
	       when, s->ready_to_use ? "ready" : "not-ready");
}

static void ctl_text_create_snapshot(struct ctl *ctl,
				     const ProtobufCMessage *reply)
{
	const Csi__V1__CreateSnapshotResponse *r =
		(const Csi__V1__CreateSnapshotResponse *)reply;

	if (r->snapshot)
		ctl_print_snapshot(r->snapshot);
}

static void ctl_text_list_snapshots(struct ctl *ctl,
				    const ProtobufCMessage *reply)
{
	const Csi__V1__ListSnapshotsResponse *r =
		(const Csi__V1__ListSnapshotsResponse *)reply;

	for (size_t i = 0; i < r->n_entries; i++)
		if (r->entries[i]->snapshot)
			ctl_print_snapshot(r->entries[i]->snapshot);
	if (r->next_token && r->next_token[0])
		printf("next_token %s\n", r->next_token);
}

static void ctl_text_delete_snapshot(struct ctl *ctl,
				     const ProtobufCMessage *reply)
{
	printf("deleted snapshot %s\n", ctl->a.pos[0]);
}

static const int ctl_opts_snapshot_list[] = {
	CTL_OPT_MAX_ENTRIES, CTL_OPT_STARTING_TOKEN, CTL_OPT_END,
};

const struct ctl_cmd ctl_snapshot_cmds[] = {
	{
		.name = "snapshot create", .synopsis = "NAME VOLUME_ID",
		.summary = "snapshot a volume as it is now, or find the snapshot of that name (CreateSnapshot)",
		.min_pos = 2, .max_pos = 2, .arg = "name",
		CTL_RPC(Controller, CreateSnapshot, create_snapshot),
		.build = ctl_build_create_snapshot,
		.text = ctl_text_create_snapshot,
		.waiting = "waiting for the volume to be frozen",
	},
	{
		.name = "snapshot list",
		.synopsis = "[--max-entries N] [--starting-token T]",
		.summary = "the snapshots: id, source volume, creation time (ListSnapshots)",
		.options =
			"  --max-entries N     at most N per reply (0: the plugin decides)\n"
			"  --starting-token T  continue from a previous reply's next_token\n",
		.opts = ctl_opts_snapshot_list,
		CTL_RPC(Controller, ListSnapshots, list_snapshots),
		.build = ctl_build_list_snapshots,
		.text = ctl_text_list_snapshots,
	},
	{
		.name = "snapshot rm", .synopsis = "ID",
		.summary = "delete a snapshot; its data stays while a clone uses it (DeleteSnapshot)",
		.min_pos = 1, .max_pos = 1, .arg = "snapshot_id",
		CTL_RPC(Controller, DeleteSnapshot, delete_snapshot),
		.text = ctl_text_delete_snapshot,
	},
	{ .name = NULL },
};
