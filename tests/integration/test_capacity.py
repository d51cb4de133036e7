# SPDX-License-Identifier: Apache-2.0
"""Capacity and usage (fuse/usage.c): -o capacity=BYTES refuses writes past
it with ENOSPC, statfs shows it, the counters follow every change without a
walk, survive a remount (-o usagefile) and a killed worker, and the control
verbs `usage` and `capacity` read and move them."""

import errno
import os
import shutil
import signal
import subprocess
import time

import pytest

from strata_common import (FILL_CHUNK, control_call, control_usage,
                           fill_to_enospc, walk_usage)
from stratatest import stratafs_binary, wait_for_mount
from test_tmpfile import name_it
from test_worker import worker_of

MiB = 1 << 20
CHUNK = FILL_CHUNK  # what fill_to_enospc writes at a time


def mount_cap(factory, tmp_path, cap, *, io=None, usagefile=True, lowers=None,
              extra=(), upper_dir=None, work_dir=None, name="c"):
    # scripts/test.sh runs the suite once more with -o passthrough on every
    # mount: a capacity is refused there by design, which
    # test_bad_options_refused checks in every run
    if cap is not None and "passthrough" in \
            os.environ.get("STRATAFS_OPTS", "").split(","):
        pytest.skip("capacity= and passthrough are refused together")
    sock = str(tmp_path / f"{name}.sock")
    ufile = str(tmp_path / f"{name}.usage")
    opts = [f"control={sock}"]
    if cap is not None:
        opts.append(f"capacity={cap}")
    if usagefile:
        opts.append(f"usagefile={ufile}")
    if io:
        opts.append(f"io={io}")
    u = factory.make(lowers or [{"base": "x"}], extra_opts=opts + list(extra),
                     upper_dir=upper_dir, work_dir=work_dir)
    return u, sock, ufile


def wait_for(cond, what, timeout=30):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"no {what} after {timeout}s")
        time.sleep(0.02)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("io", ["uring", "sync"])
def test_enospc_at_the_limit_keeps_what_was_written(stratafs_only, tmp_path, io):
    # tmpfs takes non-blocking buffered writes: the uring engine uses its ring
    tmpfs = stratafs_only.mount_tmpfs("t", size="64m")
    os.makedirs(f"{tmpfs}/upper")
    os.makedirs(f"{tmpfs}/work")
    cap = 4 * MiB
    u, sock, _ = mount_cap(stratafs_only, tmp_path, cap, io=io,
                           upper_dir=f"{tmpfs}/upper", work_dir=f"{tmpfs}/work")
    start = control_usage(sock)["used"]
    done = fill_to_enospc(u.path("big"))
    # cut short at the room left, to the block: nothing past the limit
    assert cap - start - CHUNK < done <= cap - start
    assert read_file(u.path("big")) == b"d" * done
    assert read_file(u.upath("big")) == b"d" * done
    got = control_usage(sock)
    assert got["used"] <= cap and got["capacity"] == cap
    # a second file finds no room either
    with pytest.raises(OSError) as e:
        with open(u.path("more"), "wb") as f:
            f.write(b"m" * CHUNK)
    assert e.value.errno == errno.ENOSPC
    # overwriting what is allocated needs no room
    with open(u.path("big"), "r+b") as f:
        f.write(b"o" * CHUNK)
    assert read_file(u.path("big"))[:CHUNK + 1] == b"o" * CHUNK + b"d"


def test_statfs_shows_the_capacity(stratafs_only, tmp_path):
    cap = 8 * MiB
    u, sock, _ = mount_cap(stratafs_only, tmp_path, cap)
    with open(u.path("f"), "wb") as f:
        f.write(b"s" * (2 * MiB))
    sv = os.statvfs(u.mnt)
    bs = sv.f_frsize
    used = control_usage(sock)["used"]
    assert used >= 2 * MiB
    assert sv.f_blocks * bs == cap
    assert sv.f_bfree == sv.f_bavail == cap // bs - (used + bs - 1) // bs
    # without a capacity: the upper filesystem's own numbers
    plain, _, _ = mount_cap(stratafs_only, tmp_path, None, name="p")
    assert os.statvfs(plain.mnt).f_blocks == os.statvfs(plain.upper).f_blocks


