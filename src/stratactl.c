// SPDX-License-Identifier: Apache-2.0
/*
 * stratactl: the command line client of a CSI plugin's socket.
 *
 *   stratactl [--endpoint EP] [--json] [--timeout SECONDS] COMMAND [ARGS]
 *
 * One subcommand per RPC the plugin serves, looked up in ctl_cmds[]. Every
 * command parses its arguments into one struct ctl_args (the options are
 * shared: --access-mode means the same thing wherever it is taken), builds
 * its request, makes one call (list-volumes --all and probe --wait make
 * several, delete-volume asks first whether the volume exists) and prints
 * the reply: readable lines by default, one JSON object with --json.
 * "volume list" and "volume inspect" are commands of two words.
 *
 * A command is mostly its table entry: the RPC's path and descriptors, and
 * the request field its argument fills. ctl_run() makes the request from
 * the descriptor and ctl_fill() sets the fields that every request names
 * alike (volume_id, the paths, the capability, the maps) from the options;
 * a command is only offered the options its request has fields for. What
 * one request alone has (CreateVolume's capacity range) is its `build`.
 *
 * The JSON is not written per command either: ctl_json.c walks the
 * protobuf-c descriptors, so field names are the proto's, enums are named,
 * maps become objects, and a field called "secrets" is never printed. The
 * readable output is per command, because a person wants a line, not a tree.
 *
 * Exit codes: 0 done, 1 an error status (the plugin's, or gRPC's own when
 * nobody answers: UNAVAILABLE, DEADLINE_EXCEEDED) or a negative answer
 * (probe: not ready; validate: not confirmed), 2 a usage error.
 *
 * Requests carry `secrets` only when given --secret; requests are never
 * printed, and neither are the secrets of a reply.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>

#include "csi.h"
#include "ctl.h"

#define CTL_DEFAULT_TIMEOUT_MS 30000
/* a day: longer is a typo, and the milliseconds must fit an int */
#define CTL_MAX_TIMEOUT_S 86400.0
/* probe --wait: how long without a TIMEOUT, and how often it asks */
#define CTL_PROBE_WAIT_S 60
#define CTL_PROBE_INTERVAL_MS 250
/* list-volumes --all: a plugin whose tokens never end is broken */
#define CTL_MAX_PAGES 100000

static const struct option ctl_options[] = {
	{ "help", no_argument, NULL, CTL_OPT_HELP },
	{ "endpoint", required_argument, NULL, CTL_OPT_ENDPOINT },
	{ "json", no_argument, NULL, CTL_OPT_JSON },
	{ "timeout", required_argument, NULL, CTL_OPT_TIMEOUT },
	{ "version", no_argument, NULL, CTL_OPT_VERSION },
	{ "layers", required_argument, NULL, CTL_OPT_LAYERS },
	{ "capacity", required_argument, NULL, CTL_OPT_CAPACITY },
	{ "limit", required_argument, NULL, CTL_OPT_LIMIT },
	{ "param", required_argument, NULL, CTL_OPT_PARAM },
	{ "access-mode", required_argument, NULL, CTL_OPT_ACCESS_MODE },
	{ "block", no_argument, NULL, CTL_OPT_BLOCK },
	{ "secret", required_argument, NULL, CTL_OPT_SECRET },
	{ "max-entries", required_argument, NULL, CTL_OPT_MAX_ENTRIES },
	{ "starting-token", required_argument, NULL, CTL_OPT_STARTING_TOKEN },
	{ "all", no_argument, NULL, CTL_OPT_ALL },
	{ "staging-path", required_argument, NULL, CTL_OPT_STAGING_PATH },
	{ "target", required_argument, NULL, CTL_OPT_TARGET },
	{ "path", required_argument, NULL, CTL_OPT_PATH },
	{ "readonly", no_argument, NULL, CTL_OPT_READONLY },
	{ "mount-flag", required_argument, NULL, CTL_OPT_MOUNT_FLAG },
	{ "mount-group", required_argument, NULL, CTL_OPT_MOUNT_GROUP },
	{ "fs-type", required_argument, NULL, CTL_OPT_FS_TYPE },
	{ "context", required_argument, NULL, CTL_OPT_CONTEXT },
	{ "wait", optional_argument, NULL, CTL_OPT_WAIT },
	{ "from-snapshot", required_argument, NULL, CTL_OPT_FROM_SNAPSHOT },
	{ "from-volume", required_argument, NULL, CTL_OPT_FROM_VOLUME },
	{ NULL, 0, NULL, 0 },
};
#define CTL_NOPTIONS (sizeof(ctl_options) / sizeof(*ctl_options))

/* Taken by every command, after its name too: `stratactl info --json`. */
static const int ctl_common_opts[] = {
	CTL_OPT_HELP, CTL_OPT_ENDPOINT, CTL_OPT_JSON, CTL_OPT_TIMEOUT,
	CTL_OPT_END,
};

/*
 * The options that keep only what they are given, and where: a string
 * pointed at as it is, or a flag raised. The others parse their value in
 * ctl_set_opt().
 */
static const struct ctl_slot {
	int id;
	size_t offset;		/* into struct ctl_args */
	bool flag;		/* a bool; else a const char * */
} ctl_slots[] = {
	{ CTL_OPT_LAYERS, offsetof(struct ctl_args, layers), false },
	{ CTL_OPT_BLOCK, offsetof(struct ctl_args, block), true },
	{ CTL_OPT_STARTING_TOKEN, offsetof(struct ctl_args, starting_token), false },
	{ CTL_OPT_ALL, offsetof(struct ctl_args, all), true },
	{ CTL_OPT_STAGING_PATH, offsetof(struct ctl_args, staging), false },
	{ CTL_OPT_TARGET, offsetof(struct ctl_args, target), false },
	{ CTL_OPT_PATH, offsetof(struct ctl_args, path), false },
	{ CTL_OPT_READONLY, offsetof(struct ctl_args, readonly), true },
	{ CTL_OPT_MOUNT_GROUP, offsetof(struct ctl_args, mount_group), false },
	{ CTL_OPT_FS_TYPE, offsetof(struct ctl_args, fs_type), false },
	{ CTL_OPT_FROM_SNAPSHOT, offsetof(struct ctl_args, from_snapshot), false },
	{ CTL_OPT_FROM_VOLUME, offsetof(struct ctl_args, from_volume), false },
};

/* ---- small helpers ---------------------------------------------------- */

void ctl_oom(void)
{
	fprintf(stderr, CTL_PROG ": out of memory\n");
	exit(CTL_EXIT_FAIL);
}

