# SPDX-License-Identifier: Apache-2.0
"""File locks between processes, sync calls, suid/sgid stripping."""

import errno
import fcntl
import os
import stat
import struct
import subprocess
import textwrap

import pytest

from stratatest import errno_of, run_as

F_OFD_GETLK, F_OFD_SETLK = 36, 37
PY = "/usr/bin/python3"

CHILD = textwrap.dedent("""
    import errno, fcntl, os, struct, sys
    kind, path, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    fd = os.open(path, os.O_RDWR if mode == "rw" else os.O_RDONLY)
    try:
        if kind == "flock":
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif kind == "flock_sh":
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        elif kind == "posix":
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
        elif kind == "posix_other_range":
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100)
        elif kind == "ofd":
            fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 10, 0))
        print("locked")
    except OSError as e:
        print(errno.errorcode[e.errno])
""")


def child_try(kind, path, mode="rw"):
    r = subprocess.run([PY, "-c", CHILD, kind, path, mode], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def ofd_lock(fd, ltype, start=0, length=10, wait=False):
    fcntl.fcntl(fd, F_OFD_SETLK if not wait else 38,
                struct.pack("hhqqi4x", ltype, 0, start, length, 0))


@pytest.mark.parametrize("layer", ["lower", "upper"])
def test_flock_conflicts_between_processes(union, layer):
    u = union.make(lowers=[{"f": "lower"}], upper={"g": "upper"})
    p = u.path("f" if layer == "lower" else "g")
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert child_try("flock", p) == "EAGAIN"
        assert child_try("flock_sh", p, "ro") == "EAGAIN"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert child_try("flock", p) == "locked"
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert child_try("flock_sh", p, "ro") == "locked"
        assert child_try("flock", p) == "EAGAIN"
    finally:
        os.close(fd)
    assert child_try("flock", p) == "locked"


def test_flock_taken_before_copy_up_still_conflicts(union):
    u = union.make(lowers=[{"f": "lower"}])
    p = u.path("f")
    fd = os.open(p, os.O_RDONLY)          # no copy-up yet
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert child_try("flock", p, "rw") == "EAGAIN"   # child copies up
        assert os.path.exists(u.upath("f"))
    finally:
        os.close(fd)
    assert child_try("flock", p, "rw") == "locked"


@pytest.mark.parametrize("layer", ["lower", "upper"])
def test_posix_locks_conflict_between_processes(union, layer):
    u = union.make(lowers=[{"f": "lower"}], upper={"g": "upper"})
    p = u.path("f" if layer == "lower" else "g")
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
        assert child_try("posix", p) in ("EAGAIN", "EACCES")
        assert child_try("posix_other_range", p) == "locked"
        fcntl.lockf(fd, fcntl.LOCK_UN, 10, 0)
        assert child_try("posix", p) == "locked"
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
    finally:
        os.close(fd)   # closing releases POSIX locks
    assert child_try("posix", p) == "locked"


def test_ofd_locks_conflict(union):
    u = union.make(lowers=[{"f": "lower"}])
    p = u.path("f")
    fd1 = os.open(p, os.O_RDWR)
    fd2 = os.open(p, os.O_RDWR)
    try:
        ofd_lock(fd1, fcntl.F_WRLCK)
        # OFD locks conflict between open file descriptions, even in one process
        with pytest.raises(OSError) as e:
            ofd_lock(fd2, fcntl.F_WRLCK)
        assert e.value.errno in (errno.EAGAIN, errno.EACCES)
        ofd_lock(fd2, fcntl.F_WRLCK, start=50)
        assert child_try("ofd", p) in ("EAGAIN", "EACCES")
        # F_OFD_GETLK reports the conflicting lock
        res = fcntl.fcntl(fd2, F_OFD_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 10, 0))
        ltype, _, start, length, pid = struct.unpack("hhqqi4x", res)
        assert (ltype, start, length, pid) == (fcntl.F_WRLCK, 0, 10, -1)
        ofd_lock(fd1, fcntl.F_UNLCK)
        assert child_try("ofd", p) == "locked"
    finally:
        os.close(fd1)
        os.close(fd2)


