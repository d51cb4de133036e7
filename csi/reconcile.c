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

#include "csi.h"

#define CSI_WATCH_PERIOD_MS 1000

struct csi_watch {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool stop;
};

/* Targets are bind mounts of the staging mount: re-made over a new one. */
static int csi_rebind(const struct csi_node_vol *n, char *why, size_t size)
{
	for (int i = 0; i < n->ntargets; i++) {
		const struct csi_target *t = &n->targets[i];
		int ret;

		if (!csi_mount_find(t->path, NULL, 0, NULL, 0))
			umount2(t->path, MNT_DETACH | UMOUNT_NOFOLLOW);
		if (mkdir(t->path, 0750) < 0 && errno != EEXIST) {
			snprintf(why, size, "target %s: %s", t->path,
				 strerror(errno));
			return -errno;
		}
		ret = csi_mount_bind(n->staging, t->path,
				     csi_flags_from_canon(t->flags) |
					     (t->readonly ? MS_RDONLY : 0));
		if (ret) {
			snprintf(why, size, "bind mount of %s on %s: %s",
				 n->staging, t->path, strerror(-ret));
			return ret;
		}
	}
	return 0;
}

/*
 * Brings a staged volume whose daemon died back: the dead mounts go, a
 * new daemon mounts the staging path, and the targets are bound again.
 * The caller holds the volume busy.
 */
int csi_heal(struct csi_plugin *p, const struct csi_volume *v,
	     struct csi_node_vol *n, char *why, size_t size)
{
	int ret;

	for (int i = 0; i < n->ntargets; i++)
		if (!csi_mount_find(n->targets[i].path, NULL, 0, NULL, 0))
			umount2(n->targets[i].path, MNT_DETACH | UMOUNT_NOFOLLOW);
	if (!csi_mount_find(n->staging, NULL, 0, NULL, 0))
		umount2(n->staging, MNT_DETACH | UMOUNT_NOFOLLOW);
	if (csi_daemon_alive(n))
		csi_daemon_stop(p, n);
	else
		csi_metrics_event(CSI_EV_DAEMON_EXIT);
	ret = csi_daemon_start(p, v, n->staging, n, why, size);
	if (ret)
		return ret;
	csi_metrics_event(CSI_EV_DAEMON_RESTART);
	ret = csi_rebind(n, why, size);
	if (ret)
		return ret;
	return csi_state_save(&p->store, n);
}

/* What is wrong with a staged volume, or NULL when all is well. */
static const char *csi_check_staged(const struct csi_node_vol *n)
{
	char fstype[64];

	if (!csi_daemon_alive(n))
		return "its stratafs daemon is gone";
	if (csi_mount_find(n->staging, fstype, sizeof(fstype), NULL, 0) ||
	    strcmp(fstype, "fuse.stratafs"))
		return "its staging path is not mounted";
	if (csi_mount_alive(n->staging))
		return "its mount does not answer";
	for (int i = 0; i < n->ntargets; i++)
		if (csi_mount_same(n->staging, n->targets[i].path))
			return "a published target lost its bind mount";
	return NULL;
}

/* True when the staged volume needs healing, as seen without its lock. */
static bool csi_needs_heal(struct csi_plugin *p, const char *id)
{
	struct csi_node_vol n;
	bool wrong;

	if (csi_state_load(&p->store, id, &n))
		return false;
	wrong = csi_check_staged(&n) != NULL;
	csi_state_free(&n);
	return wrong;
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
	int ret;

	if (!csi_needs_heal(p, id) || csi_busy_enter(&p->store, id))
		return;
	/* again under the lock: a call may have fixed or removed it */
	ret = csi_state_load(&p->store, id, &n);
	if (ret)
		goto out_leave;
	wrong = csi_check_staged(&n);
	if (!wrong)
		goto out_state;
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

int csi_reconcile(struct csi_plugin *p)
{
	char **ids;
	int n, ret;

	ret = csi_state_list(&p->store, &ids, &n);
	if (ret)
		return ret;
	for (int i = 0; i < n; i++)
		csi_reconcile_one(p, ids[i]);
	csi_free_strv(ids, n);
	return 0;
}

static void *csi_watch_main(void *arg)
{
	struct csi_plugin *p = arg;
	struct csi_watch *w = p->watch;

	/* what the previous plugin left staged is checked before Probe says ready */
	csi_reconcile(p);
	__atomic_store_n(&p->ready, 1, __ATOMIC_RELEASE);
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
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
	p->watch = NULL;
}
