// SPDX-License-Identifier: Apache-2.0
/*
 * CreateVolume from a VolumeContentSource. A clone is a fresh upper over
 * a snapshot's layer and the chain below it: O(1), whatever the source
 * holds. A clone of a volume takes a hidden snapshot of it first (the
 * source then continues on a fresh upper over that same layer), so both
 * share the frozen data and neither sees the other's writes.
 *
 * The content source decides the chain; a "layers" parameter, if the
 * class has one, must name the layers the source sits on, so that a
 * clone never silently differs from what its class says.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csi.h"

/* Whether LIST (the "layers" parameter, split) is CHAIN's named layers. */
static bool csi_clone_layers_match(char **list, int nlist, char **chain,
				   int nchain)
{
	int j = 0;

	for (int i = 0; i < nchain; i++) {
		if (chain[i][0] == CSI_CHAIN_SNAPSHOT)
			continue;
		if (j >= nlist || strcmp(chain[i], list[j]))
			return false;
		j++;
	}
	return j == nlist;
}

/*
 * The request's capacity against the source's: at least as much (the
 * spec's OUT_OF_RANGE), and the source's when none was asked for. 0 is
 * no limit on either side, and so no bound.
 */
static int csi_clone_capacity(struct csi_reply *r,
			      const Csi__V1__CreateVolumeRequest *req,
			      struct csi_volume *want, int64_t have,
			      const char *what)
{
	const Csi__V1__CapacityRange *cr = req->capacity_range;

	if (!want->capacity) {
		want->capacity = have;
		return 0;
	}
	if (have && (want->capacity < have ||
		     (cr && cr->limit_bytes && cr->limit_bytes < have))) {
		csi_reply_set(r, CSI_OUT_OF_RANGE,
			      "capacity_range asks for %lld bytes, less than the %lld bytes of the source %s: a clone holds at least what its source does",
			      (long long)want->capacity, (long long)have, what);
		return -ERANGE;
	}
	return 0;
}

/* WANT's chain becomes TOP (if any) over CHAIN. */
static int csi_clone_chain(struct csi_volume *want, const char *top,
			   char **chain, int n)
{
	char **v = NULL;
	int nv = 0, ret = 0;

	if (top)
		ret = csi_strv_push(&v, &nv, top);
	for (int i = 0; i < n && !ret; i++)
		ret = csi_strv_push(&v, &nv, chain[i]);
	if (ret) {
		csi_free_strv(v, nv);
		return ret;
	}
	csi_free_strv(want->layers, want->nlayers);
	want->layers = v;
	want->nlayers = nv;
	return 0;
}

/*
 * What a clone must agree with, of either kind of source (KIND, "snapshot"
 * or "volume", and ID name it): a "layers" parameter names the layers the
 * source sits on (CHAIN, N entries), and the capacity holds what the
 * source's (HAVE) does. On agreement WANT's source is ID.
 */
static int csi_clone_fit(struct csi_reply *r,
			 const Csi__V1__CreateVolumeRequest *req,
			 struct csi_volume *want, const char *kind,
			 const char *id, char **chain, int n, int64_t have)
{
	int ret;

	if (CSI_MAP_GET(req, parameters, "layers") &&
	    !csi_clone_layers_match(want->layers, want->nlayers, chain, n)) {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "parameter layers names other layers than %s %s sits on: a clone has its source's layers; drop the parameter or use a class with the same layers",
			      kind, id);
		return -EINVAL;
	}
	ret = csi_clone_capacity(r, req, want, have, id);
	if (ret)
		return ret;
	memcpy(want->source, id, sizeof(want->source));
	return 0;
}

/*
 * The content source's id into SOURCE, for the lookup by name: -EINVAL
 * for one that is missing or cannot be an id of its kind.
 */
int csi_clone_source_id(const Csi__V1__VolumeContentSource *src,
			char source[CSI_VOLUME_ID_LEN + 1])
{
	const char *id = "";

	if (src->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT &&
	    src->snapshot && csi_snapshot_id_valid(src->snapshot->snapshot_id))
		id = src->snapshot->snapshot_id;
	if (src->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME &&
	    src->volume && csi_volume_id_valid(src->volume->volume_id))
		id = src->volume->volume_id;
	if (!id[0])
		return -EINVAL;
	memcpy(source, id, CSI_VOLUME_ID_LEN + 1);
	return 0;
}

/*
 * Checks the content source of REQ and fills WANT from it: its source id,
 * its capacity, and for a snapshot its chain (a volume's is known once
 * csi_clone_freeze has frozen it). The caller holds create_lock, so a
 * snapshot found here stays until the volume names it.
 */
int csi_clone_source(struct csi_plugin *p, struct csi_reply *r,
		     const Csi__V1__CreateVolumeRequest *req,
		     struct csi_volume *want)
{
	const Csi__V1__VolumeContentSource *src = req->volume_content_source;
	struct csi_snapshot ss = { 0 };
	struct csi_volume v = { 0 };
	char entry[CSI_SNAPSHOT_ID_LEN + 2];
	const char *id;
	int ret;

