/* SPDX-License-Identifier: Apache-2.0 */
/*
 * strata-csi internals: the CSI plugin's modules and what they share.
 *
 * Only server.c and client.c know gRPC. Everything else takes unpacked
 * protobuf-c messages and answers with a status code of its own (enum
 * csi_code), a plain message and a reply (struct csi_reply), so that the
 * handlers read like the spec: check the request, lock the volume, load
 * state, return early if already done, act, save, reply. The handlers
 * and their fuzz targets build and run without gRPC.
 *
 * Below the handlers, functions return 0 or a negative errno; the handler
 * is where an errno becomes a status code and a sentence.
 */
#ifndef STRATA_CSI_H
#define STRATA_CSI_H

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <json-c/json.h>

#include "admin.pb-c.h"
#include "csi.pb-c.h"
#include "strata.h"

#define CSI_DEFAULT_DRIVER "strata.csi.dev"
#define CSI_DEFAULT_ROOT "/var/lib/strata"
#define CSI_STORE_LOCK ".lock"	/* below the root, while a plugin holds it */
/* "sv-" and 32 hex digits: 128 random bits, never a path before checked */
#define CSI_VOLUME_ID_PREFIX "sv-"
#define CSI_VOLUME_ID_LEN 35
/* "ss-" and 32 hex digits, the same way */
#define CSI_SNAPSHOT_ID_PREFIX "ss-"
#define CSI_SNAPSHOT_ID_LEN 35
/* one generator and one check make and take both kinds (store.c, validate.c) */
_Static_assert(CSI_SNAPSHOT_ID_LEN == CSI_VOLUME_ID_LEN,
	       "volume and snapshot ids differ only in their prefix");
/*
 * A chain entry naming a snapshot's layer is '@' and its id: no layer
 * name starts with '@', so the two never collide in a record.
 */
#define CSI_CHAIN_SNAPSHOT '@'
#define CSI_LAYER_NAME_MAX 128
#define CSI_MAX_LAYERS 64
#define CSI_NAME_MAX 128 /* CreateVolume name: the spec's limit */
/* how long NodeStageVolume waits for a new daemon's mount to answer */
#define CSI_STAGE_TIMEOUT_MS 15000

/*
 * The status codes CSI's error tables use. They are the canonical RPC
 * status codes, numbered as on the wire; server.c and client.c convert
 * them to and from gRPC's, and nothing else sees gRPC's.
 */
enum csi_code {
	CSI_OK = 0,
	CSI_CANCELLED = 1,
	CSI_UNKNOWN = 2,
	CSI_INVALID_ARGUMENT = 3,
	CSI_DEADLINE_EXCEEDED = 4,
	CSI_NOT_FOUND = 5,
	CSI_ALREADY_EXISTS = 6,
	CSI_PERMISSION_DENIED = 7,
	CSI_RESOURCE_EXHAUSTED = 8,
	CSI_FAILED_PRECONDITION = 9,
	CSI_ABORTED = 10,
	CSI_OUT_OF_RANGE = 11,
	CSI_UNIMPLEMENTED = 12,
	CSI_INTERNAL = 13,
	CSI_UNAVAILABLE = 14,
	CSI_DATA_LOSS = 15,
	CSI_UNAUTHENTICATED = 16,
	CSI_CODE_COUNT
};

enum csi_mode {
	CSI_MODE_NODE = 1,
	CSI_MODE_CONTROLLER = 2,
};

/* --fuse-uring: what the plugin does with fuse.enable_uring (transport.c) */
enum csi_fuse_uring {
	CSI_URING_OFF,		/* the default: never written */
	CSI_URING_ON,		/* set when found unset */
	CSI_URING_LEAVE,	/* reported only */
};

#define CSI_MAX_PREFIXES 16
#define CSI_MAX_GUARDS 4

