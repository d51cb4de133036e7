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

void ctl_text_list_layers(struct ctl *ctl, const ProtobufCMessage *reply)
{
	const Strata__V1__ListLayersResponse *r =
		(const Strata__V1__ListLayersResponse *)reply;

	printf("%-32s %-8s %-8s %s\n", "LAYER", "SIZE", "ENTRIES", "VOLUMES");
	for (size_t i = 0; i < r->n_layers; i++)
		ctl_print_layer(r->layers[i]);
}

void ctl_text_delete_layer(struct ctl *ctl, const ProtobufCMessage *reply)
{
	printf("removed layer %s\n", ctl->a.pos[0]);
}
