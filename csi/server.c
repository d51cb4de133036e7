// SPDX-License-Identifier: Apache-2.0
/*
 * The gRPC server, on the gRPC C core. One table maps a method path to
 * its handler; calls arrive through generic dispatch
 * (grpc_server_request_call), so an unknown path gets UNIMPLEMENTED at
 * once instead of hanging until the client's deadline.
 *
 * Several workers poll one completion queue. A call goes through three
 * events: it arrives (NEW), its request message arrives (RECV), its reply
 * was sent (SENT). Handlers that may wait on disks or daemons run on a
 * thread of their own, so a slow NodeStageVolume never holds up Probe.
 *
 * Shutdown follows the core's rules: the queue is shut down only once the
 * server's shutdown tag has arrived and no call of ours is in flight; a
 * batch started on a shut-down queue would abort the process.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "csi.h"

/* calls waiting for a client at any time: a burst of kubelet calls */
#define CSI_PENDING_CALLS 16

enum csi_call_state { CSI_CALL_NEW, CSI_CALL_RECV, CSI_CALL_SENT };

struct csi_server {
	struct csi_plugin *p;
	grpc_server *server;
	grpc_completion_queue *cq;
	pthread_mutex_t lock;
	int inflight;		/* calls allocated, requested ones included */
	int active;		/* calls a client made, not yet answered */
	pthread_cond_t idle;	/* signalled when active drops to 0 */
	bool stopping;		/* no new calls are requested */
	bool shutdown_seen;	/* the server's shutdown tag arrived */
	bool cq_down;
	int shutdown_tag;
	pthread_t *workers;
	int nworkers;
};

struct csi_call {
	struct csi_server *srv;
	enum csi_call_state state;
	grpc_call *call;
	grpc_call_details details;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;
	grpc_byte_buffer *out;
	grpc_slice status_details;
	int cancelled;
	const struct csi_method *method;
	ProtobufCMessage *req;
	struct csi_reply reply;
	struct timespec start;
};

static void csi_server_maybe_close(struct csi_server *srv)
{
	bool close_cq = false;

	pthread_mutex_lock(&srv->lock);
	if (srv->shutdown_seen && srv->inflight == 0 && !srv->cq_down) {
		srv->cq_down = true;
		close_cq = true;
	}
	pthread_mutex_unlock(&srv->lock);
	if (close_cq)
		grpc_completion_queue_shutdown(srv->cq);
}

static void csi_call_free(struct csi_call *c)
{
	struct csi_server *srv = c->srv;

	if (c->call)
		grpc_call_unref(c->call);
	grpc_call_details_destroy(&c->details);
	grpc_metadata_array_destroy(&c->md);
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->out)
		grpc_byte_buffer_destroy(c->out);
	grpc_slice_unref(c->status_details);
	if (c->state != CSI_CALL_NEW) {
		pthread_mutex_lock(&srv->lock);
		if (--srv->active == 0)
			pthread_cond_broadcast(&srv->idle);
		pthread_mutex_unlock(&srv->lock);
	}
	if (c->req)
		protobuf_c_message_free_unpacked(c->req, NULL);
	csi_reply_free(&c->reply);
	free(c);
	pthread_mutex_lock(&srv->lock);
	srv->inflight--;
	pthread_mutex_unlock(&srv->lock);
	csi_server_maybe_close(srv);
}

/* Keeps a call slot open for the next client. */
static void csi_server_request(struct csi_server *srv)
{
	struct csi_call *c;

	pthread_mutex_lock(&srv->lock);
	if (srv->stopping) {
		pthread_mutex_unlock(&srv->lock);
		return;
	}
	srv->inflight++;
	pthread_mutex_unlock(&srv->lock);
	c = calloc(1, sizeof(*c));
	if (!c)
		goto out_fail;
	c->srv = srv;
	c->state = CSI_CALL_NEW;
	c->status_details = grpc_empty_slice();
	grpc_call_details_init(&c->details);
	grpc_metadata_array_init(&c->md);
	if (grpc_server_request_call(srv->server, &c->call, &c->details,
				     &c->md, srv->cq, srv->cq, c) != GRPC_CALL_OK) {
		grpc_call_details_destroy(&c->details);
		grpc_metadata_array_destroy(&c->md);
		free(c);
		goto out_fail;
	}
	return;
out_fail:
	strata_err("cannot accept more calls");
	pthread_mutex_lock(&srv->lock);
	srv->inflight--;
	pthread_mutex_unlock(&srv->lock);
}

