/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stratactl internals: what its files share.
 *
 * stratactl.c reads the command line and holds the command table;
 * ctl_request.c fills the requests from the options; ctl_call.c makes
 * the call; ctl_text.c prints the reply
 * as readable lines, ctl_json.c as JSON instead (--json); ctl_volume.c prints the Admin service's volume
 * states; ctl_layer.c the layer commands' requests and replies;
 * ctl_snapshot.c the snapshot commands (a table of their own) and
 * create-volume's content source;
 * ctl_progress.c shows a long call's progress on a terminal.
 */
#ifndef STRATA_CTL_H
#define STRATA_CTL_H

#include <stdbool.h>
#include <stdint.h>

#include <json-c/json.h>
#include <protobuf-c/protobuf-c.h>

#include "admin.pb-c.h"
#include "csi.h"

#define CTL_PROG "stratactl"

enum ctl_exit {
	CTL_EXIT_OK = 0,
	CTL_EXIT_FAIL = 1,
	CTL_EXIT_USAGE = 2,
};

/* Option ids: getopt_long's val; the long options have no short form. */
enum ctl_opt {
	CTL_OPT_END = 0,
	CTL_OPT_HELP = 'h',
	CTL_OPT_ENDPOINT = 256,
	CTL_OPT_JSON,
	CTL_OPT_TIMEOUT,
	CTL_OPT_VERSION,
	CTL_OPT_LAYERS,
	CTL_OPT_CAPACITY,
	CTL_OPT_LIMIT,
	CTL_OPT_PARAM,
	CTL_OPT_ACCESS_MODE,
	CTL_OPT_BLOCK,
	CTL_OPT_SECRET,
	CTL_OPT_MAX_ENTRIES,
	CTL_OPT_STARTING_TOKEN,
	CTL_OPT_ALL,
	CTL_OPT_STAGING_PATH,
	CTL_OPT_TARGET,
	CTL_OPT_PATH,
	CTL_OPT_READONLY,
	CTL_OPT_MOUNT_FLAG,
	CTL_OPT_MOUNT_GROUP,
	CTL_OPT_FS_TYPE,
	CTL_OPT_CONTEXT,
	CTL_OPT_WAIT,
	CTL_OPT_FROM_SNAPSHOT,
	CTL_OPT_FROM_VOLUME,
};

struct ctl_kv {
	const char *key;
	const char *value;
};

struct ctl_kvs {
	int n;
	struct ctl_kv *v;
};

struct ctl_strv {
	int n;
	const char **v;
};

/* Everything any command takes; each command reads its own part. */
struct ctl_args {
	int npos;
	char **pos;
	const char *layers;
	int64_t capacity;	/* -1: not given */
	int64_t limit;		/* -1: not given */
	struct ctl_kvs params;
	int access_mode;	/* 0: not given (SINGLE_NODE_WRITER) */
	bool block;
	struct ctl_kvs secrets;
	int32_t max_entries;
	const char *starting_token;
	bool all;
	const char *staging;
	const char *target;
	const char *path;
	bool readonly;
	struct ctl_strv mount_flags;
	const char *mount_group;
	const char *fs_type;
	struct ctl_kvs context;
	int wait_ms;		/* probe --wait; -1: not given */
	const char *from_snapshot;	/* create-volume's content source */
	const char *from_volume;
};

/* What is `offset` bytes into m (a struct or a message), as a `type`. */
#define CTL_AT(m, offset, type) (*(type *)((char *)(m) + (offset)))

struct ctl;

typedef void (*ctl_text_fn)(struct ctl *ctl, const ProtobufCMessage *reply);

/* Whether a request carries the volume capability of the options. */
enum ctl_cap {
	CTL_CAP_NONE = 0,
	CTL_CAP_ALWAYS,
	CTL_CAP_ASKED,		/* only with --access-mode or --block */
};

/*
 * A command: its help, what it takes, and the RPC it makes. ctl_run()
 * makes the call from the fields below `method`; `run` replaces it where
 * one call is not enough (list-volumes --all).
 */
struct ctl_poll;
/* Refreshes a progress line's text, each second: 0 when BUF holds one. */
typedef int (*ctl_progress_fn)(void *arg, char *buf, size_t size);

struct ctl_cmd {
	const char *name;
	const char *synopsis;	/* what follows the name */
	const char *summary;
	const char *options;	/* the option lines of `COMMAND --help` */
	const int *opts;	/* the options it takes besides the common ones; NULL: none */
	const int *need;	/* those of them it cannot do without; NULL: none */
	int min_pos, max_pos;	/* positional arguments */

	const char *method;	/* "/csi.v1.Node/NodeGetInfo" */
	const ProtobufCMessageDescriptor *request, *reply;
	const char *arg;	/* the request field the argument fills */
	enum ctl_cap cap;
	/* What only this request has; returns 0 or an exit code. */
	int (*build)(struct ctl *ctl, ProtobufCMessage *req);
	ctl_text_fn text;	/* the readable reply */
	/* The exit code a reply means (probe, validate); NULL: 0. */
	int (*verdict)(const ProtobufCMessage *reply);
	/* ctl_text_done: "<done> ID[ <done_prep> <done_opt's value>]" */
	const char *done, *done_prep;
	int done_opt;
	int (*run)(struct ctl *ctl);
	/* The progress line while a call takes long, after "NAME ID: ". */
	const char *waiting;
	/* How far it has got; its argument is the call's struct ctl_poll */
	ctl_progress_fn progress;
};

