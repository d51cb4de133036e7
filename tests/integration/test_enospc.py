# SPDX-License-Identifier: Apache-2.0
"""Running out of space in the upper layer."""

import errno
import os
import random
import subprocess

import pytest

from stratatest import (is_mounted, read_bytes, sha256, snapshot_upper,
                        stratafs_binary, walk_fd)

MiB = 1 << 20


def small_upper(union, lower):
    t = union.mount_tmpfs("small", "8m")
    return union.make(lowers=[lower], upper_dir=os.path.join(t, "upper"),
                      work_dir=os.path.join(t, "work")), t


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def tree_names(root):
    return sorted(rel for rel, _, _, _ in walk_fd(root))


BIG = random.Random(10).randbytes(16 * MiB)


@pytest.mark.parametrize("how", ["open_rdwr", "open_append", "truncate_extend"])
def test_copy_up_larger_than_free_space(union, how):
    u, t = small_upper(union, {"big": BIG, "small": "small lower file", "d/x": "x"})
    upper_before = snapshot_upper(u.upper)
    work_before = tree_names(u.work)
    free_before = free_bytes(t)
    with pytest.raises(OSError) as e:
        if how == "open_rdwr":
            os.close(os.open(u.path("big"), os.O_RDWR))
        elif how == "open_append":
            os.close(os.open(u.path("big"), os.O_WRONLY | os.O_APPEND))
        else:
            os.truncate(u.path("big"), len(BIG) + 1)
    assert e.value.errno == errno.ENOSPC
    # nothing half-made: upper and work as before, the space given back
    assert snapshot_upper(u.upper) == upper_before
    assert tree_names(u.work) == work_before
    assert free_bytes(t) >= free_before - 256 * 1024
    # lower intact and still what the merged view shows
    assert sha256(read_bytes(u.lpath(0, "big"))) == sha256(BIG)
    assert sha256(read_bytes(u.path("big"))) == sha256(BIG)
    assert os.stat(u.path("big")).st_size == len(BIG)
    # smaller copy-ups still work
    with open(u.path("small"), "a") as f:
        f.write("+")
    assert read_bytes(u.path("small")) == b"small lower file+"
    u.remount()
    assert sha256(read_bytes(u.path("big"))) == sha256(BIG)
    assert sorted(os.listdir(u.mnt)) == ["big", "d", "small"]


def test_write_filling_the_disk(union):
    u, t = small_upper(union, {"small": "small lower file"})
    keep = random.Random(1).randbytes(MiB)
    with open(u.path("keep"), "wb") as f:
        f.write(keep)
        f.flush()
        os.fsync(f.fileno())
    chunk = random.Random(2).randbytes(256 * 1024)
    pattern = chunk * 64   # 16 MiB, twice the file system
    fd = os.open(u.path("fill"), os.O_CREAT | os.O_WRONLY, 0o644)
    acked, err, where = 0, None, None
    try:
        while acked < len(pattern):
            try:
                n = os.write(fd, pattern[acked:acked + len(chunk)])
            except OSError as e:
                err, where = e.errno, "write"
                break
            assert n > 0
            acked += n
        try:
            os.fsync(fd)
        except OSError as e:
            if err is None:
                err, where = e.errno, "fsync"
    finally:
        try:
            os.close(fd)
        except OSError as e:
            if err is None:
                err, where = e.errno, "close"
    # kernel overlayfs reports ENOSPC from write(2) itself; a FUSE daemon
    # with a writeback cache would only report it at fsync/close
    assert (err, where) == (errno.ENOSPC, "write"), \
        f"filling the disk gave {err and errno.errorcode[err]} at {where} after {acked} bytes"
    assert acked < 8 * MiB
    data = read_bytes(u.path("fill"))
    assert data == pattern[:len(data)], "filled file holds data that was not written"
    assert len(data) >= acked, "acknowledged writes were lost"
    assert read_bytes(u.path("keep")) == keep
    assert read_bytes(u.path("small")) == b"small lower file"
    # free the space: things work again
    os.unlink(u.path("fill"))
    assert free_bytes(t) > 5 * MiB
    with open(u.path("after"), "wb") as f:
        f.write(chunk * 8)   # 2 MiB
    with open(u.path("small"), "a") as f:
        f.write("+")
    assert read_bytes(u.path("after")) == chunk * 8
    assert read_bytes(u.path("small")) == b"small lower file+"
    u.remount()
    assert sorted(os.listdir(u.mnt)) == ["after", "keep", "small"]
    assert read_bytes(u.path("keep")) == keep


def test_copy_up_on_full_disk(union):
    u, t = small_upper(union, {"d/x": "x", "f": "f"})
    fd = os.open(u.path("filler"), os.O_CREAT | os.O_WRONLY, 0o644)
    block = b"\1" * MiB
    try:
        for _ in range(16):          # 16 MiB: twice the file system
            try:
                os.write(fd, block)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        else:
            pytest.fail("writing 16 MiB into an 8 MiB upper never gave ENOSPC")
        # top up whatever small space is left (bounded: < 1 MiB remains)
        for size in (65536, 4096, 512):
            for _ in range(MiB // size + 1):
                try:
                    if os.write(fd, b"\1" * size) == 0:
                        break
                except OSError:
                    break
    finally:
        os.close(fd)
    # tmpfs still has inodes left but no blocks: creating an empty file works
    # on tmpfs, writing to it does not; a copy-up of a non-empty file fails
    with pytest.raises(OSError) as e:
        with open(u.path("f"), "a") as fh:
            fh.write("more data")
    assert e.value.errno == errno.ENOSPC
    assert read_bytes(u.path("f")) == b"f"
    os.unlink(u.path("filler"))
    with open(u.path("f"), "a") as fh:
        fh.write("+")
    assert read_bytes(u.path("f")) == b"f+"


def fill(path):
    """Fills the filesystem of directory path."""
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (MiB, 4096):
            with pytest.raises(OSError) as e:
                while True:
                    os.write(fd, b"\1" * size)
            assert e.value.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_statsfile_on_a_full_disk_is_refused_not_a_crash(stratafs_only):
    """The counters are a shared mapping of the statsfile: on a full
    filesystem a sparse one would kill the daemon with SIGBUS at its first
    request. It must refuse to start instead, saying why."""
    t = stratafs_only.mount_tmpfs("full", "4m")
    fill(t)
    u = stratafs_only.make(lowers=[{"f": "x"}], mount=False,
                           extra_opts=[f"statsfile={t}/volume.stats"])
    os.makedirs(u.mnt)
    r = subprocess.run([stratafs_binary(), "-f", "-o", u.options(), u.mnt],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "statsfile" in r.stderr and "No space left on device" in r.stderr, r.stderr
    assert not is_mounted(u.mnt)
