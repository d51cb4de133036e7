// SPDX-License-Identifier: Apache-2.0
/*
 * Prometheus metrics on --metrics-address, served by libmicrohttpd.
 * Counters are plain atomics bumped on the RPC path; everything else
 * (volumes, store space, the daemons' own counters) is read when
 * scraped, so an idle plugin does no metrics work at all.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <microhttpd.h>

#include "csi.h"

#define CSI_MAX_METHODS 32
/* seconds: from a cached Probe to a daemon start that waits its limit */
static const double csi_buckets[] = { 0.0005, 0.001, 0.0025, 0.005, 0.01,
				      0.025,  0.05,  0.1,    0.25,  0.5,
				      1,      2.5,   5,      10,    30 };
#define CSI_NBUCKETS (sizeof(csi_buckets) / sizeof(csi_buckets[0]))

struct csi_rpc_stat {
	atomic_ullong count;
	atomic_ullong sum_us;
	atomic_ullong bucket[CSI_NBUCKETS]; /* not cumulative; summed at scrape */
};

static struct {
	struct csi_plugin *p;
	struct MHD_Daemon *mhd;
	int nmethods;
	const struct csi_method *methods[CSI_MAX_METHODS];
	struct csi_rpc_stat rpc[CSI_MAX_METHODS + 1][CSI_CODE_COUNT];
	atomic_ullong events[CSI_EV_COUNT];
} csi_m;

static const char *const csi_event_names[CSI_EV_COUNT] = {
	[CSI_EV_DAEMON_START] = "strata_csi_daemon_starts_total",
	[CSI_EV_DAEMON_EXIT] = "strata_csi_daemon_exits_total",
	[CSI_EV_DAEMON_RESTART] = "strata_csi_daemon_restarts_total",
	[CSI_EV_FLATTEN_DONE] = "strata_csi_flattens_total",
	[CSI_EV_FLATTEN_FAILED] = "strata_csi_flatten_failures_total",
};

static const char *const csi_event_help[CSI_EV_COUNT] = {
	[CSI_EV_DAEMON_START] = "stratafs daemons started (stage and heal)",
	[CSI_EV_DAEMON_EXIT] = "stratafs daemons seen exiting (unstage, or died)",
	[CSI_EV_DAEMON_RESTART] = "staged volumes healed with a new daemon",
	[CSI_EV_FLATTEN_DONE] = "runs of layers merged into one (chains deeper than 16)",
	[CSI_EV_FLATTEN_FAILED] = "flattens given up (the chains kept their layers)",
};

void csi_metrics_event(enum csi_event ev)
{
	atomic_fetch_add_explicit(&csi_m.events[ev], 1, memory_order_relaxed);
}

static int csi_method_index(const struct csi_method *m)
{
	for (int i = 0; m && i < csi_m.nmethods; i++)
		if (csi_m.methods[i] == m)
			return i;
	return CSI_MAX_METHODS; /* unknown paths share one row */
}

void csi_metrics_rpc(const struct csi_method *m, enum csi_code code,
		     double seconds)
{
	struct csi_rpc_stat *s;
	size_t b = 0;

	if ((unsigned)code >= CSI_CODE_COUNT)
		code = CSI_UNKNOWN;
	s = &csi_m.rpc[csi_method_index(m)][code];
	while (b < CSI_NBUCKETS && seconds > csi_buckets[b])
		b++;
	atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&s->sum_us,
				  (unsigned long long)(seconds * 1e6),
				  memory_order_relaxed);
	if (b < CSI_NBUCKETS)
		atomic_fetch_add_explicit(&s->bucket[b], 1, memory_order_relaxed);
}

static const char *csi_method_name(int i)
{
	const char *slash;

	if (i == CSI_MAX_METHODS)
		return "unknown";
	slash = strrchr(csi_m.methods[i]->path, '/');
	return slash ? slash + 1 : csi_m.methods[i]->path;
}