def test_fsync_fdatasync_sync(union):
    u = union.make(lowers=[{"lower": "l", "d/x": "x"}])
    fd = os.open(u.path("new"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"data" * 1000)
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(u.path("lower"), os.O_RDONLY)
    try:
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(u.path("lower"), os.O_RDWR)
    try:
        os.write(fd, b"L")
        os.fsync(fd)
    finally:
        os.close(fd)
    for d in (u.mnt, u.path("d")):
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    os.sync()
    with open(u.upath("new"), "rb") as f:
        assert f.read() == b"data" * 1000
    with open(u.upath("lower"), "rb") as f:
        assert f.read() == b"L"


def write_as(uid, gid, dirpath, name):
    """Fork a child with uid/gid that appends to dirpath/name; return the
    errno it hit (0 on success).  The dir fd is opened before dropping
    privileges: pytest's tmp dirs are 0700."""
    dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fd = os.open(name, os.O_WRONLY | os.O_APPEND, dir_fd=dfd)
            os.write(fd, b"+written by other user")
            os.close(fd)
        except OSError as e:
            code = e.errno
        except BaseException:
            code = 255
        try:
            os.write(w, str(code).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(dfd)
    out = b""
    while True:
        b = os.read(r, 100)
        if not b:
            break
        out += b
    os.close(r)
    os.waitpid(pid, 0)
    return int(out or b"254")


@pytest.mark.parametrize("layer", ["lower", "upper"])
@pytest.mark.parametrize("mode,gid,expect", [
    pytest.param(0o6777, 0, 0o777, id="6777"),
    pytest.param(0o4777, 0, 0o777, id="4777"),
    pytest.param(0o2777, 0, 0o777, id="2777"),
    # sgid without group-exec: dropped unless the writer is in the file's group
    pytest.param(0o6767, 0, 0o767, id="6767-writer-not-in-group"),
    pytest.param(0o6767, 65534, 0o2767, id="6767-writer-in-group"),
])
def test_suid_sgid_dropped_on_write_by_other_user(union, layer, mode, gid, expect):
    spec = {"f": ("file", "content", {"mode": mode, "gid": gid})}
    u = union.make(lowers=[spec if layer == "lower" else {"x": ""}],
                   upper=spec if layer == "upper" else None,
                   allow_other=True)
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == mode
    assert write_as(65534, 65534, u.mnt, "f") == 0
    st = os.stat(u.path("f"))
    assert stat.S_IMODE(st.st_mode) == expect, oct(st.st_mode)
    with open(u.path("f")) as fh:
        assert fh.read() == "content+written by other user"
    u.remount()
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == expect


def open_trunc(dfd):
    os.close(os.open("f", os.O_WRONLY | os.O_TRUNC, dir_fd=dfd))


def ftruncate(dfd):
    fd = os.open("f", os.O_WRONLY, dir_fd=dfd)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize("action", [open_trunc, ftruncate])
def test_suid_sgid_dropped_on_truncate_by_other_user(union, action):
    u = union.make(lowers=[{"f": ("file", "content", {"mode": 0o6777})}],
                   allow_other=True)
    assert run_as(65534, 65534, u.mnt, action) == 0
    st = os.stat(u.path("f"))
    assert (stat.S_IMODE(st.st_mode), st.st_size) == (0o777, 0), oct(st.st_mode)


def fallocate(dfd):
    fd = os.open("f", os.O_WRONLY, dir_fd=dfd)
    try:
        os.posix_fallocate(fd, 0, 1 << 16)
    finally:
        os.close(fd)


def copy_file_range_into(dfd):
    src = os.open("src", os.O_RDONLY, dir_fd=dfd)
    dst = os.open("f", os.O_WRONLY, dir_fd=dfd)
    try:
        assert os.copy_file_range(src, dst, 4, 0, 0) == 4
    finally:
        os.close(src)
        os.close(dst)


@pytest.mark.parametrize("action", [fallocate, copy_file_range_into])
def test_suid_sgid_dropped_on_other_changes_of_data_by_other_user(union, action):
    """fallocate and copy_file_range modify a file as a write does."""
    u = union.make(lowers=[{"f": ("file", "content", {"mode": 0o6777}),
                            "src": "data"}], allow_other=True)
    assert run_as(65534, 65534, u.mnt, action) == 0
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == 0o777


def test_suid_dropped_on_write_after_chmod_of_a_written_file(union):
    """A file written once with nothing to drop may be written unchecked
    until its mode changes: a chmod u+s must bring the check back."""
    u = union.make(lowers=[{"f": ("file", "content", {"mode": 0o777})}],
                   allow_other=True)
    assert write_as(65534, 65534, u.mnt, "f") == 0
    with open(u.path("f"), "a") as fh:
        fh.write("root")
    os.chmod(u.path("f"), 0o4777)
    assert write_as(65534, 65534, u.mnt, "f") == 0
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == 0o777


CAP = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # v2, effective, CAP_NET_RAW


@pytest.mark.parametrize("writer", ["root", "other", "truncate", "open-trunc"])
def test_capability_dropped_on_every_write_that_follows_a_setcap(union, writer):
    """Each setcap on a file already written must be undone by the next
    write or truncate, by root too, as on the kernel's own filesystems."""
    u = union.make(lowers=[{"f": ("file", "content", {"mode": 0o777})}],
                   allow_other=True)
    for _ in range(2):
        os.setxattr(u.path("f"), "security.capability", CAP)
        assert os.getxattr(u.path("f"), "security.capability") == CAP
        if writer == "root":
            with open(u.path("f"), "a") as fh:
                fh.write("root")
        elif writer == "truncate":
            os.truncate(u.path("f"), 3)
        elif writer == "open-trunc":
            os.close(os.open(u.path("f"), os.O_WRONLY | os.O_TRUNC))
        else:
            assert write_as(65534, 65534, u.mnt, "f") == 0
        assert errno_of(os.getxattr, u.path("f"), "security.capability") == \
            errno.ENODATA
    u.remount()
    assert errno_of(os.getxattr, u.path("f"), "security.capability") == errno.ENODATA


def test_suid_kept_when_root_writes(union):
    u = union.make(lowers=[{"f": ("file", "c", {"mode": 0o6777})}])
    with open(u.path("f"), "a") as fh:
        fh.write("root")
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == 0o6777


def test_suid_dropped_on_chown(union):
    u = union.make(lowers=[{"f": ("file", "c", {"mode": 0o6755})}])
    os.chown(u.path("f"), 1, 1)
    assert stat.S_IMODE(os.stat(u.path("f")).st_mode) == 0o755
