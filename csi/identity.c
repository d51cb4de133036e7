// SPDX-License-Identifier: Apache-2.0
/* The Identity service: who the plugin is, what it offers, whether it is ready. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"

static void csi_get_plugin_info(struct csi_plugin *p, const ProtobufCMessage *req,
				struct csi_reply *r)
{
	Csi__V1__GetPluginInfoResponse *out = csi_alloc(r, sizeof(*out));

	if (!out) {
		csi_reply_errno(r, -ENOMEM, "GetPluginInfo");
		return;
	}
	csi__v1__get_plugin_info_response__init(out);
	out->name = p->cfg.driver_name;
	out->vendor_version = STRATA_VERSION;
	csi_reply_ok(r, out);
}

static void csi_get_plugin_caps(struct csi_plugin *p, const ProtobufCMessage *req,
				struct csi_reply *r)
{
	Csi__V1__GetPluginCapabilitiesResponse *out = csi_alloc(r, sizeof(*out));
	Csi__V1__PluginCapability *exp = csi_alloc(r, sizeof(*exp));
	Csi__V1__PluginCapability__VolumeExpansion *ve =
		csi_alloc(r, sizeof(*ve));
	int types[2], n = 0;

	if (p->cfg.modes & CSI_MODE_CONTROLLER)
		types[n++] = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__CONTROLLER_SERVICE;
	/* volumes live on one node: the CO must schedule their pods there */
	types[n++] = CSI__V1__PLUGIN_CAPABILITY__SERVICE__TYPE__VOLUME_ACCESSIBILITY_CONSTRAINTS;
	if (!out || !exp || !ve)
		goto out_nomem;
	csi__v1__get_plugin_capabilities_response__init(out);
	out->capabilities = csi_alloc(r, (n + 1) * sizeof(*out->capabilities));
	if (!out->capabilities)
		goto out_nomem;
	/* a capacity grows while the volume is in use: the daemon is told */
	csi__v1__plugin_capability__init(exp);
	csi__v1__plugin_capability__volume_expansion__init(ve);
	ve->type = CSI__V1__PLUGIN_CAPABILITY__VOLUME_EXPANSION__TYPE__ONLINE;
	exp->type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_VOLUME_EXPANSION;
	exp->volume_expansion = ve;
	for (int i = 0; i < n; i++) {
		Csi__V1__PluginCapability *c = csi_alloc(r, sizeof(*c));
		Csi__V1__PluginCapability__Service *s = csi_alloc(r, sizeof(*s));

		if (!c || !s)
			goto out_nomem;
		csi__v1__plugin_capability__init(c);
		csi__v1__plugin_capability__service__init(s);
		s->type = types[i];
		c->type_case = CSI__V1__PLUGIN_CAPABILITY__TYPE_SERVICE;
		c->service = s;
		out->capabilities[out->n_capabilities++] = c;
	}
	out->capabilities[out->n_capabilities++] = exp;
	csi_reply_ok(r, out);
	return;
out_nomem:
	csi_reply_errno(r, -ENOMEM, "GetPluginCapabilities");
}

/*
 * Ready once the start-up checks and the reconciliation of staged volumes
 * are done. The store and the daemon binary are checked again on every
 * probe: either can go away under a running plugin.
 */
static void csi_probe(struct csi_plugin *p, const ProtobufCMessage *req,
		      struct csi_reply *r)
{
	Csi__V1__ProbeResponse *out = csi_alloc(r, sizeof(*out));
	Google__Protobuf__BoolValue *ready = csi_alloc(r, sizeof(*ready));
	char why[256];

	if (csi_store_check(&p->store, why, sizeof(why))) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION, "%s", why);
		return;
	}
	if (access(p->host.exec, X_OK) < 0) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "the stratafs daemon %s is unusable: %s",
			      p->host.exec, strerror(errno));
		return;
	}
	if (!out || !ready) {
		csi_reply_errno(r, -ENOMEM, "Probe");
		return;
	}
	csi__v1__probe_response__init(out);
	google__protobuf__bool_value__init(ready);
	ready->value = __atomic_load_n(&p->ready, __ATOMIC_ACQUIRE) > 0;
	out->ready = ready;
	csi_reply_ok(r, out);
}

const struct csi_method csi_identity_methods[] = {
	{ "/csi.v1.Identity/GetPluginInfo",
	  &csi__v1__get_plugin_info_request__descriptor, csi_get_plugin_info },
	{ "/csi.v1.Identity/GetPluginCapabilities",
	  &csi__v1__get_plugin_capabilities_request__descriptor,
	  csi_get_plugin_caps },
	{ "/csi.v1.Identity/Probe", &csi__v1__probe_request__descriptor,
	  csi_probe },
	{ NULL },
};

const struct csi_method *const csi_services[] = {
	csi_identity_methods, csi_controller_methods, csi_node_methods,
	csi_admin_methods,
	/* last: the fuzz seeds pick methods by their place in this list */
	csi_snapshot_methods, NULL,
};
