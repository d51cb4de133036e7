# SPDX-License-Identifier: Apache-2.0
"""Copy-up: what triggers it, what it preserves, what it must not touch."""

import errno
import fcntl
import hashlib
import mmap
import os
import random
import stat
import struct
import subprocess

import pytest

from stratatest import (read_bytes, sha256, snapshot_tree, snapshot_upper)

LOWER_MTIME = 1000000000.123456  # 2001-09-09


def lower_file(**extra):
    opts = {"mode": 0o640, "uid": 1234, "gid": 5678, "mtime": LOWER_MTIME,
            "xattrs": {"user.keep": "kept", "trusted.other": "t"}}
    opts.update(extra)
    return ("file", b"lower content\n", opts)


def lower_snap(u):
    return [snapshot_tree(l, mtime=True, dir_mtime=True, ctime=True) for l in u.lowers]


def _open_close(flags):
    def f(p):
        os.close(os.open(p, flags))
    return f


def _link(p):
    os.link(p, p + ".link")


TRIGGERS = {
    "open_wronly": _open_close(os.O_WRONLY),
    "open_rdwr": _open_close(os.O_RDWR),
    "open_append": _open_close(os.O_WRONLY | os.O_APPEND),
    "truncate": lambda p: os.truncate(p, 5),
    "chmod": lambda p: os.chmod(p, 0o604),
    "chown": lambda p: os.chown(p, 4321, 8765),
    "utime": lambda p: os.utime(p, (1500000000, 1500000000)),
    "setxattr": lambda p: os.setxattr(p, "user.new", b"v"),
    "removexattr": lambda p: os.removexattr(p, "user.keep"),
    "link": _link,
}


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_copy_up_trigger(union, trigger):
    u = union.make(lowers=[{"dir/f": lower_file(), "dir/other": "o"}])
    before = lower_snap(u)
    merged_before = snapshot_tree(u.path("dir"), mtime=True)["f"]
    assert snapshot_upper(u.upper) == {}
    TRIGGERS[trigger](u.path("dir", "f"))
    up = snapshot_upper(u.upper)
    assert up.get("dir", (None,))[0] == "dir", up
    assert up.get("dir/f", (None,))[0] == "file", f"{trigger} did not copy up: {up}"
    assert "dir/other" not in up
    # lower layer untouched (content, metadata, even ctime)
    assert lower_snap(u) == before
    # the merged view shows the change and otherwise the old file
    now = snapshot_tree(u.path("dir"), mtime=True)["f"]
    expect = dict(merged_before)
    if trigger == "truncate":
        expect["size"] = 5
        expect["sha256"] = sha256(b"lower")
        expect["mtime_ns"] = now["mtime_ns"]  # truncate sets mtime to now
    elif trigger == "chmod":
        expect["mode"] = oct(0o604)
    elif trigger == "chown":
        expect["uid"], expect["gid"] = 4321, 8765
    elif trigger == "utime":
        expect["mtime_ns"] = 1500000000 * 10**9
    elif trigger == "setxattr":
        expect["xattrs"] = dict(expect["xattrs"], **{"user.new": b"v".hex()})
    elif trigger == "removexattr":
        expect["xattrs"] = {k: v for k, v in expect["xattrs"].items() if k != "user.keep"}
    assert now == expect
    if trigger == "link":
        assert up.get("dir/f.link", (None,))[0] == "file"
        assert os.stat(u.upath("dir", "f")).st_ino == os.stat(u.upath("dir", "f.link")).st_ino
    u.remount()
    assert snapshot_tree(u.path("dir"), mtime=True)["f"] == now


def test_read_only_access_never_copies_up(union):
    u = union.make(lowers=[{"d/f": lower_file(), "d/l": ("symlink", "f"),
                            "d/sub/g": "g", "top": "t"}])
    before = lower_snap(u)
    p = u.path("d", "f")
    with open(p, "rb") as fh:
        assert fh.read() == b"lower content\n"
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fstat(fd)
        os.pread(fd, 4, 2)
        fcntl.flock(fd, fcntl.LOCK_SH)
        fcntl.flock(fd, fcntl.LOCK_UN)
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            assert m[:5] == b"lower"
    finally:
        os.close(fd)
    os.stat(p)
    os.lstat(u.path("d", "l"))
    os.readlink(u.path("d", "l"))
    os.listxattr(p)
    os.getxattr(p, "user.keep")
    assert os.access(p, os.W_OK)
    os.listdir(u.path("d"))
    os.listdir(u.path("d", "sub"))
    dfd = os.open(u.path("d"), os.O_RDONLY | os.O_DIRECTORY)
    os.close(dfd)
    snapshot_tree(u.mnt)
    assert snapshot_upper(u.upper) == {}
    assert os.listdir(u.upper) == []
    assert lower_snap(u) == before


