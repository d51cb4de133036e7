// SPDX-License-Identifier: Apache-2.0
/*
 * Mount options, in the kernel overlayfs syntax:
 *   stratafs [-f] [-d] -o lowerdir=L1:L2,upperdir=U,workdir=W[,opts] MNT
 * and mount.fuse3's calling form, stratafs SOURCE MNT -o OPTS.
 * Options that are not ours pass through to libfuse, which refuses the
 * ones it does not know either.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stratafs.h"

enum {
	KEY_STRING,
	KEY_MAX_READ,
	KEY_HELP,
	KEY_VERSION,
	KEY_FOREGROUND,
	KEY_DEBUG,
};

#define SFS_OPT(t, f) { t, offsetof(struct sfs_params, f), 1 }

static const struct fuse_opt sfs_opt_spec[] = {
	FUSE_OPT_KEY("lowerdir=", KEY_STRING),
	FUSE_OPT_KEY("upperdir=", KEY_STRING),
	FUSE_OPT_KEY("workdir=", KEY_STRING),
	FUSE_OPT_KEY("io=", KEY_STRING),
	FUSE_OPT_KEY("transport=", KEY_STRING),
	FUSE_OPT_KEY("timeout=", KEY_STRING),
	FUSE_OPT_KEY("statsfile=", KEY_STRING),
	FUSE_OPT_KEY("control=", KEY_STRING),
	FUSE_OPT_KEY("capacity=", KEY_STRING),
	FUSE_OPT_KEY("usagefile=", KEY_STRING),
	SFS_OPT("userxattr", userxattr),
	{ "passthrough", offsetof(struct sfs_params, passthrough),
	  SFS_PASS_ASKED },
	{ "nopassthrough", offsetof(struct sfs_params, passthrough),
	  SFS_PASS_OFF },
	SFS_OPT("noallow_other", noallow_other),
	SFS_OPT("nosupervisor", nosupervisor),
	/*
	 * libfuse takes max_read= for the kernel's mount, then refuses an
	 * INIT whose init() did not ask for the same size: seen here, and
	 * passed on.
	 */
	FUSE_OPT_KEY("max_read=", KEY_MAX_READ),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_KEY("-f", KEY_FOREGROUND),
	FUSE_OPT_KEY("-d", KEY_DEBUG),
	FUSE_OPT_KEY("debug", KEY_DEBUG),
	FUSE_OPT_END
};

/*
 * A string option given twice takes the last value, as mount options do
 * (mount.fuse3 and fstab lines can repeat one); the earlier one is freed.
 */
static int sfs_opt_string(struct sfs_params *p, const char *arg)
{
	static const struct {
		const char *prefix;
		size_t offset;
	} opts[] = {
		{ "lowerdir=", offsetof(struct sfs_params, lowerdir) },
		{ "upperdir=", offsetof(struct sfs_params, upperdir) },
		{ "workdir=", offsetof(struct sfs_params, workdir) },
		{ "io=", offsetof(struct sfs_params, io) },
		{ "transport=", offsetof(struct sfs_params, transport) },
		{ "timeout=", offsetof(struct sfs_params, timeout) },
		{ "statsfile=", offsetof(struct sfs_params, statsfile) },
		{ "control=", offsetof(struct sfs_params, control) },
		{ "capacity=", offsetof(struct sfs_params, capacity) },
		{ "usagefile=", offsetof(struct sfs_params, usagefile) },
	};

	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		size_t l = strlen(opts[i].prefix);
		char **field = (char **)((char *)p + opts[i].offset);

		if (strncmp(arg, opts[i].prefix, l))
			continue;
		free(*field);
		*field = strdup(arg + l);
		return *field ? 0 : -1;
	}
	return 1;
}

/* max_read=BYTES: kept for libfuse (1), or refused by name (-1). */
static int sfs_opt_max_read(struct sfs_params *p, const char *arg)
{
	const char *v = arg + strlen("max_read=");
	char *end;
	unsigned long n;

	errno = 0;
	n = strtoul(v, &end, 10);
	if (!*v || *end || errno || n > UINT32_MAX || *v == '-') {
		fprintf(stderr, "stratafs: %s: expected a size in bytes\n", arg);
		return -1;
	}
	p->max_read = (unsigned)n;
	return 1;
}

static int sfs_opt_proc(void *data, const char *arg, int key,
			struct fuse_args *outargs)
{
	struct sfs_params *p = data;

