// SPDX-License-Identifier: Apache-2.0
/*
 * Request checks shared by the services. Everything a caller sends is
 * checked here before it can name a path: volume ids, layer names, the
 * volume capability and its mount flags.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "csi.h"

/* An id as csi_store_new_id makes it with PREFIX, of either kind. */
static bool csi_id_valid(const char *id, const char *prefix)
{
	if (strlen(id) != CSI_VOLUME_ID_LEN || strncmp(id, prefix, 3) != 0)
		return false;
	for (const char *c = id + 3; *c; c++)
		if (!isdigit((unsigned char)*c) && !(*c >= 'a' && *c <= 'f'))
			return false;
	return true;
}

bool csi_volume_id_valid(const char *id)
{
	return csi_id_valid(id, CSI_VOLUME_ID_PREFIX);
}

bool csi_snapshot_id_valid(const char *id)
{
	return csi_id_valid(id, CSI_SNAPSHOT_ID_PREFIX);
}

/*
 * A layer name is a single path component made of a conservative
 * alphabet: it can be neither "..", nor hidden, nor a path, nor anything a
 * shell or the stratafs option syntax (',', ':', '\\') treats specially.
 */
int csi_layer_name_check(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > CSI_LAYER_NAME_MAX || !isalnum((unsigned char)name[0]))
		return -EINVAL;
	for (const char *c = name; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '.' && *c != '_' &&
		    *c != '-')
			return -EINVAL;
	if (strstr(name, ".."))
		return -EINVAL;
	return 0;
}

void csi_free_strv(char **v, int n)
{
	for (int i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

/* Appends a copy of S to *V, of *N entries: 0, or -ENOMEM (*V intact). */
int csi_strv_push(char ***v, int *n, const char *s)
{
	char **nv = realloc(*v, sizeof(**v) * (*n + 1));

	if (!nv)
		return -ENOMEM;
	*v = nv;
	nv[*n] = strdup(s);
	if (!nv[*n])
		return -ENOMEM;
	(*n)++;
	return 0;
}

static int csi_strv_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts V, of N entries, in strcmp order: listings answer in name order. */
void csi_strv_sort(char **v, int n)
{
	if (n)
		qsort(v, n, sizeof(*v), csi_strv_cmp);
}

/* Splits "a,b" into names; an empty element is an error, not skipped. */
int csi_split_layers(const char *list, char ***names, int *count)
{
	char **v = NULL;
	int n = 0;
	const char *p = list;

	*names = NULL;
	*count = 0;
	if (!*list)
		return 0;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char **nv;

		if (n == CSI_MAX_LAYERS)
			goto out_too_many;
		nv = realloc(v, sizeof(*v) * (n + 1));
		if (!nv)
			goto out_nomem;
		v = nv;
		v[n] = strndup(p, len);
		if (!v[n])
			goto out_nomem;
		n++;
		if (!end)
			break;
		p = end + 1;
	}
	*names = v;
	*count = n;
	return 0;

out_too_many:
	csi_free_strv(v, n);
	return -E2BIG;
out_nomem:
	csi_free_strv(v, n);
	return -ENOMEM;
}

/* Map fields keep wire order and the last duplicate wins, as in proto3. */
const char *csi_map_get(size_t n, void *const *entries, const char *key)
{
	for (size_t i = n; i-- > 0;) {
		const struct csi_map_entry *e = entries[i];

		if (e->key && !strcmp(e->key, key))
			return e->value;
	}
	return NULL;
}

static bool csi_mode_supported(int mode)
{
	switch (mode) {
	case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_WRITER:
	case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_READER_ONLY:
	case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_SINGLE_WRITER:
	case CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_MULTI_WRITER:
		return true;
	default:
		return false;
	}
}

/* 0 when supported, else -EINVAL with the reason in `why`. */
int csi_capability_check(const Csi__V1__VolumeCapability *cap, char *why,
			 size_t size)
{
	const Csi__V1__VolumeCapability__MountVolume *m;
	char *canon = NULL;
	unsigned long flags;
	int ret;

	if (cap->access_type_case == CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_BLOCK) {
		snprintf(why, size, "block access is not supported: a Strata volume is a filesystem (use the mount access type)");
		return -EINVAL;
	}
	if (cap->access_type_case != CSI__V1__VOLUME_CAPABILITY__ACCESS_TYPE_MOUNT) {
		snprintf(why, size, "volume_capability.access_type is required (mount)");
		return -EINVAL;
	}
	if (!cap->access_mode) {
		snprintf(why, size, "volume_capability.access_mode is required");
		return -EINVAL;
	}
	if (!csi_mode_supported(cap->access_mode->mode)) {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
			&csi__v1__volume_capability__access_mode__mode__descriptor,
			cap->access_mode->mode);

		snprintf(why, size, "access mode %s is not supported: a Strata volume lives on one node (supported: SINGLE_NODE_WRITER, SINGLE_NODE_READER_ONLY, SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER)",
			 v ? v->name : "(unknown)");
		return -EINVAL;
	}
	m = cap->mount;
	if (m->fs_type[0] && strcmp(m->fs_type, "stratafs") &&
	    strcmp(m->fs_type, "fuse.stratafs")) {
		snprintf(why, size, "fs_type '%.64s' is not supported (leave it empty, or give stratafs)",
			 m->fs_type);
		return -EINVAL;
	}
	ret = csi_mount_flags(cap, &flags, &canon, why, size);
	free(canon);
	return ret;
}

