// SPDX-License-Identifier: Apache-2.0
/*
 * A volume's usage, as its daemon counts it (fuse/usage.c): the bytes
 * its upper layer allocates and its inodes, asked on the control
 * channel, never walked. A volume whose daemon does not answer (not
 * staged, or a daemon dying) has the numbers its daemon last saved in
 * volumes/<id>/usage, said to be so. Only a volume without that file (a
 * fresh upper after a snapshot, whose file went with the old one; a
 * daemon started before the count existed, still serving after a plugin
 * upgrade) has its upper walked, said to be so too.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"

/* How long a stats call waits for a daemon: a live one answers at once. */
#define CSI_USAGE_TIMEOUT_MS 2000

/* "used=B inodes=N capacity=C", the daemon's reply to `usage`. */
static int csi_usage_parse_reply(const char *text, struct csi_usage *u)
{
	long long used, inodes, cap;
	int end = 0;

	if (sscanf(text, "used=%lld inodes=%lld capacity=%lld%n", &used,
		   &inodes, &cap, &end) != 3 || text[end] || used < 0 ||
	    inodes < 0 || cap < 0)
		return -EPROTO;
	u->bytes = used;
	u->inodes = inodes;
	u->capacity = cap;
	return 0;
}

/*
 * The usage file the daemon keeps: "strata-usage 1", bytes=, inodes=,
 * clean= (*CLEAN, unless NULL: written at the daemon's orderly end).
 */
static int csi_usage_read_file(struct csi_store *s, const char *id,
			       struct csi_usage *u, bool *clean)
{
	char path[CSI_VOLUME_ID_LEN + 16], buf[256];
	long long bytes, inodes;
	int flag, end = 0;
	ssize_t len;

	snprintf(path, sizeof(path), "%s/usage", id);
	len = csi_record_read_text(s->volumes_fd, path, buf, sizeof(buf));
	if (len < 0)
		return len;
	if (sscanf(buf, "strata-usage 1\nbytes=%lld\ninodes=%lld\nclean=%d\n%n",
		   &bytes, &inodes, &flag, &end) != 3 || end != len ||
	    bytes < 0 || inodes < 0)
		return -EBADMSG;
	u->bytes = bytes;
	u->inodes = inodes;
	u->capacity = -1;
	if (clean)
		*clean = flag == 1;
	return 0;
}

/*
 * The usage of volume ID: from its daemon (u->live), else from its usage
 * file, else from a walk of its upper, with u->why saying why the daemon
 * did not answer and where the numbers come from.
 */
int csi_usage_get(struct csi_store *s, const char *id, struct csi_usage *u)
{
	const char *argv[] = { "usage" };
	char text[256], path[PATH_MAX];
	int ret;

	memset(u, 0, sizeof(*u));
	if (!csi_volume_id_valid(id))
		return -ENOENT;
	ret = csi_control_call(s, id, argv, 1, text, sizeof(text),
			       CSI_USAGE_TIMEOUT_MS);
	if (ret == 0)
		ret = csi_usage_parse_reply(text, u);
	if (ret == 0) {
		u->live = true;
		return 0;
	}
	snprintf(u->why, sizeof(u->why), "its daemon did not answer (%.80s)",
		 ret == -ENOENT || ret == -ECONNREFUSED ? "not running" :
		 *text ? text : strerror(-ret));
	ret = csi_usage_read_file(s, id, u, NULL);
	if (ret != -ENOENT)
		return ret;
	if (snprintf(path, sizeof(path), "%s/volumes/%s/upper", s->root, id) >=
	    (int)sizeof(path))
		return -ENAMETOOLONG;
	ret = csi_tree_usage(path, &u->bytes, &u->inodes);
	if (ret)
		return ret;
	u->capacity = -1;
	strncat(u->why, ", nor did it ever save its usage: walked its upper",
		sizeof(u->why) - strlen(u->why) - 1);
	return 0;
}

/*
 * The bytes volume ID's last daemon counted at its orderly end, its
 * upper's and its workdir's: -EAGAIN when it did not end so (killed:
 * its last seconds may be missing), -ENOENT when none saved any.
 */
int csi_usage_saved(struct csi_store *s, const char *id, int64_t *bytes)
{
	struct csi_usage u;
	bool clean;
	int ret = csi_usage_read_file(s, id, &u, &clean);

	if (ret)
		return ret;
	if (!clean)
		return -EAGAIN;
	*bytes = u.bytes;
	return 0;
}

/* Tells volume ID's running daemon its new capacity (0: no limit). */
int csi_usage_set_capacity(struct csi_store *s, const char *id, int64_t cap,
			   char *why, size_t size)
{
	char num[32], text[256];
	const char *argv[] = { "capacity", num };
	int ret;

	snprintf(num, sizeof(num), "%" PRId64, cap);
	ret = csi_control_call(s, id, argv, 2, text, sizeof(text),
			       CSI_USAGE_TIMEOUT_MS);
	if (ret < 0)
		snprintf(why, size, "%s", *text ? text : strerror(-ret));
	return ret;
}
