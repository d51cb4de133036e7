# SPDX-License-Identifier: Apache-2.0
"""The store under faults: a full filesystem while the plugin writes its
records, records damaged on disk, a lower layer removed under a staged
volume, and the store turned read-only. Each gets a clear status (or,
for the layer, a clear line in the log), nothing half made is left
behind, and the plugin goes on serving."""

import errno
import os
import shutil
import signal
import subprocess
import time

import pytest

from csitest import (EPH, Kubelet, STRATAFS_FSTYPE, answers, cap, daemons_of,
                     is_mounted, mounts_under, poll, write_file)

LAYERS = {"base": {"lower.txt": "from the lower layer\n"}}


def fill(root):
    """Fills the filesystem under root; returns the filler file's path."""
    path = os.path.join(root, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096):
            try:
                while True:
                    os.write(fd, b"\1" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    return path


def store_entries(p):
    """Every name under volumes/ and node/, hidden ones included."""
    return sorted(os.listdir(p.path("volumes")) + os.listdir(p.path("node")))


def fuse_mounts(env):
    return [m for m in mounts_under(env.base) if m["fstype"] == STRATAFS_FSTYPE]


def test_create_volume_on_a_full_store(env):
    p = env.plugin(root=env.tmpfs_root(size="8m", layers=LAYERS))
    before = store_entries(p)
    filler = fill(p.root)
    r = p.csi.CreateVolume(name="full", volume_capabilities=[cap()],
                           parameters={"layers": "base"})
    assert r.code == "RESOURCE_EXHAUSTED", r
    assert "No space left" in r.details, r
    assert store_entries(p) == before, "a half-made volume was left"
    os.unlink(filler)
    r = p.csi.CreateVolume(name="full", volume_capabilities=[cap()],
                           parameters={"layers": "base"})
    assert r.code == "OK", r
    assert store_entries(p) == sorted(before + [r.reply.volume.volume_id])


def test_stage_on_a_full_store(env):
    p = env.plugin(root=env.tmpfs_root(size="8m", layers=LAYERS))
    kube = Kubelet(env, p)
    vid = kube.create("vol")
    filler = fill(p.root)
    st = env.staging("full")
    r = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                              volume_capability=cap())
    assert r.code == "RESOURCE_EXHAUSTED", r
    assert not is_mounted(st) and fuse_mounts(env) == []
    assert p.node_record(vid) is None
    os.unlink(filler)
    kube.stage(vid, st)
    assert is_mounted(st, STRATAFS_FSTYPE)


def test_damaged_volume_record(env):
    p = env.plugin(root=env.tmpfs_root(size="64m", layers=LAYERS))
    kube = Kubelet(env, p)
    bad, good = kube.create("bad"), kube.create("good")
    damaged = '{"id": "truncated'
    with open(p.path("volumes", bad, "volume.json"), "w") as f:
        f.write(damaged)
    # every RPC that needs the record says which volume and why
    st = env.staging("bad")
    r = p.csi.NodeStageVolume(volume_id=bad, staging_target_path=st,
                              volume_capability=cap())
    assert r.code == "INTERNAL" and bad in r.details and "Bad message" in r.details, r
    assert not is_mounted(st)
    r = p.csi.ValidateVolumeCapabilities(volume_id=bad, volume_capabilities=[cap()])
    assert r.code == "INTERNAL" and bad in r.details, r
    # the others are untouched, and listed; also after a restart, which
    # leaves the damaged record as it is
    r = p.csi.ListVolumes()
    assert r.code == "OK" and [e.volume.volume_id for e in r.reply.entries] == [good], r
    p.restart()
    Kubelet(env, p).stage(good, env.staging("good"))
    assert open(p.path("volumes", bad, "volume.json")).read() == damaged
    # and a damaged record does not keep the volume from being deleted
    assert p.csi.DeleteVolume(volume_id=bad).code == "OK"
    assert not os.path.exists(p.path("volumes", bad))


def test_damaged_node_record_fails_closed(env, strata, kubelet, csi):
    """A node record that cannot be read may be the one saying "staged":
    DeleteVolume, unpublish and unstage refuse, naming it, and delete or
    unmount nothing."""
    vid = kubelet.create("staged")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    path = strata.path("node", vid + ".json")
    good = open(path).read()
    with open(path, "w") as f:
        f.write('{"volume_id": "' + vid + '", "staging_pa')
    for call, kw in (("DeleteVolume", {}),
                     ("NodeUnpublishVolume", {"target_path": tgt}),
                     ("NodeUnstageVolume", {"staging_target_path": st})):
        r = csi.call(call, volume_id=vid, **kw)
        assert r.code == "INTERNAL", (call, r)
        assert path in r.details and "cannot be read" in r.details, (call, r)
    assert os.path.isdir(strata.path("volumes", vid, "upper"))
    assert is_mounted(st, STRATAFS_FSTYPE) and is_mounted(tgt, STRATAFS_FSTYPE)
    with open(path, "w") as f:
        f.write(good)
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)
    kubelet.delete(vid)