static const struct csi_method *csi_method_find(struct csi_server *srv,
						 grpc_slice path)
{
	for (size_t t = 0; csi_services[t]; t++)
		for (const struct csi_method *m = csi_services[t]; m->path; m++) {
			if (m->mode && !(m->mode & srv->p->cfg.modes))
				continue;
			if (!grpc_slice_str_cmp(path, m->path))
				return m;
		}
	return NULL;
}

static double csi_elapsed_ms(const struct timespec *start)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - start->tv_sec) * 1e3 +
	       (now.tv_nsec - start->tv_nsec) / 1e6;
}

/* One line per call. Never the request itself: it may carry secrets. */
static void csi_call_log(struct csi_call *c)
{
	char *method = grpc_slice_to_c_string(c->details.method);
	const char *name = strrchr(method, '/');
	double ms = csi_elapsed_ms(&c->start);
	char dur[32];
	const char *kv[] = {
		"method", name ? name + 1 : method,
		"volume", c->reply.volume_id[0] ? c->reply.volume_id : "-",
		"code", csi_code_name(c->reply.code),
		"duration_ms", dur,
		c->reply.code ? "error" : NULL, c->reply.msg,
		NULL,
	};

	snprintf(dur, sizeof(dur), "%.2f", ms);
	csi_metrics_rpc(c->method, c->reply.code, ms / 1e3);
	strata_log_kv(c->reply.code == CSI_OK ||
				      c->reply.code == CSI_UNIMPLEMENTED ?
			      STRATA_LOG_INFO :
			      STRATA_LOG_WARN,
		      "rpc", kv, 1u << 3 /* duration_ms */);
	gpr_free(method);
}

/* Our codes are the canonical ones, numbered as gRPC numbers them. */
_Static_assert(CSI_UNAUTHENTICATED == (int)GRPC_STATUS_UNAUTHENTICATED &&
	       CSI_FAILED_PRECONDITION == (int)GRPC_STATUS_FAILED_PRECONDITION,
	       "csi_code follows the canonical numbering");

static grpc_status_code csi_grpc_code(enum csi_code code)
{
	return (unsigned)code < CSI_CODE_COUNT ? (grpc_status_code)code :
						 GRPC_STATUS_UNKNOWN;
}

/* The final batch; it always carries initial metadata, or the client waits. */
static void csi_call_reply(struct csi_call *c)
{
	grpc_op ops[4];
	size_t n = 0;

	memset(ops, 0, sizeof(ops));
	ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (c->reply.code == CSI_OK && c->reply.msg_out) {
		size_t len = protobuf_c_message_get_packed_size(c->reply.msg_out);
		grpc_slice s = grpc_slice_malloc(len);

		protobuf_c_message_pack(c->reply.msg_out, GRPC_SLICE_START_PTR(s));
		c->out = grpc_raw_byte_buffer_create(&s, 1);
		grpc_slice_unref(s);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = c->out;
	}
	c->status_details = grpc_slice_from_copied_string(c->reply.msg);
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = csi_grpc_code(c->reply.code);
	ops[n++].data.send_status_from_server.status_details = &c->status_details;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
	csi_call_log(c);
	c->state = CSI_CALL_SENT;
	if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK) {
		strata_err("cannot send a reply");
		csi_call_free(c);
	}
}

static void csi_call_run(struct csi_call *c)
{
	c->method->handler(c->srv->p, c->req, &c->reply);
	csi_call_reply(c);
}

static void *csi_call_thread(void *arg)
{
	csi_call_run(arg);
	return NULL;
}

