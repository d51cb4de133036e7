# SPDX-License-Identifier: Apache-2.0
"""CreateVolume with a VolumeContentSource through the real plugin: clones
of snapshots and of volumes see the source's data and are independent of
it, the spec's codes, idempotency with the source, and reference-counted
layers: a deleted snapshot in use is hidden, and goes with its last user."""

import os

import pytest

from csitest import MiB, cap, pb
from snaptest import chain, clone, contents, fill, snap, snapshot_dirs


def test_clone_of_a_snapshot(csi, kubelet, strata):
    src = kubelet.create("src")
    fill(kubelet, src, {"f": "v1\n"})
    sid = snap(csi, "s", src)
    r = clone(csi, "c", snapshot=sid)
    assert r.code == "OK", r
    vol = r.reply.volume
    assert vol.content_source.snapshot.snapshot_id == sid
    cid = vol.volume_id
    assert chain(strata, cid) == ["@" + sid, "base"]
    # the chain as users name it, not the record's "@<id>"
    assert dict(vol.volume_context)["layers"] == "snapshot:%s,base" % sid
    assert contents(kubelet, cid, ["f", "lower.txt"])["f"] == "v1\n"
    # writes on either side stay there
    fill(kubelet, cid, {"f": "clone\n", "c-only": "c\n"})
    fill(kubelet, src, {"f": "source\n", "s-only": "s\n"})
    names = ["f", "c-only", "s-only"]
    assert contents(kubelet, cid, names) == {"f": "clone\n", "c-only": "c\n",
                                             "s-only": None}
    assert contents(kubelet, src, names) == {"f": "source\n", "c-only": None,
                                             "s-only": "s\n"}
    # and a second clone of the snapshot still sees it as it was
    r = clone(csi, "c2", snapshot=sid)
    assert contents(kubelet, r.reply.volume.volume_id, names) == {
        "f": "v1\n", "c-only": None, "s-only": None}


def test_clone_of_a_volume(csi, kubelet, strata):
    src = kubelet.create("src")
    fill(kubelet, src, {"f": "v1\n"})
    r = clone(csi, "c", volume=src)
    assert r.code == "OK", r
    assert r.reply.volume.content_source.volume.volume_id == src
    cid = r.reply.volume.volume_id
    # a hidden snapshot under both, in no list
    (top,) = [e for e in chain(strata, cid) if e.startswith("@")]
    assert chain(strata, src)[0] == top
    ctx = dict(r.reply.volume.volume_context)
    assert ctx["layers"] == "snapshot:%s,base" % top[1:], ctx
    (listed,) = [e.volume for e in csi.ListVolumes().reply.entries
                 if e.volume.volume_id == cid]
    assert dict(listed.volume_context) == ctx
    assert list(csi.ListSnapshots().reply.entries) == []
    assert csi.GetSnapshot(snapshot_id=top[1:]).code == "NOT_FOUND"
    assert clone(csi, "x", snapshot=top[1:]).code == "NOT_FOUND"
    fill(kubelet, cid, {"f": "clone\n"})
    fill(kubelet, src, {"g": "source\n"})
    assert contents(kubelet, cid, ["f", "g"]) == {"f": "clone\n", "g": None}
    assert contents(kubelet, src, ["f", "g"]) == {"f": "v1\n", "g": "source\n"}
    # a clone of the clone
    r = clone(csi, "cc", volume=cid)
    assert r.code == "OK", r
    assert contents(kubelet, r.reply.volume.volume_id, ["f"]) == {"f": "clone\n"}
    # the hidden snapshot goes with the last of its users
    for v in (src, r.reply.volume.volume_id, cid):
        kubelet.delete(v)
    assert snapshot_dirs(strata) == []


def test_missing_sources(csi, kubelet, strata):
    before = snapshot_dirs(strata)
    r = clone(csi, "c", snapshot="ss-" + "1" * 32)
    assert r.code == "NOT_FOUND" and "no such snapshot" in r.details, r
    r = clone(csi, "c", volume="sv-" + "1" * 32)
    assert r.code == "NOT_FOUND" and "no such volume" in r.details, r
    r = clone(csi, "c", snapshot="")
    assert r.code == "INVALID_ARGUMENT", r
    r = clone(csi, "c")
    assert r.code == "INVALID_ARGUMENT" and "neither" in r.details, r
    assert os.listdir(strata.path("volumes")) == []
    assert snapshot_dirs(strata) == before


