/* Shared utilities for the Strata programs. */
#ifndef STRATA_H
#define STRATA_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

enum strata_log_level {
	STRATA_LOG_ERR,
	STRATA_LOG_WARN,
	STRATA_LOG_INFO,
	STRATA_LOG_DEBUG,
};

/* log.c */
void strata_log_init(const char *prog, int level);
void strata_log_to_syslog(void);
void strata_log_json(bool on);
void strata_log_kv(int level, const char *msg, const char *const *kv);
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

/* fsutil.c */
int strata_rmtree_at(int parent, const char *name);

#endif
