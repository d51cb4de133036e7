// SPDX-License-Identifier: Apache-2.0
/*
 * The Admin service's view of volumes (ListVolumeStates, InspectVolume):
 * for each volume of the store, what this node does with it. Everything
 * comes from the records the other services keep (volumes/<id>/
 * volume.json, node/<id>.json) and from /proc, read without taking the
 * volume busy: a look must never make a kubelet call fail with ABORTED,
 * and each record is replaced atomically, so it is read whole or not at
 * all. A volume deleted between the listing and the read is left out.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

/* how long a look waits for a daemon's answer */
#define CSI_INSPECT_CONTROL_MS 1000

/* Seconds since the process with /proc start time `starttime` began. */
static int64_t csi_inspect_uptime(unsigned long long starttime)
{
	long hz = sysconf(_SC_CLK_TCK);
	struct timespec now;
	int64_t up;

	if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) < 0)
		return 0;
	up = (int64_t)now.tv_sec - (int64_t)(starttime / (unsigned long long)hz);
	return up > 0 ? up : 0;
}

/* Undoes the daemon's escapes of a path field (fuse/progress.c), in place. */
static void csi_inspect_unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		unsigned v;

		if (s[0] == '%' && sscanf(s + 1, "%2x", &v) == 1 && s[1] && s[2]) {
			*w++ = (char)v;
			s += 2;
		} else {
			*w++ = *s;
		}
	}
	*w = '\0';
}

/*
 * The copy-ups the daemon is making, as its control verb `progress`
 * lists them. A daemon that does not answer at once shows none: a look
 * never waits on a busy daemon.
 */
static int csi_inspect_copy_ups(struct csi_plugin *p, const char *id,
				Strata__V1__VolumeState *s, struct csi_reply *r)
{
	static const char *const verb[] = { "progress" };
	char out[8192], *save = NULL;
	int n;

	if (csi_control_call(&p->store, id, verb, 1, out, sizeof(out),
			     CSI_INSPECT_CONTROL_MS) != 0 ||
	    sscanf(out, "copyups=%d", &n) != 1 || n <= 0 || n > 64)
		return 0;
	s->copy_ups = csi_alloc(r, n * sizeof(*s->copy_ups));
	if (!s->copy_ups)
		return -ENOMEM;
	for (char *f = strtok_r(out, " ", &save); f && (int)s->n_copy_ups < n;
	     f = strtok_r(NULL, " ", &save)) {
		Strata__V1__CopyUp *c;
		char *total, *done;
		long long d, t;

		if (strncmp(f, "copyup=", 7) || !(total = strrchr(f, ':')))
			continue;
		*total++ = '\0';
		if (!(done = strrchr(f, ':')))
			continue;
		*done++ = '\0';
		if (sscanf(done, "%lld", &d) != 1 || sscanf(total, "%lld", &t) != 1)
			continue;
		c = csi_alloc(r, sizeof(*c));
		if (!c)
			return -ENOMEM;
		strata__v1__copy_up__init(c);
		csi_inspect_unescape(f + 7);
		c->path = csi_strdup(r, f + 7);
		if (!c->path)
			return -ENOMEM;
		c->done_bytes = d;
		c->total_bytes = t;
		s->copy_ups[s->n_copy_ups++] = c;
	}
	return 0;
}

/*
 * How the daemon serves, as its control verb `status` says; left empty
 * when it does not answer at once, or answers what this plugin does not
 * know.
 */
static void csi_inspect_status(struct csi_plugin *p, const char *id,
			       Strata__V1__VolumeState *s)
{
	static const char *const verb[] = { "status" };
	char out[256], transport[8], pass[4];

	if (csi_control_call(&p->store, id, verb, 1, out, sizeof(out),
			     CSI_INSPECT_CONTROL_MS) != 0 ||
	    sscanf(out, "transport=%7s passthrough=%3s", transport, pass) != 2)
		return;
	if (strcmp(transport, "uring") && strcmp(transport, "dev"))
		return;
	if (strcmp(pass, "on") && strcmp(pass, "off"))
		return;
	s->transport = !strcmp(transport, "uring") ? "uring" : "dev";
	s->passthrough = !strcmp(pass, "on") ? "on" : "off";
}

/* The node's part: state, staging path, targets, daemon. */
static int csi_inspect_node(struct csi_plugin *p, const struct csi_volume *v,
			    const struct csi_node_vol *n,
			    Strata__V1__VolumeState *s, struct csi_reply *r)
{
	s->state = n->ntargets ? "published" : "staged";
	s->staging_path = csi_strdup(r, n->staging);
	s->targets = csi_alloc(r, (n->ntargets + 1) * sizeof(*s->targets));
	if (!s->staging_path || !s->targets)
		return -ENOMEM;
	for (int i = 0; i < n->ntargets; i++) {
		Strata__V1__VolumeTarget *t = csi_alloc(r, sizeof(*t));

		if (!t)
			return -ENOMEM;
		strata__v1__volume_target__init(t);
		t->path = csi_strdup(r, n->targets[i].path);
		if (!t->path)
			return -ENOMEM;
		t->readonly = n->targets[i].readonly;
		s->targets[s->n_targets++] = t;
	}
	s->restarts = (int32_t)n->restarts;
	if (csi_daemon_alive(n)) {
		s->daemon_pid = n->pid;
		s->uptime_seconds = csi_inspect_uptime(n->starttime);
		csi_inspect_status(p, v->id, s);
		if (csi_inspect_copy_ups(p, v->id, s, r))
			return -ENOMEM;
	}
	return 0;
}

