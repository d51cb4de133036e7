// SPDX-License-Identifier: Apache-2.0
/*
 * The NUL check on request bytes (csi_wire_strings_check, csi/validate.c)
 * next to protobuf-c's own unpacking, as server.c runs them.
 *
 * The first byte picks one of the request types the plugin serves (from
 * its method tables); the rest is that request's wire bytes. For each:
 *  - the check answers 0, -EINVAL (a string holds a NUL) or -EBADMSG,
 *    and -EBADMSG only for bytes protobuf-c refuses too;
 *  - -EINVAL only when there is a NUL byte somewhere;
 *  - for a request that unpacks and passes, the same request with one
 *    more string field holding a NUL, at any depth the input chooses
 *    (nested messages, map entries), still unpacks, and is refused:
 *    protobuf-c would hand that string over cut short at the NUL.
 */
#include "csi.h"
#include "fuzz.h"

#define FZ_MAX_TYPES 64
#define FZ_MAX_DEPTH 8

static const ProtobufCMessageDescriptor *fz_types[FZ_MAX_TYPES];
static int fz_ntypes;

static void fz_add_types(const struct csi_method *m)
{
	for (; m->path; m++) {
		int i;

		for (i = 0; i < fz_ntypes && fz_types[i] != m->input; i++)
			;
		if (i == fz_ntypes && fz_ntypes < FZ_MAX_TYPES)
			fz_types[fz_ntypes++] = m->input;
	}
}

/* A little buffer of wire bytes, built back to front (inner first). */
struct fz_buf {
	uint8_t b[256];
	size_t start;	/* the bytes are b[start..] */
};

static bool fz_prepend(struct fz_buf *w, const void *p, size_t n)
{
	if (n > w->start)
		return false;
	w->start -= n;
	memcpy(w->b + w->start, p, n);
	return true;
}

static bool fz_prepend_varint(struct fz_buf *w, uint64_t v)
{
	uint8_t tmp[10];
	size_t n = 0;

	do {
		tmp[n] = v & 0x7f;
		v >>= 7;
		if (v)
			tmp[n] |= 0x80;
		n++;
	} while (v);
	return fz_prepend(w, tmp, n);
}

/* A length-delimited field: key, length, then what w holds already. */
static bool fz_wrap(struct fz_buf *w, uint32_t field)
{
	size_t len = sizeof(w->b) - w->start;

	return fz_prepend_varint(w, len) &&
	       fz_prepend_varint(w, (uint64_t)field << 3 | 2);
}

/*
 * A string field holding a NUL somewhere below descriptor d, reached
 * through the message fields the selector bytes pick. False when the
 * chosen path has no string field at its end.
 */
static bool fz_nul_field(const ProtobufCMessageDescriptor *d,
			 const uint8_t *sel, size_t nsel, int depth,
			 struct fz_buf *w)
{
	const ProtobufCFieldDescriptor *pick[64];
	unsigned n = 0;

	for (unsigned i = 0; i < d->n_fields && n < 64; i++)
		if (d->fields[i].type == PROTOBUF_C_TYPE_STRING ||
		    (d->fields[i].type == PROTOBUF_C_TYPE_MESSAGE &&
		     depth < FZ_MAX_DEPTH))
			pick[n++] = &d->fields[i];
	if (!n)
		return false;
	if (nsel)
		pick[0] = pick[sel[0] % n];
	if (pick[0]->type == PROTOBUF_C_TYPE_STRING)
		return fz_prepend(w, "x\0y", 3) && fz_wrap(w, pick[0]->id);
	return fz_nul_field(pick[0]->descriptor, nsel ? sel + 1 : sel,
			    nsel ? nsel - 1 : 0, depth + 1, w) &&
	       fz_wrap(w, pick[0]->id);
}

/* The request with a NUL-holding string appended must be refused. */
static void fz_check_refused(const ProtobufCMessageDescriptor *d,
			     const uint8_t *body, size_t len)
{
	struct fz_buf w = { .start = sizeof(w.b) };
	ProtobufCMessage *msg;
	size_t extra;
	uint8_t *all;

	/* the selector: the request's last bytes, so mutations move it */
	if (!fz_nul_field(d, body + len - (len < 8 ? len : 8),
			  len < 8 ? len : 8, 0, &w))
		return;
	extra = sizeof(w.b) - w.start;
	all = malloc(len + extra);
	if (!all)
		abort();
	memcpy(all, body, len);
	memcpy(all + len, w.b + w.start, extra);
	msg = protobuf_c_message_unpack(d, NULL, len + extra, all);
	FZ_CHECK(msg != NULL);
	FZ_CHECK(csi_wire_strings_check(d, all, len + extra, 0) == -EINVAL);
	protobuf_c_message_free_unpacked(msg, NULL);
	free(all);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fz_quiet();
	fz_add_types(csi_identity_methods);
	fz_add_types(csi_controller_methods);
	fz_add_types(csi_node_methods);
	fz_add_types(csi_snapshot_methods);
	FZ_CHECK(fz_ntypes > 0);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const ProtobufCMessageDescriptor *d;
	ProtobufCMessage *msg;
	const uint8_t *body;
	size_t len;
	int ret;

	if (size < 1)
		return 0;
	d = fz_types[data[0] % fz_ntypes];
	body = data + 1;
	len = size - 1;
	msg = protobuf_c_message_unpack(d, NULL, len, body);
	ret = csi_wire_strings_check(d, body, len, 0);
	FZ_CHECK(ret == 0 || ret == -EINVAL || ret == -EBADMSG);
	if (ret == -EINVAL)
		FZ_CHECK(memchr(body, 0, len) != NULL);
	if (!msg)
		return 0;
	FZ_CHECK(ret != -EBADMSG);
	protobuf_c_message_free_unpacked(msg, NULL);
	if (ret == 0)
		fz_check_refused(d, body, len);
	return 0;
}
