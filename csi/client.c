// SPDX-License-Identifier: Apache-2.0
/*
 * The CSI client: unary calls over the gRPC C core to a plugin's unix
 * socket, for stratactl and the tests.
 *
 * One call is one batch on a completion queue of its own: send the
 * (empty) initial metadata, the packed request and the half-close,
 * receive the initial metadata, the reply and the status, then pluck the
 * batch's tag. The call carries a deadline, so the pluck always returns:
 * a plugin that never answers ends as DEADLINE_EXCEEDED, a socket nobody
 * listens on as UNAVAILABLE (the call does not wait for the channel to
 * become ready), and both reach the caller as statuses, like any other.
 *
 * Everything gRPC hands back is owned here and released before the call
 * returns; the caller gets only malloc'd memory (the details string) and
 * a protobuf-c message to free with protobuf_c_message_free_unpacked().
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "csi.h"

/* sizeof(sun_path) less its NUL: what bind() and connect() accept */
#define CSI_CLIENT_SUN_PATH_MAX 107

struct csi_client {
	grpc_channel *channel;
	char *target; /* the endpoint as gRPC takes it: "unix:/abs" */
};

/*
 * "unix:///abs" and "unix:/abs" are what gRPC resolves; a bare "/abs" it
 * would take for a DNS name, so it gets the "unix:" it means. Anything
 * else (tcp, dns, relative paths) is refused: the plugin listens on a
 * unix socket and nothing else.
 */
int csi_client_target(const char *endpoint, char **target)
{
	const char *path;

	*target = NULL;
	if (!endpoint)
		return -EINVAL;
	if (strncmp(endpoint, "unix://", 7) == 0)
		path = endpoint + 7;
	else if (strncmp(endpoint, "unix:", 5) == 0)
		path = endpoint + 5;
	else
		path = endpoint;
	if (path[0] != '/')
		return -EINVAL;
	if (strlen(path) > CSI_CLIENT_SUN_PATH_MAX)
		return -ENAMETOOLONG;
	if (asprintf(target, "unix:%s", path) < 0) {
		*target = NULL;
		return -ENOMEM;
	}
	return 0;
}

int csi_client_open(const char *endpoint, struct csi_client **c)
{
	grpc_channel_credentials *creds = NULL;
	struct csi_client *cl;
	int ret;

	*c = NULL;
	cl = calloc(1, sizeof(*cl));
	if (!cl)
		return -ENOMEM;
	ret = csi_client_target(endpoint, &cl->target);
	if (ret < 0)
		goto out_free;

	grpc_init();
	creds = grpc_insecure_credentials_create();
	if (!creds) {
		ret = -ENOMEM;
		goto out_shutdown;
	}
	/* Connects lazily: a missing socket shows up as the first call's status. */
	cl->channel = grpc_channel_create(cl->target, creds, NULL);
	grpc_channel_credentials_release(creds);
	if (!cl->channel) {
		ret = -EINVAL;
		goto out_shutdown;
	}
	*c = cl;
	return 0;

out_shutdown:
	grpc_shutdown_blocking();
out_free:
	free(cl->target);
	free(cl);
	return ret;
}

/* The reply as one contiguous buffer, unpacked; NULL when it is not one. */
static ProtobufCMessage *csi_client_unpack(grpc_byte_buffer *buf,
					   const ProtobufCMessageDescriptor *desc,
					   size_t *len)
{
	grpc_byte_buffer_reader reader;
	ProtobufCMessage *msg;
	grpc_slice all;

	*len = 0;
	if (!grpc_byte_buffer_reader_init(&reader, buf))
		return NULL;
	all = grpc_byte_buffer_reader_readall(&reader);
	grpc_byte_buffer_reader_destroy(&reader);
	*len = GRPC_SLICE_LENGTH(all);
	msg = protobuf_c_message_unpack(desc, NULL, *len,
					GRPC_SLICE_START_PTR(all));
	grpc_slice_unref(all);
	return msg;
}

static int csi_client_set_details(char **details, const char *text, size_t len)
{
	*details = strndup(text, len);
	return *details ? 0 : -ENOMEM;
}

/* One call's gRPC state, from the packed request to the status. */
struct csi_client_rpc {
	grpc_metadata_array initial_md, trailing_md;
	grpc_byte_buffer *send_buf, *recv_buf;
	grpc_slice status_details;
	grpc_status_code status;
	const char *error_string;
	grpc_completion_queue *cq;
	grpc_call *call;
};

static void csi_client_rpc_init(struct csi_client_rpc *rpc)
{
	memset(rpc, 0, sizeof(*rpc));
	rpc->status_details = grpc_empty_slice();
	rpc->status = GRPC_STATUS_UNKNOWN;
	grpc_metadata_array_init(&rpc->initial_md);
	grpc_metadata_array_init(&rpc->trailing_md);
}

static void csi_client_rpc_destroy(struct csi_client_rpc *rpc)
{
	if (rpc->call)
		grpc_call_unref(rpc->call);
	if (rpc->cq) {
		/* A pluck queue says it is drained by returning SHUTDOWN. */
		grpc_completion_queue_shutdown(rpc->cq);
		while (grpc_completion_queue_pluck(
			       rpc->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME),
			       NULL).type != GRPC_QUEUE_SHUTDOWN)
			;
		grpc_completion_queue_destroy(rpc->cq);
	}
	if (rpc->error_string)
		gpr_free((void *)rpc->error_string);
	grpc_slice_unref(rpc->status_details);
	grpc_metadata_array_destroy(&rpc->initial_md);
	grpc_metadata_array_destroy(&rpc->trailing_md);
	if (rpc->recv_buf)
		grpc_byte_buffer_destroy(rpc->recv_buf);
	if (rpc->send_buf)
		grpc_byte_buffer_destroy(rpc->send_buf);
}