/* Staged here or not (n NULL), what is wrong with the volume, if anything. */
static int csi_inspect_condition(struct csi_plugin *p,
				 const struct csi_volume *v,
				 const struct csi_node_vol *n,
				 const struct csi_usage *u,
				 Strata__V1__VolumeState *s, struct csi_reply *r)
{
	char msg[512];

	csi_condition_volume(p, v, n, u, msg, sizeof(msg));
	if (!msg[0])
		return 0;
	s->abnormal = true;
	s->condition = csi_strdup(r, msg);
	return s->condition ? 0 : -ENOMEM;
}

/*
 * The state of volume `id` into a new message, *out. -ENOENT when the
 * store has no such volume (or it went meanwhile); another error says
 * what in `why`.
 */
static int csi_inspect_one(struct csi_plugin *p, const char *id,
			   Strata__V1__VolumeState **out, struct csi_reply *r,
			   char *why, size_t size)
{
	Strata__V1__VolumeState *s = csi_alloc(r, sizeof(*s));
	struct csi_volume v = { 0 };
	struct csi_node_vol n = { 0 };
	struct csi_usage use;
	bool known;
	int ret;

	if (!s)
		return -ENOMEM;
	strata__v1__volume_state__init(s);
	ret = csi_volume_load(&p->store, id, &v);
	if (ret) {
		snprintf(why, size, "volume %s: its record: %s", id,
			 strerror(-ret));
		return ret;
	}
	s->volume_id = csi_strdup(r, v.id);
	s->name = csi_strdup(r, v.name ? v.name : "");
	s->created = csi_strdup(r, v.created ? v.created : "");
	s->layers = csi_alloc(r, (v.nlayers + 1) * sizeof(*s->layers));
	if (!s->volume_id || !s->name || !s->created || !s->layers) {
		ret = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < v.nlayers; i++) {
		s->layers[i] = csi_strdup(r, v.layers[i]);
		if (!s->layers[i]) {
			ret = -ENOMEM;
			goto out;
		}
	}
	s->n_layers = v.nlayers;
	s->capacity_bytes = v.capacity;
	known = csi_usage_get(&p->store, id, &use) == 0;
	if (known)
		s->used_bytes = use.bytes;
	s->state = "created";
	ret = csi_state_load(&p->store, id, &n);
	if (ret == 0) {
		ret = csi_inspect_node(p, &v, &n, s, r);
		if (ret == 0)
			ret = csi_inspect_condition(p, &v, &n,
						    known ? &use : NULL, s, r);
	} else if (ret == -ENOENT) {
		ret = csi_inspect_condition(p, &v, NULL,
					    known ? &use : NULL, s, r);
	} else {
		snprintf(why, size,
			 "the node record %s/node/%s.json cannot be read (%s)",
			 p->store.root, id, strerror(-ret));
	}
	csi_state_free(&n);
	if (ret == 0)
		*out = s;
out:
	csi_volume_free(&v);
	return ret;
}

void csi_admin_list_volume_states(struct csi_plugin *p,
				  const ProtobufCMessage *msg,
				  struct csi_reply *r)
{
	Strata__V1__ListVolumeStatesResponse *out = csi_alloc(r, sizeof(*out));
	char **ids = NULL, why[512];
	int n = 0, ret;

	(void)msg;
	ret = csi_volume_list(&p->store, &ids, &n);
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL, "listing %s/volumes: %s",
			      p->store.root, strerror(-ret));
		return;
	}
	if (!out)
		goto out_nomem;
	strata__v1__list_volume_states_response__init(out);
	out->volumes = csi_alloc(r, (n + 1) * sizeof(*out->volumes));
	if (!out->volumes)
		goto out_nomem;
	csi_page_first(ids, n, "");
	for (int i = 0; i < n; i++) {
		Strata__V1__VolumeState *s;

		ret = csi_inspect_one(p, ids[i], &s, r, why, sizeof(why));
		if (ret == -ENOENT)
			continue;	/* deleted since the listing */
		if (ret == -ENOMEM)
			goto out_nomem;
		if (ret) {
			csi_reply_set(r, CSI_INTERNAL, "%s", why);
			goto out;
		}
		out->volumes[out->n_volumes++] = s;
	}
	csi_reply_ok(r, out);
	goto out;
out_nomem:
	csi_reply_errno(r, -ENOMEM, "ListVolumeStates");
out:
	csi_free_strv(ids, n);
}

void csi_admin_inspect_volume(struct csi_plugin *p,
			      const ProtobufCMessage *msg,
			      struct csi_reply *r)
{
	const Strata__V1__InspectVolumeRequest *req = (const void *)msg;
	Strata__V1__InspectVolumeResponse *out = csi_alloc(r, sizeof(*out));
	Strata__V1__VolumeState *s;
	char why[512];
	int ret;

	if (csi_reply_id_check(r, req->volume_id))
		return;
	if (!out) {
		csi_reply_errno(r, -ENOMEM, "InspectVolume");
		return;
	}
	ret = csi_inspect_one(p, req->volume_id, &s, r, why, sizeof(why));
	if (ret == -ENOENT) {
		csi_reply_set(r, CSI_NOT_FOUND, "volume %s: no such volume",
			      req->volume_id);
		return;
	}
	if (ret == -ENOMEM) {
		csi_reply_errno(r, -ENOMEM, "InspectVolume");
		return;
	}
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL, "%s", why);
		return;
	}
	strata__v1__inspect_volume_response__init(out);
	out->volume = s;
	csi_reply_ok(r, out);
}
