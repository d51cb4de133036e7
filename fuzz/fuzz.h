/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the libFuzzer targets share: how a broken property is reported,
 * how the project's own chatter is kept out of the fuzzer's log, and
 * scratch directories that are gone when the run ends.
 *
 * A target asserts properties of what the real code decided, with
 * FZ_CHECK. A failed check aborts: libFuzzer reports it like a crash
 * and keeps the input as crash-<sha1>, which replays it.
 */
#ifndef FUZZ_H
#define FUZZ_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "strata.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Straight to descriptor 2, where libFuzzer and the sanitizers write:
 * the stderr stream may have been sent to /dev/null (fz_quiet).
 */
__attribute__((noreturn, format(printf, 3, 4)))
static inline void fz_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	dprintf(STDERR_FILENO, "%s:%d: property broken: ", file, line);
	va_start(ap, fmt);
	vdprintf(STDERR_FILENO, fmt, ap);
	va_end(ap);
	dprintf(STDERR_FILENO, "\n");
	abort();
}

#define FZ_CHECK(cond)                                             \
	do {                                                       \
		if (!(cond))                                       \
			fz_fail(__FILE__, __LINE__, "%s", #cond);  \
	} while (0)

/*
 * The code under test prints its refusals ("stratafs: io=x: expected
 * uring or sync"), once per input: millions of lines in a run. glibc's
 * stderr is an ordinary variable that may be reassigned (its manual says
 * so, under "Standard Streams"); libFuzzer took its own copy of the
 * stream at start-up and the sanitizers write to the descriptor, so
 * both still reach the log.
 */
static inline void fz_quiet(void)
{
	FILE *null = fopen("/dev/null", "w");

	if (null)
		stderr = null;
	strata_log_init("fuzz", STRATA_LOG_ERR);
}

/* The input as a C string: cut at the first NUL, as the C API sees it. */
static inline char *fz_strndup(const uint8_t *data, size_t size)
{
	char *s = strndup((const char *)data, size);

	if (!s)
		abort();
	return s;
}

/*
 * The input's NUL-separated strings, empty ones too, at most max of
 * them (the last takes no more than its share); free each.
 */
static inline int fz_split(const uint8_t *data, size_t size, char **out,
			   int max)
{
	size_t start = 0;
	int n = 0;

	for (size_t i = 0; i <= size && n < max; i++)
		if (i == size || !data[i]) {
			out[n++] = fz_strndup(data + start, i - start);
			start = i + 1;
		}
	return n;
}

static inline void fz_split_free(char **strs, int n)
{
	for (int i = 0; i < n; i++)
		free(strs[i]);
}

/* A private directory under $TMPDIR (or /tmp), removed at exit. */
static inline char *fz_scratch_path(void)
{
	static char path[256];

	return path;
}

static inline void fz_scratch_remove(void)
{
	strata_rmtree_at(AT_FDCWD, fz_scratch_path());
}

static inline const char *fz_scratch(void)
{
	const char *tmp = getenv("TMPDIR");
	char *path = fz_scratch_path();

	snprintf(path, 256, "%s/strata-fuzz-XXXXXX",
		 tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(path)) {
		perror(path);
		abort();
	}
	atexit(fz_scratch_remove);
	return path;
}

#endif