	switch (key) {
	case KEY_STRING:
		return sfs_opt_string(p, arg);
	case KEY_MAX_READ:
		return sfs_opt_max_read(p, arg);
	case KEY_HELP:
		p->show_help = true;
		return 0;
	case KEY_VERSION:
		p->show_version = true;
		return 0;
	case KEY_FOREGROUND:
		p->foreground = true;
		return 0;
	case KEY_DEBUG:
		/* -d implies -f, as for every libfuse file system. */
		p->debug = true;
		p->foreground = true;
		return 1;
	case FUSE_OPT_KEY_NONOPT:
		if (!p->mountpoint) {
			p->mountpoint = strdup(arg);
			return p->mountpoint ? 0 : -1;
		}
		if (!p->source) {
			/* mount.fuse3 form: the first was the source */
			p->source = p->mountpoint;
			p->mountpoint = strdup(arg);
			return p->mountpoint ? 0 : -1;
		}
		fprintf(stderr, "stratafs: unexpected argument '%s'\n", arg);
		return -1;
	default:
		return 1;
	}
}

/*
 * fuse_opt drops the backslash of every escape in "-o" lists, but the
 * kernel's lowerdir syntax needs "\:" and "\\" to reach the layer
 * splitter intact. Doubling those backslashes first lets fuse_opt undo
 * only its own layer of escaping ("\," still escapes a comma).
 */
static char *sfs_escape_opts(const char *s)
{
	char *out = malloc(strlen(s) * 2 + 1), *w = out;

	if (!out)
		return NULL;
	for (; *s; s++) {
		if (s[0] == '\\' && (s[1] == ':' || s[1] == '\\')) {
			*w++ = '\\';
			*w++ = '\\';
			*w++ = '\\';
			*w++ = *++s;
			continue;
		}
		*w++ = *s;
	}
	*w = '\0';
	return out;
}

int sfs_params_escape(int argc, char **argv, struct fuse_args *out)
{
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		bool opts = i > 0 && !strcmp(argv[i - 1], "-o");
		char *dup = NULL;
		int ret;

		if (opts || (strncmp(a, "-o", 2) == 0 && a[2])) {
			dup = sfs_escape_opts(a);
			if (!dup)
				return -ENOMEM;
			a = dup;
		}
		ret = fuse_opt_add_arg(out, a);
		free(dup);
		if (ret < 0)
			return -ENOMEM;
	}
	return 0;
}

/*
 * upperdir= and workdir= take the escapes of lowerdir= ("\:" and "\\"),
 * as the kernel's options do: a line written for kernel overlayfs names
 * the same directories here, and a path holding a backslash can be
 * given at all (fuse_opt drops every backslash that is not escaped).
 * statsfile=, control= and usagefile= take them too, so that one escaping serves
 * every path.
 */
static void sfs_unescape_path(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && (s[1] == ':' || s[1] == '\\'))
			s++;
		*w++ = *s;
	}
	*w = '\0';
}

/* What libfuse says while it reads the options, to be said our way. */
static char sfs_fuse_said[512];

__attribute__((format(printf, 2, 0)))
static void sfs_fuse_log(enum fuse_log_level level, const char *fmt,
			 va_list ap)
{
	size_t n = strlen(sfs_fuse_said);

	(void)level;
	if (n < sizeof(sfs_fuse_said) - 1)
		vsnprintf(sfs_fuse_said + n, sizeof(sfs_fuse_said) - n, fmt, ap);
}

/*
 * The options left after ours are libfuse's, or nobody's. libfuse has
 * no list to check them against, only fuse_session_new(), which refuses
 * what it does not know: so a session is made and dropped here, before
 * any check of ours can misread a typo ("uperdir=" is not a missing
 * upperdir=), and before the layers are opened. It opens no device.
 */
static int sfs_params_check_fuse(const struct fuse_args *args)
{
	static const char unknown[] = "fuse: unknown option(s): `";
	struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
	struct fuse_session *se;
	char *said = sfs_fuse_said;
	size_t len;

	for (int i = 0; i < args->argc; i++)
		if (fuse_opt_add_arg(&copy, args->argv[i]) < 0) {
			fuse_opt_free_args(&copy);
			fprintf(stderr, "stratafs: out of memory\n");
			return -ENOMEM;
		}
	sfs_fuse_said[0] = '\0';
	fuse_set_log_func(sfs_fuse_log);
	se = fuse_session_new(&copy, &sfs_ops, sizeof(sfs_ops), NULL);
	fuse_set_log_func(NULL);
	fuse_opt_free_args(&copy);
	if (se) {
		fuse_session_destroy(se);
		return 0;
	}
	len = strlen(said);
	if (len && said[len - 1] == '\n')
		said[--len] = '\0';
	if (!strncmp(said, unknown, sizeof(unknown) - 1) && len &&
	    said[len - 1] == '\'') {
		said[len - 1] = '\0';
		said += sizeof(unknown) - 1;
		if (!strncmp(said, "-o ", 3))
			said += 3;
		fprintf(stderr, "stratafs: unknown option '%s'\n", said);
	} else {
		fprintf(stderr, "stratafs: invalid options: %s\n",
			*said ? said : "refused by libfuse");
	}
	return -EINVAL;
}