static int csi_call_unpack(struct csi_call *c)
{
	grpc_byte_buffer_reader reader;
	grpc_slice all;
	int ret;

	if (!grpc_byte_buffer_reader_init(&reader, c->payload))
		return -EBADMSG;
	all = grpc_byte_buffer_reader_readall(&reader);
	grpc_byte_buffer_reader_destroy(&reader);
	c->req = protobuf_c_message_unpack(c->method->input, NULL,
					    GRPC_SLICE_LENGTH(all),
					    GRPC_SLICE_START_PTR(all));
	ret = c->req ? csi_wire_strings_check(c->method->input,
					      GRPC_SLICE_START_PTR(all),
					      GRPC_SLICE_LENGTH(all), 0) :
		       -EBADMSG;
	grpc_slice_unref(all);
	return ret;
}

/* The request message is here: unpack it and hand it to its handler. */
static void csi_call_dispatch(struct csi_call *c, bool ok)
{
	pthread_attr_t attr;
	pthread_t tid;

	c->method = csi_method_find(c->srv, c->details.method);
	if (!c->method) {
		csi_reply_set(&c->reply, CSI_UNIMPLEMENTED,
			      "method not implemented by this plugin");
		goto out_reply;
	}
	if (!ok || !c->payload) {
		csi_reply_set(&c->reply, CSI_INVALID_ARGUMENT,
			      "the call carried no request message");
		goto out_reply;
	}
	switch (csi_call_unpack(c)) {
	case 0:
		break;
	case -EINVAL:
		csi_reply_set(&c->reply, CSI_INVALID_ARGUMENT,
			      "malformed request: a string field holds a NUL byte");
		goto out_reply;
	default:
		csi_reply_set(&c->reply, CSI_INVALID_ARGUMENT,
			      "malformed request: not a valid %s message",
			      c->method->input->name);
		goto out_reply;
	}
	if (!c->method->blocking) {
		csi_call_run(c);
		return;
	}
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&tid, &attr, csi_call_thread, c) == 0) {
		pthread_attr_destroy(&attr);
		return;
	}
	pthread_attr_destroy(&attr);
	csi_reply_set(&c->reply, CSI_RESOURCE_EXHAUSTED,
		      "cannot start a thread for this call");
out_reply:
	csi_call_reply(c);
}

static void csi_call_event(struct csi_call *c, bool ok)
{
	grpc_op op;

	switch (c->state) {
	case CSI_CALL_NEW:
		if (!ok) { /* the server is shutting down */
			c->call = NULL;
			csi_call_free(c);
			return;
		}
		csi_server_request(c->srv);
		clock_gettime(CLOCK_MONOTONIC, &c->start);
		pthread_mutex_lock(&c->srv->lock);
		c->srv->active++;
		pthread_mutex_unlock(&c->srv->lock);
		memset(&op, 0, sizeof(op));
		op.op = GRPC_OP_RECV_MESSAGE;
		op.data.recv_message.recv_message = &c->payload;
		c->state = CSI_CALL_RECV;
		if (grpc_call_start_batch(c->call, &op, 1, c, NULL) != GRPC_CALL_OK)
			csi_call_free(c);
		return;
	case CSI_CALL_RECV:
		csi_call_dispatch(c, ok);
		return;
	case CSI_CALL_SENT:
		csi_call_free(c);
		return;
	}
}

static void *csi_server_worker(void *arg)
{
	struct csi_server *srv = arg;

	for (;;) {
		grpc_event ev = grpc_completion_queue_next(
			srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type != GRPC_OP_COMPLETE)
			continue;
		if (ev.tag == &srv->shutdown_tag) {
			pthread_mutex_lock(&srv->lock);
			srv->shutdown_seen = true;
			pthread_mutex_unlock(&srv->lock);
			csi_server_maybe_close(srv);
			continue;
		}
		csi_call_event(ev.tag, ev.success);
	}
	return NULL;
}

/*
 * Calls in flight get their time to finish (a NodeStageVolume waits for
 * its daemon); then whatever is left is cancelled, since the core would
 * otherwise also wait for idle client connections to go away, and
 * kubelet never closes its own.
 */
