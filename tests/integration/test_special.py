# SPDX-License-Identifier: Apache-2.0
"""Special files, name and path limits, open-file semantics."""

import errno
import os
import socket
import stat
import threading

import pytest

from stratatest import errno_of, is_whiteout, read_bytes, snapshot_upper


# ---------------------------------------------------------------- symlinks

def test_symlinks(union):
    u = union.make(lowers=[{"f": "file", "rel": ("symlink", "f"),
                            "abs": ("symlink", "/nonexistent/abs/target"),
                            "dangling": ("symlink", "nothing"),
                            "dirlink": ("symlink", "d"), "d/x": "x"}])
    assert os.readlink(u.path("rel")) == "f"
    assert os.readlink(u.path("abs")) == "/nonexistent/abs/target"
    st = os.lstat(u.path("abs"))
    assert stat.S_ISLNK(st.st_mode) and st.st_size == len("/nonexistent/abs/target")
    assert read_bytes(u.path("rel")) == b"file"
    assert stat.S_ISREG(os.stat(u.path("rel")).st_mode)
    assert errno_of(os.stat, u.path("dangling")) == errno.ENOENT
    assert os.listdir(u.path("dirlink")) == ["x"]
    os.symlink("d/x", u.path("new"))
    assert os.readlink(u.path("new")) == "d/x"
    assert read_bytes(u.path("new")) == b"x"
    assert os.lstat(u.path("new")).st_size == 3
    assert errno_of(os.symlink, "y", u.path("f")) == errno.EEXIST
    assert errno_of(os.readlink, u.path("f")) == errno.EINVAL
    u.remount()
    assert os.readlink(u.path("new")) == "d/x"
    # reading through links never copies them up
    assert sorted(snapshot_upper(u.upper)) == ["new"]


def test_symlink_copy_up_by_lchown(union):
    u = union.make(lowers=[{"l": ("symlink", "target/x", {"uid": 10, "gid": 20})}])
    os.chown(u.path("l"), 30, 40, follow_symlinks=False)
    st = os.lstat(u.path("l"))
    assert (st.st_uid, st.st_gid) == (30, 40)
    assert snapshot_upper(u.upper) == {"l": ("symlink", "target/x")}
    ust = os.lstat(u.upath("l"))
    assert (ust.st_uid, ust.st_gid) == (30, 40)
    assert os.lstat(u.lpath(0, "l")).st_uid == 10
    u.remount()
    assert os.readlink(u.path("l")) == "target/x"


# ---------------------------------------------------------------- fifos

def _pipe_through(path, payload=b"through the fifo"):
    got = []

    def reader():
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = b""
            while True:
                b = os.read(fd, 4096)
                if not b:
                    break
                buf += b
            got.append(buf)
        finally:
            os.close(fd)
    t = threading.Thread(target=reader)
    t.start()
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    t.join(10)
    assert not t.is_alive()
    assert got == [payload]


def test_fifos(union):
    u = union.make(lowers=[{"lowfifo": ("fifo",)}])
    assert stat.S_ISFIFO(os.lstat(u.path("lowfifo")).st_mode)
    _pipe_through(u.path("lowfifo"))
    # using a fifo is not a modification: no copy-up
    assert snapshot_upper(u.upper) == {}
    os.mkfifo(u.path("newfifo"), 0o640)
    st = os.lstat(u.path("newfifo"))
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 & ~mask
    _pipe_through(u.path("newfifo"))
    assert snapshot_upper(u.upper) == {"newfifo": ("fifo",)}


def test_fifo_copy_up_by_chmod(union):
    u = union.make(lowers=[{"p": ("fifo", {"mode": 0o644})}])
    os.chmod(u.path("p"), 0o600)
    assert stat.S_IMODE(os.lstat(u.path("p")).st_mode) == 0o600
    assert snapshot_upper(u.upper) == {"p": ("fifo",)}
    assert stat.S_IMODE(os.lstat(u.upath("p")).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(u.lpath(0, "p")).st_mode) == 0o644
    _pipe_through(u.path("p"))


# ---------------------------------------------------------------- sockets

