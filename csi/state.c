// SPDX-License-Identifier: Apache-2.0
/*
 * Node state: node/<id>.json says where a volume is staged, which daemon
 * serves it, and where it is published. It is what lets a restarted plugin
 * find and keep serving the volumes its predecessor set up.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "csi.h"

void csi_state_free(struct csi_node_vol *n)
{
	free(n->staging);
	free(n->stage_flags);
	for (int i = 0; i < n->ntargets; i++) {
		free(n->targets[i].path);
		free(n->targets[i].flags);
	}
	free(n->targets);
	memset(n, 0, sizeof(*n));
}

static char *csi_dup_or_empty(const char *s)
{
	return strdup(s ? s : "");
}

static bool csi_json_bool(json_object *o, const char *key)
{
	json_object *v;

	return json_object_object_get_ex(o, key, &v) &&
	       json_object_get_boolean(v);
}

/* {"id": unique mount id, "dev": "major:minor"}; absent: no mount. */
static int csi_mnt_parse(json_object *o, const char *key, struct csi_mnt *m)
{
	unsigned int maj, min;
	json_object *v;
	const char *dev;

	m->id = 0;
	m->dev = 0;
	if (!json_object_object_get_ex(o, key, &v))
		return 0;
	dev = csi_json_str(v, "dev");
	if (!dev || sscanf(dev, "%u:%u", &maj, &min) != 2 ||
	    csi_json_int(v, "id") <= 0)
		return -EBADMSG;
	m->id = (uint64_t)csi_json_int(v, "id");
	m->dev = makedev(maj, min);
	return 0;
}

static void csi_mnt_save(json_object *o, const char *key,
			 const struct csi_mnt *m)
{
	json_object *v;
	char dev[32];

	if (!m->id)
		return;
	v = json_object_new_object();
	snprintf(dev, sizeof(dev), "%u:%u", major(m->dev), minor(m->dev));
	json_object_object_add(v, "id", json_object_new_int64((int64_t)m->id));
	json_object_object_add(v, "dev", json_object_new_string(dev));
	json_object_object_add(o, key, v);
}

/* A record names paths the Node service would act on: check them as such. */
static bool csi_state_path_ok(const char *path)
{
	char why[256];

	return path && !csi_path_check(path, why, sizeof(why));
}

static int csi_state_parse_target(struct csi_node_vol *n, json_object *t)
{
	const char *path = csi_json_str(t, "path");
	struct csi_target *nt;
	int ret;

	if (!csi_state_path_ok(path))
		return -EBADMSG;
	ret = csi_state_add_target(n, path, csi_json_bool(t, "readonly"),
				   csi_json_str(t, "flags"));
	if (ret)
		return ret;
	nt = &n->targets[n->ntargets - 1];
	nt->mode = (int)csi_json_int(t, "mode");
	nt->created = csi_json_bool(t, "created");
	return csi_mnt_parse(t, "mount", &nt->mnt);
}

static int csi_state_parse(json_object *o, struct csi_node_vol *n)
{
	const char *id = csi_json_str(o, "volume_id");
	const char *staging = csi_json_str(o, "staging_path");
	json_object *targets;
	int ret;

	if (!id || !csi_volume_id_valid(id) || !csi_state_path_ok(staging))
		return -EBADMSG;
	memcpy(n->id, id, sizeof(n->id));
	n->staging = strdup(staging);
	n->stage_flags = csi_dup_or_empty(csi_json_str(o, "stage_flags"));
	n->staging_created = csi_json_bool(o, "staging_created");
	n->pid = (pid_t)csi_json_int(o, "pid");
	n->starttime = (unsigned long long)csi_json_int(o, "starttime");
	/* absent from records written before it was counted: 0 */
	n->restarts = (unsigned)csi_json_int(o, "restarts");
	if (!n->staging || !n->stage_flags)
		return -ENOMEM;
	ret = csi_mnt_parse(o, "mount", &n->mnt);
	if (!ret)
		ret = csi_mnt_parse(o, "replacing", &n->prev);
	if (ret)
		return ret;
	if (!json_object_object_get_ex(o, "targets", &targets))
		return 0;
	if (!json_object_is_type(targets, json_type_array))
		return -EBADMSG;
	for (size_t i = 0; i < json_object_array_length(targets); i++) {
		ret = csi_state_parse_target(n, json_object_array_get_idx(targets, i));
		if (ret)
			return ret;
	}
	return 0;
}

