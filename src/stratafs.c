/*
 * stratafs: the union filesystem daemon's entry point. Parses the
 * command line, checks and opens the layers, mounts, and runs the
 * multi-threaded FUSE loop until unmounted or signalled.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stratafs.h"

/* Every node holds descriptors: take all the process may have. */
static void sfs_raise_nofile(void)
{
	struct rlimit rl;
	FILE *f;
	long max = 0;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return;
	f = fopen("/proc/sys/fs/nr_open", "r");
	if (f) {
		if (fscanf(f, "%ld", &max) != 1)
			max = 0;
		fclose(f);
	}
	if (max > 0 && (rlim_t)max > rl.rlim_max) {
		struct rlimit want = { (rlim_t)max, (rlim_t)max };

		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			return;
	}
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

/* libfuse takes "-o a=b": commas in a value must be escaped. */
static int sfs_add_fsname(struct fuse_args *args, const char *source)
{
	char *opt = malloc(strlen(source) * 2 + 16);
	char *w;
	int ret;

	if (!opt)
		return -1;
	w = opt + sprintf(opt, "-ofsname=");
	for (const char *s = source; *s; s++) {
		if (*s == ',' || *s == '\\')
			*w++ = '\\';
		*w++ = *s;
	}
	*w = '\0';
	ret = fuse_opt_add_arg(args, opt);
	free(opt);
	return ret;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_loop_config *cfg = NULL;
	struct fuse_session *se = NULL;
	static struct sfs_fs fs;
	int ret = 1;

	strata_log_init("stratafs", STRATA_LOG_INFO);
	if (sfs_params_escape(argc, argv, &args) < 0) {
		fprintf(stderr, "stratafs: out of memory\n");
		goto out_args;
	}
	if (sfs_params_parse(&args, &fs.params) < 0) {
		fprintf(stderr, "stratafs: see 'stratafs --help'\n");
		goto out_args;
	}
	if (fs.params.show_help) {
		sfs_usage(argv[0]);
		printf("\nFUSE options:\n");
		fuse_lowlevel_help();
		ret = 0;
		goto out_args;
	}
	if (fs.params.show_version) {
		printf("stratafs %s\n", STRATA_VERSION);
		/* libfuse writes its line with its own stdio: keep ours first */
		fflush(stdout);
		fuse_lowlevel_version();
		ret = 0;
		goto out_args;
	}
	if (fs.params.debug)
		strata_log_init("stratafs", STRATA_LOG_DEBUG);

	/* Modes come from the kernel already masked; ours must not mask again. */
	umask(0);
	sfs_raise_nofile();
	/*
	 * A node is allocated by the worker that looks it up and freed by
	 * whichever one gets the FORGET; with glibc's arena per thread (up
	 * to 8 per core) freed nodes stay in arenas that other workers do
	 * not allocate from, so a tree walked again after the kernel forgot
	 * it grew the heap by half (27 MiB against 40 after find, forget,
	 * du over 130k entries). Two arenas and the thread caches keep
	 * contention low on this 2-core target.
	 */
	mallopt(M_ARENA_MAX, 2);
	if (sfs_setup(&fs) < 0)
		goto out_fs;
	if (fs.params.statsfile) {
		int err = sfs_stats_open(fs.params.statsfile);

		if (err) {
			fprintf(stderr, "stratafs: statsfile %s: %s\n",
				fs.params.statsfile, strerror(-err));
			goto out_fs;
		}
	}

	/*
	 * Root mounts like the kernel's overlayfs: device nodes and setuid
	 * files in an image work, and every user gets in by the mode bits
	 * (default_permissions). First, so that nodev/nosuid given by the
	 * user still win.
	 */
	if ((geteuid() == 0 &&
	     fuse_opt_insert_arg(&args, 1, fs.params.noallow_other ?
					       "-odev,suid" :
					       "-odev,suid,allow_other")) ||
	    /* without an upper layer the view is read-only, as statvfs says */
	    (!fs.params.upperdir && fuse_opt_add_arg(&args, "-oro")) ||
	    fuse_opt_add_arg(&args, "-odefault_permissions") ||
	    fuse_opt_add_arg(&args, "-osubtype=stratafs") ||
	    sfs_add_fsname(&args, fs.params.source ? fs.params.source :
						      "stratafs"))
		goto out_fs;
	se = fuse_session_new(&args, &sfs_ops, sizeof(sfs_ops), &fs);
	if (!se) {
		/* libfuse named the option it refused just above */
		fprintf(stderr, "stratafs: invalid mount options\n");
		goto out_fs;
	}
	fs.se = se;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, fs.params.mountpoint) != 0)
		goto out_signals;
	if (sfs_tmpfile_setup(se) != 0)
		goto out_unmount;
	if (fuse_daemonize(fs.params.foreground) != 0)
		goto out_unmount;
	if (!fs.params.foreground)
		strata_log_to_syslog();

	/* After daemonizing: the completion thread must be in the daemon. */
	if (sfs_io_init(fs.params.io) < 0)
		goto out_unmount;
	if (sfs_handshake(se) < 0)
		goto out_io;
	cfg = fuse_loop_cfg_create();
	if (!cfg)
		goto out_io;
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	fuse_loop_cfg_set_max_threads(cfg, SFS_MAX_THREADS);
	/* idle workers stay, and so do their rings */
	fuse_loop_cfg_set_idle_threads(cfg, SFS_MAX_THREADS);
	ret = fuse_session_loop_mt(se, cfg) < 0 ? 1 : 0;
	fuse_loop_cfg_destroy(cfg);
out_io:
	sfs_io_shutdown();

out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
	fs.se = NULL;
out_fs:
	sfs_stats_close();
	sfs_teardown(&fs);
out_args:
	sfs_params_free(&fs.params);
	fuse_opt_free_args(&args);
	return ret;
}
