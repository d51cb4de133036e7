// SPDX-License-Identifier: Apache-2.0
/*
 * stratactl's JSON: a reply printed as one object, from the descriptors.
 *
 * Nothing here is written per message: ctl_json_message() walks the
 * protobuf-c descriptors, so field names are the proto's, enums are named,
 * maps become objects, bytes are base64, the wrappers and Timestamp print
 * as proto3's JSON mapping has them, and a field called "secrets" is never
 * printed, whatever a reply carries.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

/* messages nest: the walk recurses through field values */
static json_object *ctl_json_message(const ProtobufCMessage *m);

static size_t ctl_field_size(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_ENUM:
		return 4;
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_BOOL:
		return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	}
	return 0;
}

static json_object *ctl_json_base64(const ProtobufCBinaryData *b)
{
	static const char tab[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = 4 * ((b->len + 2) / 3), j = 0;
	json_object *o;
	char *s;

	s = malloc(n + 1);
	if (!s)
		ctl_oom();
	for (size_t i = 0; i < b->len; i += 3) {
		uint32_t v = (uint32_t)b->data[i] << 16;

		if (i + 1 < b->len)
			v |= (uint32_t)b->data[i + 1] << 8;
		if (i + 2 < b->len)
			v |= b->data[i + 2];
		s[j++] = tab[(v >> 18) & 63];
		s[j++] = tab[(v >> 12) & 63];
		s[j++] = i + 1 < b->len ? tab[(v >> 6) & 63] : '=';
		s[j++] = i + 2 < b->len ? tab[v & 63] : '=';
	}
	s[j] = '\0';
	o = json_object_new_string(s);
	free(s);
	return o;
}

/* google.protobuf.Timestamp as RFC 3339, as proto3's JSON mapping has it. */
static json_object *ctl_json_timestamp(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const ProtobufCFieldDescriptor *fs, *fn;
	char buf[64];
	struct tm tm;
	time_t secs;
	int32_t nanos;
	size_t n;

	fs = protobuf_c_message_descriptor_get_field_by_name(d, "seconds");
	fn = protobuf_c_message_descriptor_get_field_by_name(d, "nanos");
	if (!fs || !fn)
		return ctl_json_message(m);
	secs = (time_t)*(const int64_t *)((const char *)m + fs->offset);
	nanos = *(const int32_t *)((const char *)m + fn->offset);
	if (!gmtime_r(&secs, &tm))
		return json_object_new_int64((int64_t)secs);
	n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
	if (nanos > 0 && nanos < 1000000000)
		n += snprintf(buf + n, sizeof(buf) - n, ".%09d", nanos);
	snprintf(buf + n, sizeof(buf) - n, "Z");
	return json_object_new_string(buf);
}

/* One value of field f stored at p. */
static json_object *ctl_json_value(const ProtobufCFieldDescriptor *f,
				   const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32:
	case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return json_object_new_int(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32:
		return json_object_new_int64(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		return json_object_new_int64(*(const int64_t *)p);
	case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return json_object_new_uint64(*(const uint64_t *)p);
	case PROTOBUF_C_TYPE_FLOAT:
		return json_object_new_double(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE:
		return json_object_new_double(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL:
		return json_object_new_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
			f->descriptor, *(const int *)p);

		return ev ? json_object_new_string(ev->name) :
			    json_object_new_int(*(const int *)p);
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;

		return json_object_new_string(s ? s : "");
	}
	case PROTOBUF_C_TYPE_BYTES:
		return ctl_json_base64(p);
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
		const ProtobufCMessageDescriptor *d;

		if (!sub)
			return NULL;
		d = sub->descriptor;
		/* Wrappers print as the value they wrap, as proto3 JSON does. */
		if (strncmp(d->name, "google.protobuf.", 16) == 0) {
			if (strcmp(d->name, "google.protobuf.Timestamp") == 0)
				return ctl_json_timestamp(sub);
			if (d->n_fields == 1 &&
			    strcmp(d->fields[0].name, "value") == 0)
				return ctl_json_value(&d->fields[0],
						      (const char *)sub +
							      d->fields[0].offset);
		}
		return ctl_json_message(sub);
	}
	}
	return NULL;
}

/* protoc-c marks no map entries as such: a repeated "...Entry{key,value}" */
static bool ctl_field_is_map(const ProtobufCFieldDescriptor *f)
{
	const ProtobufCMessageDescriptor *d = f->descriptor;
	size_t len;

	if (f->label != PROTOBUF_C_LABEL_REPEATED ||
	    f->type != PROTOBUF_C_TYPE_MESSAGE || d->n_fields != 2)
		return false;
	len = strlen(d->name);
	return len > 5 && strcmp(d->name + len - 5, "Entry") == 0 &&
	       strcmp(d->fields[0].name, "key") == 0 &&
	       strcmp(d->fields[1].name, "value") == 0;
}

static json_object *ctl_json_message(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	json_object *obj = json_object_new_object();

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *base = (const char *)m;
		const void *p = base + f->offset;
		json_object *v = NULL;

		/* Never printed, whatever a reply carries. */
		if (strcmp(f->name, "secrets") == 0)
			continue;
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			if (*(const uint32_t *)(base + f->quantifier_offset) !=
			    f->id)
				continue;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
			   f->type != PROTOBUF_C_TYPE_MESSAGE &&
			   f->type != PROTOBUF_C_TYPE_STRING) {
			if (!*(const protobuf_c_boolean *)(base +
							   f->quantifier_offset))
				continue;
		}

		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			const char *arr = *(char *const *)p;
			size_t size = ctl_field_size(f);
			bool map = ctl_field_is_map(f);

			v = map ? json_object_new_object() :
				  json_object_new_array();
			for (size_t j = 0; j < n; j++) {
				const void *ep = arr + j * size;

				if (map) {
					const ProtobufCMessage *e =
						*(ProtobufCMessage *const *)ep;
					const ProtobufCMessageDescriptor *ed =
						f->descriptor;
					const char *key = *(char *const *)(
						(const char *)e + ed->fields[0].offset);

					json_object_object_add(
						v, key ? key : "",
						ctl_json_value(&ed->fields[1],
							       (const char *)e +
								       ed->fields[1].offset));
				} else {
					json_object_array_add(
						v, ctl_json_value(f, ep));
				}
			}
		} else {
			v = ctl_json_value(f, p);
			if (!v) /* an absent message */
				continue;
		}
		json_object_object_add(obj, f->name, v);
	}
	return obj;
}

void ctl_print_json(json_object *obj)
{
	puts(json_object_to_json_string_ext(
		obj, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
}

void ctl_print_reply_json(const ProtobufCMessage *m)
{
	json_object *obj = ctl_json_message(m);

	ctl_print_json(obj);
	json_object_put(obj);
}

/*
 * Appends the elements of the repeated field `field` of m, as JSON, to
 * the array `arr`: list-volumes --all merges its pages' entries so.
 */
void ctl_json_append(json_object *arr, const ProtobufCMessage *m,
		     const char *field)
{
	json_object *o = ctl_json_message(m);
	json_object *elems = json_object_object_get(o, field);

	for (size_t i = 0; i < json_object_array_length(elems); i++)
		json_object_array_add(arr,
			json_object_get(json_object_array_get_idx(elems, i)));
	json_object_put(o);
}