def test_delete_refused_while_a_daemon_serves_the_volume(env, strata, kubelet, csi):
    """Whatever the records say, a volume whose daemon still runs (here:
    its node record lost) is not deleted under it."""
    vid = kubelet.create("served")
    st = kubelet.stage(vid)
    os.unlink(strata.path("node", vid + ".json"))
    r = csi.DeleteVolume(volume_id=vid)
    assert r.code == "FAILED_PRECONDITION" and "still served" in r.details, r
    assert os.path.isdir(strata.path("volumes", vid, "upper"))
    assert is_mounted(st, STRATAFS_FSTYPE)


def count(text, needle):
    return text.count(needle)


@pytest.mark.timeout(120)
def test_lower_layer_removed_while_staged(env):
    """A layer removed, or renamed away, under a staged volume: calls on
    its files fail, nothing crashes, and the plugin logs the condition
    once, and once more when it ends. (The CSI VolumeCondition that would
    report it to the CO comes with issue 13.)"""
    p = env.plugin(root=env.new_root("root", layers={
        "top": {"seen.txt": "seen\n", "unseen.txt": "unseen\n",
                "sub/deep.txt": "deep\n"},
        "base": {"lower.txt": "from the lower layer\n"}}))
    k = Kubelet(env, p)
    both, plain, later = (k.create("both", layers="top,base"),
                          k.create("plain", layers="base"),
                          k.create("later", layers="top"))
    tb = k.publish(both, k.stage(both, env.staging("both")), env.target("both"))
    tp = k.publish(plain, k.stage(plain, env.staging("plain")), env.target("plain"))
    assert open(os.path.join(tb, "seen.txt")).read() == "seen\n"
    pid = p.daemon_pid(both)

    shutil.rmtree(p.path("layers", "top"))
    abnormal = f"volume {both} is abnormal: its lower layer 'top' was removed"
    poll(lambda: abnormal in p.log(), 10, what="the condition in the log")
    with pytest.raises(OSError) as e:
        open(os.path.join(tb, "unseen.txt")).read()
    assert e.value.errno == errno.ENOENT, e.value
    with pytest.raises(OSError):
        os.listdir(os.path.join(tb, "sub"))
    # what is not the layer's still works: the base, and writes
    assert open(os.path.join(tb, "lower.txt")).read() == "from the lower layer\n"
    write_file(os.path.join(tb, "new.txt"), "written after\n")
    assert open(os.path.join(tb, "new.txt")).read() == "written after\n"
    assert p.daemon_pid(both) == pid and answers(tb)
    # logged once, not every round; the other volume is well
    time.sleep(2.5)
    assert count(p.log(), abnormal) == 1, p.log()
    assert f"volume {plain} is abnormal" not in p.log()
    # a volume over the missing layer is not staged
    r = p.csi.NodeStageVolume(volume_id=later, staging_target_path=env.staging("later"),
                              volume_capability=cap())
    assert r.code == "FAILED_PRECONDITION" and "layer 'top'" in r.details, r

    # renamed away: the daemon keeps serving what it was given
    os.rename(p.path("layers", "base"), p.path("layers", "base.old"))
    gone = f"volume {plain} is abnormal: its lower layer 'base' is gone from"
    poll(lambda: gone in p.log(), 10, what="the rename in the log")
    assert open(os.path.join(tp, "lower.txt")).read() == "from the lower layer\n"
    os.rename(p.path("layers", "base.old"), p.path("layers", "base"))
    poll(lambda: f"volume {plain}: its lower layers are as they were staged again"
         in p.log(), 10, what="the end of the condition in the log")
    assert count(p.log(), gone) == 1

    for vid, tgt in ((both, tb), (plain, tp)):
        k.unpublish(vid, tgt)
        k.unstage(vid, env.staging("both" if vid == both else "plain"))
    poll(lambda: not daemons_of(p.root), 10, what="the daemons to exit")
    assert [m for m in mounts_under(env.base) if m["fstype"] == STRATAFS_FSTYPE] == []