def test_verbs_and_a_live_raise(stratafs_only, tmp_path):
    cap = 2 * MiB
    u, sock, _ = mount_cap(stratafs_only, tmp_path, cap)
    got = control_usage(sock)
    assert set(got) == {"used", "inodes", "capacity"} and got["capacity"] == cap
    assert got["inodes"] >= 1
    for bad in ("-1", "1M", "12x", "99999999999999999999"):
        status, text = control_call(sock, "capacity", bad)
        assert status == -errno.EINVAL and "expected a number of bytes" in text, text
    status, text = control_call(sock, "capacity")
    assert status == -errno.EINVAL and "takes 1 to 1 arguments" in text
    done = fill_to_enospc(u.path("f"))
    assert control_call(sock, "capacity", str(6 * MiB)) == (0, f"capacity={6 * MiB}")
    # statfs moves at once, and the writes go on where they stopped
    assert os.statvfs(u.mnt).f_blocks * os.statvfs(u.mnt).f_frsize == 6 * MiB
    more = fill_to_enospc(u.path("f"))
    assert more > 3 * MiB
    assert read_file(u.path("f")) == b"d" * (done + more)
    # 0: no limit
    assert control_call(sock, "capacity", "0") == (0, "capacity=0")
    with open(u.path("g"), "wb") as f:
        f.write(b"g" * MiB)
    assert control_usage(sock)["capacity"] == 0


