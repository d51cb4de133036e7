// SPDX-License-Identifier: Apache-2.0
/*
 * Flattening deep chains, in the background.
 *
 * Every snapshot puts a layer on its volume's chain, and a clone starts
 * on its source's chain plus one. Lookup and readdir walk the chain, so
 * they slow down with its depth (tests/bench/chain-depth.py, µs per op,
 * as multiples of depth 1):
 *
 *   depth                          1     8     32     64
 *   stratafs, a name missing     47   132    262    465   (2.8x 5.5x 9.8x)
 *   stratafs, stat of a bottom
 *   layer's file                 62   187    356    591
 *   kernel overlayfs, missing     9    34     93    646
 *
 * At 16 layers a miss costs about 4x depth 1 and grows by about 9 µs a
 * layer from there; before 16 a flatten would copy data to save little.
 * So a chain deeper than CSI_FLATTEN_DEPTH (16) is flattened: its
 * topmost run of snapshot layers ("@ss-..." entries, the ones snapshots
 * and clones pile up) becomes ONE new layer holding their merged view.
 * The whole run, not the top K: what is left is then the new layer and
 * the admin's layers (layers/, shared by many volumes and often large:
 * never copied per volume), so the depth goes back to 1 + those, and a
 * volume snapshotted forever copies its live data once per 16
 * snapshots. A run of fewer than 2 snapshot layers is left alone.
 *
 * The new layer is a hidden snapshot named "flatten:<the run's entries>"
 * with the layers below the run as its chain, so the store's reference
 * counting (chains read, csi_snapshot_gc) keeps and frees it like any
 * other, and the flattened layer shows in every chain that uses it. A
 * record whose chain ends in that run over that rest (csi_flatten_subst)
 * may take it: the merged view is the same. Every round first offers the
 * flattened layers there are to every record, so one copy serves a
 * volume, its snapshots and their clones, and a deep chain is copied
 * only if that is not enough.
 *
 * Built without any lock in snapshots/.flat-<id>/ (layer and record),
 * synced, then under create_lock only for the switch: renamed to
 * snapshots/<id>, each record taking it rewritten atomically, and the
 * layers nothing names any more removed by csi_snapshot_gc. A crash
 * before the rename leaves a .flat- directory (removed at start); after
 * it, the records not switched yet are switched at start
 * (csi_flatten_recover), or the layer goes if none takes it.
 *
 * A merge starts only if the store has room for what the run's layers
 * allocate (an upper bound) and a reserve for the volumes' own writes,
 * 5% of the store and at most 1 GiB: else it is put off, said so in the
 * log, and tried at the next round, no failure. One that runs out all
 * the same (no inode left, or the store filled meanwhile) fails: its
 * .flat- directory goes, the chain stays, the failure is counted, and no
 * merge starts for CSI_FLATTEN_BACKOFF_S.
 *
 * Staged volumes are never switched: their daemons read the old layers
 * (and a heal restarts one on the same stack), and as long as a volume's
 * record names a layer, nothing removes it. Their switch is deferred to
 * the first round after they are unstaged (NodeUnstageVolume kicks
 * one). Snapshots of a staged volume are switched at once: no daemon
 * reads a snapshot's record.
 *
 * Locks: create_lock, then a volume's busy claim (csi_busy_enter, never
 * waiting), as CreateVolume takes them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

#define CSI_FLATTEN_DEPTH 16
#define CSI_FLATTEN_NAME "flatten:"
#define CSI_FLATTEN_TMP ".flat-"
/* rounds without a kick: a volume skipped as busy is tried again */
#define CSI_FLATTEN_ROUND_S 600
/* after a failed flatten (a full store...): no copy before this */
#define CSI_FLATTEN_BACKOFF_S 60
/* left free for the volumes' own writes: 5% of the store, at most 1 GiB */
#define CSI_FLATTEN_RESERVE_PCT 5
#define CSI_FLATTEN_RESERVE_MAX (1LL << 30)
/* Layers whose size the room check remembers: a run is never longer. */
#define CSI_FLATTEN_SIZES CSI_MAX_LAYERS

