// SPDX-License-Identifier: Apache-2.0
/*
 * uring.c: what runs without a mount. The CPU list the kernel sizes its
 * queues by, and a reply to a request no ring holds, which must go on
 * to /dev/fuse. The transport itself runs over real mounts in
 * tests/integration/test_uring.py.
 */
#include <errno.h>
#include <linux/fuse.h>

#include "stratafs.h"
#include "unit.h"

static void test_cpus(void)
{
	CHECK_EQ_INT(sfs_uring_cpus("0\n"), 1);
	CHECK_EQ_INT(sfs_uring_cpus("0-1\n"), 2);
	CHECK_EQ_INT(sfs_uring_cpus("0-3,5"), 5);
	CHECK_EQ_INT(sfs_uring_cpus("0,2-3,8-15\n"), 11);
	CHECK_EQ_INT(sfs_uring_cpus(""), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("\n"), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("3-1"), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("0-"), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("-1"), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("0;1"), -EINVAL);
	CHECK_EQ_INT(sfs_uring_cpus("0-99999"), -EINVAL);
}

static void test_reply_not_ours(void)
{
	struct fuse_out_header out = { .len = sizeof(out), .unique = 42 };
	struct iovec iov = { &out, sizeof(out) };

	/* no queue runs: the reply is for the device */
	CHECK_EQ_INT(sfs_uring_reply(&iov, 1), -ENOENT);
	/* nor is a notification (unique 0) ever a ring's */
	out.unique = 0;
	CHECK_EQ_INT(sfs_uring_reply(&iov, 1), -ENOENT);
	iov.iov_len = 4;
	CHECK_EQ_INT(sfs_uring_reply(&iov, 1), -ENOENT);
}

int main(void)
{
	test_cpus();
	test_reply_not_ours();
	return unit_done("test_uring");
}