def test_capacity_against_the_source(csi, kubelet, strata):
    src = kubelet.create("src", capacity=64 * MiB)
    sid = snap(csi, "s", src)
    rng = pb().CapacityRange
    for kw in ({"snapshot": sid}, {"volume": src}):
        r = clone(csi, "small", capacity_range=rng(required_bytes=32 * MiB), **kw)
        assert r.code == "OUT_OF_RANGE" and str(64 * MiB) in r.details, r
        r = clone(csi, "small", capacity_range=rng(limit_bytes=32 * MiB), **kw)
        assert r.code == "OUT_OF_RANGE", r
    r = clone(csi, "same", snapshot=sid)
    assert r.code == "OK" and r.reply.volume.capacity_bytes == 64 * MiB, r
    r = clone(csi, "big", capacity_range=rng(required_bytes=128 * MiB), volume=src)
    assert r.code == "OK" and r.reply.volume.capacity_bytes == 128 * MiB, r


def test_idempotency_includes_the_source(csi, kubelet, strata):
    a = kubelet.create("a")
    b = kubelet.create("b")
    sa = snap(csi, "sa", a)
    sb = snap(csi, "sb", b)
    r1 = clone(csi, "c", snapshot=sa)
    r2 = clone(csi, "c", snapshot=sa)
    assert r1.code == r2.code == "OK"
    assert r1.reply.volume.volume_id == r2.reply.volume.volume_id
    for kw in ({"snapshot": sb}, {"volume": a}):
        r = clone(csi, "c", **kw)
        assert r.code == "ALREADY_EXISTS", r
    # a plain volume of that name is another volume too
    # and no class can name a snapshot's layer as if it were a layer
    r = csi.CreateVolume(name="c", volume_capabilities=[cap()],
                         parameters={"layers": "@" + sa + ",base"})
    assert r.code == "INVALID_ARGUMENT" and "malformed" in r.details, r
    vc = clone(csi, "vc", volume=a)
    assert vc.code == "OK"
    n = len(chain(strata, a))
    again = clone(csi, "vc", volume=a)
    assert again.reply.volume.volume_id == vc.reply.volume.volume_id
    assert len(chain(strata, a)) == n  # no second freeze for the retry


def test_layers_parameter_must_match_the_source(csi, kubelet):
    src = kubelet.create("src", layers="base")
    sid = snap(csi, "s", src)
    r = clone(csi, "c", snapshot=sid, parameters={"layers": "extra"})
    assert r.code == "INVALID_ARGUMENT" and "layers" in r.details, r
    r = clone(csi, "c", volume=src, parameters={"layers": "base,extra"})
    assert r.code == "INVALID_ARGUMENT", r
    r = clone(csi, "c", snapshot=sid, parameters={"layers": "base"})
    assert r.code == "OK", r


def test_deleted_snapshot_in_use_is_hidden_until_unused(csi, kubelet, strata):
    src = kubelet.create("src")
    fill(kubelet, src, {"f": "v1\n"})
    sid = snap(csi, "s", src)
    kubelet.delete(src)  # the snapshot does not need its source
    r = clone(csi, "c", snapshot=sid)
    assert r.code == "OK", r
    cid = r.reply.volume.volume_id
    assert csi.DeleteSnapshot(snapshot_id=sid).code == "OK"
    assert csi.GetSnapshot(snapshot_id=sid).code == "NOT_FOUND"
    assert list(csi.ListSnapshots().reply.entries) == []
    assert clone(csi, "c2", snapshot=sid).code == "NOT_FOUND"
    # a retry of the clone that was made finds it all the same
    again = clone(csi, "c", snapshot=sid)
    assert again.code == "OK" and again.reply.volume.volume_id == cid, again
    assert snapshot_dirs(strata) == [sid]
    assert contents(kubelet, cid, ["f"]) == {"f": "v1\n"}
    kubelet.delete(cid)
    assert snapshot_dirs(strata) == []