def test_unix_socket_bind_inside_mount(union):
    u = union.make(lowers=[{"d/x": "x"}])
    dfd = os.open(u.path("d"), os.O_RDONLY | os.O_DIRECTORY)
    # sun_path is limited to 108 bytes; go through /proc/self/fd
    addr = f"/proc/self/fd/{dfd}/sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(addr)
        srv.listen(1)
        assert stat.S_ISSOCK(os.lstat(u.path("d", "sock")).st_mode)
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        cli.settimeout(10)
        srv.settimeout(10)
        cli.connect(addr)
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.sendall(b"pong")
        assert cli.recv(4) == b"pong"
        conn.close()
        cli.close()
    finally:
        srv.close()
        os.close(dfd)
    assert stat.S_ISSOCK(os.lstat(u.path("d", "sock")).st_mode)
    assert snapshot_upper(u.upper)["d/sock"] == ("sock",)
    os.unlink(u.path("d", "sock"))
    assert os.listdir(u.path("d")) == ["x"]


def test_lower_socket_file(union):
    u = union.make(lowers=[{"s": ("socket",)}])
    assert stat.S_ISSOCK(os.lstat(u.path("s")).st_mode)
    dfd = os.open(u.mnt, os.O_RDONLY | os.O_DIRECTORY)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert errno_of(c.connect, f"/proc/self/fd/{dfd}/s") == errno.ECONNREFUSED
    finally:
        c.close()
        os.close(dfd)
    os.chown(u.path("s"), 5, 6)
    assert snapshot_upper(u.upper) == {"s": ("sock",)}


# ---------------------------------------------------------------- devices

