# SPDX-License-Identifier: Apache-2.0
"""Live freeze (fuse/freeze.c): `freeze NEWDIR` on the control channel makes
the upper as it is a read-only layer at NEWDIR while the mount serves on, on
a fresh upper at the old path.

The oracle is the kernel's overlayfs: lowerdir=NEWDIR:<old lowers> under the
new upper must show what stratafs shows, and so must stratafs mounted again
from that layout."""

import errno
import mmap
import os
import shutil
import signal
import stat
import threading
import time

import pytest

from strata_common import assert_layer_size, control_call, control_usage
from stratatest import (Union, is_mounted, lazy_umount, run,
                        snapshot_tree, snapshot_upper)
from test_tmpfile import name_it
from test_worker import worker_of

LOWER = {
    "keep": "lower keep\n",
    "gone": "lower, deleted before the freeze\n",
    "later": "lower, deleted after the freeze\n",
    "dir/a": "a\n",
    "dir/b": "b\n",
    "opq/hidden": "hidden by an opaque dir\n",
    "moved/inside": "in a dir renamed before the freeze\n",
}


def supervised():
    return "nosupervisor" not in os.environ.get("STRATAFS_OPTS", "")


# A freeze is refused while a passthrough handle is open on an upper file
# (test_passthrough_writer_refused), and passthrough is the daemon's
# default: tests that hold handles across a freeze mount without it, as
# the CSI plugin does. Asked for on every mount (STRATAFS_OPTS), they are
# that run's refusals, and left to the other runs.
holds_handles = pytest.mark.skipif(
    "passthrough" in os.environ.get("STRATAFS_OPTS", "").split(","),
    reason="a freeze refuses passthrough handles")


def mount(factory, tmp_path, lowers=(LOWER,), **kw):
    sock = str(tmp_path / "c.sock")
    u = factory.make(list(lowers), extra_opts=[f"control={sock}"]
                     + list(kw.pop("extra_opts", ())), **kw)
    u.sock = sock
    return u


def freeze(u, newdir, *, released=True):
    """freeze NEWDIR. RELEASED: the handles closed before are gone; with
    passthrough, the kernel sends their RELEASE after close(2) returns,
    so a refusal for one is asked again once it has arrived."""
    for _ in range(200):
        status, text = control_call(u.sock, "freeze", str(newdir),
                                    timeout=60)
        if not released or status != -errno.EBUSY or \
                "passthrough" not in text:
            break
        time.sleep(0.01)
    return status, text


def drained_freeze(u, newdir, tries=5):
    """freeze NEWDIR, asked again while it is refused because requests
    were still in flight after the drain timeout: a writer fsyncing in a
    loop under a sanitizer beside other load can keep one in flight that
    long, and the plugin's callers retry the same way."""
    for _ in range(tries):
        status, text = freeze(u, newdir)
        if status != -errno.EBUSY or "still in flight" not in text:
            break
    return status, text


def view(root):
    return snapshot_tree(root, xattrs=False)


def before_freeze(u):
    """Changes of every kind in the upper: a whiteout, an opaque dir, a
    renamed dir (redirect), a copied-up file, a new file and dir."""
    os.unlink(u.path("gone"))
    with open(u.path("dir/a"), "a") as f:
        f.write("appended before\n")
    os.makedirs(u.path("new/deep"))
    with open(u.path("new/deep/f"), "w") as f:
        f.write("new before\n")
    shutil.rmtree(u.path("opq"))
    os.mkdir(u.path("opq"))
    with open(u.path("opq/fresh"), "w") as f:
        f.write("fresh in an opaque dir\n")
    os.rename(u.path("moved"), u.path("moved2"))
    os.symlink("keep", u.path("link"))


def after_freeze(u):
    """Changes after the freeze: all must land in the new upper."""
    with open(u.path("new/after"), "w") as f:
        f.write("new after\n")
    with open(u.path("new/deep/f"), "r+") as f:
        f.truncate(3)
    os.unlink(u.path("later"))
    os.unlink(u.path("opq/fresh"))
    os.rename(u.path("dir/b"), u.path("dir/b2"))
    os.rename(u.path("moved2"), u.path("moved3"))
    os.chmod(u.path("dir/a"), 0o600)
    os.chmod(u.path("keep"), 0o640)
    shutil.rmtree(u.path("new/deep"))
    os.mkdir(u.path("new/deep"))


def oracle(factory, u, layers, name, look=view, kernel_opts=()):
    """The kernel's overlayfs over LAYERS (top first) and u's upper: what
    LOOK sees of it. Its own workdir: the daemon's is locked."""
    work = os.path.join(u.base, f"kwork-{name}")
    os.makedirs(work, exist_ok=True)
    k = Union("kernel", u.base, list(layers), u.upper, work,
              os.path.join(u.base, f"kmnt-{name}"), kernel_opts=kernel_opts)
    factory.unions.append(k)
    k.mount()
    try:
        return look(k.mnt)
    finally:
        k.unmount()