/*
 * capacity= is kept by the daemon seeing every write; with passthrough
 * the kernel writes upper files itself, past any count of ours.
 */
static int sfs_params_check_capacity(const struct sfs_params *p)
{
	uint64_t cap = 0;
	int ret;

	if (p->capacity) {
		ret = sfs_usage_parse(p->capacity, &cap);
		if (ret < 0) {
			fprintf(stderr, "stratafs: capacity=%s: %s\n", p->capacity,
				ret == -ERANGE ? "too large (at most 2^63-1 bytes)" :
				"expected a number of bytes (digits only; 0 for no limit)");
			return -EINVAL;
		}
	}
	if (cap && p->passthrough == SFS_PASS_ASKED) {
		fprintf(stderr,
			"stratafs: capacity= and passthrough do not go together: "
			"the kernel writes passthrough files without the daemon, "
			"which could not keep the limit; drop one of them\n");
		return -EINVAL;
	}
	if ((cap || p->usagefile) && !p->upperdir) {
		fprintf(stderr, "stratafs: %s needs upperdir= (a read-only "
			"mount spends nothing)\n",
			cap ? "capacity=" : "usagefile=");
		return -EINVAL;
	}
	return 0;
}

int sfs_params_parse(struct fuse_args *args, struct sfs_params *p)
{
	memset(p, 0, sizeof(*p));
	if (fuse_opt_parse(args, p, sfs_opt_spec, sfs_opt_proc) < 0)
		return -EINVAL;
	if (p->upperdir)
		sfs_unescape_path(p->upperdir);
	if (p->workdir)
		sfs_unescape_path(p->workdir);
	if (p->statsfile)
		sfs_unescape_path(p->statsfile);
	if (p->control)
		sfs_unescape_path(p->control);
	if (p->usagefile)
		sfs_unescape_path(p->usagefile);
	if (p->show_help || p->show_version)
		return 0;
	if (sfs_params_check_fuse(args) < 0)
		return -EINVAL;
	if (!p->mountpoint) {
		fprintf(stderr, "stratafs: no mountpoint given\n");
		return -EINVAL;
	}
	if (!p->lowerdir || !*p->lowerdir) {
		fprintf(stderr, "stratafs: missing option lowerdir=\n");
		return -EINVAL;
	}
	if (p->io && strcmp(p->io, "uring") && strcmp(p->io, "sync")) {
		fprintf(stderr, "stratafs: io=%s: expected uring or sync\n",
			p->io);
		return -EINVAL;
	}
	if (p->transport && strcmp(p->transport, "uring") &&
	    strcmp(p->transport, "dev")) {
		fprintf(stderr, "stratafs: transport=%s: expected uring or dev\n",
			p->transport);
		return -EINVAL;
	}
	if (p->timeout) {
		char *end;
		double t = strtod(p->timeout, &end);

		if (end == p->timeout || *end || !(t >= 0 && t <= 1e9)) {
			fprintf(stderr,
				"stratafs: timeout=%s: expected seconds (0 to 1e9)\n",
				p->timeout);
			return -EINVAL;
		}
	}
	if (!p->upperdir != !p->workdir) {
		fprintf(stderr,
			"stratafs: upperdir= and workdir= go together\n");
		return -EINVAL;
	}
	return sfs_params_check_capacity(p);
}

void sfs_params_free(struct sfs_params *p)
{
	free(p->lowerdir);
	free(p->upperdir);
	free(p->workdir);
	free(p->io);
	free(p->transport);
	free(p->timeout);
	free(p->statsfile);
	free(p->control);
	free(p->capacity);
	free(p->usagefile);
	free(p->source);
	free(p->mountpoint);
}

void sfs_strv_free(char **v, int count)
{
	for (int i = 0; i < count; i++)
		free(v[i]);
	free(v);
}

