"""The FUSE settings stratafs negotiates, checked by the requests the
kernel then sends (stratafs only; docs/fuse-settings.md). The daemon runs
with libfuse's debug log, which names every request it gets."""

import os

from stratatest import read_bytes


def requests(u, opcode):
    return u.stderr().count(f"opcode: {opcode} (")


def test_writes_are_one_request_each(stratafs_only):
    """HANDLE_KILLPRIV_V2, which fuse/handshake.c adds to libfuse 3.14's
    INIT reply: once a file has shown no privileges to drop, a write is
    just a WRITE, not a GETXATTR of security.capability first."""
    u = stratafs_only.make(lowers=[{"f": "x" * 100}], extra_opts=["debug"])
    fd = os.open(u.path("f"), os.O_WRONLY)
    try:
        for i in range(100):
            os.pwrite(fd, b"y", i)
    finally:
        os.close(fd)
    assert read_bytes(u.path("f")) == b"y" * 100
    assert requests(u, "WRITE") == 100
    assert requests(u, "GETXATTR") <= 1


def test_chown_is_one_request(stratafs_only):
    """Without HANDLE_KILLPRIV_V2 the kernel refreshes the mode with a
    GETATTR before each chown, to drop setuid itself."""
    u = stratafs_only.make(lowers=[{"f": "x"}], extra_opts=["debug"])
    os.stat(u.path("f"))
    before = requests(u, "GETATTR"), requests(u, "SETATTR")
    for i in range(20):
        os.chown(u.path("f"), 1000 + i % 2, 1000)
    assert os.stat(u.path("f")).st_uid == 1001
    assert requests(u, "SETATTR") - before[1] == 20
    assert requests(u, "GETATTR") - before[0] == 0
