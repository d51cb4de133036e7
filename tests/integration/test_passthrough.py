# SPDX-License-Identifier: Apache-2.0
"""Privileges a write must drop, with passthrough (the daemon's default)
and without, against kernel overlayfs: the same answer on both.

With passthrough the kernel writes the upper file through a backing file
the daemon never sees. What keeps it exact (fuse/passthrough.c): every
kernel with FUSE passthrough (6.9+) writes through backing_file_write_iter,
which first removes privileges on the FUSE file with the writer's own
credentials; under HANDLE_KILLPRIV_V2 that reaches the daemon as a SETATTR
that kills setuid/setgid, and the upper filesystem drops a file
capability on the write itself. So a bit is dropped exactly when the
kernel would drop it, whether the file had it at open or gained it while
the handle was open, after a write had already found nothing to drop."""

import os
import subprocess
import time

import pytest

NOBODY = 65534
CAP_XATTR = "security.capability"


def has_cap(path):
    try:
        os.getxattr(path, CAP_XATTR, follow_symlinks=False)
        return True
    except OSError:
        return False


def grant(path, what):
    if what == "cap":
        subprocess.run(["setcap", "cap_net_raw+ep", path], check=True)
        os.chmod(path, 0o666)
    else:
        os.chmod(path, {"setuid": 0o4777, "setgid": 0o2777}[what])


def write_through_handle(path, writer, gain):
    """Opens PATH for writing as WRITER, writes once, lets GAIN run (the
    parent grants the privilege), then writes again through the same
    handle. The directory is opened first: pytest's are 0700."""
    dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    go, ready = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go[1])
            os.close(ready[0])
            if writer == "nobody":
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            fd = os.open(os.path.basename(path), os.O_WRONLY, dir_fd=dfd)
            os.pwrite(fd, b"first", 0)       # found nothing to drop
            os.write(ready[1], b"1")
            os.read(go[0], 1)
            os.pwrite(fd, b"second", 0)
            os.close(fd)
            code = 0
        finally:
            os._exit(code)
    os.close(dfd)
    os.close(go[0])
    os.close(ready[1])
    try:
        # nothing read: the child failed before its first write
        if os.read(ready[0], 1):
            gain()
            os.write(go[1], b"1")
    finally:
        os.close(go[1])
        os.close(ready[0])
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("when", ["at-open", "gained-while-open"])
@pytest.mark.parametrize("writer", ["nobody", "root"])
@pytest.mark.parametrize("what", ["setuid", "setgid", "cap"])
@pytest.mark.parametrize("opts", [[], ["nopassthrough"]],
                         ids=["default", "nopassthrough"])
def test_write_drops_privileges_as_the_kernel(union, what, writer, when, opts):
    u = union.make(lowers=[{"keep": "x"}], allow_other=True,
                   extra_opts=opts if union.kind == "stratafs" else [])
    # the path under test is taken: passthrough unless said otherwise
    assert u.passthrough() == (u.kind == "stratafs" and
                               "nopassthrough" not in u.options().split(","))
    f = u.path("f")
    with open(f, "w") as fh:
        fh.write("data")
    os.chmod(f, 0o666)
    if when == "at-open":
        grant(f, what)
        write_through_handle(f, writer, lambda: None)
    else:
        write_through_handle(f, writer, lambda: grant(f, what))
    mode = os.stat(u.upath("f")).st_mode & 0o7777
    # the kernel's rule: setuid/setgid go unless the writer holds
    # CAP_FSETID; a capability goes on any write
    if what == "cap":
        assert not has_cap(u.upath("f"))
        assert mode == 0o666
    elif writer == "nobody":
        assert mode == 0o777
    else:
        assert mode == {"setuid": 0o4777, "setgid": 0o2777}[what]
    # and the mount shows what the upper holds
    assert os.stat(f).st_mode & 0o7777 == mode
    with open(u.upath("f"), "rb") as fh:
        assert fh.read() == b"second"


def test_passthrough_is_the_default(stratafs_only):
    u = stratafs_only.make(lowers=[{"x": ""}])
    if "nopassthrough" in u.options().split(","):
        assert not u.passthrough()
        return
    assert u.passthrough(), u.stderr()


def test_capacity_turns_the_default_off(stratafs_only):
    u = stratafs_only.make(lowers=[{"x": ""}], extra_opts=["capacity=1048576"])
    if "passthrough" in u.options().split(","):
        pytest.skip("passthrough asked for on every mount: refused with a "
                    "capacity (test_capacity.py)")
    assert not u.passthrough()
    if "nopassthrough" not in u.options().split(","):
        assert "passthrough: off, as capacity= needs the daemon to see " \
            "every write" in u.stderr()


def test_nopassthrough_after_passthrough_wins(stratafs_only):
    u = stratafs_only.make(lowers=[{"x": ""}],
                           extra_opts=["passthrough", "nopassthrough"])
    assert not u.passthrough()
    assert "passthrough" not in u.stderr()


@pytest.mark.parametrize("caller", ["nobody", "root"])
@pytest.mark.parametrize("mode", [0o6767, 0o6777], ids=["6767", "6777"])
def test_chown_to_nothing_drops_as_the_kernel(union, caller, mode):
    """chown(f, -1, -1) reaches the daemon as a SETATTR without bits, as
    a passthrough write's request to drop privileges does: both must
    keep the kernel's rule for the caller (setgid without group-exec
    goes for a caller outside the file's group, stays for root)."""
    u = union.make(lowers=[{"keep": "x"}], allow_other=True)
    f = u.path("f")
    with open(f, "w") as fh:
        fh.write("data")
    os.chown(f, NOBODY, 0)
    os.chmod(f, mode)
    dfd = os.open(u.mnt, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if caller == "nobody":
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            os.chown("f", -1, -1, dir_fd=dfd)
            code = 0
        finally:
            os._exit(code)
    os.close(dfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got = os.stat(u.upath("f")).st_mode & 0o7777
    want = {("nobody", 0o6767): 0o767, ("nobody", 0o6777): 0o777,
            ("root", 0o6767): 0o2767, ("root", 0o6777): 0o777}[caller, mode]
    assert got == want, oct(got)


def test_passthrough_is_counted_at_open_and_close(stratafs_only, tmp_path):
    """The statistics file counts what the daemon can see of passthrough
    I/O: the handles, and what a file grew by while open for writing,
    at its last close (an overwrite in place is not seen)."""
    from test_uring import counters
    stats = str(tmp_path / "stats")
    u = stratafs_only.make([{"a": "lower"}], extra_opts=[f"statsfile={stats}"])
    if not u.passthrough():
        pytest.skip("passthrough is not in effect here (nopassthrough)")
    opens, written = STAT_PASS_OPENS, STAT_WRITE_BYTES
    with open(u.path("new"), "wb") as f:
        for _ in range(256):
            f.write(b"x" * 4096)
    with open(u.path("new"), "r+b") as f:       # in place: not counted
        f.write(b"y" * 4096)
    with open(u.path("log"), "ab") as f:        # O_APPEND: the daemon's
        f.write(b"z" * 100)
    # RELEASE reaches the daemon after close(2) returns
    for _ in range(500):
        c = counters(stats)
        if c[opens] == 2 and c[written] == (1 << 20) + 100:
            break
        time.sleep(0.01)
    assert (c[opens], c[written]) == (2, (1 << 20) + 100)
    assert c[STAT_WRITE] == 1                   # the O_APPEND handle's


# lib/strata.h: enum strata_stat
STAT_WRITE, STAT_WRITE_BYTES, STAT_PASS_OPENS = 14, 33, 35
