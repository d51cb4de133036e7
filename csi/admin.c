// SPDX-License-Identifier: Apache-2.0
/*
 * The Admin service (csi/admin.proto): what an operator asks of the node
 * plugin that CSI has no call for. ReplaceWorker upgrades a staged
 * volume's daemon under its pods: the supervisor keeps the FUSE
 * connection and the mount, and starts a new worker from the binary on
 * disk now (with --daemon-binary-dir, the plugin's newest copy, through
 * the bundle directory's "current" link). ListVolumeStates and
 * InspectVolume (inspect.c) show what the node does with each volume.
 * ImportLayer, ListLayers and DeleteLayer (layer.c) manage the store's
 * layers.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "csi.h"

/* How long a new worker may take to start serving: a full takeover
 * of a large tree, or the exec of a new binary, is well under this. */
#define CSI_REPLACE_TIMEOUT_MS 10000

/* Whether pid is a stratafs worker (the name its supervisor gives it). */
static bool csi_is_worker(pid_t pid)
{
	char path[64], comm[32];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/comm", (int)pid);
	n = csi_record_read_text(AT_FDCWD, path, comm, sizeof(comm));
	return n > 0 && !strncmp(comm, "stratafs-worker\n", (size_t)n);
}

/*
 * The worker of the supervisor `sup`: its one child that calls itself a
 * worker. 0 when it has none (between two workers, or run with -o
 * nosupervisor), or -errno when the supervisor's children cannot be read.
 */
static pid_t csi_worker_of(pid_t sup)
{
	char path[64], buf[512], *p, *end;
	pid_t found = 0;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)sup,
		 (int)sup);
	n = csi_record_read_text(AT_FDCWD, path, buf, sizeof(buf));
	if (n < 0)
		return n;
	for (p = buf; *p; p = end) {
		long pid = strtol(p, &end, 10);

		if (end == p)
			break;
		if (pid > 0 && csi_is_worker((pid_t)pid))
			found = (pid_t)pid;
	}
	return found;
}

static void csi_sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/*
 * Asks the supervisor behind n for a new worker and waits until one other
 * than `old` runs. The signal goes through a pidfd opened while the
 * supervisor's start time still matched: a reused pid is never signalled.
 */
static int csi_replace(const struct csi_node_vol *n, pid_t old, pid_t *now)
{
	int pidfd, ret = 0;
	pid_t w;

	pidfd = (int)syscall(SYS_pidfd_open, n->pid, 0);
	if (pidfd < 0)
		return -errno;
	if (!csi_daemon_alive(n)) {
		ret = -ESRCH;
		goto out;
	}
	if (syscall(SYS_pidfd_send_signal, pidfd, SIGHUP, NULL, 0) < 0) {
		ret = -errno;
		goto out;
	}
	for (int waited = 0;; waited += 10) {
		if (!csi_daemon_alive(n)) {
			ret = -ESRCH;
			break;
		}
		w = csi_worker_of(n->pid);
		if (w > 0 && w != old) {
			*now = w;
			break;
		}
		if (waited >= CSI_REPLACE_TIMEOUT_MS) {
			ret = -ETIMEDOUT;
			break;
		}
		csi_sleep_ms(10);
	}
out:
	close(pidfd);
	return ret;
}

static void csi_admin_replace_worker(struct csi_plugin *p,
				     const ProtobufCMessage *msg,
				     struct csi_reply *r)
{
	const Strata__V1__ReplaceWorkerRequest *req = (const void *)msg;
	Strata__V1__ReplaceWorkerResponse *out;
	struct csi_volume v = { 0 };
	struct csi_node_vol n = { 0 };
	char exe[PATH_MAX], path[64], *binary;
	pid_t old, now = 0;
	ssize_t len;
	int ret;

