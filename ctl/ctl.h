/*
 * stratactl internals: what its files share.
 *
 * stratactl.c reads the command line, builds the request, makes the call
 * and prints the reply as readable lines; ctl_json.c prints a reply as
 * JSON instead (--json).
 */
#ifndef STRATA_CTL_H
#define STRATA_CTL_H

#include <json-c/json.h>
#include <protobuf-c/protobuf-c.h>

#define CTL_PROG "stratactl"

/* stratactl.c */
void ctl_oom(void) __attribute__((noreturn));

/* ctl_json.c */
void ctl_json_append(json_object *arr, const ProtobufCMessage *m,
		     const char *field);
void ctl_print_json(json_object *obj);
void ctl_print_reply_json(const ProtobufCMessage *m);

#endif