/* A progress line's own connection to the plugin, opened on first use. */
struct ctl_poll {
	struct ctl *ctl;
	struct csi_client *client;
};

/* The RPC of a command: its path and the descriptors of its messages. */
#define CTL_RPC(service, rpc, msg)                                         \
	.method = "/csi.v1." #service "/" #rpc,                            \
	.request = &csi__v1__##msg##_request__descriptor,                  \
	.reply = &csi__v1__##msg##_response__descriptor
/* The same for Strata's own Admin service (csi/admin.proto). */
#define CTL_ADMIN_RPC(rpc, msg)                                            \
	.method = "/strata.v1.Admin/" #rpc,                                \
	.request = &strata__v1__##msg##_request__descriptor,               \
	.reply = &strata__v1__##msg##_response__descriptor

struct ctl {
	const char *endpoint;
	bool json;
	bool no_such_volume;	/* delete-volume: there was nothing to delete */
	int timeout_ms;
	const struct ctl_cmd *cmd;
	struct csi_client *client;
	struct ctl_args a;
	/* Request parts live until exit; freed together. */
	void **pool;
	size_t npool, pool_size;
};

/* stratactl.c */
void ctl_oom(void) __attribute__((noreturn));
void *ctl_alloc(struct ctl *ctl, size_t size);
int ctl_usage_error(struct ctl *ctl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
const char *ctl_enum_name(const ProtobufCEnumDescriptor *d, int value);
const char *ctl_opt_value(const struct ctl_args *a, int id);

/* ctl_request.c: the request fields from the options */
const ProtobufCFieldDescriptor *ctl_field(const ProtobufCMessage *m,
					  const char *name, ProtobufCType type);
Csi__V1__VolumeCapability *ctl_capability(struct ctl *ctl);
void ctl_fill(struct ctl *ctl, ProtobufCMessage *req);

/* ctl_call.c: one call to the plugin */
int ctl_call_quiet(struct ctl *ctl, const char *method,
		   const ProtobufCMessage *req,
		   const ProtobufCMessageDescriptor *out_desc,
		   ProtobufCMessage **out, enum csi_code *code, char **details,
		   int timeout_ms);
int ctl_call(struct ctl *ctl, const char *method, const ProtobufCMessage *req,
	     const ProtobufCMessageDescriptor *out_desc, ProtobufCMessage **out);

/* ctl_text.c: the readable replies, and the verdicts of yes-or-no ones */
void ctl_text_done(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_info(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_plugin_caps(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_rpc_caps(struct ctl *ctl, const ProtobufCMessage *reply);
bool ctl_probe_ready(const ProtobufCMessage *reply);
void ctl_text_probe(struct ctl *ctl, const ProtobufCMessage *reply);
int ctl_verdict_probe(const ProtobufCMessage *reply);
void ctl_text_create_volume(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_validate(struct ctl *ctl, const ProtobufCMessage *reply);
int ctl_verdict_validate(const ProtobufCMessage *reply);
void ctl_text_list_volumes(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_capacity(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_stats(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_expand(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_node_expand(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_replace_worker(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_node_info(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_delete(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_volume_list(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_volume_inspect(struct ctl *ctl, const ProtobufCMessage *reply);

/* ctl_layer.c: layer import, list, rm */
int ctl_build_import_layer(struct ctl *ctl, ProtobufCMessage *req);
void ctl_text_import_layer(struct ctl *ctl, const ProtobufCMessage *reply);
void ctl_text_list_layers(struct ctl *ctl, const ProtobufCMessage *reply);
int ctl_progress_import(void *arg, char *buf, size_t size);
void ctl_text_delete_layer(struct ctl *ctl, const ProtobufCMessage *reply);

/* ctl_snapshot.c: snapshot create, list, rm; NULL-name terminated */
extern const struct ctl_cmd ctl_snapshot_cmds[];
int ctl_build_content_source(struct ctl *ctl, Csi__V1__CreateVolumeRequest *r);

/* ctl_json.c */
void ctl_json_append(json_object *arr, const ProtobufCMessage *m,
		     const char *field);
void ctl_print_json(json_object *obj);
void ctl_print_reply_json(const ProtobufCMessage *m);

/* ctl_volume.c */
void ctl_print_volume_states(const Strata__V1__ListVolumeStatesResponse *r);
void ctl_print_volume_state(const Strata__V1__VolumeState *s);
void ctl_fmt_size(char *buf, size_t size, int64_t bytes);

/* ctl_progress.c: NULL when stderr is no terminal (then all are no-ops) */
struct ctl_progress;
struct ctl_progress *ctl_progress_start(const char *what, ctl_progress_fn fn,
					void *arg);
void ctl_progress_set(struct ctl_progress *pg, const char *what);
void ctl_progress_stop(struct ctl_progress *pg);

#endif