static void csi_scrape_rpc(FILE *f)
{
	fprintf(f, "# HELP strata_csi_rpc_total CSI calls served, by method and status code.\n"
		   "# TYPE strata_csi_rpc_total counter\n");
	for (int i = 0; i <= CSI_MAX_METHODS; i++)
		for (int c = 0; c < CSI_CODE_COUNT; c++) {
			unsigned long long n = atomic_load(&csi_m.rpc[i][c].count);

			if (n)
				fprintf(f, "strata_csi_rpc_total{method=\"%s\",code=\"%s\"} %llu\n",
					csi_method_name(i), csi_code_name(c), n);
		}
	fprintf(f, "# HELP strata_csi_rpc_duration_seconds Time to answer a CSI call.\n"
		   "# TYPE strata_csi_rpc_duration_seconds histogram\n");
	for (int i = 0; i <= CSI_MAX_METHODS; i++)
		for (int c = 0; c < CSI_CODE_COUNT; c++) {
			struct csi_rpc_stat *s = &csi_m.rpc[i][c];
			unsigned long long n = atomic_load(&s->count), cum = 0;
			const char *mn, *cn;

			if (!n)
				continue;
			mn = csi_method_name(i);
			cn = csi_code_name(c);
			for (size_t b = 0; b < CSI_NBUCKETS; b++) {
				cum += atomic_load(&s->bucket[b]);
				fprintf(f, "strata_csi_rpc_duration_seconds_bucket{method=\"%s\",code=\"%s\",le=\"%g\"} %llu\n",
					mn, cn, csi_buckets[b], cum);
			}
			fprintf(f, "strata_csi_rpc_duration_seconds_bucket{method=\"%s\",code=\"%s\",le=\"+Inf\"} %llu\n"
				   "strata_csi_rpc_duration_seconds_sum{method=\"%s\",code=\"%s\"} %.6f\n"
				   "strata_csi_rpc_duration_seconds_count{method=\"%s\",code=\"%s\"} %llu\n",
				mn, cn, n, mn, cn,
				atomic_load(&s->sum_us) / 1e6, mn, cn, n);
		}
}

/* A daemon's counters, from the file it maps; -ENODATA before it wrote any. */
static int csi_read_stats(struct csi_plugin *p, const char *id,
			  struct strata_stats *st)
{
	char name[64];
	ssize_t n;
	int fd;