def test_counts_follow_changes(stratafs_only, tmp_path):
    u, sock, ufile = mount_cap(stratafs_only, tmp_path, 64 * MiB,
                           lowers=[{"low": "L" * 300000, "d/x": "1"}])
    base = control_usage(sock)
    with open(u.path("f"), "wb") as f:
        f.write(b"w" * MiB)
    after = control_usage(sock)
    assert after["used"] - base["used"] >= MiB
    assert after["inodes"] == base["inodes"] + 1
    # a copy-up spends the file's blocks
    with open(u.path("low"), "r+b") as f:
        f.write(b"c")
    cu = control_usage(sock)
    assert cu["used"] - after["used"] >= 300000 and cu["inodes"] == after["inodes"] + 1
    # truncate gives back, a whiteout costs an inode, mkdir an inode
    os.truncate(u.path("f"), 0)
    tr = control_usage(sock)
    assert cu["used"] - tr["used"] >= MiB
    os.unlink(u.path("low"))           # copied up: freed, and a whiteout
    os.mkdir(u.path("dir"))
    # the copy's room comes back at once, or at its RELEASE
    wait_for(lambda: tr["used"] - control_usage(sock)["used"] >= 300000 - 4096,
             "the copy-up's room back")
    end = control_usage(sock)
    assert end["inodes"] == tr["inodes"] + 1
    # a file removed while open gives its room back at the last close
    fd = os.open(u.path("open"), os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"o" * MiB)
    os.unlink(u.path("open"))
    held = control_usage(sock)["used"]
    os.close(fd)
    # the kernel sends RELEASE after close(2) has returned
    wait_for(lambda: held - control_usage(sock)["used"] >= MiB,
             "the room of a removed file back at its last close")
    # O_TMPFILE: counted while open, given back unless it got a name
    before = control_usage(sock)
    fd = os.open(u.mnt, os.O_TMPFILE | os.O_RDWR, 0o600)
    os.write(fd, b"t" * MiB)
    assert control_usage(sock)["inodes"] == before["inodes"] + 1
    os.close(fd)
    wait_for(lambda: control_usage(sock) == before, "an unnamed O_TMPFILE given back")
    fd = os.open(u.mnt, os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.write(fd, b"n" * (256 * 1024))
    name_it(fd, u.path("named"))
    os.close(fd)
    # a rename of a lower file: copy-up, and a whiteout where it was
    os.rename(u.path("d", "x"), u.path("moved"))
    u.unmount()
    # the daemon's own count, saved at the end, is what a walk finds
    used, inodes = walk_usage(u.upper, u.work)
    assert read_file(ufile).decode() == (
        f"strata-usage 1\nbytes={used}\ninodes={inodes}\nclean=1\n")


def test_unlink_frees_room(stratafs_only, tmp_path):
    u, sock, _ = mount_cap(stratafs_only, tmp_path, 3 * MiB)
    start = control_usage(sock)["used"]
    done = fill_to_enospc(u.path("a"))
    os.unlink(u.path("a"))
    # given back at once, or at the RELEASE that follows close(2)
    wait_for(lambda: control_usage(sock)["used"] == start, "the room back")
    assert fill_to_enospc(u.path("b")) == done


def test_fallocate_and_copy_up_past_the_room(stratafs_only, tmp_path):
    u, sock, _ = mount_cap(stratafs_only, tmp_path, 2 * MiB,
                           lowers=[{"low": "L" * (3 * MiB)}])
    fd = os.open(u.path("f"), os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError) as e:
            os.posix_fallocate(fd, 0, 4 * MiB)
        assert e.value.errno == errno.ENOSPC
        os.posix_fallocate(fd, 0, MiB)
    finally:
        os.close(fd)
    # a lower file bigger than the room is not copied up: ENOSPC, intact
    with pytest.raises(OSError) as e:
        open(u.path("low"), "r+b").close()
    assert e.value.errno == errno.ENOSPC
    assert read_file(u.path("low")) == b"L" * (3 * MiB)
    assert not os.path.exists(u.upath("low"))


def test_usage_survives_remount(stratafs_only, tmp_path):
    u, sock, ufile = mount_cap(stratafs_only, tmp_path, 16 * MiB)
    with open(u.path("f"), "wb") as f:
        f.write(b"r" * (3 * MiB))
    os.mkdir(u.path("d"))
    before = control_usage(sock)
    u.unmount()
    text = read_file(ufile).decode()
    assert text == ("strata-usage 1\nbytes=%d\ninodes=%d\nclean=1\n"
                    % (before["used"], before["inodes"]))
    # a file put in the upper behind the daemon's back is not seen: the
    # counters come from the file, not from a walk
    with open(u.upath("behind"), "wb") as f:
        f.write(b"b" * MiB)
    u.mount()
    assert control_usage(sock) == before
    assert "clean=0" in read_file(ufile).decode()


@pytest.mark.parametrize("damage", ["missing", "garbage", "not clean"])
def test_walk_when_the_usage_file_cannot_be_trusted(stratafs_only, tmp_path,
                                                     damage):
    u, sock, ufile = mount_cap(stratafs_only, tmp_path, 16 * MiB)
    with open(u.path("f"), "wb") as f:
        f.write(b"w" * MiB)
    u.unmount()
    with open(u.upath("behind"), "wb") as f:
        f.write(b"b" * MiB)
    if damage == "missing":
        os.unlink(ufile)
    elif damage == "garbage":
        with open(ufile, "w") as f:
            f.write("strata-usage 1\nbytes=12\ninodes=x\n")
    else:
        text = read_file(ufile).decode().replace("clean=1", "clean=0")
        with open(ufile, "w") as f:
            f.write(text)
    expect = walk_usage(u.upper, u.work)
    u.mount()
    got = control_usage(sock)
    assert (got["used"], got["inodes"]) == expect
    if damage == "garbage":
        assert "damaged: counting the upper layer anew" in u.stderr()
    if damage == "not clean":
        assert "did not stop cleanly" in u.stderr()


@pytest.mark.skipif("nosupervisor" in os.environ.get("STRATAFS_OPTS", ""),
                    reason="no worker to kill without the supervisor")
def test_killed_worker_keeps_the_counters(stratafs_only, tmp_path):
    cap = 4 * MiB
    u, sock, _ = mount_cap(stratafs_only, tmp_path, cap)
    with open(u.path("f"), "wb") as f:
        f.write(b"k" * (2 * MiB))
    before = control_usage(sock)
    old = worker_of(u)
    os.kill(old, signal.SIGKILL)
    worker_of(u, old)
    assert control_usage(sock) == before
    # and the limit still holds from there
    done = fill_to_enospc(u.path("g"))
    assert done <= cap - before["used"]
    assert control_usage(sock)["used"] <= cap


def refused(tmp_path, opts):
    for d in ("l", "u", "w", "m"):
        os.makedirs(tmp_path / d, exist_ok=True)
    base = f"lowerdir={tmp_path}/l,upperdir={tmp_path}/u,workdir={tmp_path}/w"
    r = subprocess.run([stratafs_binary(), "-f", "-o", f"{base},{opts}",
                        str(tmp_path / "m")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    return r.stderr


def test_bad_options_refused(tmp_path):
    err = refused(tmp_path, "capacity=1048576,passthrough")
    assert "capacity= and passthrough do not go together" in err
    err = refused(tmp_path, "capacity=10M")
    assert "capacity=10M: expected a number of bytes" in err
    # a passthrough mount without a limit is not refused for it
    assert "capacity=" not in refused(tmp_path, "capacity=0,passthrough,bogus=1")


def test_usagefile_where_it_cannot_be_written(tmp_path):
    err = refused(tmp_path, f"usagefile={tmp_path}/missing/usage")
    assert f"usagefile={tmp_path}/missing/usage: No such file or directory" in err


def test_capacity_below_the_usage(stratafs_only, tmp_path):
    # a volume remounted with less room than it already uses
    u, sock, _ = mount_cap(stratafs_only, tmp_path, 4 * MiB)
    with open(u.path("f"), "wb") as f:
        f.write(b"f" * (2 * MiB))
    assert control_call(sock, "capacity", str(MiB))[0] == 0
    sv = os.statvfs(u.mnt)
    assert sv.f_blocks * sv.f_frsize == MiB and sv.f_bavail == 0
    with pytest.raises(OSError) as e:
        with open(u.path("f"), "ab") as f:
            f.write(b"x")
    assert e.value.errno == errno.ENOSPC
    # what is there stays readable, and can be removed to make room
    assert read_file(u.path("f")) == b"f" * (2 * MiB)
    os.unlink(u.path("f"))
    wait_for(lambda: control_usage(sock)["used"] < MiB, "the room back")
    with open(u.path("g"), "wb") as f:
        f.write(b"g" * 4096)


def test_no_live_capacity_with_passthrough(stratafs_only, tmp_path):
    u, sock, _ = mount_cap(stratafs_only, tmp_path, None, extra=["passthrough"])
    status, text = control_call(sock, "capacity", str(MiB))
    assert status == -errno.EINVAL and "passthrough" in text
    assert control_call(sock, "capacity", "0") == (0, "capacity=0")


def test_ext4_upper_full_before_the_capacity(stratafs_only, tmp_path):
    if not shutil.which("mkfs.ext4") or not os.path.exists("/dev/loop-control"):
        pytest.skip("needs mkfs.ext4 and loop devices (/dev/loop-control)")
    img = str(tmp_path / "ext4.img")
    with open(img, "wb") as f:
        f.truncate(24 * MiB)
    subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
    disk = str(tmp_path / "disk")
    os.makedirs(disk)
    r = subprocess.run(["mount", "-o", "loop", img, disk], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount ext4 here: {r.stderr.strip()}")
    try:
        os.makedirs(f"{disk}/upper")
        os.makedirs(f"{disk}/work")
        u, sock, ufile = mount_cap(stratafs_only, tmp_path, 4 * MiB,
                                   upper_dir=f"{disk}/upper",
                                   work_dir=f"{disk}/work")
        # the capacity first
        done = fill_to_enospc(u.path("a"))
        assert 3 * MiB < done <= 4 * MiB
        # then a capacity bigger than the disk: the disk fills first, and
        # the error is still ENOSPC
        assert control_call(sock, "capacity", str(1 << 30))[0] == 0
        more = fill_to_enospc(u.path("b"), byte=b"e")
        assert more > MiB
        os.sync()
        assert read_file(u.path("a")) == b"d" * done
        assert read_file(u.path("b")) == b"e" * more
        got = control_usage(sock)
        u.unmount()
        assert walk_usage(u.upper, u.work)[0] == got["used"]
    finally:
        subprocess.run(["umount", disk], check=False)
    fsck = subprocess.run(["e2fsck", "-fn", img], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_a_freeze_leaves_the_frozen_files_out_of_the_count(stratafs_only,
                                                          tmp_path):
    """A freeze (freeze.c) makes the upper a lower layer: what it held is
    the frozen layer's, the capacity bounds the new upper, and a write
    through a handle opened before copies up and is counted again."""
    u, sock, ufile = mount_cap(stratafs_only, tmp_path, 8 * MiB)
    fd = os.open(u.path("kept"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"k" * (6 * MiB))
    full = control_usage(sock)
    assert full["used"] >= 6 * MiB
    status, text = control_call(sock, "freeze", str(tmp_path / "frozen"),
                                timeout=60)
    assert status == 0, text
    after = control_usage(sock)
    assert after["used"] < MiB and after["inodes"] < full["inodes"], after
    # the new upper takes 6 MiB more: the frozen 6 MiB do not count
    with open(u.path("new"), "wb") as f:
        f.write(b"n" * (6 * MiB))
    # the old handle's next write copies the file up: 6 MiB more, too much
    with pytest.raises(OSError) as e:
        os.pwrite(fd, b"x", 0)
    assert e.value.errno == errno.ENOSPC
    os.close(fd)
    assert read_file(str(tmp_path / "frozen" / "kept")) == b"k" * (6 * MiB)
    os.unlink(u.path("new"))
    wait_for(lambda: control_usage(sock)["used"] < MiB, "the new file's room back")
    u.unmount()
    used, inodes = walk_usage(u.upper, u.work)
    assert read_file(ufile).decode() == (
        f"strata-usage 1\nbytes={used}\ninodes={inodes}\nclean=1\n")
