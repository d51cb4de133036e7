# SPDX-License-Identifier: Apache-2.0
"""Flattening (csi/flatten.c): a chain deeper than 16 layers gets its
topmost run of snapshot layers merged into one, in the background, and
the records switched atomically.

The oracle is the kernel's overlayfs mounted over the ORIGINAL chain (the
volume's upper on top, read-only): what a daemon staged afresh on the
flattened chain shows must be the same, entry for entry: types, modes,
owners, sizes and data, symlink targets, devices, xattrs, times, and
which names are one file."""

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time

import pytest

from csitest import Kubelet, poll, write_file
from snaptest import chain, clone, snap, snapshot_dirs
from test_metrics import free_port, scrape, value

DEPTH = 16            # CSI_FLATTEN_DEPTH
OPAQUE = "trusted.overlay.opaque"
REDIRECT = "trusted.overlay.redirect"
PRIVATE = ("trusted.overlay.", "user.overlay.")


# --------------------------------------------------------------------------
# what a volume's layers hold, written on disk in the kernel's format

def upper(p, vid, *parts):
    return p.path("volumes", vid, "upper", *parts)


def whiteout(path):
    os.mknod(path, stat.S_IFCHR, os.makedev(0, 0))


def layer_step(p, vid, i):
    """What snapshot I (1-based) freezes: files, deletions, opaque dirs,
    special files, written into the unstaged volume's upper."""
    u = lambda *a: upper(p, vid, *a)  # noqa: E731
    if i == 1:
        write_file(u("a.txt"), "a, first\n")
        os.chmod(u("a.txt"), 0o640)
        os.setxattr(u("a.txt"), "user.k", b"v1")
        os.makedirs(u("d1"))
        write_file(u("d1/x"), "x\n")
        write_file(u("d1/y"), "y\n")
        os.chown(u("d1/x"), 1234, 5678)
        write_file(u("hl1"), "one file, two names\n")
        os.link(u("hl1"), u("hl2"))
        os.symlink("a.txt", u("sym"))
        os.mkfifo(u("fifo"))
        os.mknod(u("null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(u("sparse"), "wb") as f:
            f.truncate(8 << 20)
            f.seek(4 << 20)
            f.write(b"middle")
        os.makedirs(u("gone/deep"))
        write_file(u("gone/deep/f"), "gone later\n")
    elif i == 2:
        whiteout(u("lower.txt"))          # hides the base layer's: kept
        os.makedirs(u("d1"))
        whiteout(u("d1/y"))               # hides only the run's: dropped
        write_file(u("a.txt"), "a, second\n")
        os.chmod(u("a.txt"), 0o600)
        whiteout(u("gone"))
    elif i == 3:
        os.makedirs(u("dir"))             # opaque over the base's dir/
        os.setxattr(u("dir"), OPAQUE, b"y")
        write_file(u("dir/new.txt"), "new in an opaque dir\n")
        os.makedirs(u("d1"))              # opaque over the run only
        os.setxattr(u("d1"), OPAQUE, b"y")
        write_file(u("d1/z"), "z\n")
    elif i == 4:
        os.makedirs(u("gone"))            # a new dir where one was deleted
        os.setxattr(u("gone"), OPAQUE, b"y")
        write_file(u("gone/new"), "new\n")
    else:
        write_file(u(f"n{i}.txt"), f"file of snapshot {i}\n")


def layer_dir(p, entry):
    if entry.startswith("@"):
        return p.path("snapshots", entry[1:], "layer")
    return p.path("layers", entry)


# --------------------------------------------------------------------------
# views

def _xattrs(path):
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    return {n: os.getxattr(path, n, follow_symlinks=False).hex()
            for n in sorted(names) if not n.startswith(PRIVATE)}


def view(root):
    """{relpath: fields} of a merged tree, and its groups of names of one file."""
    out, inodes = {}, {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            rec = {"mode": oct(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
                   "xattrs": _xattrs(path)}
            if not stat.S_ISDIR(st.st_mode):
                rec["mtime"] = st.st_mtime_ns
                rec["nlink"] = st.st_nlink
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    rec["sha"] = hashlib.sha256(f.read()).hexdigest()
                rec["size"] = st.st_size
                inodes.setdefault(st.st_ino, []).append(rel)
            elif stat.S_ISLNK(st.st_mode):
                rec["target"] = os.readlink(path)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                rec["rdev"] = st.st_rdev
            out[rel] = rec
    links = sorted(sorted(v) for v in inodes.values() if len(v) > 1)
    return out, links


def kernel_view(env, layers, name):
    """The kernel's overlayfs over LAYERS (top first), read-only."""
    mnt = os.path.join(env.base, "oracle-" + name)
    os.makedirs(mnt, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    "lowerdir=" + ":".join(layers), mnt], check=True)
    try:
        return view(mnt)
    finally:
        subprocess.run(["umount", mnt], check=True)


def original_view(env, p, vid, name):
    """The oracle over the volume's chain as it is now, its upper on top."""
    return kernel_view(env, [upper(p, vid)] + [layer_dir(p, e) for e in
                                                chain(p, vid)], name)


def assert_views(after, before):
    """Entry by entry, so that a difference says where."""
    a, b = after[0], before[0]
    # (names only there, names missing)
    assert (sorted(set(a) - set(b)), sorted(set(b) - set(a))) == ([], [])
    for rel in sorted(b):
        assert a[rel] == b[rel], rel
    assert after[1] == before[1]


def daemon_view(k, vid):
    """What a daemon staged afresh shows."""
    st = k.stage(vid, k.env.staging(vid + "-view"))
    try:
        return view(st)
    finally:
        k.unstage(vid, st)


# --------------------------------------------------------------------------
# helpers

def deepen(p, vid, first, last, keep=(), step=True):
    """Snapshots FIRST..LAST of the unstaged VID, each over its own
    changes (but the first without STEP: written already); deleted
    (hidden) unless their number is in KEEP. Returns {number: id}."""
    ids = {}
    for i in range(first, last + 1):
        if step or i > first:
            layer_step(p, vid, i)
        ids[i] = snap(p.csi, f"s{i}", vid)
        if i not in keep:
            assert p.csi.DeleteSnapshot(snapshot_id=ids[i]).code == "OK"
    return ids


def flattened(p, vid, depth=2):
    poll(lambda: len(chain(p, vid)) <= depth, 60,
         what=f"the chain of {vid} to be flattened")
    return chain(p, vid)


def snap_record(p, sid):
    with open(p.path("snapshots", sid, "snapshot.json")) as f:
        return json.load(f)


# --------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_unstaged_volume_is_flattened_and_reads_the_same(env, strata, kubelet):
    p, k = strata, kubelet
    vid = k.create("v")
    deepen(p, vid, 1, DEPTH - 1)
    assert len(chain(p, vid)) == DEPTH     # 15 snapshots + base: not yet
    layer_step(p, vid, DEPTH)
    before = original_view(env, p, vid, "before")
    old = [e for e in chain(p, vid) if e.startswith("@")]
    deepen(p, vid, DEPTH, DEPTH, step=False)   # 17 deep: past the threshold
    layers = flattened(p, vid)
    assert layers[1:] == ["base"] and layers[0].startswith("@"), layers
    rec = snap_record(p, layers[0][1:])
    assert rec["hidden"] and rec["chain"] == ["base"]
    assert rec["name"].startswith("flatten:")
    # the merged run kept only the markers that still act on the base
    flat = layer_dir(p, layers[0])
    assert os.stat(os.path.join(flat, "lower.txt"), follow_symlinks=False).st_rdev == 0
    assert not os.path.lexists(os.path.join(flat, "d1", "y"))
    assert os.getxattr(os.path.join(flat, "dir"), OPAQUE) == b"y"
    with pytest.raises(OSError):
        os.getxattr(os.path.join(flat, "d1"), OPAQUE)
    # sparse stayed sparse
    st = os.stat(os.path.join(flat, "sparse"))
    assert st.st_blocks * 512 < st.st_size
    after = daemon_view(k, vid)
    assert_views(after, before)
    assert before[1] == [["hl1", "hl2"]]
    # the deleted snapshots' layers went with their last user
    poll(lambda: [d for d in snapshot_dirs(p)
                  if "@" + d.removeprefix(".del-") in old] == [], 10,
         what="the old layers to be freed")
    assert not [d for d in snapshot_dirs(p) if d.startswith(".")]
    assert "flatten: volume " + vid in p.log()
    assert " layers merged into " + layers[0] in p.log()


@pytest.mark.timeout(240)
def test_clones_and_named_snapshots_share_the_run(env, strata, kubelet):
    """Named snapshots stay (a user can still clone them); their chains
    and the volume's take one flattened layer; clones made before keep
    reading what they read."""
    p, k = strata, kubelet
    vid = k.create("v")
    ids = deepen(p, vid, 1, DEPTH, keep=range(1, DEPTH + 1))
    s10 = ids[10]
    c10 = clone(p.csi, "c10", snapshot=s10).reply.volume.volume_id
    layer_step(p, vid, DEPTH + 1)
    before_v = original_view(env, p, vid, "v")
    before_c10 = original_view(env, p, c10, "c10")
    last = snap(p.csi, "last", vid)        # 17 snapshot layers + base
    cl = clone(p.csi, "clast", snapshot=last).reply.volume.volume_id
    flattened(p, vid, depth=3)
    poll(lambda: len(p.volume_record(cl)["layers"]) <= 3, 60,
         what="the clone's chain to take the flattened layer")
    # every named snapshot is still there, listed
    listed = {e.snapshot.snapshot_id for e in p.csi.ListSnapshots().reply.entries}
    assert set(ids.values()) | {last} <= listed
    assert_views(daemon_view(k, vid), before_v)
    assert_views(daemon_view(k, cl), before_v)
    assert chain(p, c10) == ["@" + s10] + [f"@{ids[i]}" for i in range(9, 0, -1)] + ["base"]
    assert_views(daemon_view(k, c10), before_c10)
    # a new clone of the newest snapshot starts shallow, and reads the same
    c2 = clone(p.csi, "c2", snapshot=last).reply.volume.volume_id
    assert len(chain(p, c2)) <= 4
    assert_views(daemon_view(k, c2), before_v)


@pytest.mark.timeout(240)
def test_staged_volume_waits_for_unstage(env, strata, kubelet, csi):
    """A daemon reads the old layers: its volume's record and every layer
    it names stay until it is unstaged; snapshots of it are flattened at
    once, and the volume right after the unstage."""
    p, k = strata, kubelet
    vid = k.create("v")
    st = k.stage(vid)
    ids = {}
    for i in range(1, DEPTH + 2):
        write_file(os.path.join(st, f"f{i}"), f"live {i}\n")
        if i == 3:
            os.unlink(os.path.join(st, "lower.txt"))
            os.unlink(os.path.join(st, "f2"))
        ids[i] = snap(csi, f"s{i}", vid)
        if i <= DEPTH:
            assert csi.DeleteSnapshot(snapshot_id=ids[i]).code == "OK"
    # the newest snapshot's chain (17 deep) is flattened while staged
    poll(lambda: len(snap_record(p, ids[DEPTH + 1])["chain"]) <= 2, 60,
         what="the snapshot's chain to be flattened")
    time.sleep(1)
    layers = chain(p, vid)
    assert len(layers) == DEPTH + 2        # the staged volume's: untouched
    for e in layers:                       # and every layer it reads: there
        assert os.path.isdir(layer_dir(p, e)), e
    live = view(st)
    before = original_view(env, p, vid, "staged")
    assert_views(live, before)
    k.unstage(vid, st)
    layers = flattened(p, vid, depth=3)
    after = daemon_view(k, vid)
    assert_views(after, before)
    # the hidden snapshots only the staged volume held are gone now
    poll(lambda: not {ids[i] for i in range(1, DEPTH + 1)} & set(snapshot_dirs(p)),
         10, what="the hidden snapshots' layers to be freed")
    # a clone of the newest snapshot reads what the volume read
    c = clone(csi, "c", snapshot=ids[DEPTH + 1]).reply.volume.volume_id
    assert_views(daemon_view(k, c), before)


FLATTEN_POINTS = ["flatten.built", "flatten.named", "flatten.switch"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("point", FLATTEN_POINTS)
def test_killed_while_flattening(env, strata, point):
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": point})
    k = Kubelet(env, p)
    vid = k.create("v")
    deepen(p, vid, 1, DEPTH - 1)
    layer_step(p, vid, DEPTH)
    before = original_view(env, p, vid, "before")
    r = p.csi.CreateSnapshot(name="last", source_volume_id=vid)
    # the snapshot is answered; the flatten after it kills the plugin
    assert r.code in ("OK", "UNAVAILABLE"), r
    poll(lambda: not p.alive(), 30, what="the plugin to die at " + point)
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    # the chain is whole at every step: the old one or the flattened one
    layers = flattened(p, vid)
    assert layers[1:] == ["base"]
    assert not [d for d in snapshot_dirs(p) if d.startswith(".")]
    assert_views(daemon_view(k, vid), before)
    # the run's layers go once the named snapshot whose chain holds
    # them does too: nothing but the flattened layer is left
    sid = [e.snapshot.snapshot_id for e in p.csi.ListSnapshots().reply.entries]
    assert p.csi.DeleteSnapshot(snapshot_id=sid[0]).code == "OK"
    assert snapshot_dirs(p) == [layers[0][1:]]


# --------------------------------------------------------------------------
# redirects: directories renamed through a staged volume's daemon, which
# writes them as the kernel does (fuse/dir.c: a name when the directory
# stays in its parent, else its absolute path in the view below), with a
# snapshot after each rename, so that the run's layers carry them

RENAME_BASE = {"lower.txt": "from the lower layer\n",
               "dir/inner.txt": "inner\n",
               "p/q/f": "in p/q\n",
               "o/x/f1": "in o/x\n"}


def rename_step(st, i):
    """What the staged volume ST does before snapshot I (1-based)."""
    at = lambda *a: os.path.join(st, *a)  # noqa: E731
    if i == 1:                            # renames within the run
        os.makedirs(at("r1"))
        write_file(at("r1", "a"), "a\n")
        os.makedirs(at("m"))
    elif i == 2:
        os.rename(at("r1"), at("r2"))
        write_file(at("r2", "b"), "b\n")
    elif i == 3:
        os.rename(at("r2"), at("m", "r3"))
    elif i == 4:                          # a base directory moved
        os.rename(at("dir"), at("m", "dir2"))
    elif i == 5:                          # out of a renamed directory
        os.rename(at("p"), at("p2"))
    elif i == 6:
        os.rename(at("p2", "q"), at("q2"))
    elif i == 7:                          # through an opaque directory
        shutil.rmtree(at("o"))
        os.makedirs(at("o", "x"))
        write_file(at("o", "x", "g"), "g\n")
    elif i == 8:
        os.rename(at("o", "x"), at("x2"))


def redirects(p, vid):
    """Every redirect the layers of VID's chain hold."""
    found = set()
    for e in chain(p, vid):
        for dirpath, dirs, _ in os.walk(layer_dir(p, e)):
            for d in dirs:
                try:
                    found.add(os.getxattr(os.path.join(dirpath, d), REDIRECT).decode())
                except OSError as err:
                    assert err.errno == errno.ENODATA
    return found


def deepen_staged(p, vid, last):
    """Snapshots 1..LAST of the staged VID, each deleted (hidden)."""
    for i in range(1, last + 1):
        sid = snap(p.csi, f"s{i}", vid)
        assert p.csi.DeleteSnapshot(snapshot_id=sid).code == "OK"


@pytest.mark.timeout(240)
def test_redirects_are_followed(env):
    p = env.plugin(root=env.new_root(layers={"base": RENAME_BASE}))
    k = Kubelet(env, p)
    vid = k.create("v")
    st = k.stage(vid)
    for i in range(1, DEPTH + 1):
        rename_step(st, i)
        deepen_staged(p, vid, 1)
    # the daemon's redirects, relative and absolute, some through others
    assert {"r1", "/r2", "/dir", "p", "/p2/q", "/o/x"} <= redirects(p, vid)
    before = original_view(env, p, vid, "before")
    assert_views(view(st), before)       # the daemon agrees
    names = before[0]
    assert {"m/r3/a", "m/r3/b", "m/dir2/inner.txt", "q2/f", "x2/g"} <= set(names)
    assert not {"r1", "r2", "dir", "p", "p2/q", "o/x", "x2/f1"} & set(names)
    k.unstage(vid, st)
    layers = flattened(p, vid)
    assert layers[1:] == ["base"]
    assert_views(daemon_view(k, vid), before)


@pytest.mark.timeout(240)
def test_whiteouts_through_a_redirect_below_the_run(env):
    """The layers below the run reach c/b/ through a redirect: a file
    deleted there in the run stays deleted once the run is merged."""
    p = env.plugin(root=env.new_root(layers={
        "base": {"a/f": "f\n", "a/g": "g\n"}}))
    k = Kubelet(env, p)
    # an admin's layer made of a volume's upper, a/ moved to c/b/ in it
    v0 = k.create("v0")
    st = k.stage(v0)
    os.makedirs(os.path.join(st, "c"))
    os.rename(os.path.join(st, "a"), os.path.join(st, "c", "b"))
    k.unstage(v0, st)
    subprocess.run(["cp", "-a", upper(p, v0), p.path("layers", "moved")],
                   check=True)
    assert os.getxattr(p.path("layers", "moved", "c", "b"), REDIRECT) == b"/a"
    vid = k.create("v", layers="moved,base")
    st = k.stage(vid)
    os.unlink(os.path.join(st, "c", "b", "f"))
    deepen_staged(p, vid, DEPTH - 1)
    assert chain(p, vid)[-2:] == ["moved", "base"]
    before = original_view(env, p, vid, "before")
    assert "c/b/g" in before[0] and "c/b/f" not in before[0]
    k.unstage(vid, st)
    layers = flattened(p, vid, depth=3)
    assert layers[1:] == ["moved", "base"]
    assert_views(daemon_view(k, vid), before)


# --------------------------------------------------------------------------
# room on the store

def fill_store(p, leave):
    """A file taking all of the store's room but LEAVE bytes."""
    filler = os.path.join(p.root, "filler")
    sv = os.statvfs(p.root)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, sv.f_bavail * sv.f_frsize - leave)
    finally:
        os.close(fd)
    return filler


@pytest.mark.timeout(180)
def test_no_room_puts_the_flatten_off(env):
    """Room for the merged run, not for it and the reserve kept for the
    volumes' writes (5% of the store): no merge starts, the chain stays,
    the log says why; the first round with room merges it."""
    p = env.plugin(root=env.tmpfs_root(size="400m", layers={
        "base": {"lower.txt": "from the lower layer\n"}}))
    k = Kubelet(env, p)
    vid = k.create("v")
    with open(upper(p, vid, "big"), "wb") as f:
        f.write(os.urandom(20 << 20))
    deepen(p, vid, 2, DEPTH - 1)
    # the run allocates 20 MiB and a little; the reserve is 20 MiB
    filler = fill_store(p, 30 << 20)
    old = chain(p, vid)
    deepen(p, vid, DEPTH, DEPTH + 1)
    poll(lambda: "put off" in p.log(), 60, what="the flatten to be put off")
    line = [ln for ln in p.log().splitlines() if "put off" in ln][0]
    assert f"flatten of volume {vid} put off: needs " in line
    assert "the store has " in line
    layers = chain(p, vid)
    assert layers[2:] == old
    # a frozen layer never changes: its size is walked once, not at each
    # round that puts the merge off. Seen by growing one behind the
    # plugin's back: the next round (an unstage kicks one) needs the same
    need = re.search(r"needs (\d+) bytes", line).group(1)
    extra = os.path.join(layer_dir(p, layers[0]), "extra")
    with open(extra, "wb") as f:
        f.write(os.urandom(1 << 20))
    other = k.create("w")
    k.unstage(other, k.stage(other))
    mine = f"flatten of volume {vid} put off: needs "
    poll(lambda: p.log().count(mine) >= 2, 60, what="a second round")
    again = [ln for ln in p.log().splitlines() if mine in ln][1]
    assert re.search(r"needs (\d+) bytes", again).group(1) == need, again
    os.unlink(extra)
    assert not [d for d in snapshot_dirs(p) if d.startswith(".")]
    assert "failed after" not in p.log()
    before = original_view(env, p, vid, "before")
    os.unlink(filler)
    deepen(p, vid, DEPTH + 2, DEPTH + 2, step=False)    # a round
    # (the newest snapshot's chain may be merged first: the volume
    # takes that layer, and sits on its own over it)
    assert flattened(p, vid, depth=3)[-1] == "base"
    assert_views(daemon_view(k, vid), before)


@pytest.mark.timeout(180)
def test_out_of_inodes_fails_cleanly(env):
    """A merge that runs out of inodes halfway: nothing of it is left,
    the chain stays, the failure is counted, the volume reads the same."""
    addr = f"127.0.0.1:{free_port()}"
    p = env.plugin(root=env.tmpfs_root(size="200m", layers={
        "base": {"lower.txt": "from the lower layer\n"}}),
        extra=["--metrics-address", addr])
    k = Kubelet(env, p)
    vid = k.create("v")
    os.makedirs(upper(p, vid, "many"))
    for i in range(400):
        write_file(upper(p, vid, "many", f"f{i}"), f"{i}\n", sync=False)
    deepen(p, vid, 2, DEPTH - 1)
    # inodes for a snapshot, not for the 400 files the merge makes
    sv = os.statvfs(p.root)
    subprocess.run(["mount", "-o", "remount,nr_inodes=%d" %
                    (sv.f_files - sv.f_ffree + 100), p.root], check=True)
    old = chain(p, vid)
    deepen(p, vid, DEPTH, DEPTH + 1)
    poll(lambda: "failed after" in p.log(), 60, what="the flatten to fail")
    assert "No space left on device" in p.log()
    layers = chain(p, vid)
    assert layers[2:] == old
    assert not [d for d in snapshot_dirs(p) if d.startswith(".")]
    for e in layers:
        assert os.path.isdir(layer_dir(p, e)), e
    _, samples = scrape(addr)
    assert value(samples, "strata_csi_flatten_failures_total") == 1
    assert value(samples, "strata_csi_flattens_total") == 0
    before = original_view(env, p, vid, "before")
    assert "many/f399" in before[0]
    assert_views(daemon_view(k, vid), before)
