// SPDX-License-Identifier: Apache-2.0
/*
 * A volume's condition, as CSI reports it (VolumeCondition in
 * NodeGetVolumeStats and ControllerGetVolume) and `stratactl volume
 * inspect` shows it: abnormal, with a sentence saying what is wrong, when
 * its daemon is dead, a lower layer is missing, unreadable or replaced
 * under it, or its upper layer cannot be written.
 *
 * Of these, what no heal can mend is also found by the periodic check of
 * staged volumes and logged once each (and once more when it ends): a
 * lower layer removed, renamed away or replaced under the store while a
 * volume over it is staged. The daemon keeps the directory it was given
 * as a descriptor, so it does not crash; but files of a removed layer are
 * gone from the volume, and a heal or a new stage would fail or serve
 * another tree.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "csi.h"

struct csi_cond {
	struct csi_cond *next;
	char id[CSI_VOLUME_ID_LEN + 1];
	char *msg;		/* what was last logged; "" when well */
	unsigned round;		/* the last check that saw the volume staged */
};

/*
 * The daemon's lower layers as it holds them: the descriptors its
 * lowerdir= names (/proc/self/fd/N), in order. Returns how many, or
 * -errno; 0 for a daemon that was not given descriptors.
 */
static int csi_daemon_layers(pid_t pid, int *fds, int max)
{
	char path[64], buf[16384], *o = NULL, *end;
	ssize_t len;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	len = csi_record_read_text(AT_FDCWD, path, buf, sizeof(buf));
	if (len <= 0)
		return len ? len : -EIO;
	for (char *a = buf; a < buf + len; a += strlen(a) + 1)
		if (!strcmp(a, "-o") && a + 3 < buf + len)
			o = a + 3;
	if (!o || strncmp(o, "lowerdir=", 9))
		return 0;
	for (char *l = o + 9; n < max && !strncmp(l, "/proc/self/fd/", 14);) {
		fds[n++] = (int)strtol(l + 14, &end, 10);
		if (*end != ':')
			break;
		l = end + 1;
	}
	return n;
}

/*
 * What is wrong with a staged volume's layers, as its daemon holds them,
 * in `msg`; "" when nothing.
 */
static void csi_condition_layers(struct csi_plugin *p, const struct csi_volume *v,
			  const struct csi_node_vol *n, char *msg, size_t size)
{
	int fds[CSI_MAX_LAYERS], nfds, skip;

	msg[0] = '\0';
	nfds = csi_daemon_layers(n->pid, fds, CSI_MAX_LAYERS);
	/*
	 * A snapshot frozen live puts its layer on top of the chain without
	 * a restart: the daemon's own list is the bottom of the record's.
	 */
	skip = nfds > 0 && v->nlayers > nfds ? v->nlayers - nfds : 0;
	for (int i = skip; i < v->nlayers && !msg[0]; i++) {
		struct stat held, now;
		char path[64];
		int fd;

		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)n->pid,
			 i - skip < nfds ? fds[i - skip] : -1);
		if (i - skip >= nfds || stat(path, &held) < 0)
			continue;	/* the daemon is gone: a heal's business */
		fd = csi_chain_open(&p->store, v->layers[i]);
		if (fd >= 0 && fstat(fd, &now) < 0)
			now.st_ino = 0;
		if (fd >= 0)
			close(fd);
		if (held.st_nlink == 0)
			snprintf(msg, size, "its lower layer '%s' was removed while it is staged: the files of that layer are gone from the volume",
				 v->layers[i]);
		else if (fd < 0)
			snprintf(msg, size, "its lower layer '%s' is gone from %s/layers (renamed away or replaced by a symlink while the volume is staged): the daemon still serves the directory it was given, but the volume cannot be healed or staged again",
				 v->layers[i], p->store.root);
		else if (held.st_dev != now.st_dev || held.st_ino != now.st_ino)
			snprintf(msg, size, "its lower layer '%s' in %s/layers is not the directory its daemon serves (replaced while the volume is staged): a heal would serve the new one",
				 v->layers[i], p->store.root);
	}
}

/* Each lower layer opens from the store and its first entry reads. */
static void csi_condition_readable(struct csi_plugin *p,
				   const struct csi_volume *v, char *msg,
				   size_t size)
{
	for (int i = 0; i < v->nlayers && !msg[0]; i++) {
		int pfd = csi_layer_open(&p->store, v->layers[i]), fd;
		DIR *d;

		if (pfd < 0) {
			snprintf(msg, size, "its lower layer '%s' cannot be opened in %s/layers (%s): put the layer back, or delete the volume",
				 v->layers[i], p->store.root, strerror(-pfd));
			break;
		}
		/* the store hands out O_PATH descriptors: open it for reading */
		fd = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		close(pfd);
		if (fd < 0) {
			snprintf(msg, size, "its lower layer '%s' in %s/layers cannot be read (%s)",
				 v->layers[i], p->store.root, strerror(errno));
			break;
		}
		d = fdopendir(fd);
		if (!d) {
			close(fd);
			continue;	/* out of memory: no verdict */
		}
		errno = 0;
		if (!readdir(d) && errno)
			snprintf(msg, size, "its lower layer '%s' in %s/layers cannot be read (%s)",
				 v->layers[i], p->store.root, strerror(errno));
		closedir(d);
	}
}

/*
 * The upper layer takes a new file: an unnamed one (O_TMPFILE), gone at
 * its close, so the check leaves nothing behind in the volume. A
 * read-only or failing store, an immutable or missing directory all
 * refuse it.
 */