	if (csi_reply_id_check(r, req->volume_id))
		return;
	if (csi_busy_claim(&p->store, req->volume_id, r))
		return;
	ret = csi_volume_load(&p->store, req->volume_id, &v);
	if (ret) {
		csi_reply_load(r, req->volume_id, ret);
		goto out;
	}
	ret = csi_state_load(&p->store, req->volume_id, &n);
	if (ret == -ENOENT) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s is not staged on this node: it has no daemon",
			      req->volume_id);
		goto out;
	}
	if (ret) {
		csi_reply_set(r, CSI_INTERNAL,
			      "the node record %s/node/%s.json cannot be read (%s)",
			      p->store.root, req->volume_id, strerror(-ret));
		goto out;
	}
	if (!csi_daemon_alive(&n)) {
		csi_reply_set(r, CSI_UNAVAILABLE,
			      "volume %s: its daemon (pid %d) is not running; the plugin heals it within seconds, retry then",
			      req->volume_id, (int)n.pid);
		goto out;
	}
	old = csi_worker_of(n.pid);
	if (old <= 0) {
		csi_reply_set(r, CSI_FAILED_PRECONDITION,
			      "volume %s: its daemon (pid %d) has no worker to replace: it runs without a supervisor, or is between two workers; retry",
			      req->volume_id, (int)n.pid);
		goto out;
	}
	ret = csi_replace(&n, old, &now);
	if (ret) {
		csi_reply_set(r, ret == -ETIMEDOUT ? CSI_DEADLINE_EXCEEDED :
				 ret == -ESRCH ? CSI_UNAVAILABLE : CSI_INTERNAL,
			      "volume %s: replacing worker %d of daemon %d: %s%s",
			      req->volume_id, (int)old, (int)n.pid,
			      ret == -ETIMEDOUT ? "no new worker within 10 s" :
			      ret == -ESRCH ? "the daemon exited" : strerror(-ret),
			      "; its log says why");
		goto out;
	}
	snprintf(path, sizeof(path), "/proc/%d/exe", (int)now);
	len = readlink(path, exe, sizeof(exe) - 1);
	exe[len < 0 ? 0 : len] = '\0';
	strata_info("volume %s: worker %d replaced by %d, running %s",
		    req->volume_id, (int)old, (int)now, exe);
	out = csi_alloc(r, sizeof(*out));
	binary = csi_strdup(r, exe);
	if (!out || !binary) {
		csi_reply_errno(r, -ENOMEM, "ReplaceWorker");
		goto out;
	}
	strata__v1__replace_worker_response__init(out);
	out->supervisor_pid = n.pid;
	out->old_worker_pid = old;
	out->new_worker_pid = now;
	out->binary = binary;
	csi_reply_ok(r, out);
out:
	csi_state_free(&n);
	csi_volume_free(&v);
	csi_busy_leave(&p->store, req->volume_id);
}

const struct csi_method csi_admin_methods[] = {
	{ "/strata.v1.Admin/ReplaceWorker",
	  &strata__v1__replace_worker_request__descriptor,
	  csi_admin_replace_worker, CSI_MODE_NODE, true },
	/* blocking: they ask each volume's daemon for its usage */
	{ "/strata.v1.Admin/ListVolumeStates",
	  &strata__v1__list_volume_states_request__descriptor,
	  csi_admin_list_volume_states, CSI_MODE_NODE, true },
	{ "/strata.v1.Admin/InspectVolume",
	  &strata__v1__inspect_volume_request__descriptor,
	  csi_admin_inspect_volume, CSI_MODE_NODE, true },
	/* blocking: an import extracts, a list walks every layer */
	{ "/strata.v1.Admin/ImportLayer",
	  &strata__v1__import_layer_request__descriptor,
	  csi_admin_import_layer, CSI_MODE_NODE, true },
	{ "/strata.v1.Admin/ListLayers",
	  &strata__v1__list_layers_request__descriptor,
	  csi_admin_list_layers, CSI_MODE_NODE, true },
	{ "/strata.v1.Admin/DeleteLayer",
	  &strata__v1__delete_layer_request__descriptor,
	  csi_admin_delete_layer, CSI_MODE_NODE, true },
	{ NULL },
};