/* Zeroed memory freed by ctl_pool_free(): a request is built, sent, gone. */
void *ctl_alloc(struct ctl *ctl, size_t size)
{
	void *p;

	if (ctl->npool == ctl->pool_size) {
		size_t n = ctl->pool_size ? 2 * ctl->pool_size : 32;
		void **np = realloc(ctl->pool, n * sizeof(*np));

		if (!np)
			ctl_oom();
		ctl->pool = np;
		ctl->pool_size = n;
	}
	p = calloc(1, size ? size : 1);
	if (!p)
		ctl_oom();
	ctl->pool[ctl->npool++] = p;
	return p;
}

static char *ctl_strdup(struct ctl *ctl, const char *s)
{
	size_t len = strlen(s) + 1;

	return memcpy(ctl_alloc(ctl, len), s, len);
}

static void ctl_pool_free(struct ctl *ctl)
{
	for (size_t i = 0; i < ctl->npool; i++)
		free(ctl->pool[i]);
	free(ctl->pool);
	ctl->pool = NULL;
	ctl->npool = ctl->pool_size = 0;
}

int ctl_usage_error(struct ctl *ctl, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, CTL_PROG ": ");
	if (ctl->cmd)
		fprintf(stderr, "%s: ", ctl->cmd->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (ctl->cmd)
		fprintf(stderr, "\nTry '" CTL_PROG " %s --help'.\n",
			ctl->cmd->name);
	else
		fprintf(stderr, "\nTry '" CTL_PROG " --help'.\n");
	return CTL_EXIT_USAGE;
}

/*
 * Sizes as Kubernetes writes quantities: plain bytes, K/M/G/T for powers
 * of 1000, Ki/Mi/Gi/Ti for powers of 1024; a trailing B is allowed
 * ("1GiB", "512MB"). The result must fit the proto's int64. A lower-case
 * b ("1Gb") is -EDOM: it reads as bits, and whoever wrote it may have
 * meant Kubernetes' 1Gi as well as 1G, which differ by 7%.
 */
static int ctl_parse_size(const char *s, int64_t *out)
{
	static const char units[] = "KMGT";
	unsigned long long v, mult = 1;
	const char *u;
	char *end;

	if (!isdigit((unsigned char)s[0]))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -ERANGE;
	if (*end == 'b')
		return -EDOM;
	if (*end && *end != 'B') {
		u = strchr(units, toupper((unsigned char)*end));
		if (!u || !*u)
			return -EINVAL;
		end++;
		if (*end == 'i') {
			mult = 1ULL << (10 * (u - units + 1));
			end++;
		} else {
			for (int i = 0; i <= u - units; i++)
				mult *= 1000;
		}
	}
	if (*end == 'b')
		return -EDOM;
	if (*end == 'B')
		end++;
	if (*end)
		return -EINVAL;
	if (v > (unsigned long long)INT64_MAX / mult)
		return -ERANGE;
	*out = (int64_t)(v * mult);
	return 0;
}

/* "single-node-writer" or "SINGLE_NODE_WRITER"; never UNKNOWN. */
static int ctl_parse_access_mode(const char *s)
{
	const ProtobufCEnumValue *ev;
	char name[64];
	size_t i;

	for (i = 0; s[i] && i < sizeof(name) - 1; i++)
		name[i] = s[i] == '-' ? '_' : toupper((unsigned char)s[i]);
	if (s[i])
		return -EINVAL;
	name[i] = '\0';
	ev = protobuf_c_enum_descriptor_get_value_by_name(
		&csi__v1__volume_capability__access_mode__mode__descriptor,
		name);
	if (!ev || ev->value == 0)
		return -EINVAL;
	return ev->value;
}

static void ctl_kvs_put(struct ctl *ctl, struct ctl_kvs *kvs, const char *key,
			const char *value)
{
	struct ctl_kv *nv = ctl_alloc(ctl, (kvs->n + 1) * sizeof(*nv));

	if (kvs->n)
		memcpy(nv, kvs->v, kvs->n * sizeof(*nv));
	nv[kvs->n].key = key;
	nv[kvs->n].value = value;
	kvs->v = nv;
	kvs->n++;
}

/* "KEY=VALUE", split at the first '=': values may hold more of them. */
static int ctl_kvs_add(struct ctl *ctl, struct ctl_kvs *kvs, const char *arg,
		       const char *opt)
{
	char *copy, *eq;

	eq = strchr(arg, '=');
	if (!eq || eq == arg)
		return ctl_usage_error(ctl, "--%s takes KEY=VALUE, not '%s'",
				       opt, arg);
	copy = ctl_strdup(ctl, arg);
	copy[eq - arg] = '\0';
	ctl_kvs_put(ctl, kvs, copy, copy + (eq - arg) + 1);
	return 0;
}

static bool ctl_kvs_has(const struct ctl_kvs *kvs, const char *key)
{
	for (int i = 0; i < kvs->n; i++)
		if (strcmp(kvs->v[i].key, key) == 0)
			return true;
	return false;
}

static void ctl_strv_add(struct ctl *ctl, struct ctl_strv *sv, const char *s)
{
	const char **nv = ctl_alloc(ctl, (sv->n + 1) * sizeof(*nv));

	if (sv->n)
		memcpy(nv, sv->v, sv->n * sizeof(*nv));
	nv[sv->n++] = s;
	sv->v = nv;
}

const char *ctl_enum_name(const ProtobufCEnumDescriptor *d, int value)
{
	const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, value);

	return ev ? ev->name : "UNKNOWN";
}

static const struct ctl_slot *ctl_slot(int id)
{
	for (size_t i = 0; i < sizeof(ctl_slots) / sizeof(*ctl_slots); i++)
		if (ctl_slots[i].id == id)
			return &ctl_slots[i];
	return NULL;
}

/* The value a string option left in ctl->a; NULL or "" when not given. */
const char *ctl_opt_value(const struct ctl_args *a, int id)
{
	const struct ctl_slot *slot = ctl_slot(id);

	if (!slot || slot->flag)
		abort(); /* a table entry naming an option with no string value */
	return CTL_AT(a, slot->offset, const char *const);
}

/* ---- commands --------------------------------------------------------- */

/*
 * One call, its reply printed: as JSON, or by the command's text printer
 * as readable lines. The request is made from the descriptor, filled from
 * the options by ctl_fill() after the command's own `build`.
 */
static int ctl_run(struct ctl *ctl)
{
	const struct ctl_cmd *cmd = ctl->cmd;
	ProtobufCMessage *req, *out;
	int ret;

	req = ctl_alloc(ctl, cmd->request->sizeof_message);
	protobuf_c_message_init(cmd->request, req);
	if (cmd->build) {
		ret = cmd->build(ctl, req);
		if (ret)
			return ret;
	}
	ctl_fill(ctl, req);

	ret = ctl_call(ctl, cmd->method, req, cmd->reply, &out);
	if (ret)
		return ret;
	if (ctl->json)
		ctl_print_reply_json(out);
	else
		cmd->text(ctl, out);
	ret = cmd->verdict ? cmd->verdict(out) : CTL_EXIT_OK;
	protobuf_c_message_free_unpacked(out, NULL);
	return ret;
}