	if (src->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_SNAPSHOT) {
		id = src->snapshot ? src->snapshot->snapshot_id : "";
		ret = id[0] ? csi_snapshot_load(&p->store, id, &ss) : -EINVAL;
		if (ret == 0 && ss.hidden)
			ret = -ENOENT;
		if (ret == -EINVAL)
			csi_reply_set(r, CSI_INVALID_ARGUMENT,
				      "volume_content_source.snapshot.snapshot_id is required");
		else if (ret)
			csi_reply_set(r, ret == -ENOENT ? CSI_NOT_FOUND : CSI_INTERNAL,
				      "volume_content_source: snapshot %.64s: %s",
				      id, ret == -ENOENT ? "no such snapshot" :
				      strerror(-ret));
		if (ret)
			goto out;
		ret = csi_clone_fit(r, req, want, "snapshot", ss.id, ss.chain,
				    ss.nchain, ss.capacity);
		if (ret)
			goto out;
		snprintf(entry, sizeof(entry), "%c%s", CSI_CHAIN_SNAPSHOT, ss.id);
		ret = csi_clone_chain(want, entry, ss.chain, ss.nchain);
	} else if (src->type_case == CSI__V1__VOLUME_CONTENT_SOURCE__TYPE_VOLUME) {
		id = src->volume ? src->volume->volume_id : "";
		ret = id[0] ? csi_volume_load(&p->store, id, &v) : -EINVAL;
		if (ret == 0 && v.ephemeral)
			ret = -ENOENT;
		if (ret == -EINVAL) {
			csi_reply_set(r, CSI_INVALID_ARGUMENT,
				      "volume_content_source.volume.volume_id is required");
			goto out;
		}
		if (ret) {
			csi_reply_set(r, ret == -ENOENT ? CSI_NOT_FOUND : CSI_INTERNAL,
				      "volume_content_source: volume %.64s: %s",
				      id, ret == -ENOENT ? "no such volume" :
				      strerror(-ret));
			goto out;
		}
		ret = csi_clone_fit(r, req, want, "volume", v.id, v.layers,
				    v.nlayers, v.capacity);
		if (ret)
			goto out;
	} else {
		csi_reply_set(r, CSI_INVALID_ARGUMENT,
			      "volume_content_source has neither a snapshot nor a volume");
		ret = -EINVAL;
		goto out;
	}
	if (ret)
		csi_reply_errno(r, ret, "volume_content_source");
out:
	csi_snapshot_free(&ss);
	csi_volume_free(&v);
	return ret;
}

/* Whether the upper of volume VID holds no entry: -errno, 0 or 1. */
static int csi_clone_upper_empty(struct csi_store *s, const char *vid)
{
	char upper[64];
	struct dirent *de;
	int empty = 1;
	DIR *d;

	snprintf(upper, sizeof(upper), "%s/upper", vid);
	d = strata_opendir_at(s->volumes_fd, upper);
	if (!d)
		return -errno;
	while (empty && (de = readdir(d)))
		empty = !strcmp(de->d_name, ".") || !strcmp(de->d_name, "..");
	closedir(d);
	return empty;
}

/*
 * The hidden snapshot an earlier attempt at clone NAME (MARKER) took of V
 * and that was cut short before the clone was made (a crash, a full
 * disk), when taking one now would give the same: it is the top of V's
 * chain and V's upper is still empty. Reused, retries do not deepen V's
 * chain. 0 with SS loaded, or -ENOENT.
 */
static int csi_clone_earlier(struct csi_store *s, const char *marker,
			     const struct csi_volume *v,
			     struct csi_snapshot *ss)
{
	if (!v->nlayers || v->layers[0][0] != CSI_CHAIN_SNAPSHOT ||
	    csi_clone_upper_empty(s, v->id) != 1 ||
	    csi_snapshot_load(s, v->layers[0] + 1, ss))
		return -ENOENT;
	if (!ss->hidden || strcmp(ss->name, marker) ||
	    strcmp(ss->source, v->id)) {
		csi_snapshot_free(ss);
		return -ENOENT;
	}
	return 0;
}

/*
 * A clone of a volume: its hidden snapshot, taken now, is the clone's
 * top layer. The source must be idle (ABORTED otherwise: retried).
 */
int csi_clone_freeze(struct csi_plugin *p, struct csi_reply *r,
		     const char *name, struct csi_volume *want)
{
	struct csi_snapshot ss = { 0 };
	struct csi_volume v = { 0 };
	char entry[CSI_SNAPSHOT_ID_LEN + 2], why[512], marker[CSI_NAME_MAX + 16];
	int ret;

	if (!csi_volume_id_valid(want->source))
		return 0;	/* a snapshot's clone: its chain is known */
	if (csi_busy_claim(&p->store, want->source, r))
		return -EBUSY;
	ret = csi_volume_load(&p->store, want->source, &v);
	if (ret) {
		csi_reply_load(r, want->source, ret);
		goto out;
	}
	/* hidden snapshots are never found by CreateSnapshot's names */
	snprintf(marker, sizeof(marker), "clone:%s", name);
	ret = csi_clone_earlier(&p->store, marker, &v, &ss);
	if (ret == 0)
		goto out_chain;
	ss.hidden = true;
	ss.name = strdup(marker);
	if (!ss.name) {
		ret = -ENOMEM;
		csi_reply_errno(r, ret, "CreateVolume");
		goto out;
	}
	ret = csi_snapshot_take(p, &v, &ss, why, sizeof(why));
	if (ret) {
		csi_snapshot_answer(r, ret, why);
		goto out;
	}
	strata_info("snapshot %s taken of volume %s for a clone", ss.id, v.id);
out_chain:
	snprintf(entry, sizeof(entry), "%c%s", CSI_CHAIN_SNAPSHOT, ss.id);
	ret = csi_clone_chain(want, entry, ss.chain, ss.nchain);
	if (ret)
		csi_reply_errno(r, ret, "CreateVolume");
out:
	csi_busy_leave(&p->store, want->source);
	csi_snapshot_free(&ss);
	csi_volume_free(&v);
	return ret;
}