int csi_state_load(struct csi_store *s, const char *id, struct csi_node_vol *n)
{
	char name[64];
	json_object *o;
	int ret;

	memset(n, 0, sizeof(*n));
	if (!csi_volume_id_valid(id))
		return -ENOENT;
	snprintf(name, sizeof(name), "%s.json", id);
	ret = csi_record_read(s->node_fd, name, &o);
	if (ret)
		return ret;
	ret = csi_state_parse(o, n);
	json_object_put(o);
	if (!ret && strcmp(n->id, id))
		ret = -EBADMSG;
	if (ret)
		csi_state_free(n);
	return ret;
}

int csi_state_save(struct csi_store *s, const struct csi_node_vol *n)
{
	json_object *o = json_object_new_object(), *targets;
	char name[64];
	int ret;

	if (!o)
		return -ENOMEM;
	targets = json_object_new_array();
	json_object_object_add(o, "volume_id", json_object_new_string(n->id));
	json_object_object_add(o, "staging_path",
			       json_object_new_string(n->staging));
	json_object_object_add(o, "stage_flags",
			       json_object_new_string(n->stage_flags ? n->stage_flags : ""));
	json_object_object_add(o, "staging_created",
			       json_object_new_boolean(n->staging_created));
	csi_mnt_save(o, "mount", &n->mnt);
	csi_mnt_save(o, "replacing", &n->prev);
	json_object_object_add(o, "pid", json_object_new_int64(n->pid));
	json_object_object_add(o, "starttime",
			       json_object_new_int64((int64_t)n->starttime));
	json_object_object_add(o, "restarts",
			       json_object_new_int64((int64_t)n->restarts));
	for (int i = 0; targets && i < n->ntargets; i++) {
		const struct csi_target *nt = &n->targets[i];
		json_object *t = json_object_new_object();

		json_object_object_add(t, "path", json_object_new_string(nt->path));
		json_object_object_add(t, "readonly",
				       json_object_new_boolean(nt->readonly));
		json_object_object_add(t, "flags", json_object_new_string(nt->flags));
		json_object_object_add(t, "mode", json_object_new_int(nt->mode));
		json_object_object_add(t, "created",
				       json_object_new_boolean(nt->created));
		csi_mnt_save(t, "mount", &nt->mnt);
		json_object_array_add(targets, t);
	}
	json_object_object_add(o, "targets", targets);
	snprintf(name, sizeof(name), "%s.json", n->id);
	ret = csi_record_write(s->node_fd, name, o);
	json_object_put(o);
	return ret;
}

int csi_state_remove(struct csi_store *s, const char *id)
{
	char name[64];

	snprintf(name, sizeof(name), "%s.json", id);
	return csi_record_remove(s->node_fd, name);
}

/*
 * The counters of a daemon that is gone would be reported as a volume's;
 * its control socket, left by a kill, would answer nothing.
 */
void csi_state_remove_stats(struct csi_store *s, const char *id)
{
	char name[64];

	snprintf(name, sizeof(name), "%s.stats", id);
	unlinkat(s->node_fd, name, 0);
	snprintf(name, sizeof(name), "%s.ctl", id);
	unlinkat(s->node_fd, name, 0);
}

int csi_state_list(struct csi_store *s, char ***ids, int *count)
{
	return csi_store_scan(s->node_fd, ".json", ids, count);
}

struct csi_target *csi_state_target(struct csi_node_vol *n, const char *path)
{
	for (int i = 0; i < n->ntargets; i++)
		if (!strcmp(n->targets[i].path, path))
			return &n->targets[i];
	return NULL;
}

int csi_state_add_target(struct csi_node_vol *n, const char *path,
			 bool readonly, const char *flags)
{
	struct csi_target *t = realloc(n->targets,
				       sizeof(*t) * (n->ntargets + 1));

	if (!t)
		return -ENOMEM;
	n->targets = t;
	t = &n->targets[n->ntargets];
	*t = (struct csi_target){ .readonly = readonly };
	t->path = strdup(path);
	t->flags = csi_dup_or_empty(flags);
	if (!t->path || !t->flags) {
		free(t->path);
		free(t->flags);
		return -ENOMEM;
	}
	n->ntargets++;
	return 0;
}

void csi_state_drop_target(struct csi_node_vol *n, const char *path)
{
	struct csi_target *t = csi_state_target(n, path);

	if (!t)
		return;
	free(t->path);
	free(t->flags);
	*t = n->targets[--n->ntargets];
}