/* CreateVolume's own: the capacity range, and --layers as a parameter. */
static int ctl_build_create_volume(struct ctl *ctl, ProtobufCMessage *req)
{
	Csi__V1__CreateVolumeRequest *r = (Csi__V1__CreateVolumeRequest *)req;
	struct ctl_args *a = &ctl->a;

	if (a->capacity >= 0 || a->limit >= 0) {
		Csi__V1__CapacityRange *range = ctl_alloc(ctl, sizeof(*range));

		csi__v1__capacity_range__init(range);
		range->required_bytes = a->capacity > 0 ? a->capacity : 0;
		range->limit_bytes = a->limit > 0 ? a->limit : 0;
		r->capacity_range = range;
	}
	if (a->layers) {
		if (ctl_kvs_has(&a->params, "layers"))
			return ctl_usage_error(ctl, "give the layers once: --layers or --param layers=");
		ctl_kvs_put(ctl, &a->params, "layers", a->layers);
	}
	return ctl_build_content_source(ctl, r);
}

/* ControllerExpandVolume's capacity range, as CreateVolume's. */
static int ctl_build_expand(struct ctl *ctl, ProtobufCMessage *req)
{
	Csi__V1__ControllerExpandVolumeRequest *r =
		(Csi__V1__ControllerExpandVolumeRequest *)req;
	Csi__V1__CapacityRange *range;

	/* a number, not a string: the table's `need` cannot say it */
	if (ctl->a.capacity < 0)
		return ctl_usage_error(ctl, "expand-volume needs --capacity SIZE");
	range = ctl_alloc(ctl, sizeof(*range));
	csi__v1__capacity_range__init(range);
	range->required_bytes = ctl->a.capacity;
	range->limit_bytes = ctl->a.limit > 0 ? ctl->a.limit : 0;
	r->capacity_range = range;
	return 0;
}

/*
 * One page, or with --all every page: the readable lines as they come,
 * the JSON as one object whose entries are all the pages' entries.
 */
static int ctl_list_volumes(struct ctl *ctl)
{
	Csi__V1__ListVolumesRequest req = CSI__V1__LIST_VOLUMES_REQUEST__INIT;
	json_object *all_entries = NULL, *merged = NULL;
	char *token = NULL;
	int ret = CTL_EXIT_OK;

	req.max_entries = ctl->a.max_entries;
	if (ctl->a.starting_token)
		req.starting_token = (char *)ctl->a.starting_token;
	if (ctl->json && ctl->a.all) {
		merged = json_object_new_object();
		all_entries = json_object_new_array();
		json_object_object_add(merged, "entries", all_entries);
	}

	for (int page = 0;; page++) {
		Csi__V1__ListVolumesResponse *r;
		ProtobufCMessage *out;

		if (page == CTL_MAX_PAGES) {
			fprintf(stderr, CTL_PROG ": the plugin's next_token never ends after %d pages\n",
				page);
			ret = CTL_EXIT_FAIL;
			break;
		}
		ret = ctl_call(ctl, ctl->cmd->method, &req.base,
			       ctl->cmd->reply, &out);
		if (ret)
			break;
		r = (Csi__V1__ListVolumesResponse *)out;
		if (merged)
			ctl_json_append(all_entries, out, "entries");
		else if (ctl->json)
			ctl_print_reply_json(out);
		else
			ctl_text_list_volumes(ctl, out);
		if (!ctl->a.all || !*r->next_token) {
			protobuf_c_message_free_unpacked(out, NULL);
			break;
		}
		/* A token that leads to itself would loop for ever. */
		if (strcmp(req.starting_token, r->next_token) == 0) {
			fprintf(stderr, CTL_PROG ": the plugin answered starting_token '%s' with the same next_token\n",
				r->next_token);
			protobuf_c_message_free_unpacked(out, NULL);
			ret = CTL_EXIT_FAIL;
			break;
		}
		free(token);
		token = strdup(r->next_token);
		protobuf_c_message_free_unpacked(out, NULL);
		if (!token)
			ctl_oom();
		req.starting_token = token;
	}
	if (merged) {
		if (ret == CTL_EXIT_OK) {
			json_object_object_add(merged, "next_token",
					       json_object_new_string(""));
			ctl_print_json(merged);
		}
		json_object_put(merged);
	}
	free(token);
	return ret;
}

/*
 * DeleteVolume answers OK for a volume that never existed, as the spec
 * wants it idempotent, so a typo would read "deleted". A person is told:
 * ValidateVolumeCapabilities is asked first, and its NOT_FOUND means
 * there was nothing to delete. The delete is sent all the same (the
 * plugin decides), and the exit code stays the RPC's. --json prints the
 * reply alone, as for every command.
 */
static int ctl_delete_volume(struct ctl *ctl)
{
	Csi__V1__ValidateVolumeCapabilitiesRequest req =
		CSI__V1__VALIDATE_VOLUME_CAPABILITIES_REQUEST__INIT;
	Csi__V1__VolumeCapability *cap;
	ProtobufCMessage *out;
	enum csi_code code;
	char *details;

	if (!ctl->json) {
		cap = ctl_capability(ctl);
		req.volume_id = ctl->a.pos[0];
		req.n_volume_capabilities = 1;
		req.volume_capabilities = &cap;
		if (ctl_call_quiet(ctl, "/csi.v1.Controller/ValidateVolumeCapabilities",
				   &req.base,
				   &csi__v1__validate_volume_capabilities_response__descriptor,
				   &out, &code, &details, ctl->timeout_ms) == 0)
			ctl->no_such_volume = code == CSI_NOT_FOUND;
		if (out)
			protobuf_c_message_free_unpacked(out, NULL);
		free(details);
	}
	return ctl_run(ctl);
}

/*
 * probe --wait[=SECONDS]: asks again every CTL_PROBE_INTERVAL_MS until
 * the plugin says ready, so that scripts and readiness checks need no
 * loop of their own. On a terminal the line shows the last answer.
 */
