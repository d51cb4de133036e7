# SPDX-License-Identifier: Apache-2.0
"""O_TMPFILE (issue 12): an unnamed file in the upper directory, as the
kernel's overlayfs makes it; linkat(2) names it; EROFS without an upper
layer."""

import ctypes
import ctypes.util
import errno
import os
import stat

from stratatest import errno_of, read_bytes, snapshot_upper


def tmpfile(d, flags=os.O_RDWR, mode=0o640):
    return os.open(d, os.O_TMPFILE | flags, mode)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000


def name_it(fd, path):
    """linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH), as a program that
    names its O_TMPFILE file does."""
    if _libc.linkat(fd, b"", AT_FDCWD, os.fsencode(path), AT_EMPTY_PATH):
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


def test_tmpfile_in_upper_and_lower_dirs(union):
    u = union.make(lowers=[{"low/x": "x"}], upper={"up": ("dir",)})
    for d in ("up", "low", ""):
        fd = tmpfile(u.path(d))
        try:
            os.write(fd, b"unnamed in " + d.encode())
            st = os.fstat(fd)
            assert stat.S_ISREG(st.st_mode) and st.st_nlink == 0
            assert stat.S_IMODE(st.st_mode) == 0o640
            assert os.pread(fd, 100, 0) == b"unnamed in " + d.encode()
            assert sorted(os.listdir(u.path(d))) == (["x"] if d == "low" else
                                                     ["low", "up"] if d == ""
                                                     else [])
            name_it(fd, u.path(d, "named"))
            assert os.fstat(fd).st_nlink == 1
            os.write(fd, b"+")
        finally:
            os.close(fd)
        assert read_bytes(u.path(d, "named")) == b"unnamed in " + d.encode() + b"+"
    # the lower directory was copied up to hold it
    assert "low/named" in snapshot_upper(u.upper)
    u.remount()
    assert read_bytes(u.path("low", "named")) == b"unnamed in low+"
    assert read_bytes(u.path("low", "x")) == b"x"


def test_tmpfile_write_only_and_gone_when_closed(union):
    u = union.make(lowers=[{"d/x": "x"}])
    fd = tmpfile(u.path("d"), os.O_WRONLY)
    try:
        os.write(fd, b"w")
        assert errno_of(os.pread, fd, 1, 0) == errno.EBADF
    finally:
        os.close(fd)
    assert os.listdir(u.path("d")) == ["x"]
    u.remount()
    assert os.listdir(u.path("d")) == ["x"]


def test_tmpfile_excl_cannot_be_named(union):
    u = union.make(lowers=[{"d/x": "x"}])
    fd = tmpfile(u.path("d"), os.O_RDWR | os.O_EXCL)
    try:
        assert errno_of(name_it, fd, u.path("d", "n")) == errno.ENOENT
    finally:
        os.close(fd)
    assert os.listdir(u.path("d")) == ["x"]


def test_tmpfile_read_only_mount(union):
    u = union.make(lowers=[{"d/x": "x"}, {}], readonly=True)
    assert errno_of(tmpfile, u.path("d")) == errno.EROFS