struct csi_flattener {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;	/* guards kicked, stop */
	pthread_cond_t cond;
	bool kicked;
	bool stop;
	atomic_bool cancel;	/* read by a merge under way */
	time_t backoff_until;	/* the thread's own */
	/*
	 * The thread's own: what snapshots' layers allocate, walked once
	 * (a frozen layer never changes), so that a merge put off for room
	 * does not walk its whole run again every round.
	 */
	struct {
		char id[CSI_SNAPSHOT_ID_LEN + 1];
		int64_t bytes;
	} sizes[CSI_FLATTEN_SIZES];
	unsigned next_size;	/* the slot the next walk takes */
};

/* A run to flatten: the record it was found in, the run, what is below. */
struct csi_flatten_job {
	char owner[CSI_VOLUME_ID_LEN + 1];	/* a volume or snapshot id */
	char source[CSI_VOLUME_ID_LEN + 1];	/* its volume */
	char **run;
	int nrun;
	char **rest;
	int nrest;
};

static void csi_flatten_job_free(struct csi_flatten_job *j)
{
	csi_free_strv(j->run, j->nrun);
	csi_free_strv(j->rest, j->nrest);
	memset(j, 0, sizeof(*j));
}

/* "a,b,c": malloc'd, or NULL. */
static char *csi_flatten_join(char **v, int n)
{
	size_t len = 1;
	char *s;

	for (int i = 0; i < n; i++)
		len += strlen(v[i]) + 1;
	s = calloc(1, len);
	for (int i = 0; s && i < n; i++) {
		if (i)
			strcat(s, ",");
		strcat(s, v[i]);
	}
	return s;
}

/* The run a flattened layer replaces, from its record: -ENOENT if none. */
static int csi_flatten_run_of(const struct csi_snapshot *f, char ***run,
			      int *n)
{
	char *list, *save = NULL;
	int ret = 0;

	*run = NULL;
	*n = 0;
	if (!f->hidden || strncmp(f->name, CSI_FLATTEN_NAME,
				  strlen(CSI_FLATTEN_NAME)))
		return -ENOENT;
	list = strdup(f->name + strlen(CSI_FLATTEN_NAME));
	if (!list)
		return -ENOMEM;
	for (char *e = strtok_r(list, ",", &save); !ret && e;
	     e = strtok_r(NULL, ",", &save))
		ret = csi_chain_entry_check(e) ? -EBADMSG :
						 csi_strv_push(run, n, e);
	free(list);
	if (!ret && *n < 2)
		ret = -EBADMSG;
	if (ret) {
		csi_free_strv(*run, *n);
		*run = NULL;
		*n = 0;
	}
	return ret;
}

/*
 * CHAIN with "@F" in place of F's run, where the chain ends in that run
 * over F's own chain: 1 when replaced, 0 when it does not, or -errno.
 */
static int csi_flatten_subst(char ***chain, int *n,
			     const struct csi_snapshot *f, char **run, int nrun)
{
	int at = *n - nrun - f->nchain, nv = 0, ret = 0;
	char entry[CSI_SNAPSHOT_ID_LEN + 2], **v = NULL;

	if (at < 0)
		return 0;
	for (int i = 0; i < nrun; i++)
		if (strcmp((*chain)[at + i], run[i]))
			return 0;
	for (int i = 0; i < f->nchain; i++)
		if (strcmp((*chain)[at + nrun + i], f->chain[i]))
			return 0;
	snprintf(entry, sizeof(entry), "%c%s", CSI_CHAIN_SNAPSHOT, f->id);
	for (int i = 0; i < at && !ret; i++)
		ret = csi_strv_push(&v, &nv, (*chain)[i]);
	if (!ret)
		ret = csi_strv_push(&v, &nv, entry);
	for (int i = 0; i < f->nchain && !ret; i++)
		ret = csi_strv_push(&v, &nv, f->chain[i]);
	if (ret) {
		csi_free_strv(v, nv);
		return ret;
	}
	csi_free_strv(*chain, *n);
	*chain = v;
	*n = nv;
	return 1;
}

/* 0 when no daemon serves volume ID (no node record, no workdir lock). */
static int csi_flatten_unserved(struct csi_store *s, const char *id)
{
	struct csi_node_vol n;
	int ret = csi_state_load(s, id, &n);

	if (ret == 0) {
		csi_state_free(&n);
		return -EBUSY;
	}
	return ret == -ENOENT ? csi_volume_served(s, id) : ret;
}