struct csi_config {
	char *endpoint;		/* unix:///abs/path.sock */
	char *socket_path;	/* the path part of endpoint */
	char *node_id;
	char *root;
	char *driver_name;
	char *stratafs;		/* the daemon binary NodeStageVolume runs */
	unsigned modes;		/* enum csi_mode bits */
	int64_t max_volumes;	/* 0: no limit */
	int workers;		/* threads polling the completion queue */
	char *metrics_address;	/* HOST:PORT for Prometheus, or NULL */
	/* --allowed-path-prefix: canonical; staging and target paths lie below */
	char *prefixes[CSI_MAX_PREFIXES];
	int nprefixes;
	/* where the daemons run (host.c); NULL: where the plugin runs */
	char *daemon_mntns;	/* --daemon-mount-namespace */
	char *daemon_cgroup;	/* --daemon-cgroup */
	char *daemon_bindir;	/* --daemon-binary-dir */
	enum csi_fuse_uring fuse_uring;	/* --fuse-uring */
};

#define CSI_MAX_CGROUPS 16

/* Where the daemons run, set up once at start (host.c). */
struct csi_host {
	int mntns_fd;		/* the namespace the child enters, or -1 */
	char *exec;		/* what the child executes */
	char *libdir;		/* the bundle (--daemon-binary-dir): its cwd */
	char *ldpath;		/* "LD_LIBRARY_PATH=<bundle>", or NULL */
	char *binpath;		/* "STRATAFS_BINARY=<dir>/current/stratafs" */
	int ncgroups;		/* one per cgroup hierarchy, 0: none */
	char *cgroups[CSI_MAX_CGROUPS];	/* <hierarchy>/<name>, for messages */
	int cgroup_fds[CSI_MAX_CGROUPS]; /* O_PATH on each */
};

/* A directory the Node service never mounts on, in or above. */
struct csi_guard {
	char *path;		/* canonical */
	dev_t dev;
	ino_t ino;
};

/* The store's directories, opened once; paths are only for messages. */
struct csi_store {
	char *root;
	int root_fd;
	int layers_fd;
	int volumes_fd;
	int node_fd;
	int empty_fd; /* the base of a volume without layers */
	int snapshots_fd;
	int lock_fd;
	pthread_mutex_t create_lock; /* CreateVolume's name lookup + create */
	/* guards layer_busy, imports; after create_lock, never before (layer.c) */
	pthread_mutex_t layer_lock;
	int layer_busy;	/* layer imports and removals in flight */
	struct csi_import *imports;	/* in flight, newest first */
	pthread_mutex_t busy_lock;
	struct csi_busy *busy; /* volume ids with an operation in flight */
};

struct csi_plugin {
	struct csi_config cfg;
	struct csi_store store;
	char *topology_key;	/* "<driver>/node" */
	int ready;		/* 0 starting, 1 ready, <0 -errno of the check */
	char ready_msg[256];
	struct csi_watch *watch; /* daemons watched through pidfds */
	struct csi_guard guards[CSI_MAX_GUARDS]; /* the store, the socket's dir */
	int nguards;
	struct csi_host host;
	struct csi_cond *conds;	/* conditions logged (condition.c) */
	struct csi_flattener *flat; /* flattens deep chains (flatten.c) */
};

/*
 * What a handler answers: status, message, and on OK the reply. The reply
 * and all its parts are allocated with csi_alloc, and freed together once
 * the server has sent them.
 */
struct csi_reply {
	enum csi_code code;
	char msg[512];
	ProtobufCMessage *msg_out;
	void **allocs;
	size_t nallocs;
	char volume_id[64];		/* for the per-call log line */
};

/* The topology of this node, as replies carry it. */
struct csi_topo {
	Csi__V1__Topology topo;
	Csi__V1__Topology__SegmentsEntry seg;
	Csi__V1__Topology__SegmentsEntry *segs[1];
};

typedef void (*csi_handler_fn)(struct csi_plugin *p,
			       const ProtobufCMessage *req,
			       struct csi_reply *r);

struct csi_method {
	const char *path;	/* "/csi.v1.Node/NodeStageVolume" */
	const ProtobufCMessageDescriptor *input;
	csi_handler_fn handler;
	unsigned mode;		/* enum csi_mode it belongs to; 0: identity */
	bool blocking;		/* may wait on disks or daemons: own thread */
};

