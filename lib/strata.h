/* SPDX-License-Identifier: Apache-2.0 */
/* Shared utilities for the Strata programs. */
#ifndef STRATA_H
#define STRATA_H

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum strata_log_level {
	STRATA_LOG_ERR,
	STRATA_LOG_WARN,
	STRATA_LOG_INFO,
	STRATA_LOG_DEBUG,
};

/* log.c */
void strata_log_init(const char *prog, int level);
int strata_log_prepare_detach(void);
void strata_log_detached(int errfd);
void strata_log_json(bool on);
void strata_log_kv(int level, const char *msg, const char *const *kv,
		   unsigned numbers);
int strata_log_level(void);
void strata_log(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int strata_log_format(char *buf, size_t size, int level, const char *fmt,
		      va_list ap) __attribute__((format(printf, 4, 0)));

#define strata_err(...) strata_log(STRATA_LOG_ERR, __VA_ARGS__)
#define strata_warn(...) strata_log(STRATA_LOG_WARN, __VA_ARGS__)
#define strata_info(...) strata_log(STRATA_LOG_INFO, __VA_ARGS__)
#define strata_debug(...)                                          \
	do {                                                       \
		if (strata_log_level() >= STRATA_LOG_DEBUG)        \
			strata_log(STRATA_LOG_DEBUG, __VA_ARGS__); \
	} while (0)

/*
 * The counters a stratafs daemon exports with -o statsfile=FILE: the file
 * is mapped shared, the daemon bumps the counters with relaxed atomics,
 * and the CSI plugin reads them when scraped. New counters go at the end.
 */
#define STRATA_STATS_MAGIC 0x31545353u /* "SST1" */
enum strata_stat {
	STRATA_ST_LOOKUP, STRATA_ST_GETATTR, STRATA_ST_SETATTR,
	STRATA_ST_READLINK, STRATA_ST_MKNOD, STRATA_ST_MKDIR,
	STRATA_ST_SYMLINK, STRATA_ST_LINK, STRATA_ST_UNLINK, STRATA_ST_RMDIR,
	STRATA_ST_RENAME, STRATA_ST_CREATE, STRATA_ST_OPEN, STRATA_ST_READ,
	STRATA_ST_WRITE, STRATA_ST_FLUSH, STRATA_ST_RELEASE, STRATA_ST_FSYNC,
	STRATA_ST_FALLOCATE, STRATA_ST_LSEEK, STRATA_ST_COPY_FILE_RANGE,
	STRATA_ST_OPENDIR, STRATA_ST_READDIR, STRATA_ST_READDIRPLUS,
	STRATA_ST_RELEASEDIR, STRATA_ST_FSYNCDIR, STRATA_ST_STATFS,
	STRATA_ST_SETXATTR, STRATA_ST_GETXATTR, STRATA_ST_LISTXATTR,
	STRATA_ST_REMOVEXATTR, STRATA_ST_FORGET,
	STRATA_ST_NOPS, /* above: FUSE operations; below: other counters */
	STRATA_ST_READ_BYTES = STRATA_ST_NOPS,
	STRATA_ST_WRITE_BYTES,
	STRATA_ST_URING_REQUESTS,	/* requests that came over io_uring */
	STRATA_ST_PASS_OPENS,		/* handles the kernel served itself */
	STRATA_ST_COUNT,
};

struct strata_stats {
	uint32_t magic;
	uint32_t count; /* counters in this file: readers of another build */
	uint64_t v[STRATA_ST_COUNT];
};

/*
 * A volume's usage, kept by its daemon with -o usagefile=FILE: mapped
 * shared and updated as the upper changes, so neither the daemon nor the
 * plugin ever walks the upper to learn it. clean is 0 while a daemon has
 * the file mapped: a daemon that finds it 0 at start was killed, and
 * counts once, by a walk, before it mounts. Read by the plugin for
 * NodeGetVolumeStats when the daemon cannot answer.
 */
#define STRATA_USAGE_MAGIC 0x31475355u /* "USG1" */
struct strata_usage {
	uint32_t magic;
	uint32_t clean;		/* 1: the counts are whole */
	int64_t bytes;		/* st_blocks * 512 of the upper's inodes */
	int64_t inodes;		/* the upper's inodes, its root included */
	uint64_t capacity;	/* the most bytes may reach; 0: no limit */
};

/*
 * The kernel's switch for FUSE over io_uring (Linux 6.14+), one for the
 * whole machine and read at each mount's INIT: stratafs reads it to say
 * why a mount is not served over rings, strata-csi --fuse-uring may set
 * it (csi/transport.c).
 */
#define STRATA_FUSE_URING_PARAM "/sys/module/fuse/parameters/enable_uring"

/* stats.c */
extern const char *const strata_stat_names[STRATA_ST_COUNT];

/* fsutil.c */
int strata_rmtree_at(int parent, const char *name);
DIR *strata_opendir_at(int dirfd, const char *name);
int strata_lock_file(int dirfd, const char *name);
void strata_unlock_file(int dirfd, const char *name, int fd);

/* acl.c: the POSIX ACLs, by their xattr names */
#define STRATA_ACL_ACCESS "system.posix_acl_access"
#define STRATA_ACL_DEFAULT "system.posix_acl_default"
int strata_acl_clear(int dirfd);
int strata_acl_copy(int from, int to);

#endif
