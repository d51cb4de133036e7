// SPDX-License-Identifier: Apache-2.0
/* super.c: the checks made before mounting, and the scratch dirs. */
#include <errno.h>
#include <sys/file.h>

#include "fixture.h"
#include "unit.h"

static int setup_with(const char *lower, const char *upper, const char *work,
		      const char *mnt)
{
	struct fixture fx;
	char buf[256];
	int ret;

	fixture_init(&fx, 1, false);
	mkdirat(fx.fd, "m/inside", 0755);
	free(fx.fs.params.lowerdir);
	free(fx.fs.params.mountpoint);
	snprintf(buf, sizeof(buf), "%s/%s", fx.root, lower);
	fx.fs.params.lowerdir = strdup(buf);
	snprintf(buf, sizeof(buf), "%s/%s", fx.root, mnt);
	fx.fs.params.mountpoint = strdup(buf);
	if (upper) {
		snprintf(buf, sizeof(buf), "%s/%s", fx.root, upper);
		fx.fs.params.upperdir = strdup(buf);
		snprintf(buf, sizeof(buf), "%s/%s", fx.root, work);
		fx.fs.params.workdir = strdup(buf);
	}
	ret = sfs_setup(&fx.fs);
	fixture_done(&fx);
	return ret;
}

static void test_refusals(void)
{
	CHECK_EQ_INT(setup_with("l1", "u", "w", "m"), 0);
	CHECK_EQ_INT(setup_with("missing", NULL, NULL, "m"), -ENOENT);
	/* a layer at, inside or above the mountpoint */
	CHECK_EQ_INT(setup_with("m", NULL, NULL, "m"), -ELOOP);
	CHECK_EQ_INT(setup_with("m/inside", NULL, NULL, "m"), -ELOOP);
	CHECK_EQ_INT(setup_with("l1", NULL, NULL, "l1"), -ELOOP);
	CHECK_EQ_INT(setup_with(".", NULL, NULL, "m"), -ELOOP);
	/* upper and work apart from each other and from lowers */
	CHECK_EQ_INT(setup_with("l1", "u", "u", "m"), -ELOOP);
	CHECK_EQ_INT(setup_with("l1", "l1", "w", "m"), -ELOOP);
	CHECK_EQ_INT(setup_with("l1", "u", "missing", "m"), -ENOENT);
}

static void test_work(void)
{
	struct fixture fx, other;
	int lockfd;

	CHECK_EQ_INT(fixture_init(&fx, 1, true), 0);
	/* what a crash left in work/work goes at mount */
	fx_dir(&fx, "w/work");
	fx_dir(&fx, "w/work/leftover");
	fx_file(&fx, "w/work/leftover/f", "x");
	CHECK_EQ_INT(sfs_setup(&fx.fs), 0);
	CHECK(!fx_exists(&fx, "w/work/leftover"));
	CHECK(fx_exists(&fx, "w/index"));
	CHECK_EQ_STR(fx.fs.xattr_opaque, "trusted.overlay.opaque");

	/* a second instance on the same workdir is refused */
	memset(&other, 0, sizeof(other));
	other.fs.params.lowerdir = strdup(fx.fs.params.lowerdir);
	other.fs.params.upperdir = strdup(fx.fs.params.upperdir);
	other.fs.params.workdir = strdup(fx.fs.params.workdir);
	other.fs.params.mountpoint = strdup(fx.fs.params.mountpoint);
	CHECK_EQ_INT(sfs_setup(&other.fs), -EBUSY);
	sfs_teardown(&other.fs);
	sfs_params_free(&other.fs.params);
	fixture_done(&fx);

	/* the lock is the workdir's flock, held by whoever mounted */
	CHECK_EQ_INT(fixture_init(&fx, 1, true), 0);
	lockfd = openat(fx.fd, "w", O_RDONLY | O_DIRECTORY);
	CHECK_EQ_INT(flock(lockfd, LOCK_EX), 0);
	CHECK_EQ_INT(sfs_setup(&fx.fs), -EBUSY);
	close(lockfd);
	fixture_done(&fx);

	/* userxattr switches every marker name */
	CHECK_EQ_INT(fixture_init(&fx, 1, true), 0);
	fx.fs.params.userxattr = 1;
	CHECK_EQ_INT(sfs_setup(&fx.fs), 0);
	CHECK_EQ_STR(fx.fs.xattr_opaque, "user.overlay.opaque");
	CHECK(sfs_xattr_is_private("user.overlay.redirect"));
	fixture_done(&fx);
}

int main(void)
{
	UNIT_REQUIRE_ROOT();
	test_refusals();
	test_work();
	return unit_done("test_super");
}