static int ctl_probe(struct ctl *ctl)
{
	Csi__V1__ProbeRequest req = CSI__V1__PROBE_REQUEST__INIT;
	struct ctl_progress *pg;
	struct timespec start, now;
	char last[512] = "no answer yet", line[600];

	if (ctl->a.wait_ms < 0)
		return ctl_run(ctl);
	clock_gettime(CLOCK_MONOTONIC, &start);
	snprintf(line, sizeof(line), "probe: waiting for the plugin at %s",
		 ctl->endpoint);
	pg = ctl_progress_start(line, NULL, NULL);
	for (;;) {
		ProtobufCMessage *out;
		enum csi_code code;
		char *details;
		long left;
		int err;

		clock_gettime(CLOCK_MONOTONIC, &now);
		left = ctl->a.wait_ms - ((now.tv_sec - start.tv_sec) * 1000 +
					 (now.tv_nsec - start.tv_nsec) / 1000000);
		if (left <= 0)
			break;
		err = ctl_call_quiet(ctl, ctl->cmd->method, &req.base,
				     ctl->cmd->reply, &out, &code, &details,
				     left < ctl->timeout_ms ? (int)left :
							      ctl->timeout_ms);
		if (err < 0)
			snprintf(last, sizeof(last), "%s", strerror(-err));
		else if (code != CSI_OK)
			snprintf(last, sizeof(last), "%s: %s", csi_code_name(code),
				 details && *details ? details : "(no message)");
		else if (!ctl_probe_ready(out))
			snprintf(last, sizeof(last), "not ready");
		free(details);
		if (err == 0 && code == CSI_OK && ctl_probe_ready(out)) {
			ctl_progress_stop(pg);
			if (ctl->json)
				ctl_print_reply_json(out);
			else
				ctl_text_probe(ctl, out);
			protobuf_c_message_free_unpacked(out, NULL);
			return CTL_EXIT_OK;
		}
		if (out)
			protobuf_c_message_free_unpacked(out, NULL);
		snprintf(line, sizeof(line), "probe: waiting for the plugin at %s: %s",
			 ctl->endpoint, last);
		ctl_progress_set(pg, line);
		nanosleep(&(struct timespec){ 0, CTL_PROBE_INTERVAL_MS * 1000000L },
			  NULL);
	}
	ctl_progress_stop(pg);
	fprintf(stderr, CTL_PROG ": probe: the plugin at %s was not ready within %.1f s: %s\n",
		ctl->endpoint, ctl->a.wait_ms / 1000.0, last);
	return CTL_EXIT_FAIL;
}

/* ---- the command table ------------------------------------------------ */

#define CTL_HELP_CAP                                                           \
	"  --access-mode MODE  SINGLE_NODE_WRITER (default), SINGLE_NODE_READER_ONLY,\n" \
	"                      SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER,\n" \
	"                      MULTI_NODE_READER_ONLY, MULTI_NODE_SINGLE_WRITER,\n"   \
	"                      MULTI_NODE_MULTI_WRITER (any case, - for _)\n"         \
	"  --block             a block capability instead of a mount one\n"
#define CTL_HELP_MOUNT                                                         \
	"  --mount-flag F      a mount flag (repeatable)\n"                         \
	"  --mount-group GID   volume_mount_group of the mount capability\n"         \
	"  --fs-type T         fs_type of the mount capability\n"
#define CTL_HELP_SECRET                                                        \
	"  --secret K=V        an entry of the request's secrets (repeatable;\n"    \
	"                      none are sent otherwise, none are ever printed)\n"
#define CTL_HELP_CONTEXT                                                       \
	"  --context K=V       an entry of volume_context (repeatable)\n"
#define CTL_HELP_PARAM                                                         \
	"  --param K=V         a parameter (repeatable)\n"
#define CTL_HELP_STAGING                                                       \
	"  --staging-path P    staging_target_path (required)\n"
#define CTL_HELP_TARGET                                                        \
	"  --target T          target_path (required)\n"

static const int ctl_opts_create[] = {
	CTL_OPT_LAYERS, CTL_OPT_CAPACITY, CTL_OPT_LIMIT, CTL_OPT_PARAM,
	CTL_OPT_ACCESS_MODE, CTL_OPT_BLOCK, CTL_OPT_SECRET,
	CTL_OPT_FROM_SNAPSHOT, CTL_OPT_FROM_VOLUME, CTL_OPT_END,
};
static const int ctl_opts_delete[] = { CTL_OPT_SECRET, CTL_OPT_END };
static const int ctl_opts_probe[] = { CTL_OPT_WAIT, CTL_OPT_END };
static const int ctl_opts_validate[] = {
	CTL_OPT_ACCESS_MODE, CTL_OPT_BLOCK, CTL_OPT_CONTEXT, CTL_OPT_PARAM,
	CTL_OPT_SECRET, CTL_OPT_END,
};
static const int ctl_opts_list[] = {
	CTL_OPT_MAX_ENTRIES, CTL_OPT_STARTING_TOKEN, CTL_OPT_ALL, CTL_OPT_END,
};
static const int ctl_opts_capacity[] = {
	CTL_OPT_ACCESS_MODE, CTL_OPT_BLOCK, CTL_OPT_PARAM, CTL_OPT_END,
};
static const int ctl_opts_stage[] = {
	CTL_OPT_STAGING_PATH, CTL_OPT_ACCESS_MODE, CTL_OPT_BLOCK,
	CTL_OPT_MOUNT_FLAG, CTL_OPT_MOUNT_GROUP, CTL_OPT_FS_TYPE,
	CTL_OPT_CONTEXT, CTL_OPT_SECRET, CTL_OPT_END,
};
static const int ctl_opts_unstage[] = { CTL_OPT_STAGING_PATH, CTL_OPT_END };
static const int ctl_opts_publish[] = {
	CTL_OPT_STAGING_PATH, CTL_OPT_TARGET, CTL_OPT_READONLY,
	CTL_OPT_ACCESS_MODE, CTL_OPT_BLOCK, CTL_OPT_MOUNT_FLAG,
	CTL_OPT_MOUNT_GROUP, CTL_OPT_FS_TYPE, CTL_OPT_CONTEXT, CTL_OPT_SECRET,
	CTL_OPT_END,
};
static const int ctl_opts_unpublish[] = { CTL_OPT_TARGET, CTL_OPT_END };
static const int ctl_opts_stats[] = {
	CTL_OPT_PATH, CTL_OPT_STAGING_PATH, CTL_OPT_END,
};
static const int ctl_need_staging[] = { CTL_OPT_STAGING_PATH, CTL_OPT_END };
static const int ctl_need_publish[] = {
	CTL_OPT_STAGING_PATH, CTL_OPT_TARGET, CTL_OPT_END,
};
static const int ctl_need_target[] = { CTL_OPT_TARGET, CTL_OPT_END };
static const int ctl_need_path[] = { CTL_OPT_PATH, CTL_OPT_END };
static const int ctl_opts_expand[] = {
	CTL_OPT_CAPACITY, CTL_OPT_LIMIT, CTL_OPT_SECRET, CTL_OPT_END,
};

/* A command with no options or arguments of its own. */
#define CTL_PLAIN(cmd, service, rpc, msg, printer, what)                    \
	{ .name = cmd, .synopsis = "", .summary = what,                     \
	  CTL_RPC(service, rpc, msg), .text = printer }