/*
 * Claims volume ID for a switch: 0 with its busy claim held when no
 * daemon serves it, -EBUSY when one may. A staged volume is not even
 * claimed for the look: a claim held, however briefly, makes its RPCs
 * (a snapshot of it) answer ABORTED. Looked at again under the claim:
 * it may have been staged meanwhile.
 */
static int csi_flatten_claim(struct csi_store *s, const char *id)
{
	int ret = csi_flatten_unserved(s, id);

	if (ret)
		return ret;
	ret = csi_busy_enter(s, id);
	if (ret)
		return ret;
	ret = csi_flatten_unserved(s, id);
	if (ret)
		csi_busy_leave(s, id);
	return ret;
}

/* F in place of its run in volume ID's record, if it takes it: 1, 0, -errno. */
static int csi_flatten_apply_volume(struct csi_store *s, const char *id,
				    const struct csi_snapshot *f, char **run,
				    int nrun)
{
	struct csi_volume v;
	int ret;

	/*
	 * Claimed only when it would change: a claim held makes the
	 * volume's RPCs answer ABORTED meanwhile.
	 */
	ret = csi_volume_load(s, id, &v);
	if (ret == 0)
		ret = csi_flatten_subst(&v.layers, &v.nlayers, f, run, nrun);
	csi_volume_free(&v);
	if (ret <= 0)
		return ret == -ENOENT ? 0 : ret;
	if (csi_flatten_claim(s, id))
		return 0;	/* a daemon reads its chain: at unstage */
	ret = csi_volume_load(s, id, &v);
	if (ret == 0)
		ret = csi_flatten_subst(&v.layers, &v.nlayers, f, run, nrun);
	if (ret == 1) {
		int err = csi_volume_save(s, &v);

		ret = err ? err : 1;
	}
	csi_volume_free(&v);
	csi_busy_leave(s, id);
	return ret == -ENOENT ? 0 : ret;
}

/* The same for snapshot ID's record. */
static int csi_flatten_apply_snapshot(struct csi_store *s, const char *id,
				      const struct csi_snapshot *f, char **run,
				      int nrun)
{
	struct csi_snapshot ss;
	int ret;

	if (!strcmp(id, f->id))
		return 0;
	ret = csi_snapshot_load(s, id, &ss);
	if (ret)
		return ret == -ENOENT ? 0 : ret;
	ret = csi_flatten_subst(&ss.chain, &ss.nchain, f, run, nrun);
	if (ret == 1) {
		int err = csi_snapshot_write(s, ss.id, CSI_SNAP_RECORD, &ss);

		ret = err ? err : 1;
	}
	csi_snapshot_free(&ss);
	return ret;
}

/*
 * The flattened layer F in place of its run in every record that ends
 * in it, but staged volumes': how many took it, or the first error (the
 * records switched before it stay switched: each is whole either way).
 * The caller holds create_lock.
 */
static int csi_flatten_apply(struct csi_store *s, const struct csi_snapshot *f)
{
	char **run, **ids = NULL;
	int nrun, n = 0, taken = 0, ret;

	ret = csi_flatten_run_of(f, &run, &nrun);
	if (ret)
		return ret;
	for (int pass = 0; !ret && pass < 2; pass++) {
		ret = pass ? csi_volume_list(s, &ids, &n) :
			     csi_snapshot_list(s, &ids, &n);
		for (int i = 0; !ret && i < n; i++) {
			int got = pass ? csi_flatten_apply_volume(s, ids[i], f,
								   run, nrun) :
					 csi_flatten_apply_snapshot(s, ids[i], f,
								     run, nrun);

			if (got < 0) {
				strata_warn("flatten: %s %s: taking @%s: %s",
					    pass ? "volume" : "snapshot", ids[i],
					    f->id, strerror(-got));
				ret = got;
			} else if (got) {
				strata_info("flatten: %s %s now sits on @%s in place of its %d layers",
					    pass ? "volume" : "snapshot", ids[i],
					    f->id, nrun);
				taken++;
				csi_kill_point("flatten.switch");
			}
		}
		csi_free_strv(ids, n);
		ids = NULL;
		n = 0;
	}
	csi_free_strv(run, nrun);
	return ret ? ret : taken;
}

