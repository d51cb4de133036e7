// SPDX-License-Identifier: Apache-2.0
/*
 * Records are small JSON files, written so that a crash leaves either the
 * old or the new one and never half of either: a temp file beside the
 * record, fsync, rename over, fsync of the directory. And the small text
 * files the plugin reads whole: /proc's, a daemon's usage file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "csi.h"

static int csi_write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += n;
		len -= n;
	}
	return 0;
}

int csi_record_write(int dirfd, const char *name, json_object *obj)
{
	const char *text = json_object_to_json_string_ext(
		obj, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
	char tmp[256];
	int fd, ret;

	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	ret = csi_write_all(fd, text, strlen(text));
	if (!ret)
		ret = csi_write_all(fd, "\n", 1);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	if (close(fd) < 0 && !ret)
		ret = -errno;
	if (ret)
		goto out_unlink;
	if (renameat(dirfd, tmp, dirfd, name) < 0) {
		ret = -errno;
		goto out_unlink;
	}
	return fsync(dirfd) < 0 ? -errno : 0;

out_unlink:
	unlinkat(dirfd, tmp, 0);
	return ret;
}

int csi_record_read(int dirfd, const char *name, json_object **obj)
{
	json_tokener *tok = NULL;
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int fd, ret = 0;

	*obj = NULL;
	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t n;

		if (len + 4096 > cap) {
			char *nb = realloc(buf, cap + 65536);

			if (!nb) {
				ret = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap += 65536;
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ret = -errno;
			goto out;
		}
		if (n == 0)
			break;
		len += n;
		if (len > (1 << 20)) { /* no record of ours is that big */
			ret = -EFBIG;
			goto out;
		}
	}
	tok = json_tokener_new();
	if (!tok) {
		ret = -ENOMEM;
		goto out;
	}
	*obj = json_tokener_parse_ex(tok, buf, len);
	if (!*obj || json_tokener_get_error(tok) != json_tokener_success ||
	    !json_object_is_type(*obj, json_type_object)) {
		json_object_put(*obj);
		*obj = NULL;
		ret = -EBADMSG;
	}
	json_tokener_free(tok);
out:
	free(buf);
	close(fd);
	return ret;
}

/*
 * Reads NAME below DIRFD (AT_FDCWD: a path) into BUF as a string, in one
 * read of at most SIZE - 1 bytes: what a /proc file or a usage file
 * holds. Its length, or -errno.
 */
ssize_t csi_record_read_text(int dirfd, const char *name, char *buf,
			     size_t size)
{
	ssize_t n;
	int fd;

	fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, size - 1);
	if (n < 0)
		n = -errno;
	else
		buf[n] = '\0';
	close(fd);
	return n;
}

int csi_record_remove(int dirfd, const char *name)
{
	if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
		return -errno;
	return fsync(dirfd) < 0 ? -errno : 0;
}

const char *csi_json_str(json_object *o, const char *key)
{
	json_object *v;

	if (!json_object_object_get_ex(o, key, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

int64_t csi_json_int(json_object *o, const char *key)
{
	json_object *v;

	if (!json_object_object_get_ex(o, key, &v))
		return 0;
	return json_object_get_int64(v);
}
