// SPDX-License-Identifier: Apache-2.0
/*
 * The control channel: how the CSI plugin asks a running daemon to do
 * what no FUSE request can ask for (a new capacity, a snapshot's freeze)
 * and to tell what only it knows (its usage, the upper it writes to, the
 * transport and passthrough INIT agreed).
 *
 * With -o control=PATH the daemon listens on a unix SOCK_SEQPACKET socket
 * at PATH. A request is one datagram: a verb and its arguments separated
 * by NUL bytes, so a path needs no escaping. The reply is one datagram,
 * "STATUS TEXT": STATUS is 0 or a negative errno in decimal, TEXT the
 * error's message, or the result as space-separated key=value pairs (a
 * value that is a path the client gave, as freeze's layer=, may hold
 * spaces: the client matches it whole, as it knows it). One
 * request per connection, served one at a time by a thread of the
 * serving process, so verbs never race each other.
 *
 * The listening socket is made before the first worker starts and kept
 * in the shared state: it is one of the supervisor's descriptors, which
 * every worker keeps and an upgrade's exec inherits. A worker that dies
 * in the middle of a request takes the connection with it; the client
 * reads an end of file, and asks again once a new worker serves.
 *
 * The socket is 0600, and a peer that is neither root nor the daemon's
 * own user is refused even so: the mode of a socket made under another
 * umask, or reached through a bind mount, is not the only gate.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "stratafs.h"

#define SFS_CONTROL_MAX 8192	/* a request or a reply */
#define SFS_CONTROL_ARGS 8
/* a client that connects and sends nothing holds up no other for long */
#define SFS_CONTROL_TIMEOUT_S 5

static int sfs_control_ping(int argc, char **argv, char *out, size_t size)
{
	snprintf(out, size, "pong pid=%d", (int)getpid());
	return 0;
}

/*
 * How requests and file data travel, as INIT agreed them: over io_uring
 * rings or /dev/fuse (uring.c), and whether the kernel does file I/O
 * itself (passthrough.c), which turns off once the kernel refuses a
 * backing file. Both live in the shared state, so a worker that came
 * after INIT answers for it.
 */
static int sfs_control_status(int argc, char **argv, char *out, size_t size)
{
	snprintf(out, size, "transport=%s passthrough=%s",
		 atomic_load(&sfs->uring) ? "uring" : "dev",
		 atomic_load(&sfs->passthrough) ? "on" : "off");
	return 0;
}

/*
 * How many nodes the daemon keeps (the root aside): what the kernel
 * still knows, and the directories above it. A count that only grows
 * while the kernel forgets is a leak.
 */
static int sfs_control_nodes(int argc, char **argv, char *out, size_t size)
{
	snprintf(out, size, "nodes=%ld", atomic_load(&sfs->nodes));
	return 0;
}

static const struct sfs_control_verb sfs_control_verbs[] = {
	{ "ping", sfs_control_ping, 0, 0 },
	{ "status", sfs_control_status, 0, 0 },
	{ "nodes", sfs_control_nodes, 0, 0 },
	{ "progress", sfs_progress_verb, 0, 0 },
	{ "usage", sfs_usage_verb, 0, 0 },
	{ "capacity", sfs_capacity_verb, 1, 1 },
	{ "freeze", sfs_freeze_verb, 1, 1 },
};

static struct {
	pthread_t thread;
	int stopfd;		/* eventfd: the thread ends when it is written */
	bool running;
} sfs_ctl = { .stopfd = -1 };

/*
 * The socket's address: through the directory's descriptor, so that a
 * PATH longer than sun_path (108 bytes: a deep store root) still fits.
 */