def test_hidden_snapshots_go_transitively(csi, kubelet, strata):
    """s1 under s2's chain: deleting s1 keeps it (s2 names it), deleting
    s2 then removes both."""
    v = kubelet.create("v")
    fill(kubelet, v, {"one": "1\n"})
    s1 = snap(csi, "s1", v)
    fill(kubelet, v, {"two": "2\n"})
    s2 = snap(csi, "s2", v)
    kubelet.delete(v)
    assert csi.DeleteSnapshot(snapshot_id=s1).code == "OK"
    assert sorted(snapshot_dirs(strata)) == sorted([s1, s2])
    r = clone(csi, "c", snapshot=s2)
    assert contents(kubelet, r.reply.volume.volume_id, ["one", "two"]) == {
        "one": "1\n", "two": "2\n"}
    kubelet.delete(r.reply.volume.volume_id)
    assert sorted(snapshot_dirs(strata)) == sorted([s1, s2])
    assert csi.DeleteSnapshot(snapshot_id=s2).code == "OK"
    assert snapshot_dirs(strata) == []


@pytest.mark.timeout(180)
def test_clone_of_a_deep_volume_is_refused(csi, kubelet, strata):
    """A volume staged all along keeps its chain (flattened at unstage)."""
    v = kubelet.create("v")
    st = kubelet.stage(v)
    for i in range(63):
        snap(csi, f"d{i}", v)
    r = clone(csi, "c", volume=v)
    assert r.code == "RESOURCE_EXHAUSTED" and "64" in r.details, r
    # a snapshot's clone is as deep as the snapshot's chain: allowed (and
    # that chain may be flattened already)
    last = csi.ListSnapshots().reply.entries
    deepest = max(last, key=lambda e: (e.snapshot.creation_time.seconds,
                                       e.snapshot.creation_time.nanos))
    r = clone(csi, "c", snapshot=deepest.snapshot.snapshot_id)
    assert r.code == "OK", r
    assert 2 <= len(chain(strata, r.reply.volume.volume_id)) <= 64
    kubelet.unstage(v, st)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ["snapshot.upper", "snapshot.named",
                                   "create.build", "create.done"])
def test_clone_of_a_volume_killed(env, strata, point):
    """The plugin killed while cloning a volume: after a restart and the
    retry, there is one clone holding the source's data, the source lost
    nothing, and nothing half made is left."""
    from csitest import Kubelet, poll
    k = Kubelet(env, strata)
    src = k.create("src")
    fill(k, src, {"f": "v1\n"})
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": point})
    k = Kubelet(env, p)
    r = clone(p.csi, "c", volume=src)
    assert r.code == "UNAVAILABLE", r
    poll(lambda: not p.alive(), 10, what="the plugin to die at " + point)
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    assert not [d for d in snapshot_dirs(p) if d.startswith(".")]
    assert not [d for d in os.listdir(p.path("volumes")) if d.startswith(".")]
    r = clone(p.csi, "c", volume=src)
    assert r.code == "OK", r
    cid = r.reply.volume.volume_id
    assert clone(p.csi, "c", volume=src).reply.volume.volume_id == cid
    # the retries reused the snapshot the first attempt took
    assert len(chain(p, src)) == 2, chain(p, src)
    assert contents(k, cid, ["f"]) == {"f": "v1\n"}
    assert contents(k, src, ["f"]) == {"f": "v1\n"}
    k.delete(cid)
    k.delete(src)
    assert snapshot_dirs(p) == []


def test_a_new_clone_of_a_name_gets_the_volume_as_it_is(csi, kubelet, strata):
    """A clone deleted and made again under its name holds the source as
    it is then, not as the first one saw it; with nothing written in
    between, the first snapshot serves again and the chain stays as deep."""
    src = kubelet.create("src")
    fill(kubelet, src, {"f": "v1\n"})
    c1 = clone(csi, "c", volume=src).reply.volume.volume_id
    kubelet.delete(c1)
    c2 = clone(csi, "c", volume=src).reply.volume.volume_id
    assert len(chain(strata, src)) == 2
    kubelet.delete(c2)
    fill(kubelet, src, {"f": "v2\n"})
    c3 = clone(csi, "c", volume=src).reply.volume.volume_id
    assert len(chain(strata, src)) == 3
    assert contents(kubelet, c3, ["f"]) == {"f": "v2\n"}