def test_device_nodes(union):
    u = union.make(lowers=[{"lnull": ("chardev", 1, 3, {"mode": 0o666})}])
    st = os.lstat(u.path("lnull"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    os.mknod(u.path("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    st = os.lstat(u.path("null"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    up = os.lstat(u.upath("null"))
    assert stat.S_ISCHR(up.st_mode) and up.st_rdev == os.makedev(1, 3)
    assert not is_whiteout(up)
    # copy-up of a device node by chmod
    os.chmod(u.path("lnull"), 0o600)
    assert snapshot_upper(u.upper) == {"lnull": ("chr", 1, 3), "null": ("chr", 1, 3)}
    assert stat.S_IMODE(os.lstat(u.path("lnull")).st_mode) == 0o600
    u.remount()
    assert os.lstat(u.path("null")).st_rdev == os.makedev(1, 3)
    assert os.lstat(u.path("lnull")).st_rdev == os.makedev(1, 3)


def test_device_nodes_are_usable(union):
    # kernel overlayfs (mounted by root without nodev) lets device nodes be
    # opened; a FUSE mount must not be nodev for this (libfuse adds nodev
    # by default)
    u = union.make(lowers=[{"lnull": ("chardev", 1, 3, {"mode": 0o666})}])
    os.mknod(u.path("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    for p in ("null", "lnull"):
        with open(u.path(p), "r+b", buffering=0) as f:
            assert f.write(b"discarded") == 9
            assert f.read() == b""


# ---------------------------------------------------------------- names

def test_name_max(union):
    n255, n256 = "n" * 255, "m" * 256
    u = union.make(lowers=[{"l" * 255: "lower long", "d/x": ""}])
    assert read_bytes(u.path("l" * 255)) == b"lower long"
    with open(u.path(n255), "w") as f:
        f.write("ok")
    os.mkdir(u.path("d", n255))
    os.symlink(n255, u.path("d", "s" * 255))
    assert read_bytes(u.path(n255)) == b"ok"
    assert sorted(os.listdir(u.mnt)) == sorted(["d", "l" * 255, n255])
    for fn in (lambda: os.open(u.path(n256), os.O_CREAT | os.O_WRONLY, 0o644),
               lambda: os.mkdir(u.path(n256)),
               lambda: os.stat(u.path(n256)),
               lambda: os.symlink("x", u.path(n256)),
               lambda: os.rename(u.path(n255), u.path(n256)),
               lambda: os.link(u.path(n255), u.path(n256))):
        assert errno_of(fn) == errno.ENAMETOOLONG
    os.unlink(u.path("l" * 255))   # a whiteout with a 255-byte name
    assert is_whiteout(os.lstat(u.upath("l" * 255)))
    u.remount()
    assert sorted(os.listdir(u.mnt)) == sorted(["d", n255])


# ---------------------------------------------------------------- deep paths

NAME = "deep_" + "x" * 195   # 200 bytes
DEPTH = 24                   # 24 * 201 > 4096


def _open_chain(root, depth, create=False):
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            if create:
                try:
                    os.mkdir(NAME, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            nfd = os.open(NAME, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def test_path_longer_than_path_max_created_through_mount(union):
    u = union.make(lowers=[{"x": ""}])
    fd = _open_chain(u.mnt, DEPTH, create=True)
    try:
        wfd = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(wfd, b"deep data")
        os.close(wfd)
    finally:
        os.close(fd)
    assert len(os.path.join(u.mnt, *[NAME] * DEPTH)) > 4096
    u.remount()
    for root in (u.mnt, u.upper):
        fd = _open_chain(root, DEPTH)
        try:
            assert os.listdir(fd) == ["leaf"]
            rfd = os.open("leaf", os.O_RDONLY, dir_fd=fd)
            assert os.read(rfd, 100) == b"deep data"
            os.close(rfd)
        finally:
            os.close(fd)


def test_path_longer_than_path_max_in_lower(union):
    u = union.make(lowers=[{"x": ""}], mount=False)
    fd = _open_chain(u.lowers[0], DEPTH, create=True)
    for name in ("leaf", "gone"):
        wfd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(wfd, b"lower deep")
        os.close(wfd)
    os.close(fd)
    u.mount()
    fd = _open_chain(u.mnt, DEPTH)
    try:
        assert sorted(os.listdir(fd)) == ["gone", "leaf"]
        wfd = os.open("leaf", os.O_WRONLY | os.O_APPEND, dir_fd=fd)  # copy-up
        os.write(wfd, b"+more")
        os.close(wfd)
        os.unlink("gone", dir_fd=fd)                                  # whiteout
        assert os.listdir(fd) == ["leaf"]
    finally:
        os.close(fd)
    u.remount()
    fd = _open_chain(u.mnt, DEPTH)
    try:
        assert os.listdir(fd) == ["leaf"]
        rfd = os.open("leaf", os.O_RDONLY, dir_fd=fd)
        assert os.read(rfd, 100) == b"lower deep+more"
        os.close(rfd)
    finally:
        os.close(fd)
    fd = _open_chain(u.upper, DEPTH)
    try:
        assert is_whiteout(os.lstat("gone", dir_fd=fd))
        rfd = os.open("leaf", os.O_RDONLY, dir_fd=fd)
        assert os.read(rfd, 100) == b"lower deep+more"
        os.close(rfd)
    finally:
        os.close(fd)
    fd = _open_chain(u.lowers[0], DEPTH)
    try:
        rfd = os.open("leaf", os.O_RDONLY, dir_fd=fd)
        assert os.read(rfd, 100) == b"lower deep"
        os.close(rfd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- open files

@pytest.mark.parametrize("origin", ["upper", "lower"])
def test_unlinked_open_file_stays_usable(union, origin):
    u = union.make(lowers=[{"f": "lower data"}] if origin == "lower" else [{"x": ""}])
    if origin == "upper":
        write = os.open(u.path("f"), os.O_CREAT | os.O_RDWR, 0o644)
        os.write(write, b"lower data")
        fd = write
    else:
        fd = os.open(u.path("f"), os.O_RDWR)     # copy-up
    try:
        os.unlink(u.path("f"))
        assert errno_of(os.stat, u.path("f")) == errno.ENOENT
        st = os.fstat(fd)
        assert st.st_nlink == 0
        assert st.st_size == 10
        assert os.pread(fd, 100, 0) == b"lower data"
        os.pwrite(fd, b"+appended", 10)
        assert os.pread(fd, 100, 0) == b"lower data+appended"
        assert os.fstat(fd).st_size == 19
        os.ftruncate(fd, 5)
        assert os.pread(fd, 100, 0) == b"lower"
        os.fsync(fd)
    finally:
        os.close(fd)
    assert errno_of(os.stat, u.path("f")) == errno.ENOENT
    assert os.listdir(u.mnt) == ([] if origin == "lower" else ["x"])


def test_unlinked_read_only_lower_file_stays_readable(union):
    u = union.make(lowers=[{"f": "lower data"}])
    fd = os.open(u.path("f"), os.O_RDONLY)
    try:
        os.unlink(u.path("f"))
        assert os.pread(fd, 100, 0) == b"lower data"
        # kernel reports the (still linked) lower file's nlink here: 1
        os.fstat(fd)
    finally:
        os.close(fd)


def test_read_only_fd_sees_data_written_after_copy_up(union):
    size = 1 << 20
    data = bytes(i % 251 for i in range(size))
    u = union.make(lowers=[{"f": data}])
    rfd = os.open(u.path("f"), os.O_RDONLY)
    try:
        assert os.pread(rfd, 4096, 0) == data[:4096]          # cached page
        wfd = os.open(u.path("f"), os.O_WRONLY)                # copy-up
        try:
            os.pwrite(wfd, b"NEW0", 0)
            os.pwrite(wfd, b"NEW1", size // 2)                 # never read yet
            os.pwrite(wfd, b"TAIL", size)                      # extends
        finally:
            os.close(wfd)
        assert os.pread(rfd, 4, 0) == b"NEW0"
        assert os.pread(rfd, 4, size // 2) == b"NEW1"
        assert os.pread(rfd, 8, size - 4) == data[-4:] + b"TAIL"
        assert os.fstat(rfd).st_size == size + 4
    finally:
        os.close(rfd)
    assert read_bytes(u.lpath(0, "f")) == data


def test_read_only_fd_sees_truncate_after_copy_up(union):
    u = union.make(lowers=[{"f": "0123456789"}])
    rfd = os.open(u.path("f"), os.O_RDONLY)
    try:
        assert os.read(rfd, 3) == b"012"
        os.truncate(u.path("f"), 4)
        assert os.pread(rfd, 100, 0) == b"0123"
        assert os.fstat(rfd).st_size == 4
    finally:
        os.close(rfd)


@pytest.mark.parametrize("src", ["lower", "renamed_lower", "upper"])
def test_hardlinked_symlink_after_first_name_is_gone(union, src):
    # a symlink cannot be opened, so an implementation that reaches it by
    # its first path breaks once that name is unlinked (found by the
    # differential test, seed 773 with STRATA_OPS=250, old op mix)
    u = union.make(lowers=[{"s/l": ("symlink", "target"), "c/x/keep": "k"}])
    first = u.path("s", "l")
    if src == "renamed_lower":
        os.rename(first, u.path("s", "moved"))
        first = u.path("s", "moved")
    elif src == "upper":
        first = u.path("s", "new")
        os.symlink("target", first)
    second = u.path("c", "x", "l2")
    os.link(first, second, follow_symlinks=False)
    os.unlink(first)
    t = 1500659929604901417
    assert os.readlink(second) == "target"
    os.utime(second, ns=(t, t), follow_symlinks=False)
    os.chown(second, 12, 34, follow_symlinks=False)
    os.setxattr(second, "trusted.sym", b"1", follow_symlinks=False)
    st = os.lstat(second)
    assert stat.S_ISLNK(st.st_mode)
    assert (st.st_mtime_ns, st.st_uid, st.st_gid) == (t, 12, 34)
    assert os.getxattr(second, "trusted.sym", follow_symlinks=False) == b"1"
    os.rename(u.path("c", "x"), u.path("c", "y"))
    moved = u.path("c", "y", "l2")
    os.utime(moved, ns=(t + 1, t + 1), follow_symlinks=False)
    assert os.lstat(moved).st_mtime_ns == t + 1
    u.remount()
    st = os.lstat(moved)
    assert (st.st_mtime_ns, st.st_uid, st.st_gid) == (t + 1, 12, 34)
    assert os.readlink(moved) == "target"
