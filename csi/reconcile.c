// SPDX-License-Identifier: Apache-2.0
/*
 * Keeping staged volumes alive across crashes. Kubelet never sends
 * NodeStageVolume again after a plugin restart, so the plugin itself
 * must notice a dead daemon (a FUSE mount answering ENOTCONN) and bring
 * the volume back: on start for every node record, and afterwards from
 * a watcher thread that also reaps the daemons it started.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

#define CSI_WATCH_PERIOD_MS 1000

struct csi_watch {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
};

static bool csi_mnt_same(const struct csi_mnt *a, const struct csi_mnt *b)
{
	return a->id && a->id == b->id && a->dev == b->dev;
}

/*
 * Puts a new mount (newfd, detached) at a recorded path in the place of
 * the old one, with no moment in which the path shows the directory
 * beneath: the new mount goes beneath the old one (MOVE_MOUNT_BENEATH),
 * then the old one is detached. With nothing mounted at the path, the new
 * one goes on top. Anything else on top is not ours: -EBUSY, untouched.
 */
static int csi_replace_at(const char *path, int newfd,
			  const struct csi_mnt *old, const struct csi_mnt *older)
{
	struct csi_path pp;
	struct csi_mnt top;
	char why[512];
	bool root;
	int fd, ret;

	ret = csi_path_resolve(NULL, path, &pp, why, sizeof(why));
	if (ret)
		return ret;
	fd = csi_path_open(&pp, true, NULL);
	csi_path_release(&pp);
	if (fd < 0)
		return fd;
	ret = csi_mnt_of(fd, &top, &root);
	if (ret)
		goto out;
	if (!root) {
		ret = csi_mnt_attach(newfd, fd, false);
	} else if (csi_mnt_same(&top, old) || csi_mnt_same(&top, older)) {
		ret = csi_mnt_attach(newfd, fd, true);
		if (ret == 0)
			ret = csi_mnt_detach(fd);
	} else {
		ret = -EBUSY;
	}
out:
	close(fd);
	return ret;
}

/* A target's bind mount made again from the staging mount (stagefd). */
static int csi_rebind(struct csi_plugin *p, struct csi_node_vol *n,
		      struct csi_target *t, int stagefd, char *why, size_t size)
{
	struct csi_mnt m;
	int treefd, ret;

	ret = csi_mnt_clone(stagefd, csi_flags_from_canon(t->flags) |
				     (t->readonly ? MS_RDONLY : 0), &treefd);
	if (ret == 0)
		ret = csi_mnt_of(treefd, &m, NULL);
	if (ret == 0)
		ret = csi_replace_at(t->path, treefd, &t->mnt, NULL);
	if (treefd >= 0)
		close(treefd);
	if (ret) {
		snprintf(why, size, "bind mount of volume %s at %s: %s", n->id,
			 t->path, ret == -EBUSY ?
			 "another mount covers the target" : strerror(-ret));
		return ret;
	}
	t->mnt = m;
	return csi_state_save(&p->store, n);
}

/*
 * Brings back a staged volume whose daemon died or whose mount does not
 * answer: a new daemon on a new mount takes the place of the dead one at
 * the staging path, and every target is bound again the same way, so
 * that no write ever reaches a bare directory. The record names the
 * mount being replaced until it is, so that a heal cut short by a crash
 * is finished by the next. The caller holds the volume busy.
 */
int csi_heal(struct csi_plugin *p, const struct csi_volume *v,
	     struct csi_node_vol *n, char *why, size_t size)
{
	struct csi_mnt old = n->mnt;
	int mntfd, ret;

	if (csi_daemon_alive(n))
		csi_daemon_kill(n);
	else
		csi_metrics_event(CSI_EV_DAEMON_EXIT);
	ret = csi_daemon_start(p, v, n, &mntfd, why, size);
	if (ret)
		return ret;
	csi_kill_point("heal.daemon");
	if (!n->prev.id)
		n->prev = old;
	ret = csi_mnt_of(mntfd, &n->mnt, NULL);
	if (ret == 0)
		ret = csi_state_save(&p->store, n);
	csi_kill_point("heal.record");
	if (ret == 0)
		ret = csi_replace_at(n->staging, mntfd, &old, &n->prev);
	if (ret) {
		snprintf(why, size, "volume %s: a new mount at %s: %s", n->id,
			 n->staging, ret == -EBUSY ?
			 "another mount covers the staging path" : strerror(-ret));
		goto out;
	}
	csi_metrics_event(CSI_EV_DAEMON_RESTART);
	csi_kill_point("heal.staging");
	for (int i = 0; i < n->ntargets && !ret; i++) {
		ret = csi_rebind(p, n, &n->targets[i], mntfd, why, size);
		csi_kill_point("heal.target");
	}
	if (ret)
		goto out;
	n->prev = (struct csi_mnt){ 0 };
	n->restarts++;
	ret = csi_state_save(&p->store, n);
	if (ret)
		snprintf(why, size, "volume %s: saving the node record: %s",
			 n->id, strerror(-ret));
out:
	close(mntfd);
	return ret;
}

