// SPDX-License-Identifier: Apache-2.0
/* params.c: the lowerdir syntax and the command line. */
#include <errno.h>
#include <stdlib.h>

#include "stratafs.h"
#include "unit.h"

static void test_split(void)
{
	char **v;
	int n;

	CHECK_EQ_INT(sfs_split_lowerdir("/a:/b:/c", &v, &n), 0);
	CHECK_EQ_INT(n, 3);
	CHECK_EQ_STR(v[0], "/a");
	CHECK_EQ_STR(v[2], "/c");
	sfs_strv_free(v, n);

	/* \: is a colon inside a path, \\ a backslash */
	CHECK_EQ_INT(sfs_split_lowerdir("/x\\:y:/z\\\\w", &v, &n), 0);
	CHECK_EQ_INT(n, 2);
	CHECK_EQ_STR(v[0], "/x:y");
	CHECK_EQ_STR(v[1], "/z\\w");
	sfs_strv_free(v, n);

	CHECK_EQ_INT(sfs_split_lowerdir("/a::/b", &v, &n), -EINVAL);
	CHECK_EQ_INT(sfs_split_lowerdir(":/a", &v, &n), -EINVAL);
	CHECK_EQ_INT(sfs_split_lowerdir("/a:", &v, &n), -EINVAL);
}

static void test_too_many(void)
{
	char spec[SFS_MAX_LOWERS * 3 + 8], **v;
	int n, len = 0;

	for (int i = 0; i <= SFS_MAX_LOWERS; i++)
		len += sprintf(spec + len, "%sa", i ? ":" : "");
	CHECK_EQ_INT(sfs_split_lowerdir(spec, &v, &n), -E2BIG);
}

static int parse(struct sfs_params *p, int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	int ret = sfs_params_parse(&args, p);

	fuse_opt_free_args(&args);
	return ret;
}

static void test_cmdline(void)
{
	struct sfs_params p;
	char *full[] = { "stratafs", "-f", "-o",
			 "lowerdir=/l,upperdir=/u,workdir=/w,userxattr", "/m" };
	char *mountfuse[] = { "stratafs", "src", "/m", "-o",
			      "rw,lowerdir=/l" };
	char *nolower[] = { "stratafs", "-o", "upperdir=/u,workdir=/w", "/m" };
	char *halfupper[] = { "stratafs", "-o", "lowerdir=/l,upperdir=/u",
			      "/m" };
	char *nomnt[] = { "stratafs", "-o", "lowerdir=/l" };
	char *three[] = { "stratafs", "a", "b", "c", "-o", "lowerdir=/l" };
	char *help[] = { "stratafs", "--help" };

	CHECK_EQ_INT(parse(&p, 5, full), 0);
	CHECK_EQ_STR(p.lowerdir, "/l");
	CHECK_EQ_STR(p.upperdir, "/u");
	CHECK_EQ_STR(p.workdir, "/w");
	CHECK_EQ_STR(p.mountpoint, "/m");
	CHECK(p.userxattr);
	CHECK(p.foreground);
	sfs_params_free(&p);

	/* a repeated option takes the last value, the first is freed */
	{
		char *twice[] = { "stratafs", "-o", "lowerdir=/a,io=sync",
				  "-o", "lowerdir=/b,io=uring", "/m" };

		CHECK_EQ_INT(parse(&p, 6, twice), 0);
		CHECK_EQ_STR(p.lowerdir, "/b");
		CHECK_EQ_STR(p.io, "uring");
		sfs_params_free(&p);
	}
	{
		char *bad[] = { "stratafs", "-o", "lowerdir=/a,io=fast", "/m" };
		char *t_ok[] = { "stratafs", "-o", "lowerdir=/a,timeout=0.5", "/m" };
		char *t_bad[] = { "stratafs", "-o", "lowerdir=/a,timeout=1x", "/m" };
		char *t_neg[] = { "stratafs", "-o", "lowerdir=/a,timeout=-1", "/m" };

		CHECK_EQ_INT(parse(&p, 4, bad), -EINVAL);
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, t_ok), 0);
		CHECK_EQ_STR(p.timeout, "0.5");
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, t_bad), -EINVAL);
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, t_neg), -EINVAL);
		sfs_params_free(&p);
	}
	{
		char *dev[] = { "stratafs", "-o", "lowerdir=/a,transport=dev", "/m" };
		char *uring[] = { "stratafs", "-o", "lowerdir=/a,transport=uring", "/m" };
		char *none[] = { "stratafs", "-o", "lowerdir=/a", "/m" };
		char *bad[] = { "stratafs", "-o", "lowerdir=/a,transport=fast", "/m" };
		char *empty[] = { "stratafs", "-o", "lowerdir=/a,transport=", "/m" };

		CHECK_EQ_INT(parse(&p, 4, dev), 0);
		CHECK_EQ_STR(p.transport, "dev");
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, uring), 0);
		CHECK_EQ_STR(p.transport, "uring");
		sfs_params_free(&p);
		/* unset: uring where it can be, decided at INIT (uring.c) */
		CHECK_EQ_INT(parse(&p, 4, none), 0);
		CHECK(!p.transport);
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, bad), -EINVAL);
		sfs_params_free(&p);
		CHECK_EQ_INT(parse(&p, 4, empty), -EINVAL);
		sfs_params_free(&p);
	}

	CHECK_EQ_INT(parse(&p, 5, mountfuse), 0);
	CHECK_EQ_STR(p.source, "src");
	CHECK_EQ_STR(p.mountpoint, "/m");
	CHECK(!p.upperdir);
	sfs_params_free(&p);

	CHECK_EQ_INT(parse(&p, 4, nolower), -EINVAL);
	sfs_params_free(&p);
	CHECK_EQ_INT(parse(&p, 4, halfupper), -EINVAL);
	sfs_params_free(&p);
	CHECK_EQ_INT(parse(&p, 3, nomnt), -EINVAL);
	sfs_params_free(&p);
	CHECK_EQ_INT(parse(&p, 6, three), -EINVAL);
	sfs_params_free(&p);
	CHECK_EQ_INT(parse(&p, 2, help), 0);
	CHECK(p.show_help);
	sfs_params_free(&p);
}

/* The kernel's escapes hold in every path, through fuse_opt's own. */
static void test_escapes(void)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct sfs_params p;
	char *argv[] = { "stratafs", "-o",
			 "lowerdir=/l\\:1:/l\\\\2,upperdir=/u\\:1\\\\x,workdir=/w\\,2,"
			 "statsfile=/s\\:\\,\\\\3",
			 "/m" };
	char **v;
	int n;

	CHECK_EQ_INT(sfs_params_escape(4, argv, &args), 0);
	CHECK_EQ_INT(sfs_params_parse(&args, &p), 0);
	CHECK_EQ_STR(p.upperdir, "/u:1\\x");
	CHECK_EQ_STR(p.workdir, "/w,2");
	CHECK_EQ_STR(p.statsfile, "/s:,\\3");
	CHECK_EQ_INT(sfs_split_lowerdir(p.lowerdir, &v, &n), 0);
	CHECK_EQ_INT(n, 2);
	CHECK_EQ_STR(v[0], "/l:1");
	CHECK_EQ_STR(v[1], "/l\\2");
	sfs_strv_free(v, n);
	sfs_params_free(&p);
	fuse_opt_free_args(&args);
}

int main(void)
{
	test_split();
	test_too_many();
	test_cmdline();
	test_escapes();
	return unit_done("test_params");
}
