// SPDX-License-Identifier: Apache-2.0
/*
 * strata-csi: the CSI plugin's entry point. Parses the command line,
 * takes the socket's lock and the store, starts the watcher that keeps
 * staged volumes alive, and serves gRPC until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>


#include "csi.h"

static void csi_usage(FILE *f)
{
	fprintf(f,
		"usage: strata-csi --endpoint unix:///path/csi.sock --nodeid NODE [options]\n"
		"\n"
		"Serves the CSI Identity, Controller and Node services for Strata union\n"
		"volumes over gRPC on a unix socket.\n"
		"\n"
		"  --endpoint EP        unix:///abs/path.sock (default: $CSI_ENDPOINT)\n"
		"  --nodeid NODE        this node's id, as the CO knows it (required)\n"
		"  --root DIR           the directory store (default %s)\n"
		"  --driver-name NAME   the plugin name (default %s)\n"
		"  --mode LIST          node,controller (default both)\n"
		"  --max-volumes N      volumes this node may have staged (0: no limit)\n"
		"  --stratafs PATH      the stratafs daemon (default: beside strata-csi,\n"
		"                       else from PATH)\n"
		"  -v N                 verbosity: 0 warnings, 1-4 info (default), 5 debug\n"
		"  --log-format FMT     text (default) or json\n"
		"  --metrics-address A  serve Prometheus metrics at http://A/metrics\n"
		"                       (HOST:PORT, [V6]:PORT or :PORT)\n"
		"  --allowed-path-prefix DIR\n"
		"                       staging and target paths must lie below DIR\n"
		"                       (repeatable; the kubelet directory)\n"
		"  --daemon-mount-namespace NS\n"
		"                       start daemons in the mount namespace NS\n"
		"                       (/proc/1/ns/mnt: the host's, with hostPID)\n"
		"  --daemon-cgroup DIR  start each daemon in a cgroup DIR/<volume id>\n"
		"                       (in every hierarchy below DIR's parent when\n"
		"                       that is a directory of v1 hierarchies)\n"
		"  --daemon-binary-dir DIR\n"
		"                       copy stratafs and its libraries into DIR and\n"
		"                       start daemons from the copy\n"
		"  --fuse-uring MODE    the host's fuse.enable_uring: off (default: never\n"
		"                       written), on (set when unset) or leave (reported)\n"
		"  --version            print the version and exit\n"
		"  --help               print this help and exit\n",
		CSI_DEFAULT_ROOT, CSI_DEFAULT_DRIVER);
}

/* gRPC takes "unix:" URIs; a bare path would be read as a DNS name. */
static int csi_parse_endpoint(struct csi_config *c, const char *ep)
{
	const char *path = NULL;
	struct sockaddr_un sun;

	if (!strncmp(ep, "unix://", 7))
		path = ep + 7;
	else if (!strncmp(ep, "unix:", 5))
		path = ep + 5;
	else if (ep[0] == '/')
		path = ep;
	if (!path || path[0] != '/') {
		fprintf(stderr, "strata-csi: endpoint '%s' is not unix:///absolute/path\n", ep);
		return -EINVAL;
	}
	if (strlen(path) >= sizeof(sun.sun_path)) {
		fprintf(stderr, "strata-csi: socket path '%s' is longer than %zu bytes\n",
			path, sizeof(sun.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	c->socket_path = strdup(path);
	if (!c->socket_path || asprintf(&c->endpoint, "unix://%s", path) < 0)
		return -ENOMEM;
	return 0;
}

static int csi_parse_modes(struct csi_config *c, const char *list)
{
	char *copy = strdup(list), *save = NULL;

	if (!copy)
		return -ENOMEM;
	c->modes = 0;
	for (char *m = strtok_r(copy, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
		if (!strcmp(m, "node"))
			c->modes |= CSI_MODE_NODE;
		else if (!strcmp(m, "controller"))
			c->modes |= CSI_MODE_CONTROLLER;
		else {
			fprintf(stderr, "strata-csi: unknown mode '%s' (node, controller)\n", m);
			free(copy);
			return -EINVAL;
		}
	}
	free(copy);
	return c->modes ? 0 : -EINVAL;
}

/*
 * A directory below which every staging and target path must lie; taken
 * as it really is once the options are read (csi_resolve_prefixes).
 */
static int csi_parse_prefix(struct csi_config *c, const char *dir)
{
	if (dir[0] != '/') {
		fprintf(stderr, "strata-csi: --allowed-path-prefix '%s' is not an absolute path\n", dir);
		return -EINVAL;
	}
	if (c->nprefixes == CSI_MAX_PREFIXES) {
		fprintf(stderr, "strata-csi: at most %d --allowed-path-prefix\n",
			CSI_MAX_PREFIXES);
		return -E2BIG;
	}
	c->prefixes[c->nprefixes] = strdup(dir);
	if (!c->prefixes[c->nprefixes])
		return -ENOMEM;
	c->nprefixes++;
	return 0;
}

/*
 * A request's paths may hold no symlink, so they are compared with each
 * prefix's canonical form; a prefix that does not exist is a mistake.
 */
static int csi_resolve_prefixes(struct csi_config *c)
{
	for (int i = 0; i < c->nprefixes; i++) {
		char *real = realpath(c->prefixes[i], NULL);

		if (!real) {
			fprintf(stderr, "strata-csi: --allowed-path-prefix '%s': %s\n",
				c->prefixes[i], strerror(errno));
			return -errno;
		}
		if (strcmp(real, c->prefixes[i]))
			fprintf(stderr, "strata-csi: --allowed-path-prefix '%s' is '%s' once its symlinks are resolved: requests must use the latter\n",
				c->prefixes[i], real);
		free(c->prefixes[i]);
		c->prefixes[i] = real;
	}
	return 0;
}

/* The daemon beside this binary (an install or a build tree), else PATH. */
static char *csi_find_stratafs(void)
{
	char self[PATH_MAX], buf[PATH_MAX + 16];
	const char *path = getenv("PATH");
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		snprintf(buf, sizeof(buf), "%s/stratafs", dirname(self));
		if (access(buf, X_OK) == 0)
			return strdup(buf);
	}
	while (path && *path) {
		size_t len = strcspn(path, ":");

		snprintf(buf, sizeof(buf), "%.*s/stratafs", (int)len, path);
		if (buf[0] == '/' && access(buf, X_OK) == 0)
			return strdup(buf);
		path += len + (path[len] == ':');
	}
	return strdup("/usr/bin/stratafs");
}

/* The options that say where daemons run take absolute paths. */
static int csi_check_daemon_paths(const struct csi_config *c)
{
	const struct {
		const char *opt;
		const char *value;
	} paths[] = {
		{ "--daemon-mount-namespace", c->daemon_mntns },
		{ "--daemon-cgroup", c->daemon_cgroup },
		{ "--daemon-binary-dir", c->daemon_bindir },
	};

	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
		if (paths[i].value && paths[i].value[0] != '/') {
			fprintf(stderr, "strata-csi: %s takes an absolute path, not '%s'\n",
				paths[i].opt, paths[i].value);
			return -EINVAL;
		}
	return 0;
}

static int csi_parse_args(int argc, char **argv, struct csi_config *c,
			  bool *json)
{
	static const struct option opts[] = {
		{ "endpoint", required_argument, NULL, 'e' },
		{ "nodeid", required_argument, NULL, 'n' },
		{ "root", required_argument, NULL, 'r' },
		{ "driver-name", required_argument, NULL, 'd' },
		{ "mode", required_argument, NULL, 'm' },
		{ "max-volumes", required_argument, NULL, 'x' },
		{ "stratafs", required_argument, NULL, 's' },
		{ "log-format", required_argument, NULL, 'l' },
		{ "metrics-address", required_argument, NULL, 'M' },
		{ "allowed-path-prefix", required_argument, NULL, 'P' },
		{ "daemon-mount-namespace", required_argument, NULL, 'N' },
		{ "daemon-cgroup", required_argument, NULL, 'C' },
		{ "daemon-binary-dir", required_argument, NULL, 'B' },
		{ "fuse-uring", required_argument, NULL, 'U' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *endpoint = getenv("CSI_ENDPOINT");
	char *end;
	int opt;

	/* the options that just take a string: the last one given wins */
	const struct {
		int opt;
		char **field;
	} strs[] = {
		{ 'n', &c->node_id },	  { 'r', &c->root },
		{ 'd', &c->driver_name }, { 's', &c->stratafs },
		{ 'M', &c->metrics_address },	{ 'N', &c->daemon_mntns },
		{ 'C', &c->daemon_cgroup },	{ 'B', &c->daemon_bindir },
	};

	c->modes = CSI_MODE_NODE | CSI_MODE_CONTROLLER;
	c->workers = 4;
	opterr = 0; /* our messages: they name the option and stop there */
	while ((opt = getopt_long(argc, argv, ":v:", opts, NULL)) != -1) {
		size_t i;

		for (i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
			if (strs[i].opt == opt)
				break;
		if (i < sizeof(strs) / sizeof(strs[0])) {
			free(*strs[i].field);
			*strs[i].field = strdup(optarg);
			if (!*strs[i].field)
				return 2;
			continue;
		}
		switch (opt) {
		case 'e':
			endpoint = optarg;
			break;
		case 'm':
			if (csi_parse_modes(c, optarg))
				return 2;
			break;
		case 'P':
			if (csi_parse_prefix(c, optarg))
				return 2;
			break;
		case 'x':
			c->max_volumes = strtoll(optarg, &end, 10);
			if (!*optarg || *end || c->max_volumes < 0) {
				fprintf(stderr, "strata-csi: --max-volumes takes a count from 0, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'U':
			if (csi_transport_parse(optarg, &c->fuse_uring)) {
				fprintf(stderr, "strata-csi: --fuse-uring is off, on or leave, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'l':
			if (strcmp(optarg, "text") && strcmp(optarg, "json")) {
				fprintf(stderr, "strata-csi: --log-format is text or json, not '%s'\n",
					optarg);
				return 2;
			}
			*json = !strcmp(optarg, "json");
			break;
		case 'v': {
			long v = strtol(optarg, &end, 10);

			/* "-v=2" would read as 0 and silence the per-RPC lines */
			if (!*optarg || *end || v < 0) {
				fprintf(stderr, "strata-csi: -v takes a number (-v 2)\n");
				return 2;
			}
			strata_log_init("strata-csi", v == 0 ? STRATA_LOG_WARN :
				       v >= 5 ? STRATA_LOG_DEBUG : STRATA_LOG_INFO);
			break;
		}
		case 'V':
			printf("strata-csi %s\n", STRATA_VERSION);
			return 1;
		case 'h':
			csi_usage(stdout);
			return 1;
		case ':':
			fprintf(stderr, "strata-csi: option '%s' needs a value\n",
				argv[optind - 1]);
			return 2;
		default:
			/* the one line that matters, not buried under the help */
			if (optopt)
				fprintf(stderr, "strata-csi: unknown option '-%c'\n",
					optopt);
			else
				fprintf(stderr, "strata-csi: unknown option '%s'\n",
					argv[optind - 1]);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "strata-csi: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (!endpoint || !c->node_id || !c->node_id[0]) {
		fprintf(stderr, "strata-csi: --endpoint (or CSI_ENDPOINT) and --nodeid are required\n");
		return 2;
	}
	if (csi_parse_endpoint(c, endpoint) || csi_resolve_prefixes(c) ||
	    csi_check_daemon_paths(c))
		return 2;
	if (!c->root)
		c->root = strdup(CSI_DEFAULT_ROOT);
	if (!c->driver_name)
		c->driver_name = strdup(CSI_DEFAULT_DRIVER);
	if (!c->stratafs)
		c->stratafs = csi_find_stratafs();
	if (!c->root || !c->driver_name || !c->stratafs)
		return 2;
	return 0;
}

/*
 * A second live plugin would silently steal the socket: one per socket,
 * through SOCKET.lock beside it, which goes when the plugin does.
 */
static int csi_lock_socket(const char *socket_path, char **lock_path)
{
	int fd;

	if (asprintf(lock_path, "%s.lock", socket_path) < 0) {
		*lock_path = NULL;
		return -1;
	}
	fd = strata_lock_file(AT_FDCWD, *lock_path);
	if (fd == -EWOULDBLOCK)
		fprintf(stderr, "strata-csi: another strata-csi serves %s\n",
			socket_path);
	else if (fd < 0)
		fprintf(stderr, "strata-csi: %s: %s\n", *lock_path,
			strerror(-fd));
	return fd;
}

static void csi_config_free(struct csi_config *c)
{
	free(c->endpoint);
	free(c->socket_path);
	free(c->node_id);
	free(c->root);
	free(c->driver_name);
	free(c->stratafs);
	free(c->metrics_address);
	free(c->daemon_mntns);
	free(c->daemon_cgroup);
	free(c->daemon_bindir);
	for (int i = 0; i < c->nprefixes; i++)
		free(c->prefixes[i]);
}

/*
 * Directories the Node service never mounts on, in or above: the store
 * (layers, uppers, node records, daemon logs) and the socket's directory.
 */
static int csi_guard_dirs(struct csi_plugin *p)
{
	char *sockdir = strdup(p->cfg.socket_path);
	int ret;

	if (!sockdir)
		return -ENOMEM;
	ret = csi_guard_add(p, p->store.root);
	if (!ret)
		ret = csi_guard_add(p, dirname(sockdir));
	if (ret)
		strata_err("cannot guard %s: %s", ret == -ENOMEM ? "a directory" :
			   sockdir, strerror(-ret));
	free(sockdir);
	return ret;
}

int main(int argc, char **argv)
{
	static struct csi_plugin p;
	struct csi_server *srv;
	sigset_t stop;
	bool json = false;
	char *lock_path = NULL;
	int lock_fd, ret;

	strata_log_init("strata-csi", STRATA_LOG_INFO);
	ret = csi_parse_args(argc, argv, &p.cfg, &json);
	if (ret) {
		/* every usage error said what; this says where the rest is */
		if (ret == 2)
			fprintf(stderr, "Try 'strata-csi --help'.\n");
		csi_config_free(&p.cfg);
		return ret == 1 ? 0 : 2;
	}
	strata_log_json(json);
	csi_kill_points_init();
	ret = 1;
	lock_fd = csi_lock_socket(p.cfg.socket_path, &lock_path);
	if (lock_fd < 0)
		goto out_cfg;
	if (asprintf(&p.topology_key, "%s/node", p.cfg.driver_name) < 0)
		goto out_lock;
	ret = csi_store_open(&p.store, p.cfg.root);
	if (ret) {
		strata_err("store %s: %s", p.cfg.root,
			   ret == -EADDRINUSE ? "another strata-csi uses it" :
						strerror(-ret));
		ret = 1;
		goto out_topo;
	}
	if (csi_guard_dirs(&p)) {
		ret = 1;
		goto out_store;
	}
	csi_transport_init(&p.cfg);
	/* before any thread: the checks fork, and enter namespaces there */
	if (csi_host_init(&p)) {
		ret = 1;
		goto out_host;
	}
	/* every thread started from here on (gRPC's too) inherits the mask */
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop, NULL);
	/* a client that hangs up must not kill the plugin */
	signal(SIGPIPE, SIG_IGN);
	/* before the server: its RPCs kick the flattener */
	ret = csi_flatten_init(&p);
	if (ret) {
		ret = 1;
		goto out_host;
	}
	/* listening first: no other thread makes files while the umask is tight */
	ret = csi_server_start(&p, &srv);
	if (ret) {
		ret = 1;
		goto out_flatten;
	}
	ret = csi_metrics_start(&p, p.cfg.metrics_address);
	if (ret) {
		ret = 1;
		goto out_server;
	}
	ret = csi_watch_start(&p);
	if (ret) {
		strata_err("cannot start the watcher: %s", strerror(-ret));
		csi_metrics_stop();
		ret = 1;
		goto out_server;
	}
	ret = csi_flatten_start(&p);
	if (ret) {
		strata_err("cannot start the flattener: %s", strerror(-ret));
		csi_watch_stop(&p);
		csi_metrics_stop();
		ret = 1;
		goto out_server;
	}
	csi_server_serve(srv, &stop);
	ret = 0;
	csi_watch_stop(&p);
	csi_metrics_stop();
out_server:
	csi_server_stop(srv);
	unlink(p.cfg.socket_path);
out_flatten:
	/* after the server: no RPC kicks it any more */
	csi_flatten_stop(&p);
out_host:
	csi_host_free(&p.host);
out_store:
	csi_guards_free(&p);
	csi_store_close(&p.store);
out_topo:
	free(p.topology_key);
out_lock:
	strata_unlock_file(AT_FDCWD, lock_path, lock_fd);
out_cfg:
	free(lock_path);
	csi_config_free(&p.cfg);
	return ret;
}
