// SPDX-License-Identifier: Apache-2.0
/*
 * Handler answers: a status code, one plain sentence, and on OK the reply
 * message. This is where a negative errno becomes a status code; server.c
 * turns that into gRPC's.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "csi.h"

const char *csi_code_name(enum csi_code code)
{
	static const char *const names[CSI_CODE_COUNT] = {
		[CSI_OK] = "OK",
		[CSI_CANCELLED] = "CANCELLED",
		[CSI_UNKNOWN] = "UNKNOWN",
		[CSI_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
		[CSI_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
		[CSI_NOT_FOUND] = "NOT_FOUND",
		[CSI_ALREADY_EXISTS] = "ALREADY_EXISTS",
		[CSI_PERMISSION_DENIED] = "PERMISSION_DENIED",
		[CSI_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
		[CSI_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
		[CSI_ABORTED] = "ABORTED",
		[CSI_OUT_OF_RANGE] = "OUT_OF_RANGE",
		[CSI_UNIMPLEMENTED] = "UNIMPLEMENTED",
		[CSI_INTERNAL] = "INTERNAL",
		[CSI_UNAVAILABLE] = "UNAVAILABLE",
		[CSI_DATA_LOSS] = "DATA_LOSS",
		[CSI_UNAUTHENTICATED] = "UNAUTHENTICATED",
	};

	if ((unsigned)code < CSI_CODE_COUNT)
		return names[code];
	return "UNKNOWN";
}

/*
 * A volume's chain of N entries as users read it (volume_context, and
 * stratactl's inspect): top first, comma separated, a snapshot's layer
 * as "snapshot:<id>" rather than the record's "@<id>", a layer of
 * layers/ by its name. Into BUF as snprintf writes: cut to SIZE, and
 * the length of the whole returned.
 */
size_t csi_chain_format(char *buf, size_t size, char *const *chain, size_t n)
{
	size_t len = 0;

	if (size)
		buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		bool snap = chain[i][0] == CSI_CHAIN_SNAPSHOT;

		len += (size_t)snprintf(len < size ? buf + len : NULL,
					len < size ? size - len : 0, "%s%s%s",
					i ? "," : "", snap ? "snapshot:" : "",
					chain[i] + snap);
	}
	return len;
}

void csi_reply_set(struct csi_reply *r, enum csi_code code,
		   const char *fmt, ...)
{
	va_list ap;

	r->code = code;
	va_start(ap, fmt);
	vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
	va_end(ap);
}

/*
 * The codes follow the spec's tables: what the caller can do about it
 * decides the code, and the errno only says which case we are in.
 */
void csi_reply_errno(struct csi_reply *r, int err, const char *what)
{
	enum csi_code code;

	switch (err) {
	case -ENOENT:
		code = CSI_NOT_FOUND;
		break;
	case -ENOSPC:
	case -EDQUOT:
	case -EMFILE:
	case -ENFILE:
		code = CSI_RESOURCE_EXHAUSTED;
		break;
	case -EBUSY:
		code = CSI_FAILED_PRECONDITION;
		break;
	case -EINVAL:
		code = CSI_INVALID_ARGUMENT;
		break;
	default:
		code = CSI_INTERNAL;
	}
	csi_reply_set(r, code, "%s: %s", what, strerror(-err));
}

void csi_reply_ok(struct csi_reply *r, void *msg)
{
	r->code = CSI_OK;
	r->msg[0] = '\0';
	r->msg_out = msg;
}

/* Zeroed memory that lives as long as the reply; NULL when out of memory. */
void *csi_alloc(struct csi_reply *r, size_t size)
{
	void **v = realloc(r->allocs, sizeof(*v) * (r->nallocs + 1));
	void *m;

	if (!v)
		return NULL;
	r->allocs = v;
	m = calloc(1, size);
	if (m)
		r->allocs[r->nallocs++] = m;
	return m;
}

char *csi_strdup(struct csi_reply *r, const char *s)
{
	char *d = csi_alloc(r, strlen(s) + 1);

	return d ? strcpy(d, s) : NULL;
}

void csi_reply_free(struct csi_reply *r)
{
	for (size_t i = 0; i < r->nallocs; i++)
		free(r->allocs[i]);
	free(r->allocs);
	r->allocs = NULL;
	r->nallocs = 0;
	r->msg_out = NULL;
}

