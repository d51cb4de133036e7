# SPDX-License-Identifier: Apache-2.0
"""EIO from the upper filesystem (issue 11, item 6).

The upper layer lives on ext4 on a loop device whose backing file is
served by faultdisk.c, a small FUSE filesystem built here that fails
every I/O with EIO on command, and works again on another.
This kernel has no device-mapper (/dev/mapper/control: ENODEV), so its
error target cannot be used; faultdisk plays its part, below the block
layer as the error target is. Mid-test the disk fails, as a dying disk
does. Through the stratafs mount, what needs the disk fails with EIO (the
kernel's ext4 may turn later calls into EROFS once it has aborted its
journal); the daemon neither crashes nor hangs, and exits with status 0
at unmount. Once the disk works again, the data fsync'd before the
failure is intact and the filesystem passes e2fsck. The loop device and
faultdisk are gone after the test, also when it fails.
"""

import errno
import os
import subprocess
import time

import pytest

from stratatest import (is_mounted, lazy_umount, read_bytes, run,
                        wait_for_mount)

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


class FailingDisk:
    """ext4 on a loop device over faultdisk's file; fail() and heal()."""

    def __init__(self, base):
        self.base = base
        self.image = os.path.join(base, "disk.img")
        self.fdmnt = os.path.join(base, "faultdisk")
        self.mnt = os.path.join(base, "disk")
        self.proc = None
        self.loop = None
        self.mounted = False

    def create(self):
        binary = os.path.join(self.base, "faultdisk.bin")
        flags = run(["pkg-config", "--cflags", "--libs", "fuse3"]).stdout.split()
        run(["cc", "-O1", "-Wall", "-Werror", "-o", binary,
             os.path.join(HERE, "faultdisk.c"), *flags])
        with open(self.image, "wb") as f:
            f.truncate(64 * MiB)
        run(["mkfs.ext4", "-q", "-F", self.image])
        os.makedirs(self.fdmnt)
        self.err = open(os.path.join(self.base, "faultdisk.stderr"), "wb")
        self.proc = subprocess.Popen([binary, self.image, self.fdmnt],
                                     stdin=subprocess.DEVNULL, stdout=self.err,
                                     stderr=self.err)
        wait_for_mount(self.fdmnt, "fuse.faultdisk", self.proc,
                       self.err.name)
        self.loop = run(["losetup", "-f", "--show",
                         os.path.join(self.fdmnt, "disk")]).stdout.strip()
        self.mount()
        return self

    def mount(self):
        os.makedirs(self.mnt, exist_ok=True)
        run(["mount", "-t", "ext4", self.loop, self.mnt])
        self.mounted = True

    def umount(self):
        r = run(["umount", self.mnt], check=False)
        if r.returncode != 0:
            lazy_umount(self.mnt)
        self.mounted = False
        return r.returncode

    def switch(self, word):
        with open(os.path.join(self.fdmnt, "ctl"), "w") as f:
            f.write(word)

    def fail(self):
        self.switch("fail")

    def heal(self):
        self.switch("heal")

    def fsck(self):
        return run(["e2fsck", "-f", "-n", self.loop], check=False)

    def destroy(self):
        """Everything gone, whatever state the test left."""
        if self.proc is not None and self.proc.poll() is None:
            self.heal()
        if self.mounted or is_mounted(self.mnt):
            lazy_umount(self.mnt)
        if self.loop:
            run(["losetup", "-d", self.loop], check=False)
        if self.proc is not None:
            if run(["fusermount3", "-u", self.fdmnt], check=False).returncode:
                run(["fusermount3", "-u", "-z", self.fdmnt], check=False)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.err.close()


@pytest.fixture
def disk(tmp_path):
    d = FailingDisk(str(tmp_path))
    try:
        yield d.create()
    finally:
        d.destroy()
    deadline = time.monotonic() + 10
    while d.fdmnt in run(["losetup", "-a"]).stdout:
        assert time.monotonic() < deadline, f"loop device {d.loop} left behind"
        time.sleep(0.1)
    assert not is_mounted(d.fdmnt) and not is_mounted(d.mnt)
    assert d.proc.returncode is not None


def errno_of_calls(*calls):
    """The errno of the first call that fails, or 0."""
    for call in calls:
        try:
            call()
        except OSError as e:
            return e.errno
    return 0


def write_sync(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.timeout(180)
def test_upper_disk_failing(disk, stratafs_only):
    # (disk first: its teardown runs after the union's)
    up, wk = os.path.join(disk.mnt, "upper"), os.path.join(disk.mnt, "work")
    u = stratafs_only.make(lowers=[{"lower.txt": "from the lower layer\n",
                                    "d/inner.txt": "inner\n"}],
                           upper_dir=up, work_dir=wk)
    try:
        kept = os.urandom(3 * MiB)
        write_sync(u.path("kept.bin"), kept)
        os.mkdir(u.path("made"))
        write_sync(u.path("made", "small"), b"small\n")
        # a copy-up, synced: the lower file's new version is in the upper
        write_sync(u.path("lower.txt"), b"changed\n", os.O_WRONLY | os.O_APPEND)
        fd = os.open(u.path("made"), os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

        disk.fail()
        # data written before, never synced, cannot reach the disk now
        fd = os.open(u.path("kept.bin"), os.O_WRONLY)
        try:
            os.pwrite(fd, b"x" * 65536, 0)
            with pytest.raises(OSError) as e:
                os.fsync(fd)
            assert e.value.errno == errno.EIO, e.value
        finally:
            os.close(fd)
        # new files, copy-ups and directories: each fails at some step
        # with EIO, or with EROFS once ext4 has aborted its journal
        for what, calls in (
            ("create", [lambda: write_sync(u.path("new.bin"), b"n" * 65536)]),
            ("copy-up", [lambda: write_sync(u.path("d", "inner.txt"), b"+",
                                            os.O_WRONLY | os.O_APPEND)]),
            ("mkdir", [lambda: os.mkdir(u.path("newdir")),
                       lambda: write_sync(u.path("newdir", "f"), b"f")]),
        ):
            err = errno_of_calls(*calls)
            assert err in (errno.EIO, errno.EROFS), \
                f"{what} on a failing upper: {errno.errorcode.get(err, err)}"
        # the daemon is alive, and the mount answers what needs no disk
        assert u.proc.poll() is None, u.stderr()[-3000:]
        assert os.stat(u.mnt).st_ino
        assert "lower.txt" in os.listdir(u.mnt)
    finally:
        # it exits with status 0 at the unmount, with no sanitizer report
        u.unmount()
    assert disk.umount() == 0

    disk.heal()
    disk.mount()        # replays the journal
    assert read_bytes(os.path.join(up, "kept.bin")) == kept
    assert read_bytes(os.path.join(up, "made", "small")) == b"small\n"
    assert read_bytes(os.path.join(up, "lower.txt")) == \
        b"from the lower layer\nchanged\n"
    assert disk.umount() == 0
    r = disk.fsck()
    assert r.returncode == 0, f"e2fsck: {r.returncode}\n{r.stdout}\n{r.stderr}"