/*
 * Splits "L1:L2:L3" into layers, top first. "\:" stands for a colon in a
 * path and "\\" for a backslash, as in the kernel's lowerdir syntax. An
 * empty layer is an error, not a silent skip: "a::b" is a typo.
 */
int sfs_split_lowerdir(const char *spec, char ***out, int *count)
{
	size_t len = strlen(spec);
	char **v = NULL;
	char *cur = NULL;
	size_t curlen = 0;
	int n = 0, ret = -ENOMEM;

	cur = malloc(len + 1);
	v = calloc(len / 2 + 2, sizeof(*v));
	if (!cur || !v)
		goto out_err;
	for (size_t i = 0; i <= len; i++) {
		char c = spec[i];

		if (c == '\\' && i + 1 < len &&
		    (spec[i + 1] == ':' || spec[i + 1] == '\\')) {
			cur[curlen++] = spec[++i];
			continue;
		}
		if (c != ':' && c != '\0') {
			cur[curlen++] = c;
			continue;
		}
		if (curlen == 0) {
			ret = -EINVAL;
			goto out_err;
		}
		if (n == SFS_MAX_LOWERS) {
			ret = -E2BIG;
			goto out_err;
		}
		cur[curlen] = '\0';
		v[n] = strdup(cur);
		if (!v[n])
			goto out_err;
		n++;
		curlen = 0;
	}
	free(cur);
	*out = v;
	*count = n;
	return 0;

out_err:
	free(cur);
	if (v)
		sfs_strv_free(v, n);
	return ret;
}

void sfs_usage(const char *prog)
{
	printf("usage: %s [-f] [-d] -o lowerdir=L1[:L2...][,upperdir=U,workdir=W][,opts] MOUNTPOINT\n"
	       "       %s SOURCE MOUNTPOINT -o OPTS   (mount.fuse3 form)\n"
	       "\n"
	       "Merges read-only lower layers (listed top first) and a writable\n"
	       "upper layer into one view at MOUNTPOINT, in the kernel overlayfs\n"
	       "on-disk format.\n"
	       "\n"
	       "options:\n"
	       "    -o lowerdir=L1:L2   lower layers, top first; \\: escapes a colon\n"
	       "    -o upperdir=DIR     writable layer (omit for a read-only view)\n"
	       "    -o workdir=DIR      scratch dir on the upper's filesystem\n"
	       "    -o userxattr        keep markers in user.overlay.* xattrs\n"
	       "    -o io=uring|sync    file I/O engine (default uring; sync where\n"
	       "                        io_uring is unavailable)\n"
	       "    -o transport=uring|dev  how requests reach the daemon: FUSE\n"
	       "                        over io_uring (Linux 6.14+, fuse.enable_uring=1;\n"
	       "                        the default where it can be) or /dev/fuse\n"
	       "    -o timeout=SECONDS  how long the kernel may cache names and\n"
	       "                        attributes (default 86400: nothing changes\n"
	       "                        the layers behind the daemon; 0 if something does)\n"
	       "    -o passthrough      the kernel reads and writes upper files\n"
	       "                        itself (Linux 6.9+, CAP_SYS_ADMIN; the\n"
	       "                        default where it can be, except with\n"
	       "                        capacity=): docs/fuse-settings.md\n"
	       "    -o nopassthrough    file data always goes through the daemon\n"
	       "    -o statsfile=FILE   export operation and byte counters in FILE\n"
	       "                        (a small binary file the CSI plugin reads)\n"
	       "    -o control=SOCKET   answer the CSI plugin's control requests\n"
	       "                        (capacity, usage, snapshot freeze) there\n"
	       "    -o capacity=BYTES   the upper layer may allocate no more: writes\n"
	       "                        past it fail with ENOSPC, statfs shows it\n"
	       "                        (0: no limit; turns passthrough off)\n"
	       "    -o usagefile=FILE   keep the upper's usage in FILE across mounts\n"
	       "                        (without it, counted anew at each start)\n"
	       "    -o allow_other      let other users into the mount (the\n"
	       "                        default when root mounts, as on kernel\n"
	       "                        overlayfs; permissions are the kernel's)\n"
	       "    -o noallow_other    root mounts: only root gets in\n"
	       "    -o nosupervisor     one process: no worker to replace when\n"
	       "                        it dies (for gdb and valgrind)\n"
	       "    -f                  stay in the foreground\n"
	       "    -d                  debug output (implies -f)\n"
	       "    -h, --help          this text\n"
	       "    -V, --version       print the version\n",
	       prog, prog);
}