static int sfs_control_addr(int dirfd, const char *base,
			    struct sockaddr_un *sa)
{
	sa->sun_family = AF_UNIX;
	if ((size_t)snprintf(sa->sun_path, sizeof(sa->sun_path),
			     "/proc/self/fd/%d/%s", dirfd, base) >=
	    sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	return 0;
}

/*
 * A socket left at PATH by a daemon that was killed is taken over; one a
 * live daemon answers on, or anything that is not a socket, is not.
 */
static int sfs_control_clear(int dirfd, const char *base,
			     const struct sockaddr_un *sa)
{
	struct stat st;
	int fd, ret;

	if (fstatat(dirfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ret = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	close(fd);
	if (ret == 0)
		return -EADDRINUSE;
	if (unlinkat(dirfd, base, 0) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int sfs_control_bind(struct sfs_fs *fs, int dirfd, const char *base)
{
	struct sockaddr_un sa;
	struct stat st;
	mode_t mask;
	int fd, ret;

	ret = sfs_control_addr(dirfd, base, &sa);
	if (ret == 0)
		ret = sfs_control_clear(dirfd, base, &sa);
	if (ret < 0)
		return ret;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* setup is single-threaded: the umask is ours for the moment */
	mask = umask(0177);
	ret = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(mask);
	if (ret < 0 || listen(fd, 16) < 0 ||
	    fstatat(dirfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	fs->ctlfd = fd;
	fs->ctl_dev = st.st_dev;
	fs->ctl_ino = st.st_ino;
	return 0;
}

/* At setup, before any worker: the socket of -o control=PATH. */
int sfs_control_open(struct sfs_fs *fs)
{
	char *path = fs->params.control, *slash;
	const char *base;
	int dirfd, ret;

	fs->ctlfd = -1;
	if (!path)
		return 0;
	slash = strrchr(path, '/');
	base = slash ? slash + 1 : path;
	if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
		fprintf(stderr, "stratafs: control=%s: not a socket's name\n",
			path);
		return -EINVAL;
	}
	if (slash == path)
		dirfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	else if (slash) {
		*slash = '\0';
		dirfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
		*slash = '/';
	} else
		dirfd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0) {
		ret = -errno;
		goto out_msg;
	}
	ret = sfs_control_bind(fs, dirfd, base);
	close(dirfd);
	if (ret == 0)
		return 0;
out_msg:
	fprintf(stderr, "stratafs: control=%s: %s\n", path,
		ret == -EEXIST ? "exists, and is not a socket" :
		ret == -EADDRINUSE ? "another daemon answers there" :
				     strerror(-ret));
	return ret;
}

/*
 * At the daemon's end: the socket goes, unless a daemon started since
 * has bound its own at the same path (a heal racing this exit).
 */
void sfs_control_close(struct sfs_fs *fs)
{
	struct stat st;

	if (fs->ctlfd < 0)
		return;
	close(fs->ctlfd);
	fs->ctlfd = -1;
	if (stat(fs->params.control, &st) == 0 && st.st_dev == fs->ctl_dev &&
	    st.st_ino == fs->ctl_ino)
		unlink(fs->params.control);
}

static bool sfs_control_peer_ok(int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return false;
	return cred.uid == 0 || cred.uid == geteuid();
}

/* Runs one request of LEN bytes in BUF; the reply goes in OUT. */
static void sfs_control_run(char *buf, size_t len, char *out, size_t size)
{
	char *argv[SFS_CONTROL_ARGS + 1], text[SFS_CONTROL_MAX - 16];
	const struct sfs_control_verb *v = NULL;
	int argc = 0, ret;

	text[0] = '\0';
	buf[len] = '\0';
	/* fields end at each NUL; the last needs none */
	for (size_t i = 0; i < len && argc <= SFS_CONTROL_ARGS;) {
		argv[argc++] = buf + i;
		i += strlen(buf + i) + 1;
	}
	if (argc == 0 || argc > SFS_CONTROL_ARGS) {
		ret = -EINVAL;
		snprintf(text, sizeof(text), argc ? "too many arguments" :
						    "an empty request");
		goto out;
	}
	for (size_t i = 0;
	     i < sizeof(sfs_control_verbs) / sizeof(sfs_control_verbs[0]); i++)
		if (!strcmp(argv[0], sfs_control_verbs[i].name))
			v = &sfs_control_verbs[i];
	if (!v) {
		ret = -EOPNOTSUPP;
		snprintf(text, sizeof(text), "unknown verb '%.64s'", argv[0]);
		goto out;
	}
	if (argc - 1 < v->min || argc - 1 > v->max) {
		ret = -EINVAL;
		snprintf(text, sizeof(text), "%s takes %d to %d arguments, not %d",
			 v->name, v->min, v->max, argc - 1);
		goto out;
	}
	ret = v->fn(argc - 1, argv + 1, text, sizeof(text));
	if (ret < 0 && !text[0])
		snprintf(text, sizeof(text), "%s: %s", v->name, strerror(-ret));
out:
	snprintf(out, size, "%d %s", ret, text);
}

static void sfs_control_serve(int fd)
{
	struct timeval tv = { .tv_sec = SFS_CONTROL_TIMEOUT_S };
	char buf[SFS_CONTROL_MAX + 1], out[SFS_CONTROL_MAX];
	ssize_t len;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	/*
	 * Read before any answer, a refusal too: closing on an unread
	 * request resets the connection, and the client never reads why.
	 * An empty datagram reads as 0, and is answered as empty.
	 */
	len = recv(fd, buf, SFS_CONTROL_MAX, MSG_TRUNC);
	if (len < 0)
		return;
	if (!sfs_control_peer_ok(fd)) {
		snprintf(out, sizeof(out), "%d only root or the daemon's user may ask",
			 -EPERM);
		goto reply;
	}
	if (len > SFS_CONTROL_MAX) {
		snprintf(out, sizeof(out), "%d a request of over %d bytes",
			 -EMSGSIZE, SFS_CONTROL_MAX);
		goto reply;
	}
	sfs_control_run(buf, len, out, sizeof(out));
reply:
	send(fd, out, strlen(out), MSG_NOSIGNAL);
}

static void *sfs_control_loop(void *arg)
{
	struct pollfd pfd[2] = {
		{ .fd = sfs->ctlfd, .events = POLLIN },
		{ .fd = sfs_ctl.stopfd, .events = POLLIN },
	};

	for (;;) {
		int fd;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			strata_err("control: poll: %s", strerror(errno));
			break;
		}
		if (pfd[1].revents)
			break;
		fd = accept4(sfs->ctlfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		sfs_control_serve(fd);
		close(fd);
	}
	return NULL;
}

/* In the serving process, once the session is up. */
int sfs_control_start(void)
{
	int ret;

	if (sfs->ctlfd < 0)
		return 0;
	sfs_ctl.stopfd = eventfd(0, EFD_CLOEXEC);
	if (sfs_ctl.stopfd < 0)
		return -errno;
	ret = -pthread_create(&sfs_ctl.thread, NULL, sfs_control_loop, NULL);
	if (ret < 0) {
		close(sfs_ctl.stopfd);
		sfs_ctl.stopfd = -1;
		return ret;
	}
	sfs_ctl.running = true;
	return 0;
}

/* Before the session's state goes: a verb in progress ends first. */
void sfs_control_stop(void)
{
	uint64_t one = 1;

	if (!sfs_ctl.running)
		return;
	if (write(sfs_ctl.stopfd, &one, sizeof(one)) < 0)
		strata_err("control: stopping: %s", strerror(errno));
	pthread_join(sfs_ctl.thread, NULL);
	close(sfs_ctl.stopfd);
	sfs_ctl.stopfd = -1;
	sfs_ctl.running = false;
}
