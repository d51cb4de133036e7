"""The store under faults: a full filesystem while the plugin writes its
records, and records damaged on disk. Each gets a clear status, nothing
half made is left behind, and the plugin goes on serving."""

import errno
import os

from csitest import Kubelet, STRATAFS_FSTYPE, cap, is_mounted, mounts_under

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
