# SPDX-License-Identifier: Apache-2.0
"""O_DIRECT (issue 12): reads and writes of upper and lower files, aligned
as the backing filesystem asks of offsets and sizes, work as on kernel
overlayfs; misaligned ones fail there as they do on the kernel's. Memory
comes from mmap, so it is page-aligned."""

import errno
import mmap
import os

import pytest

from stratatest import errno_of, read_bytes

K = 4096
DATA = bytes(range(256)) * 256          # 64 KiB
LOWER = {"low": ("file", DATA), "tail": ("file", DATA + b"t" * 100)}
UPPER = {"up": ("file", DATA)}


def buf(size, fill=None):
    m = mmap.mmap(-1, size)
    if fill is not None:
        m[:] = fill
    return m


def dread(path, size, off=0, extra=0):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | extra)
    try:
        b = buf(size)
        n = os.preadv(fd, [b], off)
        return bytes(b[:n])
    finally:
        os.close(fd)


def dwrite(path, data, off=0, flags=os.O_WRONLY):
    fd = os.open(path, flags | os.O_DIRECT, 0o644)
    try:
        return os.pwrite(fd, buf(len(data), data), off)
    finally:
        os.close(fd)


def check_direct_io(u):
    # the table, row by row
    assert dread(u.path("up"), 64 * K) == DATA
    assert dread(u.path("low"), 64 * K) == DATA
    assert dwrite(u.path("up"), b"u" * 64 * K) == 64 * K
    assert read_bytes(u.path("up")) == b"u" * 64 * K
    assert dwrite(u.path("new"), b"n" * K, flags=os.O_WRONLY | os.O_CREAT) == K
    assert read_bytes(u.path("new")) == b"n" * K
    assert dwrite(u.path("low"), b"w" * K, off=K) == K
    assert read_bytes(u.path("low")) == DATA[:K] + b"w" * K + DATA[2 * K:]
    assert read_bytes(u.upath("low")) == read_bytes(u.path("low"))
    assert read_bytes(u.lpath(0, "low")) == DATA
    # a read past the end stops at it
    assert dread(u.path("tail"), 128 * K) == DATA + b"t" * 100
    # a read-only handle of a lower file follows a later copy-up
    fd = os.open(u.path("tail"), os.O_RDONLY | os.O_DIRECT)
    try:
        dwrite(u.path("tail"), b"c" * K)
        b = buf(K)
        assert os.preadv(fd, [b], 0) == K and bytes(b) == b"c" * K
    finally:
        os.close(fd)
    # aligned as the backing filesystem wants, and no less
    assert errno_of(dread, u.path("up"), K, off=100) == errno.EINVAL
    assert errno_of(dread, u.path("low"), 1000) == errno.EINVAL
    assert errno_of(dwrite, u.path("up"), b"x" * 1000) == errno.EINVAL
    assert errno_of(dwrite, u.path("up"), b"x" * K, off=10) == errno.EINVAL
    assert read_bytes(u.path("up")) == b"u" * 64 * K


def test_direct_io(union):
    u = union.make(lowers=[LOWER], upper=UPPER)
    check_direct_io(u)
    u.remount()
    assert read_bytes(u.path("low"))[K:2 * K] == b"w" * K


@pytest.mark.parametrize("mode", ["io=uring,nopassthrough",
                                  "io=sync,nopassthrough", "passthrough"])
def test_direct_io_every_engine(stratafs_only, mode):
    u = stratafs_only.make(lowers=[LOWER], upper=UPPER, extra_opts=[mode])
    check_direct_io(u)


@pytest.mark.parametrize("mode", ["io=uring,nopassthrough", "io=sync,nopassthrough"])
def test_direct_io_many_small_random(stratafs_only, mode):
    """What a random O_DIRECT stress run did: every call, whatever the
    heap handed out, must work."""
    u = stratafs_only.make(lowers=[{"big": ("file", os.urandom(1 << 20))}],
                           extra_opts=[mode])
    want = bytearray(read_bytes(u.lpath(0, "big")))
    fd = os.open(u.path("big"), os.O_RDWR | os.O_DIRECT)
    try:
        for i in range(300):
            off = (i * 7919 % 252) * K
            size = (1 + i % 4) * K
            if i % 3 == 0:
                data = os.urandom(size)
                assert os.pwrite(fd, buf(size, data), off) == size
                want[off:off + size] = data
            else:
                b = buf(size)
                assert os.preadv(fd, [b], off) == size
                assert bytes(b) == bytes(want[off:off + size]), (i, off, size)
    finally:
        os.close(fd)
    assert read_bytes(u.path("big")) == bytes(want)