/* A volume record: volumes/<id>/volume.json. */
struct csi_volume {
	char id[CSI_VOLUME_ID_LEN + 1];
	char *name;
	int64_t capacity;
	int nlayers;
	char **layers;		/* the chain, top first: layer names, "@ss-..." */
	char *created;		/* RFC 3339 */
	/* a clone's content source: a snapshot or a volume id; "": none */
	char source[CSI_VOLUME_ID_LEN + 1];
	bool ephemeral;		/* an inline volume: name is kubelet's id */
	bool passthrough;	/* stratafs -o passthrough */
	json_object *parameters; /* the CreateVolume parameters as given */
};

/*
 * A snapshot record: snapshots/<id>/snapshot.json beside its layer,
 * snapshots/<id>/layer, a volume's upper frozen read-only.
 */
struct csi_snapshot {
	char id[CSI_SNAPSHOT_ID_LEN + 1];
	char *name;		/* CreateSnapshot's; "" for a clone's own */
	char source[CSI_VOLUME_ID_LEN + 1];	/* the volume it was taken of */
	int64_t capacity;	/* the source's at the time: a clone's least */
	/* what its layer allocates, as the volume's daemon counted it; 0: unknown */
	int64_t size;
	int64_t created_s;	/* creation time, since the epoch */
	int32_t created_ns;
	int nchain;
	char **chain;		/* the layers below its own, top first */
	/* deleted while in use, or a clone's own: unlisted, gone once unused */
	bool hidden;
};

/*
 * A mount known for certain: its unique id (STATX_MNT_ID_UNIQUE, never
 * reused) and its superblock's device (the FUSE connection). id 0: none.
 */
struct csi_mnt {
	uint64_t id;
	dev_t dev;
};

/* One bind mount of a staged volume into a pod. */
struct csi_target {
	char *path;
	bool readonly;
	char *flags;		/* the mount flags, comma-joined, as checked */
	int mode;		/* the capability's access mode */
	bool created;		/* the plugin made the directory: it removes it */
	struct csi_mnt mnt;	/* the bind mount, recorded before it is attached */
};

/* Node state of one volume: node/<id>.json. */
/* A layer import in flight: how far it has read its archive. */
struct csi_import {
	struct csi_import *next;
	const char *name;
	int fd;			/* the archive: the child reads it, so its offset */
	off_t total;
};

struct csi_node_vol {
	char id[CSI_VOLUME_ID_LEN + 1];
	char *staging;
	char *stage_flags;	/* canonical form of the stage capability */
	bool staging_created;	/* the plugin made the directory */
	struct csi_mnt mnt;	/* the FUSE mount at the staging path */
	struct csi_mnt prev;	/* the mount a heal is replacing, until done */
	pid_t pid;
	unsigned long long starttime; /* /proc/<pid>/stat: tells pid reuse */
	unsigned restarts;	/* daemons started again by a heal */
	int ntargets;
	struct csi_target *targets;
};

/* A staging or target path, checked, with its parent open (path.c). */
struct csi_path {
	char path[PATH_MAX];
	int parent;		/* O_PATH on the parent directory, or -1 */
	const char *name;	/* the last component, within path */
};

/* server.c */
struct csi_server;
int csi_server_start(struct csi_plugin *p, struct csi_server **srv);
void csi_server_serve(struct csi_server *srv, const sigset_t *stop_signals);
void csi_server_stop(struct csi_server *srv);

/* client.c: unary calls over the gRPC C core, for stratactl and tests */
struct csi_client;
/*
 * Opens a channel to `endpoint`: "unix:///abs/path", "unix:/abs/path" or
 * a bare "/abs/path". Returns -EINVAL for any other form, -ENAMETOOLONG
 * for a path a unix socket cannot have. Connects lazily: a socket nobody
 * listens on shows up as the first call's UNAVAILABLE status.
 */
int csi_client_open(const char *endpoint, struct csi_client **c);
/* The gRPC target for `endpoint` ("unix:/abs"), malloc'd; errors as above. */
int csi_client_target(const char *endpoint, char **target);
/*
 * Calls `method` ("/csi.v1.Node/NodeGetInfo") with `req`. Returns 0 when a
 * status arrived (then *code and *details say which; *out is the unpacked
 * reply on CSI_OK), or a negative errno when the call could not be
 * made at all. A reply that does not unpack as `out_desc` comes back as
 * CSI_INTERNAL with details saying so. *details is malloc'd (free
 * it), NULL on OK; free *out with protobuf_c_message_free_unpacked().
 * timeout_ms <= 0: no deadline.
 */
