// SPDX-License-Identifier: Apache-2.0
/*
 * stratactl's connection to the plugin: one unary call over the channel
 * opened on first use (client.c), with the progress line while it runs
 * on a terminal, and its error status printed as
 * "stratactl: CODE: message" with a hint where one helps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"
#include "ctl.h"

/*
 * One call, quiet: 0 with *code and *details (malloc'd; free it) when a
 * status arrived, *out set on CSI_OK; a negative errno when no call could
 * be made. A command with a `waiting` text shows it as progress.
 */
int ctl_call_quiet(struct ctl *ctl, const char *method,
			  const ProtobufCMessage *req,
			  const ProtobufCMessageDescriptor *out_desc,
			  ProtobufCMessage **out, enum csi_code *code,
			  char **details, int timeout_ms)
{
	struct ctl_poll poll = { .ctl = ctl };
	struct ctl_progress *pg = NULL;
	int ret;

	*out = NULL;
	*details = NULL;
	if (!ctl->client) {
		ret = csi_client_open(ctl->endpoint, &ctl->client);
		if (ret < 0)
			return ret;
	}
	if (ctl->cmd->waiting) {
		char what[256];

		snprintf(what, sizeof(what), "%s%s%s: %s", ctl->cmd->name,
			 ctl->a.npos ? " " : "", ctl->a.npos ? ctl->a.pos[0] : "",
			 ctl->cmd->waiting);
		pg = ctl_progress_start(what, ctl->cmd->progress, &poll);
	}
	ret = csi_client_call(ctl->client, method, req, out_desc, out, code,
			      details, timeout_ms);
	ctl_progress_stop(pg);
	csi_client_close(poll.client);
	return ret;
}

/* The error of a call that was made, on stderr, with a hint when useful. */
static void ctl_print_status(struct ctl *ctl, const char *method,
			     enum csi_code code, const char *details)
{
	fprintf(stderr, CTL_PROG ": %s: %s\n", csi_code_name(code),
		details && *details ? details : "(no message)");
	if (code == CSI_UNAVAILABLE)
		fprintf(stderr, CTL_PROG ": is a CSI plugin listening on %s?\n",
			ctl->endpoint);
	else if (code == CSI_DEADLINE_EXCEEDED)
		fprintf(stderr, CTL_PROG ": no reply to %s within %d ms (see --timeout)\n",
			method, ctl->timeout_ms);
}

/*
 * One call; prints the error itself. Returns CTL_EXIT_OK with *out set,
 * or the exit code to leave with.
 */
int ctl_call(struct ctl *ctl, const char *method,
		    const ProtobufCMessage *req,
		    const ProtobufCMessageDescriptor *out_desc,
		    ProtobufCMessage **out)
{
	enum csi_code code;
	char *details = NULL;
	int ret;

	ret = ctl_call_quiet(ctl, method, req, out_desc, out, &code, &details,
			     ctl->timeout_ms);
	if (ret < 0) {
		if (!ctl->client)
			fprintf(stderr, CTL_PROG ": cannot open %s: %s\n",
				ctl->endpoint, strerror(-ret));
		else
			fprintf(stderr, CTL_PROG ": %s on %s failed: %s\n",
				method, ctl->endpoint, strerror(-ret));
		return CTL_EXIT_FAIL;
	}
	if (code != CSI_OK) {
		ctl_print_status(ctl, method, code, details);
		free(details);
		return CTL_EXIT_FAIL;
	}
	free(details);
	return CTL_EXIT_OK;
}
