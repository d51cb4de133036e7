// SPDX-License-Identifier: Apache-2.0
/*
 * The readable output of `stratactl volume list` and `volume inspect`
 * (strata.v1.Admin ListVolumeStates and InspectVolume): a table with one
 * line per volume, and every field of one volume as `key value` lines,
 * as the other commands print. --json goes through ctl_json.c instead.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "admin.pb-c.h"
#include "ctl.h"

/* "3d4h", "2h5m", "4m12s", "9s": two units are enough to tell ages apart */
static void ctl_fmt_age(char *buf, size_t size, int64_t s)
{
	if (s >= 86400)
		snprintf(buf, size, "%" PRId64 "d%" PRId64 "h", s / 86400,
			 s % 86400 / 3600);
	else if (s >= 3600)
		snprintf(buf, size, "%" PRId64 "h%" PRId64 "m", s / 3600,
			 s % 3600 / 60);
	else if (s >= 60)
		snprintf(buf, size, "%" PRId64 "m%" PRId64 "s", s / 60, s % 60);
	else
		snprintf(buf, size, "%" PRId64 "s", s);
}

/* Bytes in the units --capacity takes: "512", "4.0Ki", "1.5Gi" */
void ctl_fmt_size(char *buf, size_t size, int64_t bytes)
{
	static const char units[] = "KMGTPE";
	double v = (double)bytes;
	int u = -1;

	if (bytes < 1024) {
		snprintf(buf, size, "%" PRId64, bytes);
		return;
	}
	while (v >= 1024 && u < (int)sizeof(units) - 2) {
		v /= 1024;
		u++;
	}
	snprintf(buf, size, "%.1f%ci", v, units[u]);
}

/* The chain as CreateVolume's volume_context names it; "-": none. */
static void ctl_fmt_layers(char *buf, size_t size,
			   const Strata__V1__VolumeState *s)
{
	if (s->n_layers)
		csi_chain_format(buf, size, s->layers, s->n_layers);
	else
		snprintf(buf, size, "-");
}

void ctl_print_volume_states(const Strata__V1__ListVolumeStatesResponse *r)
{
	printf("%-35s %-9s %-7s %-7s %-8s %-7s %-20s %s\n", "VOLUME", "STATE",
	       "PID", "UPTIME", "RESTARTS", "USED", "LAYERS", "CONDITION");
	for (size_t i = 0; i < r->n_volumes; i++) {
		const Strata__V1__VolumeState *s = r->volumes[i];
		char pid[16] = "-", up[32] = "-", used[32], layers[256];

		if (s->daemon_pid) {
			snprintf(pid, sizeof(pid), "%d", (int)s->daemon_pid);
			ctl_fmt_age(up, sizeof(up), s->uptime_seconds);
		}
		ctl_fmt_size(used, sizeof(used), s->used_bytes);
		ctl_fmt_layers(layers, sizeof(layers), s);
		printf("%-35s %-9s %-7s %-7s %-8d %-7s %-20s %s\n",
		       s->volume_id, s->state, pid, up, (int)s->restarts, used,
		       layers, s->abnormal ? s->condition : "normal");
	}
}

void ctl_print_volume_state(const Strata__V1__VolumeState *s)
{
	char layers[1024], age[32];

	ctl_fmt_layers(layers, sizeof(layers), s);
	printf("volume_id %s\n", s->volume_id);
	printf("name %s\n", s->name);
	printf("state %s\n", s->state);
	printf("created %s\n", s->created);
	printf("layers %s\n", layers);
	printf("capacity_bytes %" PRId64 "\n", s->capacity_bytes);
	printf("used_bytes %" PRId64 "\n", s->used_bytes);
	if (*s->staging_path)
		printf("staging_path %s\n", s->staging_path);
	for (size_t i = 0; i < s->n_targets; i++)
		printf("target %s%s\n", s->targets[i]->path,
		       s->targets[i]->readonly ? " read-only" : "");
	if (s->daemon_pid) {
		ctl_fmt_age(age, sizeof(age), s->uptime_seconds);
		printf("daemon_pid %d\n", (int)s->daemon_pid);
		printf("uptime %s\n", age);
	}
	if (*s->transport)
		printf("transport %s\n", !strcmp(s->transport, "uring") ? "io_uring" :
		       !strcmp(s->transport, "dev") ? "/dev/fuse" : s->transport);
	if (*s->passthrough)
		printf("passthrough %s\n", s->passthrough);
	if (*s->staging_path)
		printf("restarts %d\n", (int)s->restarts);
	for (size_t i = 0; i < s->n_copy_ups; i++) {
		const Strata__V1__CopyUp *c = s->copy_ups[i];
		char done[32], total[32];

		ctl_fmt_size(done, sizeof(done), c->done_bytes);
		ctl_fmt_size(total, sizeof(total), c->total_bytes);
		printf("copy_up %s %s of %s (%d%%)\n", c->path, done, total,
		       c->total_bytes ? (int)(c->done_bytes * 100 / c->total_bytes) : 0);
	}
	if (s->abnormal)
		printf("condition abnormal: %s\n", s->condition);
	else
		printf("condition normal\n");
}