bool csi_capability_readonly(const Csi__V1__VolumeCapability *cap)
{
	return cap->access_mode &&
	       cap->access_mode->mode ==
		       CSI__V1__VOLUME_CAPABILITY__ACCESS_MODE__MODE__SINGLE_NODE_READER_ONLY;
}

static const struct {
	const char *name;
	unsigned long flag;
} csi_flag_table[] = {
	{ "nodev", MS_NODEV },	     { "nodiratime", MS_NODIRATIME },
	{ "noatime", MS_NOATIME },   { "noexec", MS_NOEXEC },
	{ "nosuid", MS_NOSUID },     { "relatime", MS_RELATIME },
	{ "ro", MS_RDONLY },
};

/*
 * The mount flags a bind mount can carry, as MS_* bits and as a canonical
 * string (sorted, each once) that says whether two requests agree. Flags
 * may hold secrets, so `why` never quotes one beyond its first characters
 * and nothing here is logged.
 */
int csi_mount_flags(const Csi__V1__VolumeCapability *cap, unsigned long *flags,
		    char **canon, char *why, size_t size)
{
	const Csi__V1__VolumeCapability__MountVolume *m = cap->mount;
	const size_t nt = sizeof(csi_flag_table) / sizeof(csi_flag_table[0]);
	char buf[256] = "";
	size_t len = 0;

	*flags = 0;
	*canon = NULL;
	for (size_t i = 0; m && i < m->n_mount_flags; i++) {
		size_t t;

		for (t = 0; t < nt; t++)
			if (!strcmp(m->mount_flags[i], csi_flag_table[t].name))
				break;
		if (t == nt) {
			snprintf(why, size, "mount flag '%.16s' is not supported (supported: ro, noexec, nosuid, nodev, noatime, relatime, nodiratime)",
				 m->mount_flags[i]);
			return -EINVAL;
		}
		*flags |= csi_flag_table[t].flag;
	}
	/* a reader's mount is read-only, at the staging path too */
	if (csi_capability_readonly(cap))
		*flags |= MS_RDONLY;
	for (size_t t = 0; t < nt; t++)
		if (*flags & csi_flag_table[t].flag)
			len += snprintf(buf + len, sizeof(buf) - len, "%s%s",
					len ? "," : "", csi_flag_table[t].name);
	if (m && m->volume_mount_group[0]) {
		char *end;
		unsigned long gid;

		errno = 0;
		gid = strtoul(m->volume_mount_group, &end, 10);
		if (!isdigit((unsigned char)m->volume_mount_group[0]) || *end ||
		    errno || gid >= UINT32_MAX) {
			snprintf(why, size, "volume_mount_group '%.32s' is not a numeric group id",
				 m->volume_mount_group);
			return -EINVAL;
		}
		snprintf(buf + len, sizeof(buf) - len, "%sgroup=%lu",
			 len ? "," : "", gid);
	}
	*canon = strdup(buf);
	return *canon ? 0 : -ENOMEM;
}

/* The MS_* bits of a canonical flag string stored in a node record. */
unsigned long csi_flags_from_canon(const char *canon)
{
	const size_t nt = sizeof(csi_flag_table) / sizeof(csi_flag_table[0]);
	unsigned long flags = 0;
	const char *p = canon;

	while (p && *p) {
		size_t len = strcspn(p, ",");

		for (size_t t = 0; t < nt; t++)
			if (strlen(csi_flag_table[t].name) == len &&
			    !strncmp(p, csi_flag_table[t].name, len))
				flags |= csi_flag_table[t].flag;
		p += len;
		if (*p)
			p++;
	}
	return flags;
}

