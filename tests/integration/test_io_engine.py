# SPDX-License-Identifier: Apache-2.0
"""The I/O engines (stratafs only): io=uring and io=sync give the same
data, and where io_uring is unavailable the daemon says so once and falls
back to sync. scripts/test.sh also runs the whole suite with io=sync."""

import errno
import os

import pytest

from stratatest import read_bytes, stratafs_binary, run

DISABLED = "/proc/sys/kernel/io_uring_disabled"


def data_workload(u):
    """Reads, writes, appends, copy-up and a big file, checked byte for byte."""
    big = os.urandom(3 << 20)
    with open(u.path("new"), "wb") as f:
        f.write(big)
    assert read_bytes(u.path("new")) == big
    with open(u.path("lower"), "ab") as f:         # copy-up, then append
        f.write(b"+tail")
    assert read_bytes(u.path("lower")) == b"lower data" * 1000 + b"+tail"
    fd = os.open(u.path("new"), os.O_RDWR)
    try:
        os.pwrite(fd, b"X" * 4096, 12345)
        assert os.pread(fd, 4096, 12345) == b"X" * 4096
        assert os.pread(fd, 10, len(big) + 100) == b""   # past the end
        os.fsync(fd)
    finally:
        os.close(fd)
    expect = bytearray(big)
    expect[12345:12345 + 4096] = b"X" * 4096
    assert read_bytes(u.path("new")) == bytes(expect)


@pytest.mark.parametrize("engine", ["uring", "sync"])
def test_engines_give_the_same_data(stratafs_only, engine):
    u = stratafs_only.make(lowers=[{"lower": "lower data" * 1000}],
                           extra_opts=[f"io={engine}", "nopassthrough"])
    data_workload(u)
    u.remount()
    assert read_bytes(u.path("lower")).endswith(b"+tail")
    assert "io_uring is unavailable" not in u.stderr()


def test_fallback_when_io_uring_is_disabled(stratafs_only):
    with open(DISABLED) as f:
        saved = f.read().strip()
    try:
        with open(DISABLED, "w") as f:
            f.write("2\n")          # io_uring off for everyone, root too
        # io=uring asked for explicitly: STRATAFS_OPTS may say sync
        u = stratafs_only.make(lowers=[{"lower": "lower data" * 1000}],
                               extra_opts=["io=uring", "nopassthrough"])
        data_workload(u)
        u.unmount()
    finally:
        with open(DISABLED, "w") as f:
            f.write(saved + "\n")
    log = u.stderr()
    assert log.count("io_uring is unavailable") == 1, log
    assert "using the sync engine" in log


def test_unknown_engine_is_refused(stratafs_only, tmp_path):
    mnt, lower = tmp_path / "m", tmp_path / "l"
    mnt.mkdir()
    lower.mkdir()
    r = run([stratafs_binary(), "-f", "-o", f"lowerdir={lower},io=bogus",
             str(mnt)], check=False)
    assert r.returncode != 0
    assert "stratafs: io=bogus" in r.stderr