	snprintf(name, sizeof(name), "%s.stats", id);
	fd = openat(p->store.node_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	n = pread(fd, st, sizeof(*st), 0);
	close(fd);
	if (n < (ssize_t)offsetof(struct strata_stats, v) ||
	    st->magic != STRATA_STATS_MAGIC)
		return -ENODATA;
	/* a daemon of another build may export fewer counters */
	if (st->count > STRATA_ST_COUNT)
		st->count = STRATA_ST_COUNT;
	if ((size_t)n < offsetof(struct strata_stats, v) + st->count * sizeof(uint64_t))
		return -ENODATA;
	return 0;
}

static void csi_scrape_daemons(FILE *f, struct csi_plugin *p, char **ids,
			       int n)
{
	static const struct {
		const char *name, *help;
		enum strata_stat stat;
	} bytes[] = {
		{ "strata_volume_read_bytes_total",
		  "Bytes the volume's readers asked for", STRATA_ST_READ_BYTES },
		{ "strata_volume_written_bytes_total",
		  "Bytes written to the volume (files written through passthrough: what they grew by)",
		  STRATA_ST_WRITE_BYTES },
		{ "strata_volume_passthrough_opens_total",
		  "Files opened for the kernel to read and write itself (passthrough)",
		  STRATA_ST_PASS_OPENS },
	};
	struct strata_stats *st = calloc(n ? n : 1, sizeof(*st));
	bool *ok = calloc(n ? n : 1, sizeof(*ok));

	if (!st || !ok)
		goto out;
	for (int i = 0; i < n; i++)
		ok[i] = csi_read_stats(p, ids[i], &st[i]) == 0;
	for (size_t b = 0; b < sizeof(bytes) / sizeof(bytes[0]); b++) {
		fprintf(f, "# HELP %s %s (this daemon's lifetime).\n# TYPE %s counter\n",
			bytes[b].name, bytes[b].help, bytes[b].name);
		for (int i = 0; i < n; i++)
			if (ok[i] && (uint32_t)bytes[b].stat < st[i].count)
				fprintf(f, "%s{volume=\"%s\"} %llu\n", bytes[b].name,
					ids[i],
					(unsigned long long)st[i].v[bytes[b].stat]);
	}
	fprintf(f, "# HELP strata_volume_fuse_ops_total FUSE operations the volume's daemon served.\n"
		   "# TYPE strata_volume_fuse_ops_total counter\n");
	for (int i = 0; i < n; i++)
		for (uint32_t o = 0; ok[i] && o < STRATA_ST_NOPS && o < st[i].count; o++)
			if (st[i].v[o])
				fprintf(f, "strata_volume_fuse_ops_total{volume=\"%s\",op=\"%s\"} %llu\n",
					ids[i], strata_stat_names[o],
					(unsigned long long)st[i].v[o]);
out:
	free(st);
	free(ok);
}

/* Staged volumes, their targets, and each daemon's own counters. */
static void csi_scrape_volumes(FILE *f, struct csi_plugin *p)
{
	long long staged = 0, published = 0;
	char **ids;
	int n;

	if (csi_state_list(&p->store, &ids, &n))
		ids = NULL, n = 0;
	for (int i = 0; i < n; i++) {
		struct csi_node_vol nv;

		if (csi_state_load(&p->store, ids[i], &nv))
			continue;
		staged++;
		published += nv.ntargets;
		csi_state_free(&nv);
	}
	fprintf(f, "# HELP strata_csi_volumes_staged Volumes staged on this node.\n"
		   "# TYPE strata_csi_volumes_staged gauge\n"
		   "strata_csi_volumes_staged %lld\n"
		   "# HELP strata_csi_volumes_published Bind mounts of staged volumes into pods.\n"
		   "# TYPE strata_csi_volumes_published gauge\n"
		   "strata_csi_volumes_published %lld\n",
		   staged, published);
	csi_scrape_daemons(f, p, ids, n);
	csi_free_strv(ids, n);
}

static void csi_scrape(FILE *f, struct csi_plugin *p)
{
	struct statvfs st;

	fprintf(f, "# HELP strata_csi_build_info The plugin's version.\n"
		   "# TYPE strata_csi_build_info gauge\n"
		   "strata_csi_build_info{version=\"%s\",driver=\"%s\"} 1\n",
		   STRATA_VERSION, p->cfg.driver_name);
	csi_scrape_rpc(f);
	for (int e = 0; e < CSI_EV_COUNT; e++)
		fprintf(f, "# HELP %s %s.\n# TYPE %s counter\n%s %llu\n",
			csi_event_names[e], csi_event_help[e], csi_event_names[e],
			csi_event_names[e], atomic_load(&csi_m.events[e]));
	csi_scrape_volumes(f, p);
	if (fstatvfs(p->store.root_fd, &st) == 0)
		fprintf(f, "# HELP strata_store_capacity_bytes Size of the store's filesystem.\n"
			   "# TYPE strata_store_capacity_bytes gauge\n"
			   "strata_store_capacity_bytes %llu\n"
			   "# HELP strata_store_free_bytes Space the store can still use.\n"
			   "# TYPE strata_store_free_bytes gauge\n"
			   "strata_store_free_bytes %llu\n"
			   "# HELP strata_store_free_inodes Inodes the store can still use.\n"
			   "# TYPE strata_store_free_inodes gauge\n"
			   "strata_store_free_inodes %llu\n",
			   (unsigned long long)st.f_blocks * st.f_frsize,
			   (unsigned long long)st.f_bavail * st.f_frsize,
			   (unsigned long long)st.f_favail);
}

static enum MHD_Result csi_metrics_answer(void *cls, struct MHD_Connection *conn,
					  const char *url, const char *method,
					  const char *version,
					  const char *upload_data,
					  size_t *upload_size, void **state)
{
	struct MHD_Response *resp;
	unsigned int status = MHD_HTTP_OK;
	char *body = NULL;
	size_t len = 0;
	enum MHD_Result ret;
	FILE *f;

	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
		body = strdup("only GET\n");
	} else if (strcmp(url, "/metrics")) {
		status = MHD_HTTP_NOT_FOUND;
		body = strdup("metrics are at /metrics\n");
	} else {
		f = open_memstream(&body, &len);
		if (f) {
			csi_scrape(f, csi_m.p);
			fclose(f);
		}
	}
	if (!body)
		return MHD_NO;
	resp = MHD_create_response_from_buffer(strlen(body), body,
					       MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type",
				status == MHD_HTTP_OK ?
					"text/plain; version=0.0.4; charset=utf-8" :
					"text/plain");
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* "HOST:PORT", "[V6]:PORT" or ":PORT" (every address). */
static int csi_parse_addr(const char *addr, struct addrinfo **ai)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV | AI_PASSIVE };
	char host[256];
	const char *port = strrchr(addr, ':');
	size_t hlen;

	if (!port || !port[1])
		return -EINVAL;
	hlen = port - addr;
	if (hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, addr, hlen);
	host[hlen] = '\0';
	if (host[0] == '[' && hlen > 1 && host[hlen - 1] == ']') {
		memmove(host, host + 1, hlen - 2);
		host[hlen - 2] = '\0';
	}
	return getaddrinfo(host[0] ? host : NULL, port + 1, &hints, ai) ? -EINVAL : 0;
}