int csi_client_call(struct csi_client *c, const char *method,
		    const ProtobufCMessage *req,
		    const ProtobufCMessageDescriptor *out_desc,
		    ProtobufCMessage **out, enum csi_code *code,
		    char **details, int timeout_ms);
void csi_client_close(struct csi_client *c);
/* reply.c: "NOT_FOUND", a status code as the spec spells it; a chain */
const char *csi_code_name(enum csi_code code);
size_t csi_chain_format(char *buf, size_t size, char *const *chain, size_t n);

/* identity.c, controller.c, snapshot_rpc.c, node.c, admin.c: method tables, NULL-path terminated */
extern const struct csi_method csi_identity_methods[];
extern const struct csi_method csi_controller_methods[];
extern const struct csi_method csi_node_methods[];
extern const struct csi_method csi_admin_methods[];
/* inspect.c: the Admin service's volume states */
void csi_admin_list_volume_states(struct csi_plugin *p,
				  const ProtobufCMessage *msg,
				  struct csi_reply *r);
void csi_admin_inspect_volume(struct csi_plugin *p,
			      const ProtobufCMessage *msg,
			      struct csi_reply *r);
/* layer.c: the Admin service's layers */
void csi_admin_import_layer(struct csi_plugin *p, const ProtobufCMessage *msg,
			    struct csi_reply *r);
void csi_admin_list_layers(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r);
void csi_admin_delete_layer(struct csi_plugin *p, const ProtobufCMessage *msg,
			    struct csi_reply *r);
void csi_layer_sweep(struct csi_store *s);
/* layer_extract.c: an import's archive, extracted in a child process */
struct csi_layer_job {
	int fd;			/* the archive, open */
	int dir;		/* the new layer's hidden directory */
	const char *path;	/* the archive's path, for messages */
	pid_t parent;		/* the plugin: the child dies with it */
};
int csi_layer_extract_child(void *arg, int wfd);
/* identity.c: every table above, NULL terminated: what the socket serves */
extern const struct csi_method *const csi_services[];

