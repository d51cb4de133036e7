# SPDX-License-Identifier: Apache-2.0
"""The FUSE settings stratafs negotiates, checked by the requests the
kernel then sends (stratafs only; docs/fuse-settings.md). The daemon runs
with libfuse's debug log, which names every request it gets."""

import errno
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from strata_common import control_call
from stratatest import (STRATAFS_FSTYPE, is_mounted, lazy_umount, read_bytes,
                        stratafs_binary)


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
    # with passthrough (the default) the kernel writes upper files itself
    assert requests(u, "WRITE") == (0 if u.passthrough() else 100)
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


def passthrough_union(factory, extra=(), **kw):
    u = factory.make(extra_opts=["passthrough", "debug", *extra], **kw)
    assert u.passthrough()
    return u


def test_passthrough_data_skips_the_daemon(stratafs_only):
    u = passthrough_union(stratafs_only, lowers=[{"x": ""}])
    data = os.urandom(1 << 20)
    with open(u.path("new"), "wb") as f:          # CREATE reply
        for i in range(0, len(data), 4096):
            f.write(data[i:i + 4096])
    with open(u.path("new"), "r+b") as f:         # OPEN reply
        f.seek(100)
        f.write(b"patched")
    data = data[:100] + b"patched" + data[107:]
    assert os.stat(u.path("new")).st_size == len(data)
    assert read_bytes(u.path("new")) == data
    assert read_bytes(u.upath("new")) == data
    assert (requests(u, "WRITE"), requests(u, "READ")) == (0, 0)
    u.remount()
    assert read_bytes(u.path("new")) == data


def test_passthrough_leaves_lower_files_and_appenders_to_the_daemon(stratafs_only):
    u = passthrough_union(stratafs_only, lowers=[{"low": "lower data"}],
                          upper={"suid": ("file", "s", {"mode": 0o4777})},
                          allow_other=True)
    assert read_bytes(u.path("low")) == b"lower data"
    assert requests(u, "READ") > 0
    # an O_APPEND handle (write_as appends) is the daemon's, which drops
    # setuid as the kernel would (test_passthrough.py: the same through
    # passthrough handles)
    from test_locks_sync import write_as
    assert write_as(65534, 65534, u.mnt, "suid") == 0
    assert requests(u, "WRITE") == 1
    assert os.stat(u.path("suid")).st_mode & 0o7777 == 0o777


def test_passthrough_and_cached_handles_of_one_file_agree(stratafs_only,
                                                        tmp_path):
    """The kernel fails an open that disagrees with the file's other open
    handles; and pages cached before passthrough writes must not be
    served afterwards."""
    sock = str(tmp_path / "c.sock")
    u = passthrough_union(stratafs_only, lowers=[{"f": "old" * 1000}],
                          extra=[f"control={sock}"])
    reader = open(u.path("f"), "rb")              # lower: through the daemon
    try:
        assert reader.read() == b"old" * 1000
        with open(u.path("f"), "r+b") as w:       # copy-up, while reader is open
            w.write(b"NEW")
        reader.seek(0)
        assert reader.read(6) == b"NEWold"         # follows the copy-up
    finally:
        reader.close()
    st = os.stat(u.path("f"))
    # alone now: passthrough, once the reader's RELEASE is in (it comes
    # after close(2); before it, the daemon serves the writer as it
    # serves the reader, and the page cache gets the new bytes). The
    # kernel wrote it itself when no WRITE reached the daemon.
    for _ in range(200):
        writes = requests(u, "WRITE")
        with open(u.path("f"), "r+b") as w:
            w.write(b"PT!")
            w.flush()
            os.fsync(w.fileno())
        if requests(u, "WRITE") == writes:
            break
        time.sleep(0.01)
    else:
        pytest.fail("no writer was given passthrough")
    # the old times hide the change from the kernel's own check (mtime)
    os.utime(u.path("f"), ns=(st.st_atime_ns, st.st_mtime_ns))
    # frozen into a lower layer, the file is the daemon's again: an open
    # that may keep the cache
    for _ in range(200):    # the RELEASE of the writer comes after close(2)
        status, text = control_call(sock, "freeze", str(tmp_path / "frozen"),
                                    timeout=60)
        if status != -errno.EBUSY:
            break
        time.sleep(0.01)
    assert status == 0, text
    reads = requests(u, "READ")
    with open(u.path("f"), "rb") as r:
        assert r.read(6) == b"PT!old"
    assert requests(u, "READ") > reads
    assert read_bytes(str(tmp_path / "frozen" / "f"))[:6] == b"PT!old"