/* Every flattened layer there is, offered to every record. */
static void csi_flatten_apply_all(struct csi_store *s)
{
	char **ids;
	int n;

	if (csi_snapshot_list(s, &ids, &n))
		return;
	for (int i = 0; i < n; i++) {
		struct csi_snapshot f;

		if (csi_snapshot_load(s, ids[i], &f))
			continue;
		if (f.hidden && !strncmp(f.name, CSI_FLATTEN_NAME,
					 strlen(CSI_FLATTEN_NAME)))
			csi_flatten_apply(s, &f);
		csi_snapshot_free(&f);
	}
	csi_free_strv(ids, n);
}

/*
 * At store open, before its gc: the .flat- leftovers of a flatten cut
 * short go, and a flattened layer already named is given to the records
 * a crash kept from taking it.
 */
void csi_flatten_recover(struct csi_store *s)
{
	struct dirent *de;
	DIR *d = strata_opendir_at(s->snapshots_fd, ".");

	if (d) {
		while ((de = readdir(d))) {
			if (strncmp(de->d_name, CSI_FLATTEN_TMP,
				    strlen(CSI_FLATTEN_TMP)))
				continue;
			strata_warn("store: removing the flatten cut short, %s/snapshots/%s",
				    s->root, de->d_name);
			strata_rmtree_at(s->snapshots_fd, de->d_name);
		}
		closedir(d);
	}
	csi_flatten_apply_all(s);
}

/* The job for CHAIN (of record OWNER of volume SOURCE) if it is too deep. */
static int csi_flatten_job_of(const char *owner, const char *source,
			      char **chain, int n, struct csi_flatten_job *j)
{
	int ret = 0, nrun = 0;

	if (n <= CSI_FLATTEN_DEPTH)
		return -ENOENT;
	while (nrun < n && chain[nrun][0] == CSI_CHAIN_SNAPSHOT)
		nrun++;
	if (nrun < 2)
		return -ENOENT;	/* the admin's layers: not ours to copy */
	memset(j, 0, sizeof(*j));
	snprintf(j->owner, sizeof(j->owner), "%s", owner);
	snprintf(j->source, sizeof(j->source), "%s", source);
	for (int i = 0; i < n && !ret; i++)
		ret = i < nrun ? csi_strv_push(&j->run, &j->nrun, chain[i]) :
				 csi_strv_push(&j->rest, &j->nrest, chain[i]);
	if (ret)
		csi_flatten_job_free(j);
	return ret;
}

static bool csi_flatten_skipped(char **skip, int nskip, const char *id)
{
	for (int i = 0; i < nskip; i++)
		if (!strcmp(skip[i], id))
			return true;
	return false;
}

/*
 * The next record too deep and not done this round (SKIP): visible
 * snapshots first, whose flattened layers their volume and clones may
 * then take as they are, then volumes no daemon serves. 0 with J, or
 * -ENOENT. The caller holds create_lock.
 */
static int csi_flatten_pick(struct csi_store *s, char **skip, int nskip,
			    struct csi_flatten_job *j)
{
	char **ids;
	int n, ret;

	ret = csi_snapshot_list(s, &ids, &n);
	if (ret)
		return ret;
	ret = -ENOENT;
	for (int i = 0; i < n && ret == -ENOENT; i++) {
		struct csi_snapshot ss;

		if (csi_flatten_skipped(skip, nskip, ids[i]) ||
		    csi_snapshot_load(s, ids[i], &ss))
			continue;
		if (!ss.hidden)
			ret = csi_flatten_job_of(ss.id, ss.source, ss.chain,
						 ss.nchain, j);
		csi_snapshot_free(&ss);
	}
	csi_free_strv(ids, n);
	if (ret != -ENOENT)
		return ret;
	ret = csi_volume_list(s, &ids, &n);
	if (ret)
		return ret;
	ret = -ENOENT;
	for (int i = 0; i < n && ret == -ENOENT; i++) {
		struct csi_volume v;

		/* claimed (not held) only for a chain too deep: see above */
		if (csi_flatten_skipped(skip, nskip, ids[i]) ||
		    csi_volume_load(s, ids[i], &v))
			continue;
		if (v.nlayers > CSI_FLATTEN_DEPTH &&
		    csi_flatten_claim(s, ids[i]) == 0) {
			ret = csi_flatten_job_of(v.id, v.id, v.layers,
						 v.nlayers, j);
			csi_busy_leave(s, ids[i]);
		}
		csi_volume_free(&v);
	}
	csi_free_strv(ids, n);
	return ret;
}

