// SPDX-License-Identifier: Apache-2.0
/*
 * stratafs: the union filesystem daemon's entry point. Parses the
 * command line; fuse/ does the rest (supervisor.c: sfs_run).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <unistd.h>

#include "stratafs.h"

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct sfs_params params = { 0 };
	int ret = 1;

	strata_log_init("stratafs", STRATA_LOG_INFO);
	if (sfs_params_escape(argc, argv, &args) < 0) {
		fprintf(stderr, "stratafs: out of memory\n");
		goto out;
	}
	if (sfs_params_parse(&args, &params) < 0) {
		fprintf(stderr, "stratafs: see 'stratafs --help'\n");
		goto out;
	}
	if (params.show_help) {
		sfs_usage(argv[0]);
		printf("\nFUSE options:\n");
		fuse_lowlevel_help();
		ret = 0;
		goto out;
	}
	if (params.show_version) {
		printf("stratafs %s\n", STRATA_VERSION);
		/* libfuse writes its line with its own stdio: keep ours first */
		fflush(stdout);
		fuse_lowlevel_version();
		ret = 0;
		goto out;
	}
	if (params.debug)
		strata_log_init("stratafs", STRATA_LOG_DEBUG);
	ret = sfs_run(&params, &args, argv);
out:
	sfs_params_free(&params);
	fuse_opt_free_args(&args);
	return ret;
}