/* A command on one volume, the ID its argument. */
#define CTL_ID .min_pos = 1, .max_pos = 1, .arg = "volume_id"
/* A command whose reply is empty: "<verb> ID <prep> <opt's value>". */
#define CTL_DONE(verb, prep, opt)                                          \
	.text = ctl_text_done, .done = verb, .done_prep = prep, .done_opt = opt

/* NULL opts, need: none; run NULL: ctl_run. */
static const struct ctl_cmd ctl_cmds[] = {
	CTL_PLAIN("info", Identity, GetPluginInfo, get_plugin_info,
		  ctl_text_info, "the plugin's name and version (GetPluginInfo)"),
	CTL_PLAIN("plugin-caps", Identity, GetPluginCapabilities,
		  get_plugin_capabilities, ctl_text_plugin_caps,
		  "the plugin's capabilities, one per line (GetPluginCapabilities)"),
	{
		.name = "probe", .synopsis = "[--wait[=SECONDS]]",
		.summary = "whether the plugin is ready (Probe); exits 1 when not",
		.options =
			"  --wait[=SECONDS]    ask again until it is ready, for at most SECONDS\n"
			"                      (default 60); exits 1 if it never was\n",
		.opts = ctl_opts_probe,
		CTL_RPC(Identity, Probe, probe),
		.text = ctl_text_probe, .verdict = ctl_verdict_probe,
		.run = ctl_probe,
	},
	{
		.name = "create-volume",
		.synopsis = "NAME [--layers a,b] [--capacity SIZE] [--limit SIZE] [--param K=V ...] [--access-mode MODE] [--block] [--from-snapshot ID | --from-volume ID]",
		.summary = "create a volume, or find the one of that name (CreateVolume)",
		.options =
			"  --layers a,b        the layer chain, top first: parameters[\"layers\"]\n"
			"  --capacity SIZE     capacity_range.required_bytes\n"
			"  --limit SIZE        capacity_range.limit_bytes\n"
			"  --from-snapshot ID  a clone of snapshot ID (volume_content_source)\n"
			"  --from-volume ID    a clone of volume ID as it is now\n"
			CTL_HELP_PARAM CTL_HELP_CAP CTL_HELP_SECRET
			"\nSIZE is bytes, or K/M/G/T (powers of 1000) or Ki/Mi/Gi/Ti (powers\n"
			"of 1024), with an optional B: 1Gi, 512M, 1GiB.\n",
		.opts = ctl_opts_create, .min_pos = 1, .max_pos = 1,
		CTL_RPC(Controller, CreateVolume, create_volume),
		.arg = "name", .cap = CTL_CAP_ALWAYS,
		.build = ctl_build_create_volume, .text = ctl_text_create_volume,
	},
	{
		.name = "delete-volume", .synopsis = "ID",
		.summary = "delete a volume (DeleteVolume)",
		.options = CTL_HELP_SECRET, .opts = ctl_opts_delete, CTL_ID,
		CTL_RPC(Controller, DeleteVolume, delete_volume),
		.text = ctl_text_delete, .run = ctl_delete_volume,
	},
	{
		.name = "validate", .synopsis = "ID [--access-mode MODE] [--block]",
		.summary = "whether the volume takes a capability (ValidateVolumeCapabilities); exits 1 when not",
		.options = CTL_HELP_CAP CTL_HELP_CONTEXT CTL_HELP_PARAM
			CTL_HELP_SECRET,
		.opts = ctl_opts_validate, CTL_ID, .cap = CTL_CAP_ALWAYS,
		CTL_RPC(Controller, ValidateVolumeCapabilities,
			validate_volume_capabilities),
		.text = ctl_text_validate, .verdict = ctl_verdict_validate,
	},
	{
		.name = "list-volumes",
		.synopsis = "[--max-entries N] [--starting-token T] [--all]",
		.summary = "the volumes, one per line (ListVolumes)",
		.options =
			"  --max-entries N     at most N per reply (0: the plugin decides)\n"
			"  --starting-token T  continue from a previous reply's next_token\n"
			"  --all               follow next_token to the end (with --json: one\n"
			"                      object holding every entry)\n",
		.opts = ctl_opts_list,
		CTL_RPC(Controller, ListVolumes, list_volumes),
		.run = ctl_list_volumes,
	},
	{
		.name = "capacity",
		.synopsis = "[--access-mode MODE] [--block] [--param K=V ...]",
		.summary = "the capacity left for new volumes (GetCapacity)",
		.options = CTL_HELP_CAP CTL_HELP_PARAM
			"\nNo capability is sent unless --access-mode or --block is given.\n",
		.opts = ctl_opts_capacity, .cap = CTL_CAP_ASKED,
		CTL_RPC(Controller, GetCapacity, get_capacity),
		.text = ctl_text_capacity,
	},
	{
		.name = "expand-volume",
		.synopsis = "ID --capacity SIZE [--limit SIZE]",
		.summary = "grow a volume's capacity (ControllerExpandVolume)",
		.options =
			"  --capacity SIZE     capacity_range.required_bytes (required)\n"
			"  --limit SIZE        capacity_range.limit_bytes\n"
			CTL_HELP_SECRET
			"\nSIZE as for create-volume: 1Gi, 512M. A staged volume's daemon\n"
			"takes it with node-expand.\n",
		.opts = ctl_opts_expand, CTL_ID,
		CTL_RPC(Controller, ControllerExpandVolume,
			controller_expand_volume),
		.build = ctl_build_expand, .text = ctl_text_expand,
	},
	CTL_PLAIN("controller-caps", Controller, ControllerGetCapabilities,
		  controller_get_capabilities, ctl_text_rpc_caps,
		  "the controller's capabilities, one per line (ControllerGetCapabilities)"),
	{
		.name = "stage", .synopsis = "ID --staging-path P [OPTIONS]",
		.summary = "mount a volume on its staging path (NodeStageVolume)",
		.options = CTL_HELP_STAGING CTL_HELP_CAP CTL_HELP_MOUNT
			CTL_HELP_CONTEXT CTL_HELP_SECRET,
		.opts = ctl_opts_stage, .need = ctl_need_staging, CTL_ID,
		.cap = CTL_CAP_ALWAYS,
		CTL_RPC(Node, NodeStageVolume, node_stage_volume),
		CTL_DONE("staged", "at", CTL_OPT_STAGING_PATH),
		.waiting = "waiting for its daemon to serve the mount",
	},
	{
		.name = "unstage", .synopsis = "ID --staging-path P",
		.summary = "unmount a volume from its staging path (NodeUnstageVolume)",
		.options = CTL_HELP_STAGING,
		.opts = ctl_opts_unstage, .need = ctl_need_staging, CTL_ID,
		CTL_RPC(Node, NodeUnstageVolume, node_unstage_volume),
		CTL_DONE("unstaged", "from", CTL_OPT_STAGING_PATH),
		.waiting = "waiting for its daemon to stop",
	},
	{
		.name = "publish",
		.synopsis = "ID --staging-path P --target T [OPTIONS]",
		.summary = "bind a staged volume to a target path (NodePublishVolume)",
		.options = CTL_HELP_STAGING CTL_HELP_TARGET
			"  --readonly          publish read-only\n"
			CTL_HELP_CAP CTL_HELP_MOUNT CTL_HELP_CONTEXT
			CTL_HELP_SECRET,
		.opts = ctl_opts_publish, .need = ctl_need_publish, CTL_ID,
		.cap = CTL_CAP_ALWAYS,
		CTL_RPC(Node, NodePublishVolume, node_publish_volume),
		CTL_DONE("published", "at", CTL_OPT_TARGET),
		.waiting = "waiting for the plugin",
	},
	{
		.name = "unpublish", .synopsis = "ID --target T",
		.summary = "unmount a target path (NodeUnpublishVolume)",
		.options = CTL_HELP_TARGET,
		.opts = ctl_opts_unpublish, .need = ctl_need_target, CTL_ID,
		CTL_RPC(Node, NodeUnpublishVolume, node_unpublish_volume),
		CTL_DONE("unpublished", "from", CTL_OPT_TARGET),
	},
	{
		.name = "stats", .synopsis = "ID --path P [--staging-path P]",
		.summary = "bytes and inodes used and free (NodeGetVolumeStats)",
		.options = "  --path P            volume_path (required)\n"
			"  --staging-path P    staging_target_path\n",
		.opts = ctl_opts_stats, .need = ctl_need_path, CTL_ID,
		CTL_RPC(Node, NodeGetVolumeStats, node_get_volume_stats),
		.text = ctl_text_stats,
	},
	{
		.name = "node-expand", .synopsis = "ID --path P",
		.summary = "tell a staged volume's daemon its recorded capacity (NodeExpandVolume)",
		.options = "  --path P            volume_path: where it is staged or published (required)\n"
			"  --staging-path P    staging_target_path\n",
		.opts = ctl_opts_stats, .need = ctl_need_path, CTL_ID,
		CTL_RPC(Node, NodeExpandVolume, node_expand_volume),
		.text = ctl_text_node_expand,
	},
	CTL_PLAIN("node-info", Node, NodeGetInfo, node_get_info,
		  ctl_text_node_info,
		  "the node's id, volume limit and topology (NodeGetInfo)"),
	CTL_PLAIN("node-caps", Node, NodeGetCapabilities, node_get_capabilities,
		  ctl_text_rpc_caps,
		  "the node's capabilities, one per line (NodeGetCapabilities)"),
	{
		.name = "replace-worker", .synopsis = "ID",
		.summary = "restart a staged volume's stratafs worker from the binary on disk, with no unmount (strata.v1.Admin/ReplaceWorker)",
		CTL_ID, CTL_ADMIN_RPC(ReplaceWorker, replace_worker),
		.text = ctl_text_replace_worker,
		.waiting = "waiting for the new worker",
	},
	{
		.name = "volume list", .synopsis = "",
		.summary = "every volume: state, daemon, uptime, restarts, usage, layers, condition (strata.v1.Admin/ListVolumeStates)",
		CTL_ADMIN_RPC(ListVolumeStates, list_volume_states),
		.text = ctl_text_volume_list,
	},
	{
		.name = "volume inspect", .synopsis = "ID",
		.summary = "one volume: the above, its staging path and targets (strata.v1.Admin/InspectVolume)",
		CTL_ID, CTL_ADMIN_RPC(InspectVolume, inspect_volume),
		.text = ctl_text_volume_inspect,
	},
	{
		.name = "layer import", .synopsis = "NAME FILE",
		.summary = "make layer NAME from a tar, tar.gz, tar.zst (or .xz, .bz2) or OCI image layer that the plugin reads at FILE; OCI whiteouts become overlayfs ones (strata.v1.Admin/ImportLayer)",
		.min_pos = 2, .max_pos = 2,
		CTL_ADMIN_RPC(ImportLayer, import_layer),
		.build = ctl_build_import_layer, .text = ctl_text_import_layer,
		.waiting = "extracting in the plugin",
		.progress = ctl_progress_import,
	},
	{
		.name = "layer list", .synopsis = "",
		.summary = "every layer: its size, entries and the volumes that use it (strata.v1.Admin/ListLayers)",
		CTL_ADMIN_RPC(ListLayers, list_layers),
		.text = ctl_text_list_layers,
	},
	{
		.name = "layer rm", .synopsis = "NAME",
		.summary = "remove a layer no volume uses (strata.v1.Admin/DeleteLayer)",
		.min_pos = 1, .max_pos = 1, .arg = "name",
		CTL_ADMIN_RPC(DeleteLayer, delete_layer),
		.text = ctl_text_delete_layer,
	},
};
#define CTL_NCMDS (sizeof(ctl_cmds) / sizeof(*ctl_cmds))

