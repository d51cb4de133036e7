/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A minimal harness for the unit programs, in liburing's convention:
 * exit 0 on pass, 77 on skip, 1 on failure. Every failed check prints
 * its location and goes on, so one run shows every failure.
 */
#ifndef UNIT_H
#define UNIT_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int unit_failures;
static int unit_checks;

#define CHECK(cond)                                                      \
	do {                                                             \
		unit_checks++;                                           \
		if (!(cond)) {                                           \
			fprintf(stderr, "%s:%d: check failed: %s\n",     \
				__FILE__, __LINE__, #cond);              \
			unit_failures++;                                 \
		}                                                        \
	} while (0)

#define CHECK_EQ_INT(a, b)                                               \
	do {                                                             \
		long long _a = (a), _b = (b);                            \
		unit_checks++;                                           \
		if (_a != _b) {                                          \
			fprintf(stderr, "%s:%d: %s == %lld, want %lld\n", \
				__FILE__, __LINE__, #a, _a, _b);         \
			unit_failures++;                                 \
		}                                                        \
	} while (0)

#define CHECK_EQ_STR(a, b)                                                 \
	do {                                                               \
		const char *_a = (a), *_b = (b);                           \
		unit_checks++;                                             \
		if (!_a || strcmp(_a, _b)) {                               \
			fprintf(stderr, "%s:%d: %s == \"%s\", want \"%s\"\n", \
				__FILE__, __LINE__, #a, _a ? _a : "(null)", _b); \
			unit_failures++;                                   \
		}                                                          \
	} while (0)

/* Mounting-free, but still root's: trusted.* xattrs, mknod, chown. */
#define UNIT_REQUIRE_ROOT()                                              \
	do {                                                             \
		if (geteuid() != 0) {                                    \
			fprintf(stderr, "skipped: needs root\n");       \
			return 77;                                       \
		}                                                        \
	} while (0)

static inline int unit_done(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, unit_checks, unit_failures);
	return unit_failures ? 1 : 0;
}

#endif