/*
 * What is wrong with a staged volume, or NULL when all is well. *heal
 * says whether its daemon must be replaced; otherwise *target is the one
 * target to bind again (-1: none). Anything not ours covering a path is
 * left alone.
 */
static const char *csi_check_staged(const struct csi_node_vol *n, bool *heal,
				    int *target)
{
	struct csi_path pp;
	struct csi_mnt top;
	char why[512];
	int fd, ret;

	*heal = true;
	*target = -1;
	if (!csi_daemon_alive(n))
		return "its stratafs daemon is gone";
	if (csi_path_resolve(NULL, n->staging, &pp, why, sizeof(why)))
		return NULL;	/* the path is gone: nothing to serve there */
	ret = csi_mnt_at(&pp, &n->mnt, &fd, &top);
	csi_path_release(&pp);
	if (ret != 1) {
		if (top.id && !csi_mnt_same(&top, &n->prev) &&
		    csi_mnt_exists(&n->mnt) == 0)
			return NULL;	/* covered by a mount not ours */
		return "its staging mount is gone";
	}
	ret = csi_mnt_answers(fd, CSI_STAGE_TIMEOUT_MS);
	close(fd);
	if (ret)
		return ret == -ETIMEDOUT ? "its mount does not answer" :
					   "its mount is dead";
	*heal = false;
	for (int i = 0; i < n->ntargets; i++) {
		const struct csi_target *t = &n->targets[i];

		if (csi_path_resolve(NULL, t->path, &pp, why, sizeof(why)))
			continue;
		ret = csi_mnt_at(&pp, &t->mnt, &fd, &top);
		csi_path_release(&pp);
		if (ret == 1)
			close(fd);
		/* a bind of an old mount (a heal cut short) is dead too */
		if (ret == 1 && t->mnt.dev == n->mnt.dev)
			continue;
		if (ret != 1 && top.id && csi_mnt_exists(&t->mnt) == 0)
			continue;
		*target = i;
		return "a published target lost its bind mount";
	}
	return NULL;
}

/* True when the staged volume needs work, as seen without its lock. */
static bool csi_needs_heal(struct csi_plugin *p, const char *id)
{
	struct csi_node_vol n;
	bool wrong, heal;
	int target;

	if (csi_state_load(&p->store, id, &n))
		return false;
	wrong = csi_check_staged(&n, &heal, &target) != NULL;
	csi_state_free(&n);
	return wrong;
}

/* Binds one target again from the volume's live staging mount. */
static int csi_rebind_one(struct csi_plugin *p, struct csi_node_vol *n,
			  int target, char *why, size_t size)
{
	struct csi_path pp;
	struct csi_mnt top;
	int fd, ret;

	ret = csi_path_resolve(NULL, n->staging, &pp, why, size);
	if (ret == 0)
		ret = csi_mnt_at(&pp, &n->mnt, &fd, &top);
	csi_path_release(&pp);
	if (ret != 1) {
		snprintf(why, size, "volume %s: its staging mount is not at %s",
			 n->id, n->staging);
		return ret < 0 ? ret : -ESTALE;
	}
	ret = csi_rebind(p, n, &n->targets[target], fd, why, size);
	close(fd);
	return ret;
}

/*
 * Checks one staged volume and heals it when needed. A healthy volume is
 * checked without taking it busy, so that the periodic check never makes
 * a kubelet call fail with ABORTED; only a heal takes it, and a volume
 * busy with a call is left to the next round.
 */
static void csi_reconcile_one(struct csi_plugin *p, const char *id)
{
	struct csi_node_vol n;
	struct csi_volume v;
	const char *wrong;
	char why[512];
	bool heal;
	int target, ret;

	if (!csi_needs_heal(p, id) || csi_busy_enter(&p->store, id))
		return;
	/* again under the lock: a call may have fixed or removed it */
	ret = csi_state_load(&p->store, id, &n);
	if (ret)
		goto out_leave;
	wrong = csi_check_staged(&n, &heal, &target);
	if (!wrong)
		goto out_state;
	if (!heal) {
		/* the daemon is well: only this target is bound again */
		strata_warn("volume %s: %s (%s): binding it again", id, wrong,
			    n.targets[target].path);
		if (csi_rebind_one(p, &n, target, why, sizeof(why)))
			strata_err("volume %s: %s", id, why);
		goto out_state;
	}
	strata_warn("volume %s: %s: healing", id, wrong);
	ret = csi_volume_load(&p->store, id, &v);
	if (ret) {
		strata_err("volume %s: its record cannot be read (%s): left as is",
			   id, strerror(-ret));
		goto out_state;
	}
	ret = csi_heal(p, &v, &n, why, sizeof(why));
	if (ret)
		strata_err("volume %s: healing failed: %s", id, why);
	else
		strata_info("volume %s: healed, stratafs pid %d", id,
			    (int)n.pid);
	csi_volume_free(&v);
out_state:
	csi_state_free(&n);
out_leave:
	csi_busy_leave(&p->store, id);
}