def test_copy_up_preserves_metadata(union):
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # v2, effective, CAP_NET_RAW
    u = union.make(lowers=[{"f": ("file", b"payload",
                                  {"mode": 0o6751, "uid": 1234, "gid": 5678,
                                   "mtime": LOWER_MTIME,
                                   "xattrs": {"user.a": "1", "user.b": b"\x00\x01bin",
                                              "trusted.t": "t",
                                              "security.capability": cap}})}])
    # ACL: setfacl keeps the other bits; it rewrites the group bits as mask
    subprocess.run(["setfacl", "-m", "u:4242:rwx", u.lpath(0, "f")], check=True)
    lower = snapshot_tree(u.lowers[0], mtime=True)["f"]
    assert "system.posix_acl_access" in lower["xattrs"]
    assert lower["xattrs"]["security.capability"] == cap.hex()
    # trigger copy-up without touching data or caps: open O_RDWR, no write
    os.close(os.open(u.path("f"), os.O_RDWR))
    assert snapshot_upper(u.upper)["f"][0] == "file"
    merged = snapshot_tree(u.mnt, mtime=True)["f"]
    upper = snapshot_tree(u.upper, mtime=True)["f"]
    assert merged == lower
    upper["xattrs"] = {k: v for k, v in upper["xattrs"].items()
                       if not k.startswith("trusted.overlay.")}
    assert upper == lower
    acl = subprocess.run(["getfacl", "-n", "--omit-header", u.path("f")], check=True,
                         capture_output=True, text=True).stdout
    assert "user:4242:rwx" in acl
    assert os.getxattr(u.path("f"), "security.capability") == cap


def test_copy_up_keeps_mtime_and_atime_of_file(union):
    u = union.make(lowers=[{"f": ("file", "x", {"mtime": LOWER_MTIME})}])
    st0 = os.stat(u.lpath(0, "f"))
    os.close(os.open(u.path("f"), os.O_WRONLY))
    st = os.stat(u.path("f"))
    assert st.st_mtime_ns == st0.st_mtime_ns
    assert os.stat(u.upath("f")).st_mtime_ns == st0.st_mtime_ns


def test_copy_up_of_sparse_file_keeps_holes(union):
    size = 16 << 20
    u = union.make(lowers=[{"sparse": ("sparse", size, {0: b"A" * 4096,
                                                        8 << 20: b"B" * 4096})}])
    lower_sha = sha256(read_bytes(u.lpath(0, "sparse")))
    fd = os.open(u.path("sparse"), os.O_RDWR)
    try:
        os.pwrite(fd, b"C", 100)
    finally:
        os.close(fd)
    st_up = os.stat(u.upath("sparse"))
    assert st_up.st_size == size
    # kernel overlayfs copies data in 1 MiB chunks and skips holes; a full
    # copy would allocate 16 MiB
    assert st_up.st_blocks * 512 < 4 << 20, f"upper allocates {st_up.st_blocks * 512} bytes"
    assert os.stat(u.path("sparse")).st_blocks * 512 < 4 << 20
    fd = os.open(u.upath("sparse"), os.O_RDONLY)
    try:
        assert os.lseek(fd, 2 << 20, os.SEEK_DATA) >= 4 << 20
    finally:
        os.close(fd)
    data = read_bytes(u.path("sparse"))
    expect = bytearray(size)
    expect[0:4096] = b"A" * 4096
    expect[100] = ord("C")
    expect[8 << 20:(8 << 20) + 4096] = b"B" * 4096
    assert data == bytes(expect)
    assert sha256(read_bytes(u.lpath(0, "sparse"))) == lower_sha


def test_seek_data_and_hole_through_mount(union):
    size = 16 << 20
    u = union.make(lowers=[{"sparse": ("sparse", size, {8 << 20: b"B" * 4096})}],
                   upper={"up": ("sparse", size, {8 << 20: b"B" * 4096})})
    for p in (u.path("sparse"), u.path("up")):
        fd = os.open(p, os.O_RDONLY)
        try:
            assert os.lseek(fd, 0, os.SEEK_DATA) >= 4 << 20, p
            assert os.lseek(fd, 0, os.SEEK_HOLE) == 0, p
            assert os.lseek(fd, (8 << 20) + 4096 + (1 << 20), os.SEEK_HOLE) < size, p
        finally:
            os.close(fd)