/* A listening socket on ai's address, or a negative errno. */
static int csi_metrics_listen(const struct addrinfo *ai)
{
	int one = 1, fd, ret;

	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* a restart must not wait out the last run's TIME_WAIT connections */
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 16) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	return fd;
}

int csi_metrics_start(struct csi_plugin *p, const char *addr)
{
	struct addrinfo *ai;
	int ret;

	csi_m.p = p;
	for (size_t t = 0; csi_services[t]; t++)
		for (const struct csi_method *m = csi_services[t];
		     m->path && csi_m.nmethods < CSI_MAX_METHODS; m++)
			csi_m.methods[csi_m.nmethods++] = m;
	if (!addr)
		return 0;
	ret = csi_parse_addr(addr, &ai);
	if (ret) {
		strata_err("--metrics-address '%s' is not HOST:PORT", addr);
		return ret;
	}
	/*
	 * Bound here, not by libmicrohttpd: its own error names neither the
	 * address nor the port asked for ("Failed to bind to port 0").
	 */
	ret = csi_metrics_listen(ai);
	freeaddrinfo(ai);
	if (ret < 0) {
		strata_err("cannot serve metrics on %s: %s%s", addr,
			   strerror(-ret),
			   ret == -EADDRINUSE ?
				   ": another program listens there; give --metrics-address another port" :
				   "");
		return ret;
	}
	csi_m.mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
					     MHD_USE_ERROR_LOG,
				     0, NULL, NULL, csi_metrics_answer, NULL,
				     MHD_OPTION_LISTEN_SOCKET, ret,
				     MHD_OPTION_CONNECTION_LIMIT, 16U,
				     MHD_OPTION_CONNECTION_TIMEOUT, 10U,
				     MHD_OPTION_END);
	if (!csi_m.mhd) {
		close(ret);
		strata_err("cannot serve metrics on %s", addr);
		return -EADDRNOTAVAIL;
	}
	strata_info("metrics on http://%s/metrics", addr);
	return 0;
}

void csi_metrics_stop(void)
{
	if (csi_m.mhd)
		MHD_stop_daemon(csi_m.mhd);
	csi_m.mhd = NULL;
}
