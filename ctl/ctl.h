/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stratactl internals: what its files share.
 *
 * stratactl.c reads the command line, builds the request, makes the call
 * and prints the reply as readable lines; ctl_json.c prints a reply as
 * JSON instead (--json); ctl_volume.c prints the Admin service's volume
 * states; ctl_progress.c shows a long call's progress on a terminal.
 */
#ifndef STRATA_CTL_H
#define STRATA_CTL_H

#include <stdbool.h>

#include <json-c/json.h>
#include <protobuf-c/protobuf-c.h>

#include "admin.pb-c.h"

#define CTL_PROG "stratactl"

/* stratactl.c */
void ctl_oom(void) __attribute__((noreturn));

/* ctl_json.c */
void ctl_json_append(json_object *arr, const ProtobufCMessage *m,
		     const char *field);
void ctl_print_json(json_object *obj);
void ctl_print_reply_json(const ProtobufCMessage *m);

/* ctl_volume.c */
void ctl_print_volume_states(const Strata__V1__ListVolumeStatesResponse *r);
void ctl_print_volume_state(const Strata__V1__VolumeState *s);

/* ctl_progress.c: NULL when stderr is no terminal (then all are no-ops) */
struct ctl_progress;
struct ctl_progress *ctl_progress_start(const char *what);
void ctl_progress_set(struct ctl_progress *pg, const char *what);
void ctl_progress_stop(struct ctl_progress *pg);

#endif