/*
 * A staging or target path as the Node service takes it: absolute,
 * canonical (what is checked is what gets used), printable, and short
 * enough for what the plugin adds to it.
 */
int csi_path_check(const char *path, char *why, size_t size)
{
	const char *c;

	if (path[0] != '/') {
		snprintf(why, size, "'%.200s' is not an absolute path", path);
		return -EINVAL;
	}
	if (strlen(path) >= PATH_MAX - 64) {
		snprintf(why, size, "the path is longer than %d bytes",
			 PATH_MAX - 64);
		return -EINVAL;
	}
	if (!path[1]) {
		snprintf(why, size, "'/' cannot be mounted on");
		return -EINVAL;
	}
	for (c = path; *c; c++) {
		if ((unsigned char)*c < 0x20 || *c == 0x7f) {
			snprintf(why, size, "the path holds a control character");
			return -EINVAL;
		}
		if (c[0] != '/')
			continue;
		/* each component: not empty, not ".", not ".." */
		if (c[1] == '/' || !c[1] ||
		    (c[1] == '.' && (c[2] == '/' || !c[2])) ||
		    (c[1] == '.' && c[2] == '.' && (c[3] == '/' || !c[3]))) {
			snprintf(why, size,
				 "'%.200s' is not canonical (empty, '.' or '..' components, or a trailing '/')",
				 path);
			return -EINVAL;
		}
	}
	return 0;
}

/*
 * The volume options a StorageClass (parameters) or an inline volume
 * (volume_context) may give: "layers", left to csi_layers_check, and
 * "passthrough", "true" or "false" (the default). Keys under
 * csi.storage.k8s.io/ are the CO's own metadata, never ours.
 */
int csi_volume_options_check(size_t n, void *const *entries, const char *what,
			     bool *passthrough, char *why, size_t size)
{
	static const char k8s[] = "csi.storage.k8s.io/";
	const char *pt;

	for (size_t i = 0; i < n; i++) {
		const char *k = ((const struct csi_map_entry *)entries[i])->key;

		if (strcmp(k, "layers") && strcmp(k, "passthrough") &&
		    strncmp(k, k8s, sizeof(k8s) - 1)) {
			snprintf(why, size, "unknown %s '%.64s' (Strata takes: layers, passthrough)",
				 what, k);
			return -EINVAL;
		}
	}
	pt = csi_map_get(n, entries, "passthrough");
	*passthrough = pt && !strcmp(pt, "true");
	if (pt && !*passthrough && strcmp(pt, "false")) {
		snprintf(why, size, "passthrough: '%.32s' is neither true nor false", pt);
		return -EINVAL;
	}
	return 0;
}

static int csi_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (*p == end)
			return -EBADMSG;
		*v |= (uint64_t)(**p & 0x7f) << shift;
		if (!(*(*p)++ & 0x80))
			return 0;
	}
	return -EBADMSG;
}

/*
 * protobuf-c hands strings over as C strings, so a NUL inside one would
 * cut it short without a word ("base\0/../x" read as "base"). This walks
 * the request's wire bytes with its descriptor and refuses a string that
 * holds a NUL, in nested messages and map entries too. Run after a
 * successful unpack, which already vouched for the framing.
 */
int csi_wire_strings_check(const ProtobufCMessageDescriptor *d,
			   const uint8_t *data, size_t len, int depth)
{
	const uint8_t *p = data, *end = data + len;

	if (depth > 32)
		return -EBADMSG;
	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, n;
		int ret;

		if (csi_varint(&p, end, &key))
			return -EBADMSG;
		switch (key & 7) {
		case 0:
			if (csi_varint(&p, end, &n))
				return -EBADMSG;
			break;
		case 1:
		case 5:
			n = (key & 7) == 1 ? 8 : 4;
			if ((uint64_t)(end - p) < n)
				return -EBADMSG;
			p += n;
			break;
		case 2:
			if (csi_varint(&p, end, &n) || n > (uint64_t)(end - p))
				return -EBADMSG;
			f = protobuf_c_message_descriptor_get_field(d, key >> 3);
			if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, n))
				return -EINVAL;
			if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
				ret = csi_wire_strings_check(f->descriptor, p, n,
							     depth + 1);
				if (ret)
					return ret;
			}
			p += n;
			break;
		default:
			return -EBADMSG;
		}
	}
	return 0;
}