/* The I-th command of this table, then of ctl_snapshot.c's; NULL past both. */
static const struct ctl_cmd *ctl_cmd_at(size_t i)
{
	if (i < CTL_NCMDS)
		return &ctl_cmds[i];
	for (const struct ctl_cmd *c = ctl_snapshot_cmds; c->name; c++)
		if (i-- == CTL_NCMDS)
			return c;
	return NULL;
}

static const struct ctl_cmd *ctl_cmd_find(const char *name)
{
	const struct ctl_cmd *c;

	for (size_t i = 0; (c = ctl_cmd_at(i)); i++)
		if (strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

static void ctl_help(FILE *f)
{
	fprintf(f,
		"usage: " CTL_PROG " [--endpoint EP] [--json] [--timeout SECONDS] COMMAND [ARGS]\n"
		"\n"
		"Calls the RPCs of a CSI plugin (strata-csi) on its unix socket.\n"
		"\n"
		"Options (also taken after COMMAND):\n"
		"  --endpoint EP       unix:///path/csi.sock, unix:/path or /path\n"
		"                      (default: $CSI_ENDPOINT)\n"
		"  --json              print the reply as one JSON object\n"
		"  --timeout SECONDS   the call's deadline (default %d)\n"
		"  --help              this text; COMMAND --help: the command's\n"
		"  --version           the version\n"
		"\n"
		"Commands:\n",
		CTL_DEFAULT_TIMEOUT_MS / 1000);
	for (size_t i = 0; ctl_cmd_at(i); i++)
		fprintf(f, "  %-16s %s\n", ctl_cmd_at(i)->name,
			ctl_cmd_at(i)->summary);
	fprintf(f,
		"\n"
		"Exit status: 0 done; 1 an error status from the plugin or gRPC\n"
		"(printed as 'stratactl: CODE: message'), or a negative answer\n"
		"(probe, validate); 2 a usage error.\n");
}

static void ctl_cmd_help(const struct ctl_cmd *cmd)
{
	printf("usage: " CTL_PROG " [--endpoint EP] [--json] [--timeout SECONDS] %s%s%s\n\n%s.\n",
	       cmd->name, *cmd->synopsis ? " " : "", cmd->synopsis,
	       cmd->summary);
	if (cmd->options)
		printf("\nOptions:\n%s", cmd->options);
	printf("\n--endpoint, --json and --timeout are taken here too; see '" CTL_PROG " --help'.\n");
}

/* The commands of two words: "volume list", "layer import NAME FILE". */
static const char *const ctl_groups[] = { "volume", "layer", "snapshot",
					  NULL };

static bool ctl_is_group(const char *name)
{
	for (const char *const *g = ctl_groups; *g; g++)
		if (!strcmp(*g, name))
			return true;
	return false;
}

static bool ctl_in_group(const struct ctl_cmd *cmd, const char *group)
{
	size_t len = strlen(group);

	return !strncmp(cmd->name, group, len) && cmd->name[len] == ' ';
}

/* "volume list, volume inspect ID": a group's commands, for messages. */
static void ctl_group_list(const char *group, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	const struct ctl_cmd *c;

	for (size_t i = 0; (c = ctl_cmd_at(i)) && len < size; i++)
		if (ctl_in_group(c, group))
			len += snprintf(buf + len, size - len, "%s%s%s%s",
					len ? ", " : "", c->name,
					*c->synopsis ? " " : "", c->synopsis);
}

/* `stratactl volume --help`: the commands that start with "volume ". */
static void ctl_group_help(const char *group)
{
	printf("usage: " CTL_PROG " [--endpoint EP] [--json] [--timeout SECONDS] %s SUBCOMMAND\n\n",
	       group);
	const struct ctl_cmd *c;

	for (size_t i = 0; (c = ctl_cmd_at(i)); i++)
		if (ctl_in_group(c, group))
			printf("  %s%s%s\n      %s.\n", c->name,
			       *c->synopsis ? " " : "", c->synopsis, c->summary);
	printf("\n--endpoint, --json and --timeout are taken here too; see '" CTL_PROG " --help'.\n");
}

static bool ctl_opt_in(const int *list, int id)
{
	for (; list && *list != CTL_OPT_END; list++)
		if (*list == id)
			return true;
	return false;
}

/* The value of an option, into ctl->a or the globals. */
static int ctl_set_opt(struct ctl *ctl, int id, const char *name,
		       const char *arg)
{
	const struct ctl_slot *slot = ctl_slot(id);
	struct ctl_args *a = &ctl->a;
	char *end;
	long v;
	int ret;

	if (slot) {
		if (slot->flag)
			CTL_AT(a, slot->offset, bool) = true;
		else
			CTL_AT(a, slot->offset, const char *) = arg;
		return 0;
	}
	switch (id) {
	case CTL_OPT_ENDPOINT:
		ctl->endpoint = arg;
		break;
	case CTL_OPT_JSON:
		ctl->json = true;
		break;
	case CTL_OPT_TIMEOUT: {
		double s;

		errno = 0;
		s = strtod(arg, &end);
		if (errno || end == arg || *end || !isfinite(s) || s <= 0 ||
		    s > CTL_MAX_TIMEOUT_S)
			return ctl_usage_error(ctl, "--timeout takes seconds, above 0 and at most %.0f: '%s'",
					       CTL_MAX_TIMEOUT_S, arg);
		/* rounded up, without ceil(): stratactl does not link libm */
		ctl->timeout_ms = (int)(s * 1000);
		if (ctl->timeout_ms < s * 1000)
			ctl->timeout_ms++;
		break;
	}
	case CTL_OPT_CAPACITY:
	case CTL_OPT_LIMIT:
		ret = ctl_parse_size(arg, id == CTL_OPT_CAPACITY ? &a->capacity :
								&a->limit);
		if (ret == -EDOM)
			return ctl_usage_error(ctl, "--%s '%s': a lower-case b would be bits; write 1Gi for 2^30 bytes (what Kubernetes' 1Gi means) or 1G for 10^9",
					       name, arg);
		if (ret < 0)
			return ctl_usage_error(ctl, "--%s takes a size like 1073741824, 1Gi, 512M: '%s'%s",
					       name, arg,
					       ret == -ERANGE ? " is too large" : "");
		break;
	case CTL_OPT_PARAM:
		return ctl_kvs_add(ctl, &a->params, arg, name);
	case CTL_OPT_CONTEXT:
		return ctl_kvs_add(ctl, &a->context, arg, name);
	case CTL_OPT_SECRET:
		return ctl_kvs_add(ctl, &a->secrets, arg, name);
	case CTL_OPT_ACCESS_MODE:
		ret = ctl_parse_access_mode(arg);
		if (ret < 0)
			return ctl_usage_error(ctl, "unknown access mode '%s' (try SINGLE_NODE_WRITER)",
					       arg);
		a->access_mode = ret;
		break;
	case CTL_OPT_MAX_ENTRIES:
		errno = 0;
		v = strtol(arg, &end, 10);
		if (errno || end == arg || *end || v < 0 || v > INT32_MAX)
			return ctl_usage_error(ctl, "--max-entries takes a count from 0: '%s'",
					       arg);
		a->max_entries = (int32_t)v;
		break;
	case CTL_OPT_MOUNT_FLAG:
		ctl_strv_add(ctl, &a->mount_flags, arg);
		break;
	case CTL_OPT_WAIT: {
		double s = CTL_PROBE_WAIT_S;

		if (arg) {
			errno = 0;
			s = strtod(arg, &end);
			if (errno || end == arg || *end || !isfinite(s) ||
			    s <= 0 || s > CTL_MAX_TIMEOUT_S)
				return ctl_usage_error(ctl, "--wait takes seconds, above 0 and at most %.0f (--wait=30): '%s'",
						       CTL_MAX_TIMEOUT_S, arg);
		}
		a->wait_ms = (int)(s * 1000);
		break;
	}
	default:
		return ctl_usage_error(ctl, "option --%s is not taken here", name);
	}
	return 0;
}

static const char *ctl_opt_name(int id)
{
	for (const struct option *o = ctl_options; o->name; o++)
		if (o->val == id)
			return o->name;
	return "?";
}

static int ctl_check_required(struct ctl *ctl)
{
	const struct ctl_args *a = &ctl->a;

	for (const int *id = ctl->cmd->need; id && *id != CTL_OPT_END; id++) {
		const char *v = ctl_opt_value(a, *id);

		if (!v || !*v)
			return ctl_usage_error(ctl, "--%s is required",
					       ctl_opt_name(*id));
	}
	if (a->block && (a->mount_flags.n || a->mount_group || a->fs_type))
		return ctl_usage_error(ctl, "--block takes no --mount-flag, --mount-group or --fs-type");
	return 0;
}

/* Taken before COMMAND: the common options, and --version. */
static const int ctl_global_opts[] = { CTL_OPT_VERSION, CTL_OPT_END };

/*
 * getopt_long over argv[0..argc) with the common options and `opts`, each
 * set into ctl by ctl_set_opt(). Before COMMAND (ctl->cmd still NULL) and
 * after it alike. Returns -1 after printing the help or the version, 0 to
 * go on, or an exit code.
 */
static int ctl_getopt(struct ctl *ctl, int argc, char **argv,
		      const char *shortopts, const int *opts)
{
	struct option longopts[CTL_NOPTIONS];
	size_t n = 0;
	int c, ret;

	for (const struct option *o = ctl_options; o->name; o++)
		if (ctl_opt_in(ctl_common_opts, o->val) ||
		    ctl_opt_in(opts, o->val))
			longopts[n++] = *o;
	memset(&longopts[n], 0, sizeof(longopts[n]));

	opterr = 0;
	while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		switch (c) {
		case 'h':
			if (ctl->cmd)
				ctl_cmd_help(ctl->cmd);
			else
				ctl_help(stdout);
			return -1;
		case CTL_OPT_VERSION:
			printf(CTL_PROG " %s\n", STRATA_VERSION);
			return -1;
		case ':':
			return ctl_usage_error(ctl, "option '%s' needs a value",
					       argv[optind - 1]);
		case '?':
			if (optopt)
				return ctl_usage_error(ctl, "unknown option '-%c'",
						       optopt);
			return ctl_usage_error(ctl, "unknown option '%s'",
					       argv[optind - 1]);
		default:
			ret = ctl_set_opt(ctl, c, ctl_opt_name(c), optarg);
			if (ret)
				return ret;
		}
	}
	return 0;
}

/*
 * A command's own options and arguments, argv[0..argc) (argv[0] is its
 * name): positional arguments in any place. Returns as ctl_getopt().
 */
static int ctl_parse_cmd(struct ctl *ctl, int argc, char **argv)
{
	const struct ctl_cmd *cmd = ctl->cmd;
	int ret;

	optind = 0; /* GNU: start over, and reinitialise */
	ret = ctl_getopt(ctl, argc, argv, ":h", cmd->opts);
	if (ret)
		return ret;
	ctl->a.pos = argv + optind;
	ctl->a.npos = argc - optind;
	if (ctl->a.npos < cmd->min_pos)
		return ctl_usage_error(ctl, "missing argument: %s %s",
				       cmd->name, cmd->synopsis);
	if (ctl->a.npos > cmd->max_pos)
		return ctl_usage_error(ctl, "unexpected argument '%s'",
				       ctl->a.pos[cmd->max_pos]);
	for (int i = 0; i < ctl->a.npos; i++)
		if (!*ctl->a.pos[i])
			return ctl_usage_error(ctl, "an empty argument");
	return ctl_check_required(ctl);
}

int main(int argc, char **argv)
{
	struct ctl ctl = {
		.timeout_ms = CTL_DEFAULT_TIMEOUT_MS,
		.a = { .capacity = -1, .limit = -1, .wait_ms = -1 },
	};
	const char *name;
	char *target = NULL;
	int ret;

	ret = ctl_getopt(&ctl, argc, argv, "+:h", ctl_global_opts);
	if (ret)
		goto out;
	if (optind >= argc) {
		ret = ctl_usage_error(&ctl, "no command given");
		goto out;
	}
	name = argv[optind];
	if (strcmp(name, "help") == 0) {
		const struct ctl_cmd *cmd =
			optind + 1 < argc ? ctl_cmd_find(argv[optind + 1]) : NULL;

		if (cmd)
			ctl_cmd_help(cmd);
		else if (optind + 1 < argc && ctl_is_group(argv[optind + 1]))
			ctl_group_help(argv[optind + 1]);
		else
			ctl_help(stdout);
		ret = -1;
		goto out;
	}
	/* "volume list", "layer rm NAME": a command of two words */
	if (ctl_is_group(name)) {
		char two[64], list[256];

		ctl_group_list(name, list, sizeof(list));
		if (optind + 1 < argc && (!strcmp(argv[optind + 1], "--help") ||
					  !strcmp(argv[optind + 1], "-h"))) {
			ctl_group_help(name);
			ret = -1;
			goto out;
		}
		if (optind + 1 >= argc || argv[optind + 1][0] == '-') {
			ret = ctl_usage_error(&ctl, "%s takes a subcommand: %s",
					      name, list);
			goto out;
		}
		snprintf(two, sizeof(two), "%s %s", name, argv[optind + 1]);
		ctl.cmd = ctl_cmd_find(two);
		if (!ctl.cmd) {
			ret = ctl_usage_error(&ctl, "unknown command '%s %s' (%s)",
					      name, argv[optind + 1], list);
			goto out;
		}
		optind++;
	} else {
		ctl.cmd = ctl_cmd_find(name);
	}
	if (!ctl.cmd) {
		ret = ctl_usage_error(&ctl, "unknown command '%s'", name);
		goto out;
	}
	ret = ctl_parse_cmd(&ctl, argc - optind, argv + optind);
	if (ret)
		goto out;

	if (!ctl.endpoint || !*ctl.endpoint)
		ctl.endpoint = getenv("CSI_ENDPOINT");
	if (!ctl.endpoint || !*ctl.endpoint) {
		ret = ctl_usage_error(&ctl, "no endpoint: give --endpoint unix:///path/csi.sock or set CSI_ENDPOINT");
		goto out;
	}
	ret = csi_client_target(ctl.endpoint, &target);
	if (ret < 0) {
		ret = ctl_usage_error(&ctl, "endpoint '%s' %s", ctl.endpoint,
				      ret == -ENAMETOOLONG ?
					      "is longer than a unix socket path may be" :
					      "is not a unix socket: give unix:///abs/path, unix:/abs/path or /abs/path");
		goto out;
	}
	ret = ctl.cmd->run ? ctl.cmd->run(&ctl) : ctl_run(&ctl);

out:
	free(target);
	csi_client_close(ctl.client);
	ctl_pool_free(&ctl);
	if (fflush(stdout) != 0 && ret == CTL_EXIT_OK) {
		fprintf(stderr, CTL_PROG ": writing the output: %s\n",
			strerror(errno));
		ret = CTL_EXIT_FAIL;
	}
	return ret < 0 ? CTL_EXIT_OK : ret;
}
