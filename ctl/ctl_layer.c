// SPDX-License-Identifier: Apache-2.0
/*
 * `stratactl layer import|list|rm` (strata.v1.Admin ImportLayer,
 * ListLayers, DeleteLayer): the request ImportLayer needs beyond its
 * table entry, and the readable replies. The plugin reads the archive,
 * not stratactl, so a relative FILE is made absolute here against the
 * caller's working directory; whether it exists is the plugin's to say,
 * in its own mount namespace.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"
#include "ctl.h"

int ctl_build_import_layer(struct ctl *ctl, ProtobufCMessage *req)
{
	Strata__V1__ImportLayerRequest *r = (Strata__V1__ImportLayerRequest *)req;
	const char *file = ctl->a.pos[1];
	char cwd[PATH_MAX], *path;
	size_t len;

	r->name = ctl->a.pos[0];
	if (file[0] == '/') {
		r->path = (char *)file;
		return 0;
	}
	if (!getcwd(cwd, sizeof(cwd)))
		return ctl_usage_error(ctl, "FILE '%s' is relative, and the working directory cannot be read (%s): give an absolute path",
				       file, strerror(errno));
	len = strlen(cwd) + strlen(file) + 2;
	path = ctl_alloc(ctl, len);
	snprintf(path, len, "%s%s%s", cwd, strcmp(cwd, "/") ? "/" : "", file);
	r->path = path;
	return 0;
}

static void ctl_print_layer(const Strata__V1__Layer *l)
{
	char size[32];

	ctl_fmt_size(size, sizeof(size), l->size_bytes);
	printf("%-32s %-8s %-8" PRId64 " ", l->name, size, l->entries);
	for (size_t i = 0; i < l->n_volumes; i++)
		printf("%s%s", i ? "," : "", l->volumes[i]);
	printf("%s\n", l->n_volumes ? "" : "-");
}

void ctl_text_import_layer(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Strata__V1__ImportLayerResponse *r =
		(const Strata__V1__ImportLayerResponse *)reply;
	char size[32];

	if (!r->layer)
		return;
	ctl_fmt_size(size, sizeof(size), r->layer->size_bytes);
	printf("imported layer %s: %" PRId64 " entries, %s on disk\n",
	       r->layer->name, r->layer->entries, size);
}

/*
 * The progress line of `layer import NAME FILE`: how much of the archive
 * the plugin has read, from ListLayers' imports in flight.
 */
int ctl_progress_import(void *arg, char *buf, size_t size)
{
	struct ctl_poll *poll = arg;
	const char *name = poll->ctl->a.pos[0];
	Strata__V1__ListLayersRequest req = STRATA__V1__LIST_LAYERS_REQUEST__INIT;
	Strata__V1__ListLayersResponse *r = NULL;
	ProtobufCMessage *out = NULL;
	enum csi_code code;
	char *details = NULL;
	int ret = -ENOENT;

	if (!poll->client &&
	    csi_client_open(poll->ctl->endpoint, &poll->client) < 0)
		return -ENOTCONN;
	if (csi_client_call(poll->client, "/strata.v1.Admin/ListLayers",
			    &req.base, &strata__v1__list_layers_response__descriptor,
			    &out, &code, &details, 5000) < 0 || code != CSI_OK)
		goto out;
	r = (Strata__V1__ListLayersResponse *)out;
	for (size_t i = 0; i < r->n_importing; i++) {
		const Strata__V1__LayerImport *im = r->importing[i];
		char done[32], total[32];

		if (strcmp(im->name, name) || im->total_bytes <= 0)
			continue;
		ctl_fmt_size(done, sizeof(done), im->done_bytes);
		ctl_fmt_size(total, sizeof(total), im->total_bytes);
		snprintf(buf, size, "layer import %s: extracting in the plugin, %s of %s read (%d%%)",
			 name, done, total,
			 (int)(im->done_bytes * 100 / im->total_bytes));
		ret = 0;
	}
out:
	if (out)
		protobuf_c_message_free_unpacked(out, NULL);
	free(details);
	return ret;
}

void ctl_text_list_layers(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Strata__V1__ListLayersResponse *r =
		(const Strata__V1__ListLayersResponse *)reply;

	printf("%-32s %-8s %-8s %s\n", "LAYER", "SIZE", "ENTRIES", "VOLUMES");
	for (size_t i = 0; i < r->n_layers; i++)
		ctl_print_layer(r->layers[i]);
	for (size_t i = 0; i < r->n_importing; i++) {
		const Strata__V1__LayerImport *im = r->importing[i];
		char done[32], total[32];

		ctl_fmt_size(done, sizeof(done), im->done_bytes);
		ctl_fmt_size(total, sizeof(total), im->total_bytes);
		printf("%-32s importing: %s of %s read\n", im->name, done, total);
	}
}

void ctl_text_delete_layer(struct ctl *ctl, const ProtobufCMessage *reply)
{
	printf("removed layer %s\n", ctl->a.pos[0]);
}