/* Readable descriptors on the roots of the chain entries V. */
static int csi_flatten_open(struct csi_store *s, char **v, int n, int *fds)
{
	for (int i = 0; i < n; i++)
		fds[i] = -1;
	for (int i = 0; i < n; i++) {
		int path = csi_chain_open(s, v[i]);

		if (path < 0)
			return path;
		fds[i] = openat(path, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		close(path);
		if (fds[i] < 0)
			return -errno;
	}
	return 0;
}

static void csi_flatten_close(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static const char *csi_flatten_kind(const struct csi_flatten_job *j)
{
	return csi_volume_id_valid(j->owner) ? "volume" : "snapshot";
}

/* What snapshot ID's layer allocates: remembered, or walked. */
static int csi_flatten_layer_bytes(struct csi_flattener *fl,
				   struct csi_store *s, const char *id,
				   int64_t *bytes)
{
	char path[PATH_MAX];
	int64_t inodes;
	unsigned slot;
	int ret;

	for (int i = 0; i < CSI_FLATTEN_SIZES; i++) {
		if (!strcmp(fl->sizes[i].id, id)) {
			*bytes = fl->sizes[i].bytes;
			return 0;
		}
	}
	if (snprintf(path, sizeof(path), "%s/snapshots/%s/layer", s->root,
		     id) >= (int)sizeof(path) ||
	    strlen(id) >= sizeof(fl->sizes[0].id))
		return -ENAMETOOLONG;
	ret = csi_tree_usage(path, bytes, &inodes);
	if (ret)
		return ret;
	slot = fl->next_size++ % CSI_FLATTEN_SIZES;
	strcpy(fl->sizes[slot].id, id);
	fl->sizes[slot].bytes = *bytes;
	return 0;
}

/*
 * Whether the store has room for J's merge: what the run's layers
 * allocate (an upper bound: data the filesystem shares costs less) and
 * a reserve for the volumes' own writes, which a merge must not starve.
 * 0, -ENOSPC when it has not (said so), or -errno.
 */
static int csi_flatten_room(struct csi_plugin *p,
			    const struct csi_flatten_job *j)
{
	struct csi_store *s = &p->store;
	int64_t need = 0, avail, size, reserve;
	int ret;

	for (int i = 0; i < j->nrun; i++) {
		int64_t bytes;

		/* the run is snapshots' layers only: csi_flatten_job_of */
		ret = csi_flatten_layer_bytes(p->flat, s, j->run[i] + 1, &bytes);
		if (ret)
			return ret;
		need += bytes;
	}
	ret = csi_store_space(s, &avail, &size);
	if (ret)
		return ret;
	reserve = size / 100 * CSI_FLATTEN_RESERVE_PCT;
	if (reserve > CSI_FLATTEN_RESERVE_MAX)
		reserve = CSI_FLATTEN_RESERVE_MAX;
	if (need + reserve <= avail)
		return 0;
	strata_info("flatten of %s %s put off: needs %lld bytes (%lld for its %d layers, %lld kept for the volumes' writes), the store has %lld free; trying again next round",
		    csi_flatten_kind(j), j->owner, (long long)(need + reserve),
		    (long long)need, j->nrun, (long long)reserve,
		    (long long)avail);
	return -ENOSPC;
}

/*
 * J's run merged into snapshots/.flat-<F's id>/layer, synced, with F's
 * record beside it. On an error nothing of it is left.
 */
static int csi_flatten_build(struct csi_plugin *p, struct csi_flatten_job *j,
			     struct csi_snapshot *f, struct csi_flat_ctx *c)
{
	struct csi_store *s = &p->store;
	int range[CSI_MAX_LAYERS], below[CSI_MAX_LAYERS], out = -1, ret;
	char dir[64], layer[64];
	struct timespec now;

	if (j->nrun > CSI_MAX_LAYERS || j->nrest > CSI_MAX_LAYERS)
		return -E2BIG;	/* no record of ours is that deep */
	snprintf(dir, sizeof(dir), CSI_FLATTEN_TMP "%s", f->id);
	snprintf(layer, sizeof(layer), CSI_FLATTEN_TMP "%s/layer", f->id);
	ret = csi_flatten_open(s, j->run, j->nrun, range);
	if (!ret)
		ret = csi_flatten_open(s, j->rest, j->nrest, below);
	if (ret)
		goto out_close;
	if (mkdirat(s->snapshots_fd, dir, 0700) < 0 ||
	    mkdirat(s->snapshots_fd, layer, 0700) < 0) {
		ret = -errno;
		goto out_remove;
	}
	out = openat(s->snapshots_fd, layer, O_RDONLY | O_DIRECTORY |
						     O_NOFOLLOW | O_CLOEXEC);
	if (out < 0) {
		ret = -errno;
		goto out_remove;
	}
	c->range = range;
	c->nrange = j->nrun;
	c->below = below;
	c->nbelow = j->nrest;
	c->out_root = out;
	ret = csi_flatten_merge(c);
	/* one syncfs for the whole tree: a file at a time costs far more */
	if (!ret && syncfs(out) < 0)
		ret = -errno;
	if (ret)
		goto out_remove;
	clock_gettime(CLOCK_REALTIME, &now);
	f->created_s = now.tv_sec;
	f->created_ns = now.tv_nsec;
	ret = csi_snapshot_write(s, dir, CSI_SNAP_RECORD, f);
	if (ret)
		goto out_remove;
	csi_kill_point("flatten.built");
	goto out_close;
out_remove:
	strata_rmtree_at(s->snapshots_fd, dir);
out_close:
	if (out >= 0)
		close(out);
	csi_flatten_close(range, j->nrun);
	csi_flatten_close(below, j->nrest);
	return ret;
}

/*
 * F named, and taken by the records that end in its run: under
 * create_lock, for this short while only. How many took it, or -errno.
 */
static int csi_flatten_switch(struct csi_store *s, struct csi_snapshot *f)
{
	char dir[64];
	int ret;

	snprintf(dir, sizeof(dir), CSI_FLATTEN_TMP "%s", f->id);
	pthread_mutex_lock(&s->create_lock);
	/* read-only from here on, as a snapshot's directory */
	if (fchmodat(s->snapshots_fd, dir, 0755, 0) < 0 ||
	    renameat(s->snapshots_fd, dir, s->snapshots_fd, f->id) < 0 ||
	    fsync(s->snapshots_fd) < 0) {
		ret = -errno;
		strata_rmtree_at(s->snapshots_fd, dir);
		goto out;
	}
	csi_kill_point("flatten.named");
	ret = csi_flatten_apply(s, f);
	/* the layers nothing names any more, and F itself if none took it */
	csi_snapshot_gc(s);
out:
	pthread_mutex_unlock(&s->create_lock);
	return ret;
}

/* Flattens J's run: 0 once done (whether or not a record took it), or -errno. */
static int csi_flatten_one(struct csi_plugin *p, struct csi_flatten_job *j)
{
	struct csi_flat_ctx c = { .cancel = &p->flat->cancel };
	struct csi_snapshot f = { .hidden = true };
	char *list = csi_flatten_join(j->run, j->nrun);
	struct timespec t0, t1;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	ret = list ? csi_flatten_room(p, j) : -ENOMEM;
	if (ret == -ENOSPC) {
		free(list);
		return 0;	/* put off, not failed: the next round tries */
	}
	if (!ret)
		ret = csi_store_new_id(CSI_SNAPSHOT_ID_PREFIX, f.id);
	if (!ret && asprintf(&f.name, CSI_FLATTEN_NAME "%s", list) < 0) {
		f.name = NULL;
		ret = -ENOMEM;
	}
	memcpy(f.source, j->source, sizeof(f.source));
	for (int i = 0; !ret && i < j->nrest; i++)
		ret = csi_strv_push(&f.chain, &f.nchain, j->rest[i]);
	if (ret)
		goto out;
	strata_info("flatten: %s %s sits on %d layers (more than %d): merging its top %d, %s, into @%s",
		    csi_flatten_kind(j), j->owner, j->nrun + j->nrest,
		    CSI_FLATTEN_DEPTH, j->nrun, list, f.id);
	ret = csi_flatten_build(p, j, &f, &c);
	if (!ret)
		ret = csi_flatten_switch(&p->store, &f);
out:
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (ret < 0) {
		strata_warn("flatten: %s: merging %s failed after %.2f s: %s; its chain is unchanged",
			    j->owner, list ? list : "its layers",
			    (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
			    strerror(-ret));
		csi_metrics_event(CSI_EV_FLATTEN_FAILED);
	} else {
		strata_info("flatten: %s: %d layers merged into @%s in %.2f s (%lld entries, %lld bytes); %d records took it",
			    j->owner, j->nrun, f.id,
			    (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
			    (long long)c.entries, (long long)c.bytes, ret);
		csi_metrics_event(CSI_EV_FLATTEN_DONE);
	}
	free(list);
	csi_snapshot_free(&f);
	return ret < 0 ? ret : 0;
}

/*
 * One round: the flattened layers there are offered to every record,
 * then each record still too deep flattened, once per round.
 */
static void csi_flatten_round(struct csi_plugin *p)
{
	struct csi_flattener *fl = p->flat;
	struct csi_store *s = &p->store;
	char **done = NULL;
	int ndone = 0;

	pthread_mutex_lock(&s->create_lock);
	csi_flatten_apply_all(s);
	csi_snapshot_gc(s);
	pthread_mutex_unlock(&s->create_lock);
	if (time(NULL) < fl->backoff_until)
		return;
	while (!atomic_load(&fl->cancel)) {
		struct csi_flatten_job j;
		int ret;

		pthread_mutex_lock(&s->create_lock);
		ret = csi_flatten_pick(s, done, ndone, &j);
		pthread_mutex_unlock(&s->create_lock);
		if (ret)
			break;
		ret = csi_strv_push(&done, &ndone, j.owner);
		if (!ret)
			ret = csi_flatten_one(p, &j);
		csi_flatten_job_free(&j);
		if (ret) {
			fl->backoff_until = time(NULL) + CSI_FLATTEN_BACKOFF_S;
			break;
		}
	}
	csi_free_strv(done, ndone);
}

static void *csi_flatten_main(void *arg)
{
	struct csi_plugin *p = arg;
	struct csi_flattener *fl = p->flat;

	pthread_mutex_lock(&fl->lock);
	while (!fl->stop) {
		if (!fl->kicked) {
			struct timespec until;

			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_sec += CSI_FLATTEN_ROUND_S;
			pthread_cond_timedwait(&fl->cond, &fl->lock, &until);
			if (fl->stop)
				break;
		}
		fl->kicked = false;
		pthread_mutex_unlock(&fl->lock);
		csi_flatten_round(p);
		pthread_mutex_lock(&fl->lock);
	}
	pthread_mutex_unlock(&fl->lock);
	return NULL;
}

/* Before the server starts: RPCs may kick it from then on. */
int csi_flatten_init(struct csi_plugin *p)
{
	struct csi_flattener *fl = calloc(1, sizeof(*fl));
	pthread_condattr_t attr;

	if (!fl)
		return -ENOMEM;
	pthread_mutex_init(&fl->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&fl->cond, &attr);
	pthread_condattr_destroy(&attr);
	atomic_init(&fl->cancel, false);
	fl->kicked = true;	/* a first round at start */
	p->flat = fl;
	return 0;
}

/* Once the socket is made: the thread makes files, under the normal umask. */
int csi_flatten_start(struct csi_plugin *p)
{
	int ret = pthread_create(&p->flat->thread, NULL, csi_flatten_main, p);

	if (ret)
		return -ret;
	p->flat->started = true;
	return 0;
}

/* Stops a merge under way (its directory removed) and the thread. */
void csi_flatten_stop(struct csi_plugin *p)
{
	struct csi_flattener *fl = p->flat;

	if (!fl)
		return;
	pthread_mutex_lock(&fl->lock);
	fl->stop = true;
	atomic_store(&fl->cancel, true);
	pthread_cond_signal(&fl->cond);
	pthread_mutex_unlock(&fl->lock);
	if (fl->started)
		pthread_join(fl->thread, NULL);
	pthread_cond_destroy(&fl->cond);
	pthread_mutex_destroy(&fl->lock);
	free(fl);
	p->flat = NULL;
}

/* Something may have made a chain deeper, or a volume unstaged: a round. */
void csi_flatten_kick(struct csi_plugin *p)
{
	struct csi_flattener *fl = p->flat;

	if (!fl)
		return;
	pthread_mutex_lock(&fl->lock);
	fl->kicked = true;
	pthread_cond_signal(&fl->cond);
	pthread_mutex_unlock(&fl->lock);
}