static void csi_condition_upper(struct csi_plugin *p,
				const struct csi_volume *v, char *msg,
				size_t size)
{
	char path[CSI_VOLUME_ID_LEN + 8];
	int dfd, fd;

	snprintf(path, sizeof(path), "%s/upper", v->id);
	dfd = openat(p->store.volumes_fd, path,
		     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		snprintf(msg, size, "its upper layer %s/volumes/%s cannot be opened (%s)",
			 p->store.root, path, strerror(errno));
		return;
	}
	fd = openat(dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	else if (errno != EOPNOTSUPP && errno != EISDIR)
		snprintf(msg, size, "its upper layer %s/volumes/%s cannot be written (%s): writes in the volume fail",
			 p->store.root, path, strerror(errno));
	close(dfd);
}

/*
 * What the usage says: a staged volume whose daemon does not report it
 * (alive but not answering), or one over its capacity (a limit below what
 * it held, files put in the upper behind the daemon's back). `u` NULL:
 * nothing is known of its usage.
 */
static void csi_condition_usage(const struct csi_volume *v,
				const struct csi_node_vol *n,
				const struct csi_usage *u, char *msg,
				size_t size)
{
	int64_t cap;

	if (n && u && !u->live) {
		snprintf(msg, size, "its usage is as last saved: %s", u->why);
		return;
	}
	if (!u)
		return;
	cap = u->live && u->capacity >= 0 ? u->capacity : v->capacity;
	if (cap > 0 && u->bytes > cap)
		snprintf(msg, size, "it is over its capacity: its upper layer holds %lld bytes of %lld: delete files in the volume, or expand it",
			 (long long)u->bytes, (long long)cap);
}

/*
 * What is wrong with volume `v`, in `msg`; "" when nothing. `n` is its
 * node state when it is staged here, else NULL; `u` its usage when the
 * caller has it, else NULL (then it is asked for here). Reads only (the
 * upper's check makes an unnamed file), so any thread may ask.
 */
void csi_condition_volume(struct csi_plugin *p, const struct csi_volume *v,
			  const struct csi_node_vol *n,
			  const struct csi_usage *u, char *msg, size_t size)
{
	struct csi_usage own;

	msg[0] = '\0';
	if (n && !csi_daemon_alive(n)) {
		/* the watcher heals it within seconds; until then it is down */
		snprintf(msg, size,
			 "its daemon (pid %d) is not running: the plugin starts it again",
			 (int)n->pid);
		return;
	}
	if (n)
		csi_condition_layers(p, v, n, msg, size);
	if (!msg[0])
		csi_condition_readable(p, v, msg, size);
	if (!msg[0])
		csi_condition_upper(p, v, msg, size);
	if (!msg[0] && !u && csi_usage_get(&p->store, v->id, &own) == 0)
		u = &own;
	if (!msg[0])
		csi_condition_usage(v, n, u, msg, size);
}

static struct csi_cond *csi_cond_get(struct csi_plugin *p, const char *id)
{
	struct csi_cond *c;

	for (c = p->conds; c; c = c->next)
		if (!strcmp(c->id, id))
			return c;
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	snprintf(c->id, sizeof(c->id), "%s", id);
	c->msg = strdup("");
	if (!c->msg) {
		free(c);
		return NULL;
	}
	c->next = p->conds;
	p->conds = c;
	return c;
}

/* Checks one staged volume; logs a condition when it starts and ends. */
void csi_condition_check(struct csi_plugin *p, const char *id, unsigned round)
{
	struct csi_node_vol n;
	struct csi_volume v;
	struct csi_cond *c;
	char msg[512];

	if (csi_state_load(&p->store, id, &n))
		return;
	if (!csi_daemon_alive(&n) || csi_volume_load(&p->store, id, &v))
		goto out_state;
	csi_condition_layers(p, &v, &n, msg, sizeof(msg));
	c = csi_cond_get(p, id);
	if (!c)
		goto out_volume;
	c->round = round;
	if (strcmp(c->msg, msg)) {
		char *copy = strdup(msg);

		if (msg[0])
			strata_warn("volume %s is abnormal: %s", id, msg);
		else
			strata_info("volume %s: its lower layers are as they were staged again",
				    id);
		if (copy) {
			free(c->msg);
			c->msg = copy;
		}
	}
out_volume:
	csi_volume_free(&v);
out_state:
	csi_state_free(&n);
}

/* Forgets volumes the check of `round` did not see staged. */
void csi_condition_prune(struct csi_plugin *p, unsigned round)
{
	struct csi_cond **pc = &p->conds;

	while (*pc) {
		struct csi_cond *c = *pc;

		if (c->round == round) {
			pc = &c->next;
			continue;
		}
		*pc = c->next;
		free(c->msg);
		free(c);
	}
}

/* The volume's condition as a VolumeCondition message, or NULL (ENOMEM). */
Csi__V1__VolumeCondition *csi_condition_msg(struct csi_plugin *p,
					    struct csi_reply *r,
					    const struct csi_volume *v,
					    const struct csi_node_vol *n,
					    const struct csi_usage *u)
{
	Csi__V1__VolumeCondition *c = csi_alloc(r, sizeof(*c));
	char msg[512];

	if (!c)
		return NULL;
	csi__v1__volume_condition__init(c);
	csi_condition_volume(p, v, n, u, msg, sizeof(msg));
	c->abnormal = msg[0] != '\0';
	c->message = csi_strdup(r, msg[0] ? msg : "the volume is healthy");
	return c->message ? c : NULL;
}
