// SPDX-License-Identifier: Apache-2.0
/*
 * Logging shared by the programs: to stderr while a terminal or a
 * supervisor reads it, to syslog once a daemon has detached (its stderr
 * is /dev/null then, and a lost error message is worse than none), or to
 * the stderr it was started with where there is no syslog socket.
 */
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <syslog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "strata.h"

static const char *log_prog = "strata";
static int log_max = STRATA_LOG_INFO;
static bool log_syslog;
static bool log_json;

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

static bool log_have_syslog(void)
{
	struct stat st;

	return stat("/dev/log", &st) == 0 && S_ISSOCK(st.st_mode);
}

/*
 * Before a daemon detaches: where its messages go afterwards. Syslog
 * where /dev/log exists; else the stderr it was started with, when that
 * is a file or a terminal: a copy of it is returned, for
 * strata_log_detached(). A pipe is not kept: whoever reads it waits for
 * its end, and `out=$(stratafs ... 2>&1)` would never return. Then the
 * messages would be lost, and this says so while it still can be read.
 */
int strata_log_prepare_detach(void)
{
	struct stat st;

	if (log_have_syslog())
		return -1;
	if (fstat(STDERR_FILENO, &st) == 0 &&
	    (S_ISREG(st.st_mode) || isatty(STDERR_FILENO)))
		return fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	strata_warn("no syslog here (/dev/log) and stderr is no file: what the "
		    "daemon says once detached is lost; run it with -f, or with 2>>FILE");
	return -1;
}

/*
 * Once detached: to syslog, or to errfd (taken over) from
 * strata_log_prepare_detach(), or nowhere (-1, said then).
 */
void strata_log_detached(int errfd)
{
	if (log_have_syslog()) {
		openlog(log_prog, LOG_PID, LOG_DAEMON);
		log_syslog = true;
	} else if (errfd >= 0) {
		dup2(errfd, STDERR_FILENO);
	}
	if (errfd >= 0)
		close(errfd);
}

/* One JSON object per line, for log collectors that parse fields. */
void strata_log_json(bool on)
{
	log_json = on;
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

/*
 * A text line holds no control character: a newline in a name or a path
 * from a request would otherwise start a line the reader takes for the
 * plugin's own. They become \n, \t, \r or \xNN.
 */
static void log_escape(const char *line, char *out, size_t size)
{
	size_t o = 0;

	for (const unsigned char *c = (const void *)line; *c && o + 5 < size; c++) {
		if (*c >= 0x20 && *c != 0x7f) {
			out[o++] = (char)*c;
			continue;
		}
		out[o++] = '\\';
		if (*c == '\n' || *c == '\t' || *c == '\r')
			out[o++] = *c == '\n' ? 'n' : *c == '\t' ? 't' : 'r';
		else
			o += snprintf(out + o, size - o, "x%02x", *c);
	}
	out[o] = '\0';
}

void strata_log(int level, const char *fmt, ...)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	char line[1024], esc[4 * sizeof(line)];
	va_list ap;

	if (level > log_max)
		return;
	if (log_json) {
		const char *none[] = { NULL };

		va_start(ap, fmt);
		vsnprintf(line, sizeof(line), fmt, ap);
		va_end(ap);
		strata_log_kv(level, line, none, 0);
		return;
	}
	va_start(ap, fmt);
	strata_log_format(line, sizeof(line), level, fmt, ap);
	va_end(ap);
	log_escape(line, esc, sizeof(esc));
	if (log_syslog)
		syslog(prio[level], "%s", esc);
	else
		fprintf(stderr, "%s\n", esc);
}

static size_t log_json_str(char *buf, size_t size, size_t len, const char *s)
{
	if (len < size)
		buf[len] = '"';
	len++;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		const char *out = esc;

		if (c == '"' || c == '\\')
			snprintf(esc, sizeof(esc), "\\%c", c);
		else if (c < 0x20)
			snprintf(esc, sizeof(esc), "\\u%04x", c);
		else {
			esc[0] = (char)c;
			esc[1] = '\0';
		}
		for (; *out; out++, len++)
			if (len < size)
				buf[len] = *out;
	}
	if (len < size)
		buf[len] = '"';
	return len + 1;
}

/*
 * A message with key/value fields: "msg k=v k=v" as text, or the fields
 * as members of the JSON object. `kv` is a list of key, value pairs that
 * ends at the first NULL key. Bit i of `numbers` marks pair i's value as
 * a number, written bare in JSON so that collectors can sum and compare
 * it ("duration_ms":1.25, not "1.25"); the caller formats it as one.
 */
void strata_log_kv(int level, const char *msg, const char *const *kv,
		   unsigned numbers)
{
	char line[2048];
	size_t len = 0;

	if (level > log_max)
		return;
	if (level < STRATA_LOG_ERR || level > STRATA_LOG_DEBUG)
		level = STRATA_LOG_ERR;
	if (log_json) {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		len = snprintf(line, sizeof(line),
			       "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"prog\":\"%s\",\"level\":\"%s\",\"message\":",
			       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			       tm.tm_hour, tm.tm_min, tm.tm_sec,
			       ts.tv_nsec / 1000000, log_prog, log_names[level]);
		len = log_json_str(line, sizeof(line), len, msg);
		for (unsigned i = 0; kv[0]; kv += 2, i++) {
			if (len < sizeof(line))
				line[len] = ',';
			len = log_json_str(line, sizeof(line), len + 1, kv[0]);
			if (len < sizeof(line))
				line[len] = ':';
			len++;
			if (i < 32 && (numbers >> i & 1))
				len += snprintf(line + (len < sizeof(line) ? len : sizeof(line)),
						len < sizeof(line) ? sizeof(line) - len : 0,
						"%s", kv[1]);
			else
				len = log_json_str(line, sizeof(line), len, kv[1]);
		}
		if (len + 2 > sizeof(line))
			len = sizeof(line) - 2; /* cut, but still one line */
		line[len++] = '}';
		line[len] = '\0';
		fprintf(stderr, "%s\n", line);
		return;
	}
	len = snprintf(line, sizeof(line), "%s", msg);
	for (; kv[0] && len < sizeof(line); kv += 2)
		len += snprintf(line + len, sizeof(line) - len,
				strpbrk(kv[1], " \"=\n\t\r") || !kv[1][0] ?
					" %s=\"%s\"" : " %s=%s",
				kv[0], kv[1]);
	strata_log(level, "%s", line);
}
