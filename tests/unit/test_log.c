// SPDX-License-Identifier: Apache-2.0
/* log.c: the line format every program's messages share. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "strata.h"
#include "unit.h"

static int fmt(char *buf, size_t size, int level, const char *f, ...)
{
	va_list ap;
	int n;

	va_start(ap, f);
	n = strata_log_format(buf, size, level, f, ap);
	va_end(ap);
	return n;
}

/* What strata_log_kv writes to stderr, caught in a temporary file. */
static void kv_line(char *buf, size_t size, const char *const *kv,
		    unsigned numbers)
{
	FILE *tmp = tmpfile();
	int saved = dup(STDERR_FILENO);
	size_t n;

	fflush(stderr);
	dup2(fileno(tmp), STDERR_FILENO);
	strata_log_kv(STRATA_LOG_ERR, "rpc", kv, numbers);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(tmp);
	n = fread(buf, 1, size - 1, tmp);
	buf[n] = '\0';
	fclose(tmp);
}

/* duration_ms is a JSON number; the text line is as before */
static void check_kv_numbers(void)
{
	const char *kv[] = { "code", "OK", "duration_ms", "1.25", NULL };
	char line[512];

	strata_log_json(true);
	kv_line(line, sizeof(line), kv, 1u << 1);
	CHECK(strstr(line, ",\"code\":\"OK\",\"duration_ms\":1.25}\n") != NULL);
	kv_line(line, sizeof(line), kv, 0);
	CHECK(strstr(line, "\"duration_ms\":\"1.25\"}") != NULL);
	strata_log_json(false);
	kv_line(line, sizeof(line), kv, 1u << 1);
	CHECK_EQ_STR(line, "prog: error: rpc code=OK duration_ms=1.25\n");
}

int main(void)
{
	char buf[64];

	strata_log_init("prog", STRATA_LOG_WARN);
	CHECK_EQ_INT(strata_log_level(), STRATA_LOG_WARN);
	fmt(buf, sizeof(buf), STRATA_LOG_ERR, "x=%d", 7);
	CHECK_EQ_STR(buf, "prog: error: x=7");
	fmt(buf, sizeof(buf), STRATA_LOG_DEBUG, "%s", "hi");
	CHECK_EQ_STR(buf, "prog: debug: hi");
	/* an out-of-range level is reported as an error, never indexed */
	fmt(buf, sizeof(buf), 42, "z");
	CHECK_EQ_STR(buf, "prog: error: z");
	/* truncation keeps the buffer terminated */
	fmt(buf, 12, STRATA_LOG_INFO, "a long message");
	CHECK_EQ_INT(strlen(buf), 11);
	check_kv_numbers();
	return unit_done("test_log");
}