/* Volumes are reachable from this node only: one segment names it. */
Csi__V1__Topology *csi_topo_init(struct csi_topo *t,
				 const struct csi_plugin *p)
{
	csi__v1__topology__init(&t->topo);
	csi__v1__topology__segments_entry__init(&t->seg);
	t->seg.key = p->topology_key;
	t->seg.value = p->cfg.node_id;
	t->segs[0] = &t->seg;
	t->topo.n_segments = 1;
	t->topo.segments = t->segs;
	return &t->topo;
}

bool csi_topo_matches(const Csi__V1__Topology *t, const struct csi_plugin *p)
{
	const char *v = CSI_MAP_GET(t, segments, p->topology_key);

	/* a segment this plugin does not know cannot be satisfied */
	return v && !strcmp(v, p->cfg.node_id) && t->n_segments == 1;
}

void csi_reply_volume(struct csi_reply *r, const char *volume_id)
{
	snprintf(r->volume_id, sizeof(r->volume_id), "%s", volume_id);
}

/*
 * Controller and node capabilities share one shape in the generated code
 * (a oneof holding an RPC message with a type enum), so one builder makes
 * either list from its two descriptors.
 */
struct csi_cap_shape {
	ProtobufCMessage base;
	int type_case;
	ProtobufCMessage *rpc;
};

struct csi_rpc_shape {
	ProtobufCMessage base;
	int type;
};

static void **csi_caps_build(struct csi_reply *r,
			     const ProtobufCMessageDescriptor *cap_desc,
			     const ProtobufCMessageDescriptor *rpc_desc,
			     const int *types, size_t n)
{
	void **caps = csi_alloc(r, n * sizeof(void *));

	for (size_t i = 0; caps && i < n; i++) {
		struct csi_cap_shape *c = csi_alloc(r, cap_desc->sizeof_message);
		struct csi_rpc_shape *rpc = csi_alloc(r, rpc_desc->sizeof_message);

		if (!c || !rpc)
			return NULL;
		protobuf_c_message_init(cap_desc, c);
		protobuf_c_message_init(rpc_desc, rpc);
		rpc->type = types[i];
		c->type_case = 1; /* the rpc member: field 1 of the oneof */
		c->rpc = &rpc->base;
		caps[i] = c;
	}
	return caps;
}

/* Answers a Get*Capabilities call: its response is the list alone. */
void csi_reply_caps(struct csi_reply *r,
		    const ProtobufCMessageDescriptor *resp_desc,
		    const ProtobufCMessageDescriptor *cap_desc,
		    const ProtobufCMessageDescriptor *rpc_desc,
		    const int *types, size_t n)
{
	struct {
		ProtobufCMessage base;
		size_t n_capabilities;
		void **capabilities;
	} *out = csi_alloc(r, resp_desc->sizeof_message);

	if (out) {
		protobuf_c_message_init(resp_desc, out);
		out->capabilities = csi_caps_build(r, cap_desc, rpc_desc, types, n);
		out->n_capabilities = n;
	}
	if (!out || !out->capabilities)
		csi_reply_errno(r, -ENOMEM, resp_desc->short_name);
	else
		csi_reply_ok(r, out);
}

/* A volume record that would not load (csi_volume_load's ERR), answered. */
void csi_reply_load(struct csi_reply *r, const char *id, int err)
{
	csi_reply_set(r, err == -ENOENT ? CSI_NOT_FOUND : CSI_INTERNAL,
		      "volume %.64s: %s", id,
		      err == -ENOENT ? "no such volume" : strerror(-err));
}

/*
 * A request's volume_id: required (INVALID_ARGUMENT), and one the store
 * could hold (NOT_FOUND otherwise: never a path). 0 when it may be used.
 */
int csi_reply_id_check(struct csi_reply *r, const char *id)
{
	if (!id[0]) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT, "volume_id is required");
		return -EINVAL;
	}
	csi_reply_volume(r, id);
	if (!csi_volume_id_valid(id)) {
		csi_reply_set(r, CSI_NOT_FOUND, "volume %.64s: no such volume",
			      id);
		return -ENOENT;
	}
	return 0;
}