/*
 * A mount recorded by a plugin that ran in another mount namespace (the
 * container of a plugin that was restarted) is seen here as a copy with
 * an id of its own: the recorded id names a mount of a namespace that is
 * gone. The copy is the same superblock, the connection of the daemon
 * that still serves it, so it is known by its device: the record takes
 * the copy's id, and the daemon is adopted rather than healed.
 */
static bool csi_adopt_mnt(const char *id, const char *path,
			  struct csi_mnt *m)
{
	struct csi_path pp;
	struct csi_mnt top;
	char why[512];
	bool root = false;
	int fd;

	if (!m->id || csi_mnt_exists(m) == 0 ||
	    csi_path_resolve(NULL, path, &pp, why, sizeof(why)))
		return false;
	fd = csi_path_open(&pp, false, NULL);
	csi_path_release(&pp);
	if (fd < 0)
		return false;
	if (csi_mnt_of(fd, &top, &root) || !root || top.dev != m->dev)
		root = false;
	close(fd);
	if (!root)
		return false;
	strata_info("volume %s: the mount at %s was made in another mount namespace: adopted as mount %llu",
		    id, path, (unsigned long long)top.id);
	m->id = top.id;
	return true;
}

static void csi_adopt_one(struct csi_plugin *p, const char *id)
{
	struct csi_node_vol n;
	bool changed;
	int ret;

	if (csi_busy_enter(&p->store, id))
		return;
	if (csi_state_load(&p->store, id, &n))
		goto out_leave;
	if (!csi_daemon_alive(&n))
		goto out_state;
	changed = csi_adopt_mnt(id, n.staging, &n.mnt);
	for (int i = 0; i < n.ntargets; i++)
		changed |= csi_adopt_mnt(id, n.targets[i].path, &n.targets[i].mnt);
	ret = changed ? csi_state_save(&p->store, &n) : 0;
	if (ret)
		strata_err("volume %s: saving the node record: %s", id,
			   strerror(-ret));
out_state:
	csi_state_free(&n);
out_leave:
	csi_busy_leave(&p->store, id);
}

/* At start: the daemons a previous plugin left, found again. */
static void csi_adopt(struct csi_plugin *p)
{
	char **ids;
	int n;

	if (csi_state_list(&p->store, &ids, &n))
		return;
	for (int i = 0; i < n; i++)
		csi_adopt_one(p, ids[i]);
	csi_free_strv(ids, n);
}

int csi_reconcile(struct csi_plugin *p)
{
	static unsigned round; /* the watcher's thread alone runs this */
	char **ids;
	int n, ret;

	ret = csi_state_list(&p->store, &ids, &n);
	if (ret)
		return ret;
	/* round 0 is never a check's: csi_watch_stop forgets with it */
	if (++round == 0)
		round = 1;
	for (int i = 0; i < n; i++) {
		csi_reconcile_one(p, ids[i]);
		csi_condition_check(p, ids[i], round);
	}
	csi_condition_prune(p, round);
	csi_free_strv(ids, n);
	if (p->host.ncgroups)
		csi_cgroup_sweep(p);
	return 0;
}

static void *csi_watch_main(void *arg)
{
	struct csi_plugin *p = arg;
	struct csi_watch *w = p->watch;

	/* what the previous plugin left staged is checked before Probe says ready */
	csi_adopt(p);
	csi_reconcile(p);
	__atomic_store_n(&p->ready, 1, __ATOMIC_RELEASE);
	/*
	 * Probe checks the daemon binary on every call; without this line
	 * the log would say "ready" over a plugin that can stage nothing.
	 */
	if (access(p->host.exec, X_OK) < 0)
		strata_err("not ready: the stratafs daemon %s is unusable (%s): "
			   "give --stratafs the path of a stratafs binary",
			   p->host.exec, strerror(errno));
	else
		strata_info("ready");
	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += CSI_WATCH_PERIOD_MS / 1000;
		pthread_cond_timedwait(&w->cond, &w->lock, &ts);
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->lock);
		/* daemons started by this plugin that exited: no zombies */
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		csi_reconcile(p);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int csi_watch_start(struct csi_plugin *p)
{
	struct csi_watch *w = calloc(1, sizeof(*w));
	int ret;

	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	p->watch = w;
	ret = pthread_create(&w->thread, NULL, csi_watch_main, p);
	if (ret) {
		p->watch = NULL;
		free(w);
		return -ret;
	}
	return 0;
}

void csi_watch_stop(struct csi_plugin *p)
{
	struct csi_watch *w = p->watch;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	csi_condition_prune(p, 0);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
	p->watch = NULL;
}
