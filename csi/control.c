// SPDX-License-Identifier: Apache-2.0
/*
 * The plugin's end of a daemon's control channel (fuse/control.c says
 * what travels on it): node/<id>.ctl, one request per connection.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "csi.h"

#define CSI_CONTROL_MAX 8192

/* The request: the verb and its arguments, each ended by a NUL. */
static ssize_t csi_control_pack(const char *const *argv, int argc, char *buf,
				size_t size)
{
	size_t len = 0;

	for (int i = 0; i < argc; i++) {
		size_t l = strlen(argv[i]) + 1;

		if (len + l > size)
			return -EMSGSIZE;
		memcpy(buf + len, argv[i], l);
		len += l;
	}
	return len;
}

/*
 * Asks the daemon of volume VID: its status (0 or -errno) with its text
 * in OUT, or -errno of the call itself: -ENOENT or -ECONNREFUSED when no
 * daemon listens, -ETIMEDOUT when it does not answer in TIMEOUT_MS, -EIO
 * when it hung up without a reply (a worker that died on the way).
 */
int csi_control_call(struct csi_store *s, const char *vid,
		     const char *const *argv, int argc, char *out, size_t size,
		     int timeout_ms)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000,
			      .tv_usec = timeout_ms % 1000 * 1000 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char buf[CSI_CONTROL_MAX + 1], *end;
	ssize_t len;
	long status;
	int fd, ret;

	out[0] = '\0';
	len = csi_control_pack(argv, argc, buf, CSI_CONTROL_MAX);
	if (len < 0)
		return len;
	/* through the directory: a deep store root outgrows sun_path */
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s.ctl",
		 s->node_fd, vid);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
	    connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    send(fd, buf, len, MSG_NOSIGNAL) < 0) {
		ret = -errno;
		goto out;
	}
	len = recv(fd, buf, CSI_CONTROL_MAX, 0);
	if (len <= 0) {
		ret = len == 0 ? -EIO :
		      errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
		goto out;
	}
	buf[len] = '\0';
	errno = 0;
	status = strtol(buf, &end, 10);
	if (end == buf || errno || status > 0 || status < -4095 ||
	    (*end && *end != ' ')) {
		ret = -EPROTO;
		goto out;
	}
	snprintf(out, size, "%s", *end ? end + 1 : "");
	ret = status;
out:
	close(fd);
	return ret;
}