static void csi_server_drain(struct csi_server *srv)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += CSI_STAGE_TIMEOUT_MS / 1000 + 5;
	pthread_mutex_lock(&srv->lock);
	while (srv->active > 0 &&
	       pthread_cond_timedwait(&srv->idle, &srv->lock, &until) == 0)
		;
	if (srv->active > 0)
		strata_warn("%d calls still running at shutdown: cancelled",
			    srv->active);
	pthread_mutex_unlock(&srv->lock);
	grpc_server_cancel_all_calls(srv->server);
}

/*
 * Listens on the socket and serves calls from here on. The socket is
 * made 0660 root:root whatever the umask: it is created by bind(2) under
 * a umask that leaves no wider mode, not chmod'ed after, so there is no
 * moment in which any local user could connect. The caller has blocked
 * SIGTERM and SIGINT, so that gRPC's own threads, started here, inherit
 * the mask.
 */
int csi_server_start(struct csi_plugin *p, struct csi_server **out)
{
	grpc_server_credentials *creds;
	struct csi_server *srv = calloc(1, sizeof(*srv));
	mode_t umask_was;
	int ok;

	*out = NULL;
	if (!srv)
		return -ENOMEM;
	srv->p = p;
	srv->workers = calloc(p->cfg.workers, sizeof(*srv->workers));
	if (!srv->workers) {
		free(srv);
		return -ENOMEM;
	}
	pthread_mutex_init(&srv->lock, NULL);
	pthread_cond_init(&srv->idle, NULL);
	grpc_init();
	srv->server = grpc_server_create(NULL, NULL);
	srv->cq = grpc_completion_queue_create_for_next(NULL);
	grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
	creds = grpc_insecure_server_credentials_create();
	umask_was = umask(0117);
	ok = grpc_server_add_http2_port(srv->server, p->cfg.endpoint, creds);
	umask(umask_was);
	grpc_server_credentials_release(creds);
	if (!ok) {
		strata_err("cannot listen on %s (does its directory exist?)",
			   p->cfg.endpoint);
		srv->shutdown_seen = true;
		srv->stopping = true;
		grpc_server_destroy(srv->server);
		srv->server = NULL;
		csi_server_stop(srv);
		return -EADDRNOTAVAIL;
	}
	grpc_server_start(srv->server);
	for (int i = 0; i < CSI_PENDING_CALLS; i++)
		csi_server_request(srv);
	for (; srv->nworkers < p->cfg.workers; srv->nworkers++)
		if (pthread_create(&srv->workers[srv->nworkers], NULL,
				   csi_server_worker, srv))
			break;
	strata_info("serving CSI on %s (node %s, driver %s)", p->cfg.endpoint,
		    p->cfg.node_id, p->cfg.driver_name);
	*out = srv;
	return 0;
}

/* Serves until SIGTERM or SIGINT reaches the sigwait here. */
void csi_server_serve(struct csi_server *srv, const sigset_t *stop_signals)
{
	int sig;

	do
		sig = sigwaitinfo(stop_signals, NULL);
	while (sig < 0 && errno == EINTR);
	strata_info("signal %d: shutting down", sig);
}

void csi_server_stop(struct csi_server *srv)
{
	if (!srv)
		return;
	if (srv->server) {
		pthread_mutex_lock(&srv->lock);
		srv->stopping = true;
		pthread_mutex_unlock(&srv->lock);
		grpc_server_shutdown_and_notify(srv->server, srv->cq,
						&srv->shutdown_tag);
		csi_server_drain(srv);
		for (int i = 0; i < srv->nworkers; i++)
			pthread_join(srv->workers[i], NULL);
		grpc_server_destroy(srv->server);
	}
	if (!srv->nworkers) {
		grpc_completion_queue_shutdown(srv->cq);
		while (grpc_completion_queue_next(srv->cq,
						  gpr_inf_future(GPR_CLOCK_REALTIME),
						  NULL).type != GRPC_QUEUE_SHUTDOWN)
			;
	}
	grpc_completion_queue_destroy(srv->cq);
	grpc_shutdown_blocking();
	pthread_cond_destroy(&srv->idle);
	pthread_mutex_destroy(&srv->lock);
	free(srv->workers);
	free(srv);
}