/* reply.c */
void csi_reply_set(struct csi_reply *r, enum csi_code code,
		   const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void csi_reply_errno(struct csi_reply *r, int err, const char *what);
void csi_reply_ok(struct csi_reply *r, void *msg);
void *csi_alloc(struct csi_reply *r, size_t size);
char *csi_strdup(struct csi_reply *r, const char *s);
void csi_reply_free(struct csi_reply *r);
Csi__V1__Topology *csi_topo_init(struct csi_topo *t,
				 const struct csi_plugin *p);
bool csi_topo_matches(const Csi__V1__Topology *t, const struct csi_plugin *p);
void csi_reply_caps(struct csi_reply *r,
		    const ProtobufCMessageDescriptor *resp_desc,
		    const ProtobufCMessageDescriptor *cap_desc,
		    const ProtobufCMessageDescriptor *rpc_desc,
		    const int *types, size_t n);
void csi_reply_volume(struct csi_reply *r, const char *volume_id);
void csi_reply_load(struct csi_reply *r, const char *id, int err);
int csi_reply_id_check(struct csi_reply *r, const char *id);

/* validate.c */
bool csi_volume_id_valid(const char *id);
bool csi_snapshot_id_valid(const char *id);
int csi_layer_name_check(const char *name);
int csi_split_layers(const char *list, char ***names, int *count);
void csi_free_strv(char **v, int n);
int csi_strv_push(char ***v, int *n, const char *s);
void csi_strv_sort(char **v, int n);
/* Every map<string,string> entry protoc-c generates has this layout. */
struct csi_map_entry {
	ProtobufCMessage base;
	char *key;
	char *value;
};
const char *csi_map_get(size_t n, void *const *entries, const char *key);
#define CSI_MAP_GET(msg, field, key) \
	csi_map_get((msg)->n_##field, (void *const *)(msg)->field, (key))
int csi_capability_check(const Csi__V1__VolumeCapability *cap, char *why,
			 size_t size);
bool csi_capability_readonly(const Csi__V1__VolumeCapability *cap);
int csi_mount_flags(const Csi__V1__VolumeCapability *cap, unsigned long *flags,
		    char **canon, char *why, size_t size);
unsigned long csi_flags_from_canon(const char *canon);
int csi_path_check(const char *path, char *why, size_t size);
int csi_volume_options_check(size_t n, void *const *entries, const char *what,
			     bool *passthrough, char *why, size_t size);
int csi_wire_strings_check(const ProtobufCMessageDescriptor *d,
			   const uint8_t *data, size_t len, int depth);

/* killpoint.c: where a test may make the plugin die */
void csi_kill_points_init(void);
void csi_kill_point(const char *name);

/* lock.c: one operation at a time per volume */
int csi_busy_enter(struct csi_store *s, const char *id);
void csi_busy_leave(struct csi_store *s, const char *id);
void csi_busy_clear(struct csi_store *s);
int csi_busy_claim(struct csi_store *s, const char *id, struct csi_reply *r);

/* record.c: JSON files written atomically */
int csi_record_write(int dirfd, const char *name, json_object *obj);
int csi_record_read(int dirfd, const char *name, json_object **obj);
ssize_t csi_record_read_text(int dirfd, const char *name, char *buf,
			     size_t size);
int csi_record_remove(int dirfd, const char *name);
const char *csi_json_str(json_object *o, const char *key);
int64_t csi_json_int(json_object *o, const char *key);

/* store.c */
int csi_store_open(struct csi_store *s, const char *root);
void csi_store_close(struct csi_store *s);
int csi_store_check(struct csi_store *s, char *why, size_t size);
int csi_store_writable(struct csi_store *s, struct csi_reply *r);
int csi_store_space(struct csi_store *s, int64_t *avail, int64_t *size);
int64_t csi_store_free(struct csi_store *s);
bool csi_store_full(struct csi_store *s);
int csi_store_new_id(const char *prefix, char id[CSI_VOLUME_ID_LEN + 1]);
int csi_volume_load(struct csi_store *s, const char *id, struct csi_volume *v);
int csi_volume_find(struct csi_store *s, const char *name, bool ephemeral,
		    struct csi_volume *v);
int csi_volume_create(struct csi_store *s, struct csi_volume *v);
int csi_volume_save(struct csi_store *s, const struct csi_volume *v);
int csi_volume_served(struct csi_store *s, const char *id);
int csi_volume_delete(struct csi_store *s, const char *id);
/* what csi_store_names lists of NAME: a part of it, or NULL for nothing */
typedef const char *(*csi_store_keep_fn)(int dirfd, char *name,
					 const void *arg);
int csi_store_names(int dirfd, csi_store_keep_fn keep, const void *arg,
		    char ***names, int *count);
int csi_store_scan(int dirfd, const char *suffix, char ***ids, int *count);
int csi_page_first(char **ids, int n, const char *token);
int csi_volume_list(struct csi_store *s, char ***ids, int *count);
void csi_volume_free(struct csi_volume *v);
int csi_layer_open(struct csi_store *s, const char *name);

/* snapshot.c: snapshots in the store, their chains, users, recovery */
#define CSI_SNAP_RECORD "snapshot.json"
int csi_snapshot_write(struct csi_store *s, const char *dir,
		       const char *name, const struct csi_snapshot *ss);
int csi_chain_entry_check(const char *entry);
int csi_chain_open(struct csi_store *s, const char *entry);
void csi_snapshot_free(struct csi_snapshot *ss);
int csi_snapshot_load(struct csi_store *s, const char *id,
		      struct csi_snapshot *ss);
int csi_snapshot_list(struct csi_store *s, char ***ids, int *count);
int csi_snapshot_find(struct csi_store *s, const char *name,
		      struct csi_snapshot *ss);
int csi_snapshot_take(struct csi_plugin *p, struct csi_volume *v,
		      struct csi_snapshot *ss, char *why, size_t size);
int csi_snapshot_hide(struct csi_store *s, struct csi_snapshot *ss);
int csi_snapshot_recover(struct csi_store *s, const char *vid);
void csi_snapshot_gc(struct csi_store *s);
int csi_chain_users(struct csi_store *s, const char *entry, char ***users,
		    int *count, bool strict);
/* flatten.c: chains too deep merged into one layer, in the background */
int csi_flatten_init(struct csi_plugin *p);
int csi_flatten_start(struct csi_plugin *p);
void csi_flatten_stop(struct csi_plugin *p);
void csi_flatten_kick(struct csi_plugin *p);
void csi_flatten_recover(struct csi_store *s);

/* One merge: the run's layers, the layers below it, and the result. */
struct csi_flat_ctx {
	const int *range;	/* the run's roots, top first */
	int nrange;
	const int *below;	/* the roots of the layers below it */
	int nbelow;
	int out_root;		/* the new layer's root, empty */
	atomic_bool *cancel;	/* set when the plugin stops */
	void *links;		/* tsearch tree: files of several names */
	int64_t entries;	/* what was written, for the log */
	int64_t bytes;
};

/* flatten_merge.c: the merged tree of a run of layers, written out */
int csi_flatten_merge(struct csi_flat_ctx *c);
/* snapshot_rpc.c: the Controller's snapshot methods */
extern const struct csi_method csi_snapshot_methods[];
void csi_snapshot_answer(struct csi_reply *r, int err, const char *why);
/* clone.c: CreateVolume from a VolumeContentSource */
int csi_clone_source_id(const Csi__V1__VolumeContentSource *src,
			char source[CSI_VOLUME_ID_LEN + 1]);
int csi_clone_source(struct csi_plugin *p, struct csi_reply *r,
		     const Csi__V1__CreateVolumeRequest *req,
		     struct csi_volume *want);
int csi_clone_freeze(struct csi_plugin *p, struct csi_reply *r,
		     const char *name, struct csi_volume *want);

/* controller.c */
int csi_name_check(const char *name, char *why, size_t size);
int csi_layers_check(struct csi_plugin *p, struct csi_volume *v,
		     const char *list, char *why, size_t size);

/* store.c: what a layer's tree holds on disk */
int csi_tree_usage(const char *path, int64_t *bytes, int64_t *inodes);

/* usage.c: a volume's usage, from its daemon's counters */
struct csi_usage {
	int64_t bytes;		/* allocated by its upper layer */
	int64_t inodes;
	int64_t capacity;	/* the daemon's limit (0: none), -1 unknown */
	bool live;		/* from the daemon; else its usage file */
	char why[160];		/* when not live: why the daemon did not say */
};
int csi_usage_get(struct csi_store *s, const char *id, struct csi_usage *u);
int csi_usage_saved(struct csi_store *s, const char *id, int64_t *bytes);
int csi_usage_set_capacity(struct csi_store *s, const char *id, int64_t cap,
			   char *why, size_t size);

/* condition.c: a volume's condition (staged volumes' also checked, logged) */
void csi_condition_volume(struct csi_plugin *p, const struct csi_volume *v,
			  const struct csi_node_vol *n,
			  const struct csi_usage *u, char *msg, size_t size);
Csi__V1__VolumeCondition *csi_condition_msg(struct csi_plugin *p,
					    struct csi_reply *r,
					    const struct csi_volume *v,
					    const struct csi_node_vol *n,
					    const struct csi_usage *u);

/* expand.c: ControllerExpandVolume and NodeExpandVolume */
void csi_controller_expand(struct csi_plugin *p, const ProtobufCMessage *msg,
			   struct csi_reply *r);
void csi_node_expand(struct csi_plugin *p, const ProtobufCMessage *msg,
		     struct csi_reply *r);

/* state.c: node records */
int csi_state_load(struct csi_store *s, const char *id, struct csi_node_vol *n);
int csi_state_save(struct csi_store *s, const struct csi_node_vol *n);
int csi_state_remove(struct csi_store *s, const char *id);
void csi_state_remove_stats(struct csi_store *s, const char *id);
int csi_state_list(struct csi_store *s, char ***ids, int *count);
void csi_state_free(struct csi_node_vol *n);
struct csi_target *csi_state_target(struct csi_node_vol *n, const char *path);
int csi_state_add_target(struct csi_node_vol *n, const char *path,
			 bool readonly, const char *flags);
void csi_state_drop_target(struct csi_node_vol *n, const char *path);

/* path.c: the trust boundary for staging and target paths */
int csi_openat2(int dirfd, const char *path, int flags,
		unsigned long long resolve);
int csi_guard_add(struct csi_plugin *p, const char *path);
void csi_guards_free(struct csi_plugin *p);
void csi_path_init(struct csi_path *pp);
void csi_path_release(struct csi_path *pp);
int csi_path_resolve(const struct csi_plugin *p, const char *path,
		     struct csi_path *pp, char *why, size_t size);
int csi_path_open(const struct csi_path *pp, bool create, bool *created);
int csi_mnt_at(const struct csi_path *pp, const struct csi_mnt *want, int *fd,
	       struct csi_mnt *top);
void csi_path_reply(struct csi_reply *r, const char *field, int err,
		    const char *why);

/* mount.c: mounts by descriptor, known by unique id (all fuzz/rpc.c stubs) */
int csi_mnt_of(int fd, struct csi_mnt *m, bool *root);
int csi_mnt_exists(const struct csi_mnt *m);
int csi_mnt_fuse(const char *source, bool ro, int *fusefd, int *mntfd);
int csi_mnt_clone(int fd, unsigned long msflags, int *treefd);
int csi_mnt_attach(int mntfd, int dirfd, bool beneath);
int csi_mnt_detach(int fd);
int csi_mnt_answers(int fd, int timeout_ms);
const char *csi_mnt_strerror(int err);

/* control.c */
int csi_control_call(struct csi_store *s, const char *vid,
		     const char *const *argv, int argc, char *out, size_t size,
		     int timeout_ms);

/* daemon.c */
int csi_daemon_start(struct csi_plugin *p, const struct csi_volume *v,
		     struct csi_node_vol *n, int *mntfd, char *why,
		     size_t size);
int csi_daemon_stop(struct csi_plugin *p, struct csi_node_vol *n);
void csi_daemon_kill(struct csi_node_vol *n);
bool csi_daemon_alive(const struct csi_node_vol *n);
unsigned long long csi_daemon_starttime(pid_t pid);

/* host.c, bundle.c, cgroup.c: where the daemons run */
int csi_host_init(struct csi_plugin *p);
int csi_child_run(int (*fn)(void *arg, int wfd), void *arg, void *out,
		  size_t size, size_t *len);
void csi_host_free(struct csi_host *h);
int csi_bundle_prepare(struct csi_plugin *p, char *why, size_t size);
int csi_cgroup_init(struct csi_plugin *p, char *why, size_t size);
int csi_cgroup_open(struct csi_plugin *p, const char *name, int *fds,
		    char *why, size_t size);
int csi_cgroup_join(const int *fds, int n, int *failed);
void csi_cgroup_remove(struct csi_plugin *p, const char *name);
void csi_cgroup_sweep(struct csi_plugin *p);
void csi_cgroup_free(struct csi_host *h);

/* transport.c: the host's switch for FUSE over io_uring */
int csi_transport_parse(const char *name, enum csi_fuse_uring *mode);
void csi_transport_init(const struct csi_config *c);

/* condition.c: the periodic check of staged volumes */
void csi_condition_check(struct csi_plugin *p, const char *id, unsigned round);
void csi_condition_prune(struct csi_plugin *p, unsigned round);

/* metrics.c */
enum csi_event {
	CSI_EV_DAEMON_START,
	CSI_EV_DAEMON_EXIT,
	CSI_EV_DAEMON_RESTART,
	CSI_EV_FLATTEN_DONE,
	CSI_EV_FLATTEN_FAILED,
	CSI_EV_COUNT,
};
int csi_metrics_start(struct csi_plugin *p, const char *addr);
void csi_metrics_stop(void);
void csi_metrics_rpc(const struct csi_method *m, enum csi_code code,
		     double seconds);
void csi_metrics_event(enum csi_event ev);

/* reconcile.c */
int csi_reconcile(struct csi_plugin *p);
int csi_heal(struct csi_plugin *p, const struct csi_volume *v,
	     struct csi_node_vol *n, char *why, size_t size);
int csi_watch_start(struct csi_plugin *p);
void csi_watch_stop(struct csi_plugin *p);

#endif
