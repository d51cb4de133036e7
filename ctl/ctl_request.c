// SPDX-License-Identifier: Apache-2.0
/*
 * stratactl's requests: the fields that requests name alike (volume_id,
 * the paths, the capability, the maps), set from the options through
 * the protobuf-c descriptors, so that a command is mostly its table
 * entry in stratactl.c. What one request alone has is its `build`.
 */
#include <stdlib.h>
#include <string.h>

#include "csi.h"
#include "ctl.h"

/*
 * The field `name` of m, of protobuf-c type `type`. The names are this
 * file's, not input: one that the message lacks is a bug, not a request.
 */
const ProtobufCFieldDescriptor *ctl_field(const ProtobufCMessage *m,
					  const char *name, ProtobufCType type)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field_by_name(m->descriptor,
								name);

	if (!f || f->type != type)
		abort(); /* a typo in a field name here: a bug, not input */
	return f;
}

/*
 * Fills the map field `field` of `m` from `kvs`. protoc-c gives every
 * map<string,string> entry the layout of struct csi_map_entry, so one
 * function serves every map of every request.
 */
static void ctl_map_set(struct ctl *ctl, ProtobufCMessage *m,
			const char *field, const struct ctl_kvs *kvs)
{
	const ProtobufCFieldDescriptor *f;
	const ProtobufCMessageDescriptor *ed;
	struct csi_map_entry *e;
	void **ptrs;

	if (!kvs->n)
		return;
	f = ctl_field(m, field, PROTOBUF_C_TYPE_MESSAGE);
	ed = f->descriptor;
	if (f->label != PROTOBUF_C_LABEL_REPEATED ||
	    ed->sizeof_message != sizeof(struct csi_map_entry))
		abort();
	e = ctl_alloc(ctl, kvs->n * sizeof(*e));
	ptrs = ctl_alloc(ctl, kvs->n * sizeof(*ptrs));
	for (int i = 0; i < kvs->n; i++) {
		protobuf_c_message_init(ed, &e[i]);
		e[i].key = (char *)kvs->v[i].key;
		e[i].value = (char *)kvs->v[i].value;
		ptrs[i] = &e[i];
	}
	CTL_AT(m, f->quantifier_offset, size_t) = kvs->n;
	CTL_AT(m, f->offset, void **) = ptrs;
}

/* The string field `field` of m, when there is a value to put in it. */
static void ctl_string_set(ProtobufCMessage *m, const char *field,
			   const char *value)
{
	if (value)
		CTL_AT(m, ctl_field(m, field, PROTOBUF_C_TYPE_STRING)->offset,
		       char *) = (char *)value;
}

/* The one capability a request carries: mount (or block) plus the mode. */
Csi__V1__VolumeCapability *ctl_capability(struct ctl *ctl)
{
	const struct ctl_args *a = &ctl->a;
	Csi__V1__VolumeCapability *cap;
	Csi__V1__VolumeCapability__AccessMode *mode;

	cap = ctl_alloc(ctl, sizeof(*cap));
	csi__v1__volume_capability__init(cap);
	mode = ctl_alloc(ctl, sizeof(*mode));
	csi__v1__volume_capability__access_mode__init(mode);
	mode->mode = a->access_mode ? a->access_mode :
		CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER;
	cap->access_mode = mode;
	if (a->block) {
		Csi__V1__VolumeCapability__BlockVolume *b;

		b = ctl_alloc(ctl, sizeof(*b));
		csi__v1__volume_capability__block_volume__init(b);
		cap->access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK;
		cap->block = b;
	} else {
		Csi__V1__VolumeCapability__MountVolume *mv;

		mv = ctl_alloc(ctl, sizeof(*mv));
		csi__v1__volume_capability__mount_volume__init(mv);
		if (a->fs_type)
			mv->fs_type = (char *)a->fs_type;
		if (a->mount_group)
			mv->volume_mount_group = (char *)a->mount_group;
		mv->n_mount_flags = a->mount_flags.n;
		mv->mount_flags = (char **)a->mount_flags.v;
		cap->access_type_case = CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT;
		cap->mount = mv;
	}
	return cap;
}

/*
 * The capability into the request: one `volume_capability` (the node's
 * requests), or a `volume_capabilities` list of one (the controller's).
 */
static void ctl_capability_set(struct ctl *ctl, ProtobufCMessage *req)
{
	const ProtobufCFieldDescriptor *f;

	f = protobuf_c_message_descriptor_get_field_by_name(req->descriptor,
							    "volume_capability");
	if (!f)
		f = ctl_field(req, "volume_capabilities",
			      PROTOBUF_C_TYPE_MESSAGE);
	if (f->label == PROTOBUF_C_LABEL_REPEATED) {
		Csi__V1__VolumeCapability **caps =
			ctl_alloc(ctl, sizeof(*caps));

		caps[0] = ctl_capability(ctl);
		CTL_AT(req, f->quantifier_offset, size_t) = 1;
		CTL_AT(req, f->offset, Csi__V1__VolumeCapability **) = caps;
	} else {
		CTL_AT(req, f->offset, Csi__V1__VolumeCapability *) =
			ctl_capability(ctl);
	}
}

/*
 * The fields that requests name alike, from the command's argument and
 * options. A command is offered only the options its request has fields
 * for, and ctl_args holds nothing for an option not given, so every value
 * found here has a field to go in.
 */
void ctl_fill(struct ctl *ctl, ProtobufCMessage *req)
{
	const struct ctl_cmd *cmd = ctl->cmd;
	const struct ctl_args *a = &ctl->a;

	if (cmd->arg)
		ctl_string_set(req, cmd->arg, a->pos[0]);
	ctl_string_set(req, "staging_target_path", a->staging);
	ctl_string_set(req, "target_path", a->target);
	ctl_string_set(req, "volume_path", a->path);
	if (a->readonly)
		CTL_AT(req, ctl_field(req, "readonly",
				      PROTOBUF_C_TYPE_BOOL)->offset,
		       protobuf_c_boolean) = 1;
	/* GetCapacity: no capability unless asked; then the plugin reports all. */
	if (cmd->cap == CTL_CAP_ALWAYS ||
	    (cmd->cap == CTL_CAP_ASKED && (a->access_mode || a->block)))
		ctl_capability_set(ctl, req);
	ctl_map_set(ctl, req, "volume_context", &a->context);
	ctl_map_set(ctl, req, "parameters", &a->params);
	ctl_map_set(ctl, req, "secrets", &a->secrets);
}
