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
 * "NOT_FOUND": a status code as gRPC spells it. It lives here, in
 * libcsiwire, because both sides need it: stratactl, which links only the
 * wire, prints the codes it gets, and the plugin (libcsi links libcsiwire)
 * logs and counts the codes it sends.
 */
const char *csi_code_name(grpc_status_code code)
{
	static const char *const names[] = {
		[GRPC_STATUS_OK] = "OK",
		[GRPC_STATUS_CANCELLED] = "CANCELLED",
		[GRPC_STATUS_UNKNOWN] = "UNKNOWN",
		[GRPC_STATUS_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
		[GRPC_STATUS_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
		[GRPC_STATUS_NOT_FOUND] = "NOT_FOUND",
		[GRPC_STATUS_ALREADY_EXISTS] = "ALREADY_EXISTS",
		[GRPC_STATUS_PERMISSION_DENIED] = "PERMISSION_DENIED",
		[GRPC_STATUS_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
		[GRPC_STATUS_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
		[GRPC_STATUS_ABORTED] = "ABORTED",
		[GRPC_STATUS_OUT_OF_RANGE] = "OUT_OF_RANGE",
		[GRPC_STATUS_UNIMPLEMENTED] = "UNIMPLEMENTED",
		[GRPC_STATUS_INTERNAL] = "INTERNAL",
		[GRPC_STATUS_UNAVAILABLE] = "UNAVAILABLE",
		[GRPC_STATUS_DATA_LOSS] = "DATA_LOSS",
		[GRPC_STATUS_UNAUTHENTICATED] = "UNAUTHENTICATED",
	};

	if ((unsigned)code < sizeof(names) / sizeof(names[0]) && names[code])
		return names[code];
	return "UNKNOWN";
}

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

int csi_client_call(struct csi_client *c, const char *method,
		    const ProtobufCMessage *req,
		    const ProtobufCMessageDescriptor *out_desc,
		    ProtobufCMessage **out, grpc_status_code *code,
		    char **details, int timeout_ms)
{
	grpc_metadata_array initial_md, trailing_md;
	grpc_byte_buffer *send_buf = NULL, *recv_buf = NULL;
	grpc_slice status_details = grpc_empty_slice();
	grpc_status_code status = GRPC_STATUS_UNKNOWN;
	const char *error_string = NULL;
	grpc_completion_queue *cq = NULL;
	grpc_call *call = NULL;
	gpr_timespec deadline;
	grpc_op ops[6], *op;
	grpc_call_error err;
	grpc_event ev;
	uint8_t *packed = NULL;
	size_t len;
	grpc_slice slice;
	int ret;

	*out = NULL;
	*code = GRPC_STATUS_UNKNOWN;
	*details = NULL;
	grpc_metadata_array_init(&initial_md);
	grpc_metadata_array_init(&trailing_md);

	len = protobuf_c_message_get_packed_size(req);
	packed = malloc(len ? len : 1);
	if (!packed) {
		ret = -ENOMEM;
		goto out;
	}
	protobuf_c_message_pack(req, packed);
	/* The slice takes its own copy, so `packed` stays ours to free. */
	slice = grpc_slice_from_copied_buffer((const char *)packed, len);
	send_buf = grpc_raw_byte_buffer_create(&slice, 1);
	grpc_slice_unref(slice);

	if (timeout_ms > 0)
		deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
					gpr_time_from_millis(timeout_ms,
							     GPR_TIMESPAN));
	else
		deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);

	cq = grpc_completion_queue_create_for_pluck(NULL);
	if (!cq) {
		ret = -ENOMEM;
		goto out;
	}
	call = grpc_channel_create_call(c->channel, NULL,
					GRPC_PROPAGATE_DEFAULTS, cq,
					grpc_slice_from_static_string(method),
					NULL, deadline, NULL);
	if (!call) {
		ret = -EINVAL;
		goto out;
	}

	memset(ops, 0, sizeof(ops));
	op = ops;
	op->op = GRPC_OP_SEND_INITIAL_METADATA;
	op->data.send_initial_metadata.count = 0;
	op++;
	op->op = GRPC_OP_SEND_MESSAGE;
	op->data.send_message.send_message = send_buf;
	op++;
	op->op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	op++;
	op->op = GRPC_OP_RECV_INITIAL_METADATA;
	op->data.recv_initial_metadata.recv_initial_metadata = &initial_md;
	op++;
	op->op = GRPC_OP_RECV_MESSAGE;
	op->data.recv_message.recv_message = &recv_buf;
	op++;
	op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	op->data.recv_status_on_client.trailing_metadata = &trailing_md;
	op->data.recv_status_on_client.status = &status;
	op->data.recv_status_on_client.status_details = &status_details;
	op->data.recv_status_on_client.error_string = &error_string;
	op++;

	err = grpc_call_start_batch(call, ops, (size_t)(op - ops), call, NULL);
	if (err != GRPC_CALL_OK) {
		ret = -EIO;
		goto out;
	}
	/* The call's deadline bounds this wait: the batch always completes. */
	ev = grpc_completion_queue_pluck(cq, call,
					 gpr_inf_future(GPR_CLOCK_REALTIME),
					 NULL);
	if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
		ret = -EIO;
		goto out;
	}

	*code = status;
	if (status != GRPC_STATUS_OK) {
		ret = csi_client_set_details(
			details, (const char *)GRPC_SLICE_START_PTR(status_details),
			GRPC_SLICE_LENGTH(status_details));
		goto out;
	}
	/* OK with no message, or one that is not the reply: a broken server. */
	if (!recv_buf) {
		*code = GRPC_STATUS_INTERNAL;
		ret = -ENOMEM;
		if (asprintf(details, "%s answered OK without a reply message",
			     method) >= 0)
			ret = 0;
		else
			*details = NULL;
		goto out;
	}
	*out = csi_client_unpack(recv_buf, out_desc, &len);
	if (!*out) {
		*code = GRPC_STATUS_INTERNAL;
		ret = -ENOMEM;
		if (asprintf(details,
			     "%s: the reply (%zu bytes) does not unpack as %s",
			     method, len, out_desc->name) >= 0)
			ret = 0;
		else
			*details = NULL;
		goto out;
	}
	ret = 0;

out:
	if (call)
		grpc_call_unref(call);
	if (cq) {
		/* A pluck queue says it is drained by returning SHUTDOWN. */
		grpc_completion_queue_shutdown(cq);
		while (grpc_completion_queue_pluck(
			       cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME),
			       NULL).type != GRPC_QUEUE_SHUTDOWN)
			;
		grpc_completion_queue_destroy(cq);
	}
	if (error_string)
		gpr_free((void *)error_string);
	grpc_slice_unref(status_details);
	grpc_metadata_array_destroy(&initial_md);
	grpc_metadata_array_destroy(&trailing_md);
	if (recv_buf)
		grpc_byte_buffer_destroy(recv_buf);
	if (send_buf)
		grpc_byte_buffer_destroy(send_buf);
	free(packed);
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
