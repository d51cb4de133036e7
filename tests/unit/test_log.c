/* log.c: the line format every program's messages share. */
#include <stdarg.h>

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
	return unit_done("test_log");
}
