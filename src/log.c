/*
 * Logging shared by the programs: to stderr while a terminal or a
 * supervisor reads it, to syslog once a daemon has detached (its stderr
 * is /dev/null then, and a lost error message is worse than none).
 */
#include <stdio.h>
#include <syslog.h>
#include <unistd.h>

#include "strata.h"

static const char *log_prog = "strata";
static int log_max = STRATA_LOG_INFO;
static bool log_syslog;

static const char *const log_names[] = {
	[STRATA_LOG_ERR] = "error",
	[STRATA_LOG_WARN] = "warning",
	[STRATA_LOG_INFO] = "info",
	[STRATA_LOG_DEBUG] = "debug",
};

void strata_log_init(const char *prog, int level)
{
	log_prog = prog;
	log_max = level;
}

void strata_log_to_syslog(void)
{
	openlog(log_prog, LOG_PID, LOG_DAEMON);
	log_syslog = true;
}

int strata_log_level(void)
{
	return log_max;
}

/* Formats one line as "prog: level: message"; split out so it is testable. */
int strata_log_format(char *buf, size_t size, int level, const char *fmt,
		      va_list ap)
{
	int n, m;

	if (level < STRATA_LOG_ERR || level > STRATA_LOG_DEBUG)
		level = STRATA_LOG_ERR;
	n = snprintf(buf, size, "%s: %s: ", log_prog, log_names[level]);
	if (n < 0 || (size_t)n >= size)
		return n;
	m = vsnprintf(buf + n, size - n, fmt, ap);
	return m < 0 ? m : n + m;
}

void strata_log(int level, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char line[1024];
	va_list ap;

	if (level > log_max)
		return;
	va_start(ap, fmt);
	strata_log_format(line, sizeof(line), level, fmt, ap);
	va_end(ap);
	if (log_syslog)
		syslog(prio[level], "%s", line + 0);
	else
		fprintf(stderr, "%s\n", line);
}