@pytest.mark.timeout(120)
def test_copy_up_of_large_file(union):
    data = random.Random(64).randbytes(64 << 20)
    u = union.make(lowers=[{"big": data}])
    fd = os.open(u.path("big"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"tail")
    finally:
        os.close(fd)
    h = hashlib.sha256(data)
    h.update(b"tail")
    assert os.stat(u.path("big")).st_size == len(data) + 4
    assert sha256(read_bytes(u.path("big"))) == h.hexdigest()
    assert sha256(read_bytes(u.upath("big"))) == h.hexdigest()
    assert sha256(read_bytes(u.lpath(0, "big"))) == sha256(data)
    u.remount()
    assert sha256(read_bytes(u.path("big"))) == h.hexdigest()


def test_copy_up_copies_parent_dirs_with_metadata(union):
    dmeta = lambda mode, uid, gid, x: ("dir", {"mode": mode, "uid": uid, "gid": gid,  # noqa: E731
                                               "mtime": LOWER_MTIME,
                                               "xattrs": {"user.dir": x}})
    u = union.make(lowers=[{"a": dmeta(0o750, 11, 22, "a"),
                            "a/b": dmeta(0o711, 33, 44, "b"),
                            "a/b/c": dmeta(0o1777, 55, 66, "c"),
                            "a/b/c/f": "data", "a/b/c/g": "g", "a/side": "s"}])
    subprocess.run(["setfacl", "-d", "-m", "u:99:rx", u.lpath(0, "a", "b")], check=True)
    os.utime(u.lpath(0, "a", "b"), (LOWER_MTIME, LOWER_MTIME))
    lower = snapshot_tree(u.lowers[0], mtime=True, dir_mtime=True)
    os.chmod(u.path("a", "b", "c", "f"), 0o600)
    up = snapshot_tree(u.upper, mtime=True, dir_mtime=True)
    assert sorted(p for p in up if p != ".") == ["a", "a/b", "a/b/c", "a/b/c/f"]
    for d in ("a", "a/b", "a/b/c"):
        assert up[d] == lower[d], d
    merged = snapshot_tree(u.mnt, mtime=True, dir_mtime=True)
    for d in ("a", "a/b", "a/b/c"):
        assert merged[d] == lower[d], d


def test_copy_up_of_file_with_long_xattr_list(union):
    xattrs = {f"user.x{i:03d}": os.urandom(8).hex() * 2 for i in range(40)}
    u = union.make(lowers=[{"f": ("file", "x", {"xattrs": xattrs})}])
    os.chmod(u.path("f"), 0o600)
    names = sorted(n for n in os.listxattr(u.path("f")) if n.startswith("user."))
    assert names == sorted(xattrs)
    for k, v in xattrs.items():
        assert os.getxattr(u.path("f"), k) == v.encode()
        assert os.getxattr(u.upath("f"), k) == v.encode()


def test_copy_up_of_open_for_write_then_write(union):
    u = union.make(lowers=[{"f": "0123456789"}])
    fd = os.open(u.path("f"), os.O_RDWR)
    try:
        assert os.pread(fd, 10, 0) == b"0123456789"
        os.pwrite(fd, b"ab", 3)
        assert os.pread(fd, 10, 0) == b"012ab56789"
    finally:
        os.close(fd)
    assert read_bytes(u.path("f")) == b"012ab56789"
    assert read_bytes(u.lpath(0, "f")) == b"0123456789"


def test_write_to_file_from_deeper_lower(union):
    u = union.make(lowers=[{"x": "x"}, {"d/f": "deep"}, {"d/g": "deepest"}])
    with open(u.path("d", "g"), "a") as fh:
        fh.write("+")
    assert read_bytes(u.path("d", "g")) == b"deepest+"
    assert read_bytes(u.lpath(2, "d", "g")) == b"deepest"
    up = snapshot_upper(u.upper)
    assert sorted(up) == ["d", "d/g"]


def test_open_trunc_of_lower_file(union):
    u = union.make(lowers=[{"f": "long old content"}])
    fd = os.open(u.path("f"), os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert read_bytes(u.path("f")) == b"new"
    assert read_bytes(u.lpath(0, "f")) == b"long old content"


def test_mkdir_in_lower_dir_copies_up_parent(union):
    u = union.make(lowers=[{"p": ("dir", {"mode": 0o705, "uid": 7, "gid": 8})}])
    os.mkdir(u.path("p", "child"))
    st = os.stat(u.upath("p"))
    assert stat.S_IMODE(st.st_mode) == 0o705 and (st.st_uid, st.st_gid) == (7, 8)
    assert os.listdir(u.path("p")) == ["child"]


def test_create_file_gets_caller_owner_and_umask_mode(union):
    u = union.make(lowers=[{"d": ("dir", {"mode": 0o777})}])
    old = os.umask(0o027)
    try:
        fd = os.open(u.path("d", "n"), os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.mkdir(u.path("d", "m"), 0o777)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(u.path("d", "n")).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(u.path("d", "m")).st_mode) == 0o750
    st = os.stat(u.path("d", "n"))
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_setxattr_errors(union):
    u = union.make(lowers=[{"f": "x", "l": ("symlink", "f")}])
    with pytest.raises(OSError) as e:
        os.getxattr(u.path("f"), "user.missing")
    assert e.value.errno == errno.ENODATA
    with pytest.raises(OSError) as e:
        os.setxattr(u.path("f"), "user.x", b"1", os.XATTR_REPLACE)
    assert e.value.errno == errno.ENODATA
    os.setxattr(u.path("f"), "user.x", b"1", os.XATTR_CREATE)
    with pytest.raises(OSError) as e:
        os.setxattr(u.path("f"), "user.x", b"2", os.XATTR_CREATE)
    assert e.value.errno == errno.EEXIST
    # user.* xattrs are not permitted on symlinks
    with pytest.raises(OSError) as e:
        os.setxattr(u.path("l"), "user.x", b"1", follow_symlinks=False)
    assert e.value.errno == errno.EPERM
