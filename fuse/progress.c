// SPDX-License-Identifier: Apache-2.0
/*
 * How far the copy-ups in progress have got. A write to a big lower file
 * waits for its whole copy-up, and without this nothing says why: the
 * operator asks the daemon (`stratactl volume inspect`, through the
 * control verb `progress`), and a daemon run in the foreground on a
 * terminal says so itself, once a second. Nothing is printed otherwise.
 *
 * The table is the serving process's own: a copy-up dies with the worker
 * that made it, and so does its entry.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_PROGRESS_SLOTS 16
/* smaller copies end before anyone could look */
#define SFS_PROGRESS_MIN (4 << 20)
#define SFS_PROGRESS_TTY_MIN (64 << 20)

struct sfs_progress {
	bool used;
	bool tty;		/* said on the terminal */
	char path[PATH_MAX];	/* within its layer */
	off_t total;
	_Atomic off_t done;
	struct timespec said;	/* when the terminal was last told */
};

static struct sfs_progress sfs_progress_tab[SFS_PROGRESS_SLOTS];
static pthread_mutex_t sfs_progress_lock = PTHREAD_MUTEX_INITIALIZER;

/* Where FD's file is, as its /proc link says: -errno if it cannot tell. */
static int sfs_progress_readlink(int fd, char *buf, size_t size)
{
	char link[64];
	ssize_t len;

	sfs_proc_path(fd, link, sizeof(link));
	len = readlink(link, buf, size - 1);
	if (len < 0)
		return -errno;
	buf[len] = '\0';
	return 0;
}

/* FD's path within LAYER's root (the root's own path removed). */
static void sfs_progress_path(int fd, int layer, char *buf, size_t size)
{
	char root[PATH_MAX];
	size_t len;

	if (sfs_progress_readlink(fd, buf, size) < 0) {
		snprintf(buf, size, "?");
		return;
	}
	if (layer < 1 || layer > sfs->nlower ||
	    sfs_progress_readlink(sfs->lower[layer - 1].fd, root,
				  sizeof(root)) < 0)
		return;
	/* a layer the daemon holds as a mount of its own is "/" */
	len = strcmp(root, "/") ? strlen(root) : 0;
	if (!strncmp(buf, root, len) && buf[len] == '/')
		memmove(buf, buf + len + 1, strlen(buf + len + 1) + 1);
}

/*
 * A copy-up of TOTAL bytes from the lower file FD (of LAYER) begins: its
 * entry, or NULL when it is too small to show or the table is full.
 */
struct sfs_progress *sfs_progress_begin(int fd, int layer, off_t total)
{
	struct sfs_progress *p = NULL;
	char path[PATH_MAX];

	if (total < SFS_PROGRESS_MIN)
		return NULL;
	sfs_progress_path(fd, layer, path, sizeof(path));
	/* whole before the verb can see it */
	pthread_mutex_lock(&sfs_progress_lock);
	for (int i = 0; i < SFS_PROGRESS_SLOTS && !p; i++)
		if (!sfs_progress_tab[i].used)
			p = &sfs_progress_tab[i];
	if (p) {
		p->used = true;
		memcpy(p->path, path, sizeof(path));
		p->total = total;
		atomic_store(&p->done, 0);
		p->tty = total >= SFS_PROGRESS_TTY_MIN &&
			 sfs->params.foreground && isatty(STDERR_FILENO);
		clock_gettime(CLOCK_MONOTONIC, &p->said);
	}
	pthread_mutex_unlock(&sfs_progress_lock);
	return p;
}

static void sfs_progress_say(struct sfs_progress *p, off_t done)
{
	fprintf(stderr, "stratafs: copying up %s: %lld of %lld MiB (%d%%)\n",
		p->path, (long long)(done >> 20), (long long)(p->total >> 20),
		(int)(done * 100 / p->total));
}

/* DONE bytes of P are copied. */
void sfs_progress_set(struct sfs_progress *p, off_t done)
{
	struct timespec now;

	if (!p)
		return;
	atomic_store(&p->done, done);
	if (!p->tty)
		return;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec - p->said.tv_sec < 1)
		return;
	p->said = now;
	sfs_progress_say(p, done);
}

void sfs_progress_end(struct sfs_progress *p)
{
	if (!p)
		return;
	if (p->tty)
		sfs_progress_say(p, atomic_load(&p->done));
	pthread_mutex_lock(&sfs_progress_lock);
	p->used = false;
	pthread_mutex_unlock(&sfs_progress_lock);
}

/* A path as one field of a reply: blanks, '%', ':' and controls escaped. */
static size_t sfs_progress_escape(const char *s, char *out, size_t size)
{
	size_t len = 0;

	for (; *s && len + 4 < size; s++) {
		unsigned char c = *s;

		if (c <= ' ' || c == '%' || c == ':' || c == 0x7f)
			len += snprintf(out + len, size - len, "%%%02X", c);
		else
			out[len++] = c;
	}
	out[len] = '\0';
	return len;
}

/*
 * The control verb: "copyups=N" and a "copyup=PATH:DONE:TOTAL" for each,
 * PATH percent-escaped.
 */
int sfs_progress_verb(int argc, char **argv, char *out, size_t size)
{
	char path[3 * 128 + 1];
	size_t len;
	int n = 0;

	len = snprintf(out, size, "copyups=");
	pthread_mutex_lock(&sfs_progress_lock);
	for (int i = 0; i < SFS_PROGRESS_SLOTS; i++)
		n += sfs_progress_tab[i].used;
	len += snprintf(out + len, size - len, "%d", n);
	for (int i = 0; i < SFS_PROGRESS_SLOTS && len < size; i++) {
		struct sfs_progress *p = &sfs_progress_tab[i];

		if (!p->used)
			continue;
		/* room for every slot in a reply: a long path is cut short */
		sfs_progress_escape(p->path, path, sizeof(path));
		len += snprintf(out + len, size - len, " copyup=%s:%lld:%lld",
				path, (long long)atomic_load(&p->done),
				(long long)p->total);
	}
	pthread_mutex_unlock(&sfs_progress_lock);
	return 0;
}