def remount_ro_killing_daemons(p):
    """The store's tmpfs read-only. A daemon holds its log and statistics
    files open for writing, and the kernel refuses to make a filesystem
    read-only under such files: the daemons are killed (the watcher's
    heals restart them, and are killed too) until the remount succeeds."""
    for _ in range(200):
        for pid in daemons_of(p.root):
            os.kill(pid, signal.SIGKILL)
        if subprocess.run(["mount", "-o", "remount,ro", p.root],
                          stderr=subprocess.DEVNULL).returncode == 0:
            return
        time.sleep(0.05)
    holders = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
                if t.startswith(p.root):
                    flags = open(f"/proc/{pid}/fdinfo/{fd}").read().split()[3]
                    holders.append((pid, t, flags))
            for line in open(f"/proc/{pid}/maps"):
                if p.root in line:
                    holders.append((pid, line.strip()))
        except OSError:
            pass
    raise AssertionError(f"{p.root} could not be made read-only: {holders}")


@pytest.mark.timeout(120)
def test_read_only_store(env):
    """The store turned read-only under a running plugin, whose daemons
    died: every call that must write (a heal too) answers
    FAILED_PRECONDITION naming the store, and changes nothing; once it is
    writable again, the volumes are healed and all works."""
    p = env.plugin(root=env.tmpfs_root(size="64m", layers=LAYERS))
    k = Kubelet(env, p)
    pub, staged, cold = k.create("pub"), k.create("staged"), k.create("cold")
    st_pub = k.stage(pub, env.staging("pub"))
    tgt = k.publish(pub, st_pub, env.target("pub"))
    write_file(os.path.join(tgt, "kept"), "before\n")
    st_staged = k.stage(staged, env.staging("staged"))
    before = (store_entries(p), sorted(m["mountpoint"] for m in mounts_under(env.base)))
    remount_ro_killing_daemons(p)
    try:
        r = p.csi.Probe()
        assert r.code == "FAILED_PRECONDITION" and "Read-only" in r.details, r
        calls = [
            ("CreateVolume", dict(name="new", volume_capabilities=[cap()],
                                  parameters={"layers": "base"})),
            ("DeleteVolume", dict(volume_id=cold)),
            ("NodeStageVolume", dict(volume_id=cold, volume_capability=cap(),
                                     staging_target_path=env.staging("cold"))),
            # staged already, but its daemon is dead: a heal would write
            ("NodeStageVolume", dict(volume_id=pub, volume_capability=cap(),
                                     staging_target_path=st_pub)),
            ("NodePublishVolume", dict(volume_id=staged, volume_capability=cap(),
                                       staging_target_path=st_staged,
                                       target_path=env.target("staged"))),
            ("NodePublishVolume", dict(volume_id="csi-" + "ab" * 16,
                                       volume_capability=cap(),
                                       target_path=env.target("inline"),
                                       volume_context={EPH: "true"})),
            ("NodeUnpublishVolume", dict(volume_id=pub, target_path=tgt)),
            ("NodeUnstageVolume", dict(volume_id=staged,
                                       staging_target_path=st_staged)),
        ]
        for method, kw in calls:
            r = p.csi.call(method, **kw)
            assert r.code == "FAILED_PRECONDITION", (method, r)
            assert f"the store {p.root} is on a read-only filesystem" in r.details, \
                (method, r)
            assert "nothing was changed" in r.details, (method, r)
        # deleting what is not there writes nothing: done
        assert p.csi.DeleteVolume(volume_id="sv-" + "0" * 32).code == "OK"
        # the watcher's heals fail too, and say why
        poll(lambda: "healing failed" in p.log() and "Read-only" in p.log(), 10,
             what="the failed heal in the log")
        after = (store_entries(p), sorted(m["mountpoint"] for m in mounts_under(env.base)))
        assert after == before, "a call changed something on a read-only store"
        assert not os.path.exists(env.target("staged"))
        assert not os.path.exists(env.target("inline"))
        assert daemons_of(p.root) == []
    finally:
        subprocess.run(["mount", "-o", "remount,rw", p.root], check=True)
    assert p.csi.Probe().code == "OK"
    poll(lambda: answers(tgt), 20, what="the heal once the store is writable")
    assert open(os.path.join(tgt, "kept")).read() == "before\n"
    tgt2 = k.publish(staged, st_staged, env.target("staged"))
    write_file(os.path.join(tgt2, "f"), "writable again\n")
    k.unpublish(staged, tgt2)
    k.unpublish(pub, tgt)
    k.unstage(staged, st_staged)
    k.unstage(pub, st_pub)
    for vid in (pub, staged, cold):
        k.delete(vid)
    assert [n for n in store_entries(p) if not n.endswith(".log")] == []