static int csi_client_pack(struct csi_client_rpc *rpc,
			   const ProtobufCMessage *req)
{
	size_t len = protobuf_c_message_get_packed_size(req);
	uint8_t *packed = malloc(len ? len : 1);
	grpc_slice slice;

	if (!packed)
		return -ENOMEM;
	protobuf_c_message_pack(req, packed);
	/* The slice takes its own copy. */
	slice = grpc_slice_from_copied_buffer((const char *)packed, len);
	free(packed);
	rpc->send_buf = grpc_raw_byte_buffer_create(&slice, 1);
	grpc_slice_unref(slice);
	return 0;
}

/* Sends the request and waits for the status, within the deadline. */
static int csi_client_exchange(struct csi_client *c, struct csi_client_rpc *rpc,
			       const char *method, int timeout_ms)
{
	gpr_timespec deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
	grpc_op ops[6], *op = ops;
	grpc_event ev;

	if (timeout_ms > 0)
		deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
					gpr_time_from_millis(timeout_ms,
							     GPR_TIMESPAN));
	rpc->cq = grpc_completion_queue_create_for_pluck(NULL);
	if (!rpc->cq)
		return -ENOMEM;
	rpc->call = grpc_channel_create_call(c->channel, NULL,
					     GRPC_PROPAGATE_DEFAULTS, rpc->cq,
					     grpc_slice_from_static_string(method),
					     NULL, deadline, NULL);
	if (!rpc->call)
		return -EINVAL;

	memset(ops, 0, sizeof(ops));
	(op++)->op = GRPC_OP_SEND_INITIAL_METADATA;
	op->op = GRPC_OP_SEND_MESSAGE;
	(op++)->data.send_message.send_message = rpc->send_buf;
	(op++)->op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	op->op = GRPC_OP_RECV_INITIAL_METADATA;
	(op++)->data.recv_initial_metadata.recv_initial_metadata = &rpc->initial_md;
	op->op = GRPC_OP_RECV_MESSAGE;
	(op++)->data.recv_message.recv_message = &rpc->recv_buf;
	op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	op->data.recv_status_on_client.trailing_metadata = &rpc->trailing_md;
	op->data.recv_status_on_client.status = &rpc->status;
	op->data.recv_status_on_client.status_details = &rpc->status_details;
	(op++)->data.recv_status_on_client.error_string = &rpc->error_string;

	if (grpc_call_start_batch(rpc->call, ops, (size_t)(op - ops), rpc->call,
				  NULL) != GRPC_CALL_OK)
		return -EIO;
	/* The call's deadline bounds this wait: the batch always completes. */
	ev = grpc_completion_queue_pluck(rpc->cq, rpc->call,
					 gpr_inf_future(GPR_CLOCK_REALTIME),
					 NULL);
	return ev.type == GRPC_OP_COMPLETE && ev.success ? 0 : -EIO;
}

/* A broken server's answer becomes INTERNAL with details saying why. */
static int csi_client_broken(enum csi_code *code, char **details,
			     const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int csi_client_broken(enum csi_code *code, char **details,
			     const char *fmt, ...)
{
	va_list ap;
	int n;

	*code = CSI_INTERNAL;
	va_start(ap, fmt);
	n = vasprintf(details, fmt, ap);
	va_end(ap);
	if (n < 0) {
		*details = NULL;
		return -ENOMEM;
	}
	return 0;
}

/* The status, its details, and on OK the unpacked reply. */
static int csi_client_result(struct csi_client_rpc *rpc, const char *method,
			     const ProtobufCMessageDescriptor *out_desc,
			     ProtobufCMessage **out, enum csi_code *code,
			     char **details)
{
	size_t len;

	/* Our codes are gRPC's, numbered alike (csi.h). */
	*code = (unsigned)rpc->status < CSI_CODE_COUNT ?
			(enum csi_code)rpc->status : CSI_UNKNOWN;
	if (*code != CSI_OK)
		return csi_client_set_details(
			details,
			(const char *)GRPC_SLICE_START_PTR(rpc->status_details),
			GRPC_SLICE_LENGTH(rpc->status_details));
	/* OK with no message, or one that is not the reply: a broken server. */
	if (!rpc->recv_buf)
		return csi_client_broken(code, details,
					 "%s answered OK without a reply message",
					 method);
	*out = csi_client_unpack(rpc->recv_buf, out_desc, &len);
	if (!*out)
		return csi_client_broken(code, details,
					 "%s: the reply (%zu bytes) does not unpack as %s",
					 method, len, out_desc->name);
	return 0;
}

int csi_client_call(struct csi_client *c, const char *method,
		    const ProtobufCMessage *req,
		    const ProtobufCMessageDescriptor *out_desc,
		    ProtobufCMessage **out, enum csi_code *code,
		    char **details, int timeout_ms)
{
	struct csi_client_rpc rpc;
	int ret;

	*out = NULL;
	*code = CSI_UNKNOWN;
	*details = NULL;
	csi_client_rpc_init(&rpc);
	ret = csi_client_pack(&rpc, req);
	if (ret == 0)
		ret = csi_client_exchange(c, &rpc, method, timeout_ms);
	if (ret == 0)
		ret = csi_client_result(&rpc, method, out_desc, out, code,
					details);
	csi_client_rpc_destroy(&rpc);
	return ret;
}

void csi_client_close(struct csi_client *c)
{
	if (!c)
		return;
	grpc_channel_destroy(c->channel);
	/* Blocking: gRPC's threads are gone when this returns (valgrind-clean). */
	grpc_shutdown_blocking();
	free(c->target);
	free(c);
}
