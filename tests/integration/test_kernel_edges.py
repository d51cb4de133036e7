# SPDX-License-Identifier: Apache-2.0
"""The last POSIX edges where stratafs and kernel overlayfs once differed
(issue 12): each test runs on both, and asserts what the kernel does."""

import errno
import fcntl
import mmap
import os
import stat
import struct
import time

import pytest

from stratatest import errno_of, read_bytes, run_as, snapshot_upper

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_NOATIME_FL = 0x80
FS_NODUMP_FL = 0x40
OTHER_UID = 1000


# ---------------------------------------------------------------- mknod

def test_mknod_of_a_whiteout_is_refused(union):
    u = union.make(lowers=[{"d/lower": "l"}])
    for name in ("new", "d/new"):
        e = errno_of(os.mknod, u.path(name), stat.S_IFCHR | 0o600,
                     os.makedev(0, 0))
        assert e == errno.EPERM, name
    assert errno_of(os.mknod, u.path("d", "lower"), stat.S_IFCHR | 0o600,
                    os.makedev(0, 0)) == errno.EEXIST
    assert read_bytes(u.path("d", "lower")) == b"l"
    assert not os.path.lexists(u.path("new"))
    assert sorted(os.listdir(u.path("d"))) == ["lower"]
    # nothing reached the upper layer: no whiteout, not even the parent
    assert snapshot_upper(u.upper) == {}
    # other devices are fine
    os.mknod(u.path("d", "null"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
    assert os.stat(u.path("d", "null")).st_rdev == os.makedev(1, 3)


# ---------------------------------------------------------------- chown

@pytest.mark.parametrize("where", ["upper", "lower"])
def test_chown_to_the_same_owner_updates_ctime(union, where):
    spec = {"f": "data", "d/x": "x"}
    u = union.make(lowers=[spec if where == "lower" else {}],
                   upper=spec if where == "upper" else None)
    for name in ("f", "d"):
        before = os.lstat(u.path(name))
        time.sleep(0.05)
        os.chown(u.path(name), -1, -1)
        after = os.lstat(u.path(name))
        assert after.st_ctime_ns > before.st_ctime_ns, name
        assert (after.st_uid, after.st_gid) == (before.st_uid, before.st_gid)
        assert after.st_ctime_ns == os.lstat(u.upath(name)).st_ctime_ns


# ---------------------------------------------------------------- read-only

def test_read_only_mount_says_so(union):
    u = union.make(lowers=[{"f": ("file", "x", {"mode": 0o666}), "d": ("dir",)}, {}],
                   readonly=True)
    assert os.statvfs(u.mnt).f_flag & os.ST_RDONLY
    assert not os.access(u.path("f"), os.W_OK)
    assert not os.access(u.path("d"), os.W_OK)
    assert os.access(u.path("f"), os.R_OK)
    assert errno_of(os.open, u.path("f"), os.O_WRONLY) == errno.EROFS
    assert errno_of(os.mkdir, u.path("new")) == errno.EROFS


def test_writable_mount_is_not_read_only(union):
    u = union.make(lowers=[{"f": "x"}])
    assert not os.statvfs(u.mnt).f_flag & os.ST_RDONLY
    assert os.access(u.path("f"), os.W_OK)


# ---------------------------------------------------------------- nlink

def test_fstat_of_an_unlinked_lower_file(union):
    u = union.make(lowers=[{"f": "lower data"}], upper={"g": "upper data"})
    fd = os.open(u.path("f"), os.O_RDONLY)
    gfd = os.open(u.path("g"), os.O_RDONLY)
    try:
        os.unlink(u.path("f"))
        os.unlink(u.path("g"))
        # the lower file is still there below the whiteout: one name
        assert os.fstat(fd).st_nlink == 1
        assert os.pread(fd, 100, 0) == b"lower data"
        # the upper file has none left
        assert os.fstat(gfd).st_nlink == 0
        assert os.pread(gfd, 100, 0) == b"upper data"
    finally:
        os.close(fd)
        os.close(gfd)


# ---------------------------------------------------------------- xattrs

def test_overlay_xattr_names_are_escaped(union):
    u = union.make(lowers=[{"f": "x", "d/y": "y"}])
    os.setxattr(u.path("f"), "trusted.overlay.x", b"v1")
    os.setxattr(u.path("d"), "trusted.overlay.opaque", b"y")
    assert os.getxattr(u.path("f"), "trusted.overlay.x") == b"v1"
    assert "trusted.overlay.x" in os.listxattr(u.path("f"))
    # stored escaped: the directory is not made opaque by it
    assert os.getxattr(u.upath("f"), "trusted.overlay.overlay.x") == b"v1"
    assert os.getxattr(u.upath("d"), "trusted.overlay.overlay.opaque") == b"y"
    assert sorted(os.listdir(u.path("d"))) == ["y"]
    assert "trusted.overlay.opaque" in os.listxattr(u.path("d"))
    u.remount()
    assert sorted(os.listdir(u.path("d"))) == ["y"]
    assert os.getxattr(u.path("f"), "trusted.overlay.x") == b"v1"
    os.removexattr(u.path("f"), "trusted.overlay.x")
    assert errno_of(os.getxattr, u.path("f"), "trusted.overlay.x") == errno.ENODATA
    assert "trusted.overlay.x" not in os.listxattr(u.path("f"))


def test_real_overlay_markers_stay_hidden(union):
    u = union.make(lowers=[{"d/x": "x"}], upper={"d": ("opaque_dir",)})
    assert os.listdir(u.path("d")) == []
    assert not [n for n in os.listxattr(u.path("d")) if "overlay" in n]
    assert errno_of(os.getxattr, u.path("d"),
                    "trusted.overlay.opaque") == errno.ENODATA


def test_trusted_xattrs_listed_to_root_only(union):
    u = union.make(lowers=[{"f": ("file", "x", {"mode": 0o644,
                                                "xattrs": {"trusted.t": "1",
                                                           "user.u": "2"}})}])
    os.chmod(u.base, 0o755)
    assert {"trusted.t", "user.u"} <= set(os.listxattr(u.path("f")))
    r, w = os.pipe()

    def listing(dfd):
        fd = os.open("mnt/f", os.O_RDONLY, dir_fd=dfd)
        try:
            os.write(w, "\n".join(sorted(os.listxattr(fd))).encode())
        finally:
            os.close(fd)
    try:
        assert run_as(OTHER_UID, OTHER_UID, u.base, listing) == 0
        os.close(w)
        w = None
        assert os.read(r, 4096).decode().split("\n") == ["user.u"]
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


# ---------------------------------------------------------------- flags

def _getflags(path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("I", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
    finally:
        os.close(fd)


def _setflags(path, flags):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("I", flags))
    finally:
        os.close(fd)


def test_file_flags_are_the_real_files(union):
    u = union.make(lowers=[{"low": "l", "dl/x": "x"}], upper={"up": "u", "du": ("dir",)})
    flags = _getflags(u.lpath(0, "low"))
    _setflags(u.lpath(0, "low"), flags | FS_NODUMP_FL)
    assert _getflags(u.path("low")) & FS_NODUMP_FL
    for name in ("up", "du", "low", "dl"):
        f = _getflags(u.path(name))
        _setflags(u.path(name), f | FS_NOATIME_FL)
        assert _getflags(u.path(name)) & FS_NOATIME_FL, name
        assert _getflags(u.upath(name)) & FS_NOATIME_FL, name
    # setting copied the lower ones up, with their data
    assert read_bytes(u.upath("low")) == b"l"
    assert not _getflags(u.lpath(0, "low")) & FS_NOATIME_FL
    _setflags(u.path("up"), _getflags(u.path("up")) & ~FS_NOATIME_FL)
    assert not _getflags(u.upath("up")) & FS_NOATIME_FL


# ---------------------------------------------------------------- st_blocks

def assert_blocks_follow(through_mount, upath):
    """st_blocks through the mount is the upper file's. The upper's
    filesystem may allocate (writeback: extent tree blocks) between the
    two looks, so the look through the mount is taken between two looks
    at the upper file: equal when those agree, else between them."""
    for _ in range(3):
        a = os.stat(upath).st_blocks
        m = through_mount().st_blocks
        b = os.stat(upath).st_blocks
        if a == b:
            assert m == a, (m, a)
            return
    assert a <= m <= b, (a, m, b)


def test_st_blocks_follow_the_upper_file(union):
    """A fragmented file's extent tree is allocated when it is written
    back: st_blocks grows after the writes, and must show it."""
    u = union.make(lowers=[{}], upper={"f": ""})
    fd = os.open(u.path("f"), os.O_WRONLY)
    upath = u.upath("f")
    try:
        for i in range(2000):
            os.pwrite(fd, b"x" * 4096, i * 8192)
        assert_blocks_follow(lambda: os.fstat(fd), upath)
        os.fsync(fd)
        assert_blocks_follow(lambda: os.fstat(fd), upath)
        assert_blocks_follow(lambda: os.stat(u.path("f")), upath)
        os.ftruncate(fd, 4096)
        assert_blocks_follow(lambda: os.stat(u.path("f")), upath)
        os.posix_fallocate(fd, 0, 1 << 20)
        assert_blocks_follow(lambda: os.stat(u.path("f")), upath)
    finally:
        os.close(fd)
    os.sync()
    assert_blocks_follow(lambda: os.stat(u.path("f")), upath)


# ---------------------------------------------------------------- other users

def test_other_users_get_in_by_mode_bits(union):
    u = union.make(lowers=[{"pub": ("file", "public", {"mode": 0o644}),
                            "priv": ("file", "private", {"mode": 0o600}),
                            "d": ("dir", {"mode": 0o777})}])
    os.chmod(u.base, 0o755)
    os.chmod(u.mnt, 0o755)

    def read(name):
        def fn(dfd):
            fd = os.open(os.path.join("mnt", name), os.O_RDONLY, dir_fd=dfd)
            os.close(fd)
        return fn

    def create(dfd):
        fd = os.open("mnt/d/new", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd)
        os.close(fd)

    assert run_as(OTHER_UID, OTHER_UID, u.base, read("pub")) == 0
    assert run_as(OTHER_UID, OTHER_UID, u.base, read("priv")) == errno.EACCES
    assert run_as(OTHER_UID, OTHER_UID, u.base, create) == 0
    assert os.stat(u.path("d", "new")).st_uid == OTHER_UID


def test_noallow_other_keeps_other_users_out(stratafs_only):
    u = stratafs_only.make(lowers=[{"pub": ("file", "public", {"mode": 0o644})}],
                           extra_opts=["noallow_other"])
    os.chmod(u.base, 0o755)

    def read(dfd):
        os.close(os.open("mnt/pub", os.O_RDONLY, dir_fd=dfd))
    assert run_as(OTHER_UID, OTHER_UID, u.base, read) == errno.EACCES
    assert read_bytes(u.path("pub")) == b"public"


@pytest.mark.parametrize("where", ["lower", "upper", "beside-a-writer"])
def test_append_cleared_by_fcntl_writes_at_the_offset(union, where):
    """O_APPEND is the kernel's to apply: cleared with fcntl(F_SETFL), a
    pwrite at 0 writes at 0, as on the kernel's overlayfs (which passes
    the change on to the real file). stratafs opened the real file with
    O_APPEND, so it appended; that also made a WRITE sent again after a
    worker's death append its bytes twice.

    beside-a-writer: another handle is open on the file (with passthrough,
    the daemon's default, the kernel writes through it without the
    daemon) when the O_APPEND one opens. The O_APPEND handle joined that
    passthrough and the kernel's backing file kept O_APPEND past the
    F_SETFL. A RELEASE is sent after close(2) returns, so a handle just
    closed can still be open for the daemon: the upper case met this at
    random in CI."""
    u = union.make([{"f": "abcdef"} if where == "lower" else {}])
    if where != "lower":
        with open(u.path("f"), "w") as f:
            f.write("abcdef")
    other = (os.open(u.path("f"), os.O_RDWR) if where == "beside-a-writer"
             else -1)
    fd = os.open(u.path("f"), os.O_RDWR | os.O_APPEND)
    expect = b"XYcdefGHZ" if other >= 0 else b"XbcdefGHZ"
    try:
        os.write(fd, b"GH")
        os.pwrite(fd, b"Z", 0)      # O_APPEND: at the end, whatever the offset
        fcntl.fcntl(fd, fcntl.F_SETFL, 0)
        os.pwrite(fd, b"X", 0)
        if other >= 0:
            # the first handle still writes where it is told
            os.pwrite(other, b"Y", 1)
            assert os.pread(other, 16, 0) == expect
        # and the appending handle maps what both wrote
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            assert m[:] == expect
    finally:
        os.close(fd)
        if other >= 0:
            os.close(other)
    assert read_bytes(u.path("f")) == expect