@pytest.mark.parametrize("opts", ["", ",passthrough", ",nopassthrough"],
                         ids=["default", "passthrough", "nopassthrough"])
def test_daemon_without_privileges(stratafs_only, opts):
    """A user's own daemon (no CAP_SYS_ADMIN, no CAP_SETFCAP): root mounts
    /dev/fuse for it, as fusermount3 would, and it serves as nobody.
    Writes must work (dropping a capability that is not there needs no
    privilege), and passthrough falls back to the daemon, saying why: a
    warning when asked for, a note when it was only the default."""
    base = tempfile.mkdtemp(prefix="strata-unpriv-")
    try:
        for d in ("l", "u", "w", "m"):
            os.mkdir(os.path.join(base, d))
        with open(os.path.join(base, "l", "f"), "w") as f:
            f.write("lower\n")
        for root, dirs, files in os.walk(base):
            for n in [root] + [os.path.join(root, x) for x in dirs + files]:
                os.chown(n, NOBODY, NOBODY)
        os.chmod(base, 0o755)
        run_unprivileged(base, opts)
    finally:
        if is_mounted(os.path.join(base, "m")):
            lazy_umount(os.path.join(base, "m"))
        shutil.rmtree(base)


NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def run_unprivileged(base, opts):
    m = os.path.join(base, "m")
    fd = os.open("/dev/fuse", os.O_RDWR)
    try:
        subprocess.run(["mount", "-i", "-t", STRATAFS_FSTYPE, "-o",
                        f"fd={fd},rootmode=40000,user_id={NOBODY},group_id={NOBODY},"
                        "allow_other,default_permissions", "stratafs", m],
                       check=True, pass_fds=(fd,))
        err = os.path.join(base, "stderr")
        with open(err, "w") as e:
            proc = subprocess.Popen(
                AS_NOBODY + [stratafs_binary(), "-f", "-o",
                             f"lowerdir={base}/l,upperdir={base}/u,workdir={base}/w,"
                             f"userxattr{opts}", f"/dev/fd/{fd}"],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=e, stderr=e)
    finally:
        os.close(fd)
    try:
        subprocess.run(AS_NOBODY + ["sh", "-c", f"echo new > {m}/n && echo more >> {m}/f"],
                       check=True, timeout=30)
        assert read_bytes(os.path.join(m, "n")) == b"new\n"
        assert read_bytes(os.path.join(m, "f")) == b"lower\nmore\n"
        assert read_bytes(os.path.join(base, "u", "f")) == b"lower\nmore\n"
        subprocess.run(["umount", m], check=True)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = open(err).read()
    said = {"": "info: ", ",passthrough": "warning: "}.get(opts)
    refused = "passthrough refused (Operation not permitted, it needs CAP_SYS_ADMIN)"
    assert (refused in log) == bool(said), log
    if said:
        assert said + refused in log, log


def test_max_read_is_taken(stratafs_only):
    """libfuse passes max_read= to the kernel and then refuses an INIT
    that does not ask for the same size: every worker died of it, and
    the supervisor gave up."""
    data = os.urandom(1 << 20)
    u = stratafs_only.make([{}], extra_opts=["max_read=65536"])
    with open(u.path("big"), "wb") as f:
        f.write(data)
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    with open(u.path("big"), "rb") as f:
        assert f.read() == data
    assert "max_read=65536" in open("/proc/mounts").read()
    assert "worker exited" not in u.stderr(), u.stderr()