def remount_frozen(factory, u, layers):
    """stratafs again, from the frozen layout: same upper and workdir."""
    r = Union("stratafs", u.base, list(layers), u.upper, u.work,
              u.mnt, extra_opts=[f"control={u.sock}"])
    factory.unions.append(r)
    r.sock = u.sock
    return r.mount()


def assert_stack_agrees(factory, u, frozen, name, look=view, kernel_opts=()):
    """Unmounts U, frozen into FROZEN (paths, newest first): the kernel's
    overlayfs over them and U's lowers (mounted with KERNEL_OPTS), and
    stratafs mounted again from them, show what U showed, as LOOK sees."""
    merged = look(u.mnt)
    layers = [str(f) for f in frozen] + u.lowers
    u.unmount()
    assert oracle(factory, u, layers, name, look, kernel_opts) == merged
    r2 = remount_frozen(factory, u, layers)
    assert look(r2.mnt) == merged


@holds_handles
def test_freeze_content_and_later_writes(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    before_freeze(u)
    # a writer open across the freeze, written to but never synced
    w = os.open(u.path("new/appended"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(w, b"unsynced before\n")
    # and one on a file that was only in the lower
    rw = os.open(u.path("keep"), os.O_RDWR)
    # a reader of a file that will change
    r = os.open(u.path("dir/a"), os.O_RDONLY)
    upper_then = snapshot_upper(u.upper)
    view_then = view(u.mnt)
    upper_ino = os.stat(u.upper).st_ino
    ino_then = os.stat(u.path("new/appended")).st_ino

    inos_then = snapshot_tree(u.mnt, xattrs=False, ino=True)
    frozen = tmp_path / "frozen"
    status, text = freeze(u, frozen)
    assert status == 0 and text.startswith(f"layer={frozen} bytes="), text
    assert os.stat(frozen).st_ino == upper_ino
    assert os.listdir(u.upper) == []
    assert view(u.mnt) == view_then
    # inode numbers stay, also for names looked up again from the frozen
    # layer (copied-up files keep their lower number there)
    assert snapshot_tree(u.mnt, xattrs=False, ino=True) == inos_then
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
    assert snapshot_tree(u.mnt, xattrs=False, ino=True) == inos_then
    for e in os.scandir(u.path("dir")):
        assert e.inode() == os.stat(e.path).st_ino
    assert snapshot_upper(str(frozen)) == upper_then

    os.write(w, b"appended after\n")
    os.write(rw, b"LOWER")
    os.close(w)
    os.close(rw)
    assert os.pread(r, 100, 0) == b"a\nappended before\n"
    after_freeze(u)
    os.close(r)
    # the frozen layer is exactly what the upper was
    assert snapshot_upper(str(frozen)) == upper_then
    with open(u.path("new/appended"), "rb") as f:
        assert f.read() == b"unsynced before\nappended after\n"
    with open(os.path.join(frozen, "new/appended"), "rb") as f:
        assert f.read() == b"unsynced before\n"
    with open(u.upath("keep"), "rb") as f:
        assert f.read() == b"LOWER keep\n"
    # the kernel keeps the inode numbers it was told of
    assert os.stat(u.path("new/appended")).st_ino == ino_then
    # later changes are in the new upper: whiteouts for what the frozen
    # layer has
    for wh in ("later", "opq/fresh"):
        st = os.lstat(u.upath(wh))
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0

    assert_stack_agrees(stratafs_only, u, [frozen], "1")


def freeze_to_death(u, newdir):
    """freeze NEWDIR on a daemon told to kill its worker in the freeze
    (STRATAFS_CRASH_AFTER): asked until no answer comes."""
    for _ in range(200):
        try:
            status, text = control_call(u.sock, "freeze", str(newdir),
                                        timeout=60)
        except (OSError, ValueError):
            return                  # no answer: it died
        # a passthrough handle's RELEASE, sent after close(2), not in yet
        assert status == -errno.EBUSY and "passthrough" in text, text
        time.sleep(0.01)
    pytest.fail("the worker did not die in the freeze")


def freeze_killed(u, newdir):
    """freeze_to_death, then returns once the next worker serves."""
    old = worker_of(u)
    freeze_to_death(u, newdir)
    worker_of(u, old)


@pytest.mark.skipif(not supervised(),
                    reason="without a supervisor a dead daemon's mount is gone")
@pytest.mark.parametrize("point,said", [
    ("freeze.moved", "died after its upper moved"),
    ("freeze.made", "died after its upper moved"),
    ("freeze.layers", "died in its switch"),
    ("freeze:moved2", "died in its switch"),
    ("freeze:a", "died in its switch"),
    ("freeze:opq", "died in its switch"),
    ("freeze:still", "died in its switch"),
    ("frozen:a", "died in its switch"),
    ("freeze.through", "nothing to finish")])
def test_a_freeze_its_worker_died_in_is_finished(stratafs_only, tmp_path,
                                                 point, said):
    """The worker killed once the upper was renamed (moved: no new upper
    yet; made: the new upper made) and before the switch: the next one
    finishes the freeze before it serves, so nothing written afterwards
    lands in the new layer, and the view is the frozen stack's. Killed
    inside the switch (layers: the stack switched, no node yet;
    freeze:NAME: half way through that node, the nodes the walk met
    before it through, the rest not; "still", a directory only in the
    lower, only moves down a layer, recorded apart; frozen:NAME: that
    node through but for freeing what it let go of): the next one puts
    that node back, or frees that, and goes on past those through.
    Killed once the switch was through, before it said so: the next one
    keeps the stack as it is."""
    # the lower on a filesystem of its own: an entry taken for the wrong
    # layer shows in the inode numbers of what is found through it
    lowerfs = stratafs_only.mount_tmpfs("lowerfs")
    u = mount(stratafs_only, tmp_path, env={"STRATAFS_CRASH_AFTER": point},
              layer_dirs=[os.path.join(lowerfs, "lower")],
              lowers=({**LOWER, "still/x": "untouched\n"},))
    before_freeze(u)
    upper_then = snapshot_upper(u.upper)
    view_then = snapshot_tree(u.mnt, xattrs=False, ino=True)
    upper_ino = os.stat(u.upper).st_ino
    # the nodes named stay (a dentry held: O_PATH sends no OPEN), the rest
    # go: the walk after looks their children up through them again
    held = [os.open(u.path(p), os.O_PATH)
            for p in ("dir/a", "moved2", "opq", "new/deep", "still")]
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2")
    frozen = tmp_path / "frozen"
    freeze_killed(u, frozen)
    assert snapshot_tree(u.mnt, xattrs=False, ino=True) == view_then
    for fd in held:
        os.close(fd)
    assert os.stat(frozen).st_ino == upper_ino
    assert os.listdir(u.upper) == []
    after_freeze(u)
    assert snapshot_upper(str(frozen)) == upper_then
    told = [line for line in u.stderr().splitlines() if said in line]
    assert len(told) == 1 and str(frozen) in told[0], u.stderr()
    assert_stack_agrees(stratafs_only, u, [frozen], "1")


@pytest.mark.skipif(not supervised(),
                    reason="without a supervisor a dead daemon's mount is gone")
@pytest.mark.parametrize("point", ["freeze:d2", "frozen:d2"])
def test_a_grown_node_its_worker_died_in(stratafs_only, tmp_path, point):
    """A directory frozen with an upper entry, then renamed (an upper
    entry again): the second freeze gives its entries an array of their
    own, made ready before the switch. The worker killed half way
    through that node (the array still the list's) or once through (the
    node's): the next one ends with the stack the kernel's overlayfs
    shows."""
    u = mount(stratafs_only, tmp_path, env={"STRATAFS_CRASH_AFTER": point})
    with open(u.path("dir/a"), "a") as f:
        f.write("first\n")
    f1, f2 = tmp_path / "f1", tmp_path / "f2"
    status, text = freeze(u, f1)
    assert status == 0, text
    os.rename(u.path("dir"), u.path("d2"))
    with open(u.path("d2/b"), "a") as f:
        f.write("second\n")
    upper_then = snapshot_upper(u.upper)
    view_then = view(u.mnt)
    freeze_killed(u, f2)
    told = [line for line in u.stderr().splitlines()
            if "died in its switch" in line]
    assert len(told) == 1 and str(f2) in told[0], u.stderr()
    assert view(u.mnt) == view_then
    assert snapshot_upper(str(f2)) == upper_then
    with open(u.path("d2/c"), "w") as f:
        f.write("third\n")
    os.unlink(u.path("d2/a"))
    assert snapshot_upper(str(f2)) == upper_then
    assert_stack_agrees(stratafs_only, u, [f2, f1], "1")


@pytest.mark.skipif(not supervised(),
                    reason="without a supervisor a dead daemon's mount is gone")
@holds_handles
def test_handles_of_a_switch_its_worker_died_in(stratafs_only, tmp_path):
    """The worker killed once the switch had moved the first open handle
    (freeze.files): the next one moves the others, and the one moved
    stays as it is. Readers opened on lower files that were copied up
    since read the copies; a writer's later writes go to the new upper,
    not into the frozen layer."""
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"],
              env={"STRATAFS_CRASH_AFTER": "freeze.files"})
    readers = {name: os.open(u.path(name), os.O_RDONLY)
               for name in ("keep", "dir/a", "dir/b")}
    for name in readers:
        with open(u.path(name), "r+") as f:
            f.write("UPPER")
    w = os.open(u.path("written"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.write(w, b"before\n")
    upper_then = snapshot_upper(u.upper)
    frozen = tmp_path / "frozen"
    freeze_killed(u, frozen)
    told = [line for line in u.stderr().splitlines()
            if "died in its switch" in line]
    assert len(told) == 1 and str(frozen) in told[0], u.stderr()
    assert os.pread(readers["keep"], 100, 0) == b"UPPER keep\n"
    assert os.pread(readers["dir/a"], 100, 0) == b"UPPER"
    assert os.pread(readers["dir/b"], 100, 0) == b"UPPER"
    os.write(w, b"after\n")
    with open(u.path("keep"), "a") as f:
        f.write("more\n")
    assert os.pread(readers["keep"], 100, 0) == b"UPPER keep\nmore\n"
    for fd in list(readers.values()) + [w]:
        os.close(fd)
    with open(u.path("written"), "rb") as f:
        assert f.read() == b"before\nafter\n"
    assert snapshot_upper(str(frozen)) == upper_then
    assert sorted(os.listdir(u.upper)) == ["keep", "written"]
    assert_stack_agrees(stratafs_only, u, [frozen], "1")


@pytest.mark.skipif(not supervised(),
                    reason="without a supervisor a dead daemon's mount is gone")
def test_a_freeze_that_cannot_be_finished(stratafs_only, tmp_path):
    """The worker killed once the upper was renamed, and the next one
    cannot make the new upper: its filesystem has no inode left (the
    rename took none). No worker may serve then, or the frozen layer
    would be written as the upper: each says why in the log and ends,
    the supervisor gives up as for any worker that cannot start, and the
    mount fails (ENOTCONN) rather than hang. The frozen layer is as the
    upper was; with room again, the stack the freeze was making (a fresh
    upper over it, as the CSI plugin finishes a snapshot) serves the
    view that was frozen, and writes go to the new upper."""
    t = stratafs_only.mount_tmpfs("small", "8m", "nr_inodes=256")
    u = mount(stratafs_only, tmp_path, upper_dir=os.path.join(t, "upper"),
              work_dir=os.path.join(t, "work"),
              env=dict(os.environ, STRATAFS_CRASH_AFTER="freeze.moved"))
    before_freeze(u)
    upper_then = snapshot_upper(u.upper)
    view_then = view(u.mnt)
    fill = os.path.join(t, "fill")
    os.mkdir(fill)
    for n in range(1000):
        try:
            os.close(os.open(os.path.join(fill, str(n)),
                             os.O_WRONLY | os.O_CREAT, 0o644))
        except OSError as e:
            assert e.errno == errno.ENOSPC
            break
    else:
        pytest.fail("the tmpfs has inodes without end")
    # a directory of the mount, open across the freeze
    held = os.open(u.mnt, os.O_RDONLY | os.O_DIRECTORY)
    frozen = os.path.join(t, "frozen")
    try:
        freeze_to_death(u, frozen)
        assert u.proc.wait(60) == 1
        with pytest.raises(OSError) as e:
            os.close(os.open("after", os.O_WRONLY | os.O_CREAT, 0o644,
                             dir_fd=held))
        assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), e.value
    finally:
        os.close(held)
    u.mounted = False
    if is_mounted(u.mnt):
        lazy_umount(u.mnt)
    err = u.stderr()
    # each worker in turn, until young deaths in a row end the supervisor
    told = [line for line in err.splitlines() if "cannot be finished" in line]
    assert told, err
    assert all(frozen in line and "No space left on device" in line
               for line in told), told
    # each ended as unfit (SFS_WORKER_UNFIT), which counts towards giving
    # up however long its takeover took (the killed one may count too)
    assert err.count("worker exited with status 76") in (4, 5), err
    assert ("5 workers in a row died within a second or before they "
            "served: giving up") in err
    # nothing half made, nothing written where the layer is
    assert snapshot_upper(frozen) == upper_then
    assert not os.path.exists(u.upper)
    shutil.rmtree(fill)
    os.mkdir(u.upper)
    os.chmod(u.upper, stat.S_IMODE(os.stat(frozen).st_mode))
    r = remount_frozen(stratafs_only, u, [frozen] + u.lowers)
    assert view(r.mnt) == view_then
    after_freeze(r)
    assert snapshot_upper(frozen) == upper_then
    assert os.path.exists(r.upath("new", "after"))


@holds_handles
def test_reader_of_a_replaced_lower_file(stratafs_only, tmp_path):
    # a reader opened on the lower file, which another handle then copied
    # up and changed, reads the change after the freeze, as before it
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    r = os.open(u.path("keep"), os.O_RDONLY)
    with open(u.path("keep"), "r+") as f:
        f.write("UPPER")
    assert freeze(u, tmp_path / "f")[0] == 0
    assert os.pread(r, 100, 0) == b"UPPER keep\n"
    with open(u.path("keep"), "a") as f:
        f.write("more\n")
    assert os.pread(r, 100, 0) == b"UPPER keep\nmore\n"
    os.close(r)
    with open(tmp_path / "f" / "keep", "rb") as f:
        assert f.read() == b"UPPER keep\n"


@holds_handles
def test_nameless_files_stay_out(stratafs_only, tmp_path):
    # an unlinked file still open, and an O_TMPFILE not linked yet, are
    # in no layer: the freeze leaves them be, and they work on
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    gone = os.open(u.path("unlinked"), os.O_RDWR | os.O_CREAT)
    os.write(gone, b"before\n")
    os.unlink(u.path("unlinked"))
    tmp = os.open(u.path("dir"), os.O_TMPFILE | os.O_RDWR, 0o644)
    os.write(tmp, b"tmp before\n")
    assert freeze(u, tmp_path / "f")[0] == 0
    os.write(gone, b"after\n")
    assert os.pread(gone, 100, 0) == b"before\nafter\n"
    os.write(tmp, b"tmp after\n")
    name_it(tmp, u.path("dir/linked"))
    os.close(gone)
    os.close(tmp)
    with open(u.path("dir/linked"), "rb") as f:
        assert f.read() == b"tmp before\ntmp after\n"
    # the O_TMPFILE copied its directory up: all the frozen layer holds
    assert os.listdir(tmp_path / "f") == ["dir"]
    assert os.listdir(tmp_path / "f" / "dir") == []
    assert os.path.exists(u.upath("dir/linked"))
    merged = view(u.mnt)
    layers = [str(tmp_path / "f")] + u.lowers
    u.unmount()
    assert oracle(stratafs_only, u, layers, "n") == merged


@holds_handles
def test_mapped_writes_are_in_the_frozen_layer(stratafs_only, tmp_path):
    # written through a shared mapping, never synced: in the kernel's
    # page cache of the mount until the freeze asks for it
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    with open(u.path("mapped"), "wb") as f:
        f.write(b"." * 4096)
    fd = os.open(u.path("mapped"), os.O_RDWR)
    m = mmap.mmap(fd, 4096)
    m[0:6] = b"mapped"
    try:
        assert freeze(u, tmp_path / "f")[0] == 0
        with open(tmp_path / "f" / "mapped", "rb") as f:
            assert f.read(6) == b"mapped"
    finally:
        m.close()
        os.close(fd)


@holds_handles
def test_freeze_twice(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    before_freeze(u)
    f1, f2 = tmp_path / "f1", tmp_path / "f2"
    assert freeze(u, f1)[0] == 0
    after_freeze(u)
    held = os.open(u.path("dir/a"), os.O_WRONLY | os.O_APPEND)
    os.write(held, b"between\n")
    upper_then = snapshot_upper(u.upper)
    assert freeze(u, f2)[0] == 0
    assert snapshot_upper(str(f2)) == upper_then
    os.write(held, b"after the second\n")
    os.close(held)
    os.rename(u.path("new"), u.path("new2"))
    with open(u.path("dir/c"), "w") as f:
        f.write("c\n")
    assert snapshot_upper(str(f2)) == upper_then
    with open(u.path("dir/a")) as f:
        assert f.read() == "a\nappended before\nbetween\nafter the second\n"
    assert_stack_agrees(stratafs_only, u, [f2, f1], "2")


def frozen_bytes(u, newdir):
    """freeze NEWDIR: the bytes it answers the frozen layer allocates."""
    status, text = freeze(u, newdir)
    assert status == 0, text
    layer, count = text.rsplit(" ", 1)
    assert layer == f"layer={newdir}" and count.startswith("bytes="), text
    return int(count[len("bytes="):])


@holds_handles
def test_freeze_answers_what_the_layer_allocates(stratafs_only, tmp_path):
    """The answer's bytes= is the daemon's count at the freeze less its
    count of the fresh upper: what the frozen layer allocates, its blocks
    as a walk finds them, also for a second freeze, a path with a space,
    and a layer of a whiteout alone."""
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    before_freeze(u)
    with open(u.path("big"), "wb") as f:
        f.write(os.urandom(3 << 20))
    with open(u.path("sparse"), "wb") as f:  # a hole costs nothing
        f.truncate(8 << 20)
        f.seek(4 << 20)
        f.write(b"s" * 8192)
    with open(u.path("dir/a"), "a") as f:   # a copy-up, grown
        f.write("x" * 100000)
    os.link(u.path("big"), u.path("new/big-link"))
    first = tmp_path / "frozen one"
    counted = frozen_bytes(u, first)
    assert counted >= 3 << 20
    assert_layer_size(counted, first)
    # what the daemon counts now is the fresh upper and the workdir
    assert control_usage(u.sock)["used"] < 64 << 10

    with open(u.path("new/after"), "wb") as f:
        f.write(os.urandom(1 << 20))
    second = tmp_path / "f2"
    counted = frozen_bytes(u, second)
    assert (1 << 20) <= counted < (3 << 20)
    assert_layer_size(counted, second)

    os.unlink(u.path("keep"))
    counted = frozen_bytes(u, tmp_path / "f3")
    assert_layer_size(counted, tmp_path / "f3")


def test_root_acls_stay(stratafs_only, tmp_path):
    """The new upper's root has the ACLs the old one had, not those its
    parent directory's default ACL would give it."""
    def getfacl(path):
        return run(["getfacl", "-n", "--omit-header", path]).stdout

    u = mount(stratafs_only, tmp_path)
    run(["setfacl", "-m", "u:3001:r-x,d:u:3002:rwx", u.mnt])
    run(["setfacl", "-d", "-m", "u:3003:rwx", os.path.dirname(u.upper)])
    acl = getfacl(u.mnt)
    assert "user:3001:r-x" in acl and "default:user:3002:rwx" in acl
    assert freeze(u, tmp_path / "f1")[0] == 0
    assert getfacl(u.mnt) == acl == getfacl(u.upper)
    # and none where the old root had none
    run(["setfacl", "-b", "-k", u.mnt])
    plain = getfacl(u.mnt)
    assert freeze(u, tmp_path / "f2")[0] == 0
    assert getfacl(u.mnt) == plain == getfacl(u.upper)
    assert "3003" not in plain


def test_directories_frozen_over_and_over(stratafs_only, tmp_path):
    # directories whose layers outgrow their node's own room, some
    # changed between freezes and some not, over three freezes
    u = mount(stratafs_only, tmp_path)
    idle = [f"idle{i}" for i in range(8)]
    busy = [f"busy{i}" for i in range(8)]
    for d in idle + busy:
        os.mkdir(u.path(d))
        with open(u.path(d, "x"), "w") as f:
            f.write("x\n")
    layers = []
    for i in range(3):
        layers.insert(0, str(tmp_path / f"f{i}"))
        assert freeze(u, layers[0])[0] == 0
        for d in busy + (idle if i == 0 else []):
            with open(u.path(d, f"y{i}"), "w") as f:
                f.write(f"{i}\n")
    for d in idle + busy:
        assert "x" in os.listdir(u.path(d))
    merged = view(u.mnt)
    u.unmount()
    assert oracle(stratafs_only, u, layers + u.lowers, "dirs") == merged


@holds_handles
def test_writer_during_freeze_loses_nothing(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    path = u.path("log")
    stop = threading.Event()
    errors = []
    count = [0]

    def writer():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not stop.is_set():
                os.write(fd, b"%08d\n" % count[0])
                os.fsync(fd)
                count[0] += 1
        except OSError as e:
            errors.append(e)
        finally:
            os.close(fd)

    t = threading.Thread(target=writer)
    t.start()
    try:
        while count[0] < 50:
            time.sleep(0.01)
        for i in range(3):
            synced = count[0]
            assert drained_freeze(u, tmp_path / f"f{i}")[0] == 0
            # what was fsync'd before the freeze is in the frozen layer
            with open(tmp_path / f"f{i}" / "log", "rb") as f:
                assert len(f.read()) >= 9 * synced
            start = count[0]
            while count[0] < start + 20:
                time.sleep(0.01)
    finally:
        stop.set()
        t.join()
    assert errors == []
    with open(path, "rb") as f:
        assert f.read() == b"".join(b"%08d\n" % i for i in range(count[0]))


@pytest.mark.skipif(not supervised(), reason="needs the supervisor")
@holds_handles
def test_replaced_worker_keeps_the_new_stack(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    before_freeze(u)
    held = os.open(u.path("dir/a"), os.O_WRONLY | os.O_APPEND)
    old = worker_of(u)
    assert freeze(u, tmp_path / "f1")[0] == 0
    upper_then = snapshot_upper(str(tmp_path / "f1"))
    os.kill(old, signal.SIGKILL)
    new = worker_of(u, old)
    assert new != old
    # the handle opened before the freeze still writes, to the new upper
    os.write(held, b"after the kill\n")
    os.close(held)
    after_freeze(u)
    with open(u.path("after-kill"), "w") as f:
        f.write("x\n")
    assert snapshot_upper(str(tmp_path / "f1")) == upper_then
    assert os.path.exists(u.upath("after-kill"))
    assert control_call(u.sock, "ping")[1] == f"pong pid={new}"
    # and it freezes again, over the stack it took over
    assert freeze(u, tmp_path / "f2")[0] == 0
    # an upgrade in place (the supervisor execs itself) takes it over too
    os.kill(u.pid, signal.SIGHUP)
    newer = worker_of(u, new)
    with open(u.path("after-upgrade"), "w") as f:
        f.write("y\n")
    assert os.path.exists(u.upath("after-upgrade"))
    assert not os.path.exists(tmp_path / "f2" / "after-upgrade")
    assert control_call(u.sock, "ping")[1] == f"pong pid={newer}"
    assert freeze(u, tmp_path / "f3")[0] == 0
    assert "upgrade: serving the mount on, from this binary" in u.stderr()
    merged = view(u.mnt)
    layers = [str(tmp_path / f) for f in ("f3", "f2", "f1")] + u.lowers
    u.unmount()
    assert oracle(stratafs_only, u, layers, "k") == merged


def unchanged(u, upper_ino, newdir=None):
    """A refused freeze changed nothing: same upper, writes still there."""
    assert os.stat(u.upper).st_ino == upper_ino
    assert newdir is None or not os.path.lexists(newdir)
    with open(u.path("probe"), "a") as f:
        f.write("x")
    assert os.path.exists(u.upath("probe"))


def test_refusals_change_nothing(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path)
    upper_ino = os.stat(u.upper).st_ino
    before_freeze(u)
    view_then = view(u.mnt)

    status, text = freeze(u, "relative/dir")
    assert status == -errno.EINVAL and "not an absolute path" in text
    unchanged(u, upper_ino, "relative/dir")

    exists = tmp_path / "exists"
    exists.mkdir()
    status, text = freeze(u, exists)
    assert status == -errno.EEXIST and str(exists) in text
    assert os.listdir(exists) == []
    unchanged(u, upper_ino)

    missing = tmp_path / "no" / "such"
    status, text = freeze(u, missing)
    assert status == -errno.ENOENT and "parent" in text
    unchanged(u, upper_ino, missing)

    other = stratafs_only.mount_tmpfs("tmpfs")
    status, text = freeze(u, os.path.join(other, "f"))
    assert status == -errno.EXDEV and "another filesystem" in text
    unchanged(u, upper_ino, os.path.join(other, "f"))

    # inside the mount: another filesystem too, and no deadlock
    status, text = freeze(u, u.path("inside"))
    assert status == -errno.EXDEV
    unchanged(u, upper_ino, u.upath("inside"))

    status, text = freeze(u, "/")
    assert status == -errno.EINVAL
    status, text = control_call(u.sock, "freeze")
    assert status == -errno.EINVAL and "takes 1 to 1 arguments" in text

    # an index entry whose names cannot be found (test_freeze_hardlinks.py)
    junk = os.path.join(u.work, "index", "junk")
    with open(junk, "w"):
        pass
    status, text = freeze(u, tmp_path / "f")
    assert status == -errno.ESTALE and "index/junk has no origin" in text
    unchanged(u, upper_ino, tmp_path / "f")
    os.unlink(junk)

    os.unlink(u.path("probe"))
    assert view(u.mnt) == view_then
    assert freeze(u, tmp_path / "f")[0] == 0


def test_layer_limit(stratafs_only, tmp_path):
    # stratafs serves at most 128 lower layers (SFS_MAX_LOWERS)
    lowers = [{f"l{i}": f"{i}\n"} for i in range(127)]
    u = mount(stratafs_only, tmp_path, lowers=lowers)
    upper_ino = os.stat(u.upper).st_ino
    with open(u.path("l5"), "a") as f:
        f.write("changed\n")
    assert freeze(u, tmp_path / "f1")[0] == 0
    status, text = freeze(u, tmp_path / "f2")
    assert status == -errno.E2BIG and "128" in text
    assert not os.path.exists(tmp_path / "f2")
    assert os.stat(tmp_path / "f1").st_ino == upper_ino
    with open(u.path("l5")) as f:
        assert f.read() == "5\nchanged\n"


def test_read_only_mount_refused(stratafs_only, tmp_path):
    sock = str(tmp_path / "c.sock")
    u = stratafs_only.make([LOWER], readonly=True,
                           extra_opts=[f"control={sock}"])
    u.sock = sock
    status, text = freeze(u, tmp_path / "f")
    assert status == -errno.EROFS and "read-only" in text


@holds_handles
def test_a_request_that_does_not_end_refuses_the_freeze(stratafs_only,
                                                         tmp_path):
    """A handler waiting on something that is not coming soon (here a
    read of a lower layer on a stopped FUSE daemon) keeps the gate from
    closing: after the drain timeout the freeze is refused, the gate
    opens again and nothing changed; once the read ends it goes through."""
    slow = stratafs_only.make([{}])          # the lower layer's filesystem
    data = os.urandom(256 << 10)
    # put in behind slow's back: slow's page cache has none of it, so a
    # read must go to its daemon
    with open(os.path.join(slow.lowers[0], "big"), "wb") as f:
        f.write(data)
    u = mount(stratafs_only, tmp_path, lowers=[{}],
              layer_dirs=[slow.mnt], extra_opts=["nopassthrough"])
    os.stat(u.mnt)                           # INIT is answered
    upper_ino = os.stat(u.upper).st_ino
    fd = os.open(u.path("big"), os.O_RDONLY)
    up = os.open(u.path("up"), os.O_WRONLY | os.O_CREAT, 0o644)
    got = []
    reader = threading.Thread(target=lambda: got.append(os.pread(fd, len(data), 0)))
    os.killpg(slow.proc.pid, signal.SIGSTOP)
    try:
        reader.start()
        # the read is in u's daemon, waiting on slow's
        time.sleep(0.5)
        assert reader.is_alive()
        status, text = freeze(u, tmp_path / "f")
        assert status == -errno.EBUSY and "still in flight" in text, text
        assert reader.is_alive()
        # the gate opened again: requests that need nothing of the
        # stopped lower go through meanwhile
        os.write(up, b"written while the read waits")
        os.fsync(up)
    finally:
        os.killpg(slow.proc.pid, signal.SIGCONT)
    reader.join(60)
    os.close(fd)
    os.close(up)
    assert got == [data]
    unchanged(u, upper_ino, tmp_path / "f")
    assert freeze(u, tmp_path / "f")[0] == 0
    with open(tmp_path / "f" / "up", "rb") as f:
        assert f.read() == b"written while the read waits"


def test_passthrough_writer_refused(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["passthrough"])
    if not u.passthrough():
        pytest.skip("passthrough is not in effect here")
    upper_ino = os.stat(u.upper).st_ino
    with open(u.path("pt"), "w") as f:
        f.write("x")
    fd = os.open(u.path("pt"), os.O_WRONLY)
    r = None
    try:
        status, text = freeze(u, tmp_path / "f", released=False)
        assert status == -errno.EBUSY and "passthrough" in text
        unchanged(u, upper_ino, tmp_path / "f")
        # a reader's backing file is the upper one too, and a writer
        # opened after the freeze would be given it. Opened while the
        # writer is, so that it is surely a passthrough handle (alone,
        # it could meet the writer's RELEASE half done: then it is the
        # daemon's, which a freeze takes)
        r = os.open(u.path("pt"), os.O_RDONLY)
    finally:
        os.close(fd)
    try:
        for _ in range(200):        # until the writer's RELEASE is in
            status, text = freeze(u, tmp_path / "f", released=False)
            if "(0 for writing)" in text:
                break
            time.sleep(0.01)
        assert status == -errno.EBUSY and "(0 for writing)" in text
        unchanged(u, upper_ino, tmp_path / "f")
    finally:
        os.close(r)
    assert freeze(u, tmp_path / "f")[0] == 0
    with open(u.path("pt"), "a") as f:
        f.write("y")
    with open(tmp_path / "f" / "pt") as f:
        assert f.read() == "x"
    with open(u.path("pt")) as f:
        assert f.read() == "xy"


def churn(root, seed, stop, errors, done):
    """Metadata and data operations in a directory of its own, until
    STOP: each succeeds or the test fails."""
    n = 0
    try:
        os.makedirs(root, exist_ok=True)
        while not stop.is_set() or n < 40:
            name = os.path.join(root, f"f{n % 7}")
            with open(name, "ab") as f:
                f.write(b"%d:%d\n" % (seed, n))
            os.stat(name)
            os.listdir(root)
            if n % 3 == 0:
                os.rename(name, os.path.join(root, f"r{n % 5}"))
            if n % 4 == 0:
                os.makedirs(os.path.join(root, f"d{n % 3}"), exist_ok=True)
            if n % 5 == 0:
                for e in os.listdir(root):
                    if e.startswith("r") and (n // 5) % 2:
                        os.unlink(os.path.join(root, e))
            with open(os.path.join(root, "log"), "ab") as f:
                f.write(b"%d\n" % n)
                os.fsync(f.fileno())
            n += 1
    except OSError as e:
        errors.append(e)
    done.append((seed, n))


@holds_handles
def test_freezes_under_load(stratafs_only, tmp_path):
    u = mount(stratafs_only, tmp_path, extra_opts=["nopassthrough"])
    stop = threading.Event()
    errors, done = [], []
    threads = [threading.Thread(target=churn,
                                args=(u.path(f"t{i}"), i, stop, errors, done))
               for i in range(4)]
    for t in threads:
        t.start()
    layers = []
    try:
        for i in range(10):
            time.sleep(0.02)
            layers.insert(0, str(tmp_path / f"f{i}"))
            status, text = drained_freeze(u, layers[0])
            assert status == 0, text
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    for seed, n in done:
        with open(u.path(f"t{seed}", "log"), "rb") as f:
            assert f.read() == b"".join(b"%d\n" % i for i in range(n))
    merged = view(u.mnt)
    u.unmount()
    assert oracle(stratafs_only, u, layers + u.lowers, "load") == merged
