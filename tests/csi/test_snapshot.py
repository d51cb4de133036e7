# SPDX-License-Identifier: Apache-2.0
"""CreateSnapshot, DeleteSnapshot, ListSnapshots and GetSnapshot through
the real plugin: the spec's codes, idempotency, pagination and filters,
what a snapshot holds on disk and through a daemon, chain depth, layer
removal, restarts, and kill points at every step of taking one."""

import json
import os
import subprocess
import time

import pytest

from csitest import (Kubelet, MiB, daemons_of, pb, poll, read_file,
                     stratafs_binary, write_file)
from strata_common import (assert_layer_size, control_usage, fill_to_enospc,
                           walk_usage)
from snaptest import (SNAPSHOT_ID_RE, chain, clone, contents, fill, snap,
                      snapshot_dirs)

NOT_THERE = "ss-" + "0" * 32


def test_create_get_list_delete(csi, kubelet, strata):
    vid = kubelet.create("data")
    fill(kubelet, vid, {"a.txt": "one\n", "dir/b.txt": "two\n"})
    before = time.time()
    r = csi.CreateSnapshot(name="snap-1", source_volume_id=vid)
    assert r.code == "OK", r
    s = r.reply.snapshot
    assert SNAPSHOT_ID_RE.match(s.snapshot_id)
    assert s.source_volume_id == vid and s.ready_to_use
    assert before - 5 <= s.creation_time.seconds <= time.time() + 5
    sid = s.snapshot_id
    # on disk: the old upper is the snapshot's layer, on top of the chain
    layer = strata.path("snapshots", sid, "layer")
    assert_layer_size(s.size_bytes, layer)
    assert open(os.path.join(layer, "a.txt")).read() == "one\n"
    assert open(os.path.join(layer, "dir", "b.txt")).read() == "two\n"
    assert chain(strata, vid) == ["@" + sid, "base"]
    assert os.listdir(strata.path("volumes", vid, "upper")) == []
    # the fresh upper is the merged root: as the old one was
    new, old = os.stat(strata.path("volumes", vid, "upper")), os.stat(layer)
    assert (new.st_mode, new.st_uid, new.st_gid) == (old.st_mode, old.st_uid, old.st_gid)
    rec = json.load(open(strata.path("snapshots", sid, "snapshot.json")))
    assert rec["name"] == "snap-1" and rec["chain"] == ["base"]
    assert not rec["hidden"]
    # the volume reads the same, its layer below now
    assert contents(kubelet, vid, ["a.txt", "dir/b.txt", "lower.txt"]) == {
        "a.txt": "one\n", "dir/b.txt": "two\n",
        "lower.txt": open(strata.path("layers", "base", "lower.txt")).read()}

    g = csi.GetSnapshot(snapshot_id=sid)
    assert g.code == "OK" and g.reply.snapshot == s, g
    code, lst = csi.ListSnapshots()
    assert code == "OK" and [e.snapshot for e in lst.entries] == [s]

    assert csi.DeleteSnapshot(snapshot_id=sid).code == "OK"
    assert csi.GetSnapshot(snapshot_id=sid).code == "NOT_FOUND"
    assert list(csi.ListSnapshots().reply.entries) == []
    # the volume still uses the layer: it stays, hidden, until it does not
    assert os.path.isdir(layer)
    assert contents(kubelet, vid, ["a.txt"]) == {"a.txt": "one\n"}
    kubelet.delete(vid)
    assert snapshot_dirs(strata) == []
    # deleting what is gone is done
    assert csi.DeleteSnapshot(snapshot_id=sid).code == "OK"


def getfacl(path):
    return subprocess.run(["getfacl", "-n", "--omit-header", path],
                          capture_output=True, text=True, check=True).stdout


def test_root_acls_outlive_a_snapshot_of_an_unstaged_volume(csi, kubelet,
                                                            strata):
    """Unstaged, the plugin freezes the volume itself: the fresh upper is
    the merged root, so it has the old root's ACLs, and new entries go on
    inheriting its default ACL, as after a daemon's live freeze."""
    vid = kubelet.create("acl")
    st = kubelet.stage(vid, kubelet.env.staging("acl-1"))
    subprocess.run(["setfacl", "-m", "u:3001:r-x,d:u:3002:rwx", st],
                   check=True)
    acl = getfacl(st)
    assert "user:3001:r-x" in acl and "default:user:3002:rwx" in acl, acl
    kubelet.unstage(vid, st)
    sid = snap(csi, "s", vid)
    assert chain(strata, vid) == ["@" + sid, "base"]
    upper = strata.path("volumes", vid, "upper")
    assert os.listdir(upper) == [] and getfacl(upper) == acl
    st = kubelet.stage(vid, kubelet.env.staging("acl-2"))
    assert getfacl(st) == acl
    write_file(os.path.join(st, "f"), "new\n")
    os.mkdir(os.path.join(st, "d"))
    assert "user:3002:rwx" in getfacl(os.path.join(st, "f"))
    assert "default:user:3002:rwx" in getfacl(os.path.join(st, "d"))
    kubelet.unstage(vid, st)


def sizes(csi, sid):
    """size_bytes as GetSnapshot and ListSnapshots answer it."""
    got = csi.GetSnapshot(snapshot_id=sid).reply.snapshot.size_bytes
    (e,) = csi.ListSnapshots(snapshot_id=sid).reply.entries
    assert e.snapshot.size_bytes == got
    return got


def test_size_is_what_the_layer_allocates(csi, kubelet, strata):
    """size_bytes is the frozen layer's blocks as the volume's daemon
    counted them, never walked by the plugin: a live freeze's answer, or
    for an unstaged volume the count its last daemon saved at its end;
    0 (the spec's unknown) without a clean count."""
    vid = kubelet.create("sized")
    fill(kubelet, vid, {"big": os.urandom(3 * MiB), "dir/small": "s\n",
                        "dir/deeper/mid": os.urandom(100000)})
    # unstaged: the count its daemon saved when it was unstaged
    r = csi.CreateSnapshot(name="unstaged", source_volume_id=vid)
    assert r.code == "OK", r
    sid, size = r.reply.snapshot.snapshot_id, r.reply.snapshot.size_bytes
    assert size >= 3 * MiB
    assert_layer_size(size, strata.path("snapshots", sid, "layer"))
    assert sizes(csi, sid) == size
    with open(strata.path("snapshots", sid, "snapshot.json")) as f:
        assert json.load(f)["size_bytes"] == size

    # staged: what the daemon answers its freeze
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "live"), os.urandom(2 * MiB))
    write_file(os.path.join(st, "dir", "deeper", "more"), "m\n")
    r = csi.CreateSnapshot(name="staged", source_volume_id=vid)
    assert r.code == "OK", r
    live, size = r.reply.snapshot.snapshot_id, r.reply.snapshot.size_bytes
    assert 2 * MiB <= size < 3 * MiB
    assert_layer_size(size, strata.path("snapshots", live, "layer"))
    assert sizes(csi, live) == size
    kubelet.unstage(vid, st)
    # kept across a restart of the plugin
    strata.restart()
    assert sizes(strata.csi, sid) >= 3 * MiB
    assert sizes(strata.csi, live) == size

    # no clean count: never staged, or its daemon killed (what it leaves)
    never = kubelet.create("never")
    assert strata.csi.CreateSnapshot(
        name="never", source_volume_id=never).reply.snapshot.size_bytes == 0
    k = Kubelet(kubelet.env, strata)
    killed = k.create("killed")
    fill(k, killed, {"big": os.urandom(MiB)})
    ufile = strata.path("volumes", killed, "usage")
    with open(ufile) as f:
        text = f.read()
    assert text.endswith("clean=1\n")
    with open(ufile, "w") as f:
        f.write(text.replace("clean=1\n", "clean=0\n"))
    r = strata.csi.CreateSnapshot(name="killed", source_volume_id=killed)
    assert r.code == "OK" and r.reply.snapshot.size_bytes == 0, r


def test_unstaged_snapshot_leaves_the_volume_its_capacity(csi, kubelet, strata):
    """The count the last daemon saved is the frozen upper's: it goes with
    it, and the next daemon counts the fresh upper, so the snapshot's
    bytes are not charged to the volume's capacity."""
    vid = kubelet.create("cap", capacity=8 * MiB)
    fill(kubelet, vid, {"big": "b" * (3 * MiB)})
    ufile = strata.path("volumes", vid, "usage")
    assert os.path.exists(ufile)
    snap(csi, "s", vid)
    assert not os.path.exists(ufile)
    st = kubelet.stage(vid)
    upper = strata.path("volumes", vid)
    used = control_usage(strata.path("node", f"{vid}.ctl"))["used"]
    assert used == walk_usage(os.path.join(upper, "upper"),
                              os.path.join(upper, "work"))[0]
    assert used < MiB
    assert os.path.getsize(os.path.join(st, "big")) == 3 * MiB
    assert fill_to_enospc(os.path.join(st, "more"), limit=9 * MiB) > 7 * MiB
    kubelet.unstage(vid, st)


def test_create_errors(csi, kubelet, strata):
    vid = kubelet.create("v")
    r = csi.CreateSnapshot(source_volume_id=vid)
    assert r.code == "INVALID_ARGUMENT" and "name" in r.details, r
    r = csi.CreateSnapshot(name="x" * 129, source_volume_id=vid)
    assert r.code == "INVALID_ARGUMENT" and "128" in r.details, r
    r = csi.CreateSnapshot(name="s")
    assert r.code == "INVALID_ARGUMENT" and "source_volume_id" in r.details, r
    for bad in ("sv-" + "0" * 32, "../../etc", "nope"):
        r = csi.CreateSnapshot(name="s", source_volume_id=bad)
        assert r.code == "NOT_FOUND" and "no such volume" in r.details, r
    assert snapshot_dirs(strata) == []
    assert chain(strata, vid) == ["base"]


def test_create_is_idempotent_by_name(csi, kubelet, strata):
    a = kubelet.create("a")
    b = kubelet.create("b")
    s1 = snap(csi, "same", a)
    fill(kubelet, a, {"later": "x"})
    assert snap(csi, "same", a) == s1  # the same one, not a newer one
    assert chain(strata, a) == ["@" + s1, "base"]
    r = csi.CreateSnapshot(name="same", source_volume_id=b)
    assert r.code == "ALREADY_EXISTS" and s1 in r.details, r
    # a deleted name is free again
    assert csi.DeleteSnapshot(snapshot_id=s1).code == "OK"
    s2 = snap(csi, "same", b)
    assert s2 != s1


def test_get_and_delete_errors(csi):
    for call in (csi.GetSnapshot, csi.DeleteSnapshot):
        r = call(snapshot_id="")
        assert r.code == "INVALID_ARGUMENT" and "snapshot_id is required" in r.details
    for bad in (NOT_THERE, "../x", "sv-" + "0" * 32):
        r = csi.GetSnapshot(snapshot_id=bad)
        assert r.code == "NOT_FOUND" and "no such snapshot" in r.details, r
        assert csi.DeleteSnapshot(snapshot_id=bad).code == "OK"


def test_list_pages_and_filters(csi, kubelet):
    a = kubelet.create("a")
    b = kubelet.create("b")
    ids = {snap(csi, f"a{i}", a) for i in range(3)} | \
        {snap(csi, f"b{i}", b) for i in range(2)}
    seen, token, pages = [], "", 0
    while True:
        code, r = csi.ListSnapshots(max_entries=2, starting_token=token)
        assert code == "OK" and len(r.entries) <= 2
        seen += [e.snapshot.snapshot_id for e in r.entries]
        pages += 1
        token = r.next_token
        if not token:
            break
    assert pages == 3 and sorted(seen) == sorted(ids)
    # a page that ends exactly at the end hands out no token
    code, r = csi.ListSnapshots(max_entries=5)
    assert len(r.entries) == 5 and r.next_token == ""

    code, r = csi.ListSnapshots(source_volume_id=b)
    assert {e.snapshot.snapshot_id for e in r.entries} == \
        {i for i in ids if csi.GetSnapshot(snapshot_id=i).reply.snapshot.source_volume_id == b}
    assert len(r.entries) == 2
    one = sorted(ids)[1]
    code, r = csi.ListSnapshots(snapshot_id=one)
    assert [e.snapshot.snapshot_id for e in r.entries] == [one]
    code, r = csi.ListSnapshots(snapshot_id=one, source_volume_id="sv-" + "1" * 32)
    assert code == "OK" and list(r.entries) == []
    for sid in (NOT_THERE, "junk"):
        code, r = csi.ListSnapshots(snapshot_id=sid)
        assert code == "OK" and list(r.entries) == []

    r = csi.ListSnapshots(starting_token="not-a-token")
    assert r.code == "ABORTED" and "starting_token" in r.details, r
    r = csi.ListSnapshots(max_entries=-1)
    assert r.code == "INVALID_ARGUMENT", r


def test_snapshot_holds_the_volume_as_it_was(csi, kubelet):
    vid = kubelet.create("v")
    fill(kubelet, vid, {"keep": "v1\n", "gone": "here\n", "changed": "old\n"})
    sid = snap(csi, "then", vid)
    fill(kubelet, vid, {"changed": "new\n", "added": "late\n"}, remove=["gone"])
    names = ["keep", "gone", "changed", "added"]
    assert contents(kubelet, vid, names) == {
        "keep": "v1\n", "gone": None, "changed": "new\n", "added": "late\n"}
    r = clone(csi, "restored", snapshot=sid)
    assert r.code == "OK", r
    assert contents(kubelet, r.reply.volume.volume_id, names) == {
        "keep": "v1\n", "gone": "here\n", "changed": "old\n", "added": None}


@pytest.mark.timeout(180)
def test_chain_depth_limit(csi, kubelet, strata):
    """Reached by a volume staged all along: an unstaged one is flattened
    long before (test_flatten.py), a staged one only once unstaged."""
    vid = kubelet.create("deep")  # on base: one layer
    st = kubelet.stage(vid)
    ids = [snap(csi, f"d{i}", vid) for i in range(63)]
    assert len(chain(strata, vid)) == 64
    r = csi.CreateSnapshot(name="one-too-many", source_volume_id=vid)
    assert r.code == "RESOURCE_EXHAUSTED" and "64" in r.details, r
    assert len(chain(strata, vid)) == 64
    # the 63 snapshots, and the layers their deep chains were flattened into
    assert set(ids) <= set(snapshot_dirs(strata))
    for d in set(snapshot_dirs(strata)) - set(ids):
        if d.startswith("."):
            continue        # a merge (.flat-) or a removal (.del-) under way
        try:
            with open(strata.path("snapshots", d, "snapshot.json")) as f:
                assert json.load(f)["name"].startswith("flatten:"), d
        except FileNotFoundError:
            pass            # a flattened layer no record took: freed since
    kubelet.unstage(vid, st)
    # and the deep volume still serves
    fill(kubelet, vid, {"top": "t\n"})
    assert contents(kubelet, vid, ["top", "lower.txt"])["top"] == "t\n"


def test_layer_rm_refused_while_a_snapshot_uses_it(csi, kubelet, strata, env):
    import subprocess
    from csitest import stratactl_binary
    vid = kubelet.create("v", layers="extra")
    sid = snap(csi, "s", vid)
    kubelet.delete(vid)

    def rm():
        return subprocess.run([stratactl_binary(), "--endpoint", strata.endpoint,
                               "layer", "rm", "extra"], capture_output=True,
                              text=True)
    r = rm()
    assert r.returncode != 0 and f"used by 1 snapshot ({sid})" in r.stderr, r.stderr
    assert csi.DeleteSnapshot(snapshot_id=sid).code == "OK"
    assert snapshot_dirs(strata) == []
    r = rm()
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(strata.path("layers", "extra"))


def test_snapshots_outlive_a_restart(csi, kubelet, strata):
    vid = kubelet.create("v")
    fill(kubelet, vid, {"f": "x\n"})
    sid = snap(csi, "kept", vid)
    strata.restart()
    code, r = strata.csi.ListSnapshots()
    assert [e.snapshot.snapshot_id for e in r.entries] == [sid]
    assert snap(strata.csi, "kept", vid) == sid
    assert contents(Kubelet(kubelet.env, strata), vid, ["f"]) == {"f": "x\n"}


def test_inline_volume_is_no_source(env, strata):
    from csitest import EPH, cap
    tgt = env.target("inl")
    kid = "csi-" + "ab" * 32
    r = strata.csi.NodePublishVolume(volume_id=kid, target_path=tgt,
                                     volume_capability=cap(),
                                     volume_context={EPH: "true", "layers": "base"})
    assert r.code == "OK", r
    (store_id,) = os.listdir(strata.path("volumes"))
    r = strata.csi.CreateSnapshot(name="s", source_volume_id=store_id)
    assert r.code == "NOT_FOUND", r
    assert strata.csi.NodeUnpublishVolume(volume_id=kid, target_path=tgt).code == "OK"


def test_staged_volume_freezes_through_its_daemon(csi, kubelet, strata):
    """A staged volume is frozen live by its daemon ("freeze" on the
    control channel); the pod keeps writing on a fresh upper."""
    vid = kubelet.create("live")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "before"), "b\n")
    r = csi.CreateSnapshot(name="live-1", source_volume_id=vid)
    assert r.code == "OK", r
    sid = r.reply.snapshot.snapshot_id
    assert chain(strata, vid) == ["@" + sid, "base"]
    write_file(os.path.join(st, "after"), "a\n")
    assert open(os.path.join(st, "before")).read() == "b\n"
    layer = strata.path("snapshots", sid, "layer")
    assert sorted(os.listdir(layer)) == ["before"]
    # a restart of its daemon (a heal) serves the recorded chain
    os.kill(strata.daemon_pid(vid), 9)

    def healed():
        # until the heal moves the new mount over, the dead one answers
        # ENOTCONN or ECONNABORTED
        try:
            return (os.path.exists(os.path.join(st, "after")) and
                    open(os.path.join(st, "before")).read() == "b\n")
        except OSError:
            return False
    poll(healed, 30, what="the heal")
    kubelet.unstage(vid, st)
    r = clone(csi, "from-live", snapshot=sid)
    assert r.code == "OK", r
    assert contents(kubelet, r.reply.volume.volume_id, ["before", "after"]) == {
        "before": "b\n", "after": None}


# --------------------------------------------------------------------------
# kill points: a crash at any step leaves no snapshot or a whole one

SNAP_POINTS = ["snapshot.intent", "snapshot.upper", "snapshot.fresh",
               "snapshot.record", "snapshot.named"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", SNAP_POINTS)
def test_killed_while_taking(env, strata, point):
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": point})
    k = Kubelet(env, p)
    vid = k.create("v")
    fill(k, vid, {"data": "precious\n", "big": os.urandom(MiB)})
    r = p.csi.CreateSnapshot(name="s", source_volume_id=vid)
    assert r.code == "UNAVAILABLE", r
    poll(lambda: not p.alive(), 10, what="the plugin to die at " + point)
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    assert "kill point " + point in open(p.log_path.replace(
        f".{p.nstarts}.log", f".{p.nstarts - 1}.log")).read()
    # no half snapshot: whole and listed, or nothing at all
    dirs = snapshot_dirs(p)
    assert not [d for d in dirs if d.startswith(".")], dirs
    listed = [e.snapshot.snapshot_id for e in p.csi.ListSnapshots().reply.entries]
    assert dirs == listed
    # the saved count goes with the upper it counted, the size stays
    ufile = p.path("volumes", vid, "usage")
    if listed:
        assert chain(p, vid) == ["@" + listed[0], "base"]
        layer = p.path("snapshots", listed[0], "layer")
        assert open(os.path.join(layer, "data")).read() == "precious\n"
        assert not os.path.exists(ufile)
        size = sizes(p.csi, listed[0])
        assert size >= MiB
        assert_layer_size(size, layer)
    else:
        assert chain(p, vid) == ["base"]
        assert os.path.exists(ufile)
    # the volume lost and hid nothing
    assert contents(k, vid, ["data"]) == {"data": "precious\n"}
    # the retry makes it (or finds it), whole
    sid = snap(p.csi, "s", vid)
    assert not listed or sid == listed[0]
    r = clone(p.csi, "c", snapshot=sid)
    assert r.code == "OK", r
    assert contents(k, r.reply.volume.volume_id, ["data"]) == {"data": "precious\n"}


def staged_with_data(env, strata, var, point):
    """A plugin in STRATA's place with VAR=POINT in its environment (and
    its daemons'), and a volume staged with a file written: (plugin,
    kubelet, volume id, staging path)."""
    strata.stop()
    p = env.plugin(root=strata.root, environ={var: point})
    k = Kubelet(env, p)
    vid = k.create("v")
    st = k.stage(vid)
    write_file(os.path.join(st, "data"), "precious\n")
    return p, k, vid, st


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", SNAP_POINTS)
def test_killed_while_freezing_a_staged_volume(env, strata, point):
    """The daemon outlives the plugin: the restarted plugin finishes or
    drops the snapshot by what the disk holds, and the pod's view never
    loses or hides a byte, through a restage too."""
    p, k, vid, st = staged_with_data(env, strata, "STRATA_CSI_KILL_AT", point)
    r = p.csi.CreateSnapshot(name="s", source_volume_id=vid)
    assert r.code == "UNAVAILABLE", r
    poll(lambda: not p.alive(), 10, what="the plugin to die at " + point)
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    dirs = snapshot_dirs(p)
    assert not [d for d in dirs if d.startswith(".")], dirs
    listed = [e.snapshot.snapshot_id for e in p.csi.ListSnapshots().reply.entries]
    assert dirs == listed
    assert chain(p, vid) == (["@" + listed[0]] if listed else []) + ["base"]
    assert open(os.path.join(st, "data")).read() == "precious\n"
    write_file(os.path.join(st, "more"), "later\n")
    sid = snap(p.csi, "s", vid)
    k.unstage(vid, st)
    assert contents(k, vid, ["data", "more"]) == {"data": "precious\n",
                                                  "more": "later\n"}
    r = clone(p.csi, "c", snapshot=sid)
    assert contents(k, r.reply.volume.volume_id, ["data"]) == {"data": "precious\n"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", ["freeze.moved", "freeze.made"])
def test_daemon_worker_killed_while_freezing(env, strata, point):
    """The daemon's worker dies once its upper is renamed into the new
    layer, before it switched to a fresh one: the plugin finishes the
    snapshot (the layer moved), the next worker finishes the freeze, and
    what the pod writes afterwards is in the volume, not in the snapshot."""
    p, k, vid, st = staged_with_data(env, strata, "STRATAFS_CRASH_AFTER", point)
    sid = snap(p.csi, "s", vid)
    assert chain(p, vid) == ["@" + sid, "base"]
    poll(lambda: "finished the freeze into " + p.path("snapshots") in
         read_file(p.path("node", vid + ".log")).decode(), 30,
         what="the next worker to finish the freeze")
    write_file(os.path.join(st, "more"), "later\n")
    layer = p.path("snapshots", sid, "layer")
    assert sorted(os.listdir(layer)) == ["data"]
    assert sorted(os.listdir(p.path("volumes", vid, "upper"))) == ["more"]
    k.unstage(vid, st)
    assert contents(k, vid, ["data", "more"]) == {"data": "precious\n",
                                                  "more": "later\n"}
    r = clone(p.csi, "c", snapshot=sid)
    assert r.code == "OK", r
    assert contents(k, r.reply.volume.volume_id, ["data", "more"]) == {
        "data": "precious\n", "more": None}


@pytest.mark.timeout(60)
def test_killed_while_removing(env, strata):
    strata.stop()
    p = env.plugin(root=strata.root,
                   environ={"STRATA_CSI_KILL_AT": "snapshot.remove"})
    k = Kubelet(env, p)
    vid = k.create("v")
    sid = snap(p.csi, "s", vid)
    k.delete(vid)
    r = p.csi.DeleteSnapshot(snapshot_id=sid)
    assert r.code == "UNAVAILABLE", r
    poll(lambda: not p.alive(), 10, what="the plugin to die")
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    assert snapshot_dirs(p) == []
    assert p.csi.DeleteSnapshot(snapshot_id=sid).code == "OK"
    assert p.csi.GetSnapshot(snapshot_id=sid).code == "NOT_FOUND"


# --------------------------------------------------------------------------
# stratactl snapshot create|list|rm, create-volume --from-*

def test_stratactl_snapshots_and_clones(strata):
    from csitest import stratactl_binary

    def ctl(*args):
        return subprocess.run([stratactl_binary(), "--endpoint", strata.endpoint]
                              + list(args), capture_output=True, text=True,
                              timeout=60)
    r = ctl("--json", "create-volume", "v", "--layers", "base")
    assert r.returncode == 0, r.stderr
    vid = json.loads(r.stdout)["volume"]["volume_id"]
    r = ctl("snapshot", "create", "s", vid)
    assert r.returncode == 0, r.stderr
    sid, src, _, ready = r.stdout.split()
    assert SNAPSHOT_ID_RE.match(sid) and src == vid and ready == "ready"
    r = ctl("snapshot", "list")
    assert r.returncode == 0 and r.stdout.split()[0] == sid, r
    r = ctl("snapshot", "list", "--max-entries", "1", "--starting-token", "junk")
    assert r.returncode == 1 and "ABORTED" in r.stderr, r
    r = ctl("create-volume", "c", "--from-snapshot", sid)
    assert r.returncode == 0 and f"source snapshot {sid}" in r.stdout, r
    # its chain named as `volume inspect` names it (below), "@" nowhere
    assert f" layers snapshot:{sid},base " in r.stdout and "@" not in r.stdout, r
    r = ctl("create-volume", "d", "--from-volume", vid)
    assert r.returncode == 0 and f"source volume {vid}" in r.stdout, r
    r = ctl("create-volume", "e", "--from-volume", vid, "--from-snapshot", sid)
    assert r.returncode == 2 and "give one source" in r.stderr, r
    r = ctl("create-volume", "e", "--from-snapshot", "ss-" + "0" * 32)
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr, r
    # the chain, legibly: snapshot layers named as such
    r = ctl("volume", "inspect", vid)
    line = [x for x in r.stdout.splitlines() if x.startswith("layers ")][0]
    top = strata.volume_record(vid)["layers"][0][1:]
    assert line == f"layers snapshot:{top},snapshot:{sid},base", line
    r = ctl("snapshot", "rm", sid)
    assert r.returncode == 0 and r.stdout == f"deleted snapshot {sid}\n", r
    assert ctl("snapshot", "list").stdout == ""
    r = ctl("snapshot", "create", "only-one-arg")
    assert r.returncode == 2, r


def test_a_snapshot_cut_short_is_settled_before_a_daemon_starts(csi, kubelet, strata):
    """What a freeze that timed out leaves (the layer moved, the chain not
    yet recorded) while the plugin runs: the next stage finishes the
    snapshot before its daemon starts, so the data stays in view."""
    vid = kubelet.create("v")
    fill(kubelet, vid, {"data": "kept\n"})
    sid = "ss-" + "ab" * 16
    rec = {"id": sid, "name": "cut", "source_volume_id": vid,
           "capacity_bytes": 0, "created_seconds": int(time.time()),
           "created_nanos": 0, "chain": ["base"], "hidden": False}
    with open(strata.path("snapshots", f".new-{sid}.json"), "w") as f:
        json.dump(rec, f)
    os.mkdir(strata.path("snapshots", f".new-{sid}"))
    os.rename(strata.path("volumes", vid, "upper"),
              strata.path("snapshots", f".new-{sid}", "layer"))
    assert contents(kubelet, vid, ["data"]) == {"data": "kept\n"}
    assert chain(strata, vid) == ["@" + sid, "base"]
    assert snapshot_dirs(strata) == [sid]
    s = csi.GetSnapshot(snapshot_id=sid).reply.snapshot
    # an intent without size_bytes (written before sizes): unknown
    assert s.source_volume_id == vid and s.size_bytes == 0


def test_a_snapshot_cut_before_the_move_is_dropped(csi, kubelet, strata):
    vid = kubelet.create("v")
    fill(kubelet, vid, {"data": "kept\n"})
    sid = "ss-" + "cd" * 16
    rec = {"id": sid, "name": "cut", "source_volume_id": vid,
           "capacity_bytes": 0, "created_seconds": 0, "created_nanos": 0,
           "chain": ["base"], "hidden": False}
    with open(strata.path("snapshots", f".new-{sid}.json"), "w") as f:
        json.dump(rec, f)
    os.mkdir(strata.path("snapshots", f".new-{sid}"))
    assert contents(kubelet, vid, ["data"]) == {"data": "kept\n"}
    assert chain(strata, vid) == ["base"]
    assert snapshot_dirs(strata) == []


@pytest.mark.valgrind
@pytest.mark.timeout(300)
def test_snapshots_valgrind_clean(env, strata):
    """Snapshots, clones and their refusals under valgrind: no memory error,
    no definite leak (test_valgrind.py's rules)."""
    from test_valgrind import (assert_valgrind_clean, require_valgrind,
                               valgrind_plugin)
    require_valgrind()
    strata.stop()
    p = valgrind_plugin(env, strata.root)
    csi, k = p.csi, Kubelet(env, p)
    vid = k.create("v", capacity=8 << 20)
    # what a daemon saves at its end (none stages under valgrind): the size
    with open(p.path("volumes", vid, "usage"), "w") as f:
        f.write("strata-usage 1\nbytes=1048576\ninodes=3\nclean=1\n")
    sid = snap(csi, "s", vid)
    assert 0 < csi.GetSnapshot(snapshot_id=sid).reply.snapshot.size_bytes <= 1 << 20
    assert snap(csi, "s", vid) == sid
    other = k.create("o")
    assert csi.CreateSnapshot(name="s", source_volume_id=other).code == "ALREADY_EXISTS"
    assert csi.CreateSnapshot(name="x", source_volume_id=NOT_THERE.replace("ss", "sv")).code == "NOT_FOUND"
    assert csi.ListSnapshots(max_entries=1).code == "OK"
    assert csi.ListSnapshots(starting_token="bogus").code == "ABORTED"
    assert csi.GetSnapshot(snapshot_id=sid).code == "OK"
    assert csi.GetSnapshot(snapshot_id=NOT_THERE).code == "NOT_FOUND"
    c1 = clone(csi, "c1", snapshot=sid)
    assert c1.code == "OK", c1
    c2 = clone(csi, "c2", volume=vid)
    assert c2.code == "OK", c2
    assert clone(csi, "c3", volume=vid, capacity_range=pb().CapacityRange(
        required_bytes=1 << 20)).code == "OUT_OF_RANGE"
    assert clone(csi, "c4", snapshot=NOT_THERE).code == "NOT_FOUND"
    assert csi.DeleteSnapshot(snapshot_id=sid).code == "OK"
    for v in (c1.reply.volume.volume_id, c2.reply.volume.volume_id, vid, other):
        k.delete(v)
    assert snapshot_dirs(p) == []
    assert_valgrind_clean(env, p)


# --------------------------------------------------------------------------
# the store under faults

LAYERS = {"base": {"lower.txt": "from the lower layer\n"}}


def test_snapshot_and_clone_on_a_full_store(env):
    from test_store_faults import fill as fill_disk
    p = env.plugin(root=env.tmpfs_root(size="8m", layers=LAYERS))
    k = Kubelet(env, p)
    vid = k.create("v")
    sid = snap(p.csi, "s", vid)
    before = (snapshot_dirs(p), chain(p, vid), sorted(os.listdir(p.path("volumes"))))
    filler = fill_disk(p.root)
    r = p.csi.CreateSnapshot(name="full", source_volume_id=vid)
    assert r.code == "RESOURCE_EXHAUSTED" and "No space left" in r.details, r
    r = clone(p.csi, "c", volume=vid)
    assert r.code == "RESOURCE_EXHAUSTED" and "No space left" in r.details, r
    r = clone(p.csi, "c", snapshot=sid)
    assert r.code == "RESOURCE_EXHAUSTED", r
    assert (snapshot_dirs(p), chain(p, vid), sorted(os.listdir(p.path("volumes")))) \
        == before, "a half-made snapshot or clone was left"
    os.unlink(filler)
    assert snap(p.csi, "full", vid)
    assert clone(p.csi, "c", volume=vid).code == "OK"


def test_read_only_store(env):
    import subprocess
    p = env.plugin(root=env.tmpfs_root(size="64m", layers=LAYERS))
    k = Kubelet(env, p)
    vid = k.create("v")
    sid = snap(p.csi, "s", vid)
    before = (snapshot_dirs(p), chain(p, vid))
    subprocess.run(["mount", "-o", "remount,ro", p.root], check=True)
    try:
        for method, kw in (
                ("CreateSnapshot", dict(name="ro", source_volume_id=vid)),
                ("DeleteSnapshot", dict(snapshot_id=sid))):
            r = p.csi.call(method, **kw)
            assert r.code == "FAILED_PRECONDITION", (method, r)
            assert "read-only filesystem" in r.details and \
                "nothing was changed" in r.details, (method, r)
        r = clone(p.csi, "c", volume=vid)
        assert r.code == "FAILED_PRECONDITION", r
        # reading works on
        assert p.csi.GetSnapshot(snapshot_id=sid).code == "OK"
        assert len(p.csi.ListSnapshots().reply.entries) == 1
        assert (snapshot_dirs(p), chain(p, vid)) == before
    finally:
        subprocess.run(["mount", "-o", "remount,rw", p.root], check=True)
    assert p.csi.DeleteSnapshot(snapshot_id=sid).code == "OK"


def test_damaged_snapshot_record(csi, kubelet, strata):
    vid = kubelet.create("v")
    sid = snap(csi, "s", vid)
    good = snap(csi, "t", vid)
    with open(strata.path("snapshots", sid, "snapshot.json"), "w") as f:
        f.write("{ not json")
    r = csi.GetSnapshot(snapshot_id=sid)
    assert r.code == "INTERNAL" and sid in r.details, r
    r = csi.DeleteSnapshot(snapshot_id=sid)
    assert r.code == "INTERNAL" and "cannot be read" in r.details, r
    assert os.path.isdir(strata.path("snapshots", sid, "layer"))
    # the others are listed on; the damaged one is not taken for unused
    assert [e.snapshot.snapshot_id for e in csi.ListSnapshots().reply.entries] == [good]
    kubelet.delete(vid)
    assert os.path.isdir(strata.path("snapshots", sid, "layer"))


def hard_linked_volume(env):
    """A volume over a layer with one file under two names, written
    through one: its copy in the workdir's index. Staged."""
    root = env.new_root("hl", layers={"links": {"a": "shared\n"}})
    os.link(os.path.join(root, "layers", "links", "a"),
            os.path.join(root, "layers", "links", "b"))
    p = env.plugin(root=root)
    k = Kubelet(env, p)
    vid = k.create("v", layers="links")
    st = k.stage(vid)
    write_file(os.path.join(st, "a"), "changed\n")
    assert open(os.path.join(st, "b")).read() == "changed\n"
    return p, k, vid, st


def test_copied_up_hard_links_in_an_unstaged_snapshot(env):
    """Unstaged, a renamed upper would part the names the index joins:
    the plugin starts a daemon on a mount of its own to link them up and
    freeze, and stops it. The snapshot holds the file under both names,
    the volume goes on over a fresh upper, and no daemon is left."""
    p, k, vid, st = hard_linked_volume(env)
    k.unstage(vid, st)
    assert not daemons_of(p.root)
    sid = snap(p.csi, "s", vid)
    layer = p.path("snapshots", sid, "layer")
    a, b = (os.lstat(os.path.join(layer, n)) for n in "ab")
    assert (a.st_ino, a.st_nlink) == (b.st_ino, 2)
    assert open(os.path.join(layer, "b")).read() == "changed\n"
    assert chain(p, vid) == ["@" + sid, "links"]
    assert os.listdir(p.path("volumes", vid, "upper")) == []
    assert not daemons_of(p.root)
    with open(p.path("node", vid + ".log")) as f:
        assert "a daemon to freeze an unstaged volume" in f.read()
    index = p.path("volumes", vid, "work", "index")
    assert not os.path.isdir(index) or os.listdir(index) == []
    assert contents(k, vid, ["a", "b"]) == {"a": "changed\n", "b": "changed\n"}
    r = clone(p.csi, "c", snapshot=sid)
    assert r.code == "OK", r
    assert contents(k, r.reply.volume.volume_id, ["a", "b"]) == {
        "a": "changed\n", "b": "changed\n"}


def test_unstaged_hard_links_whose_daemon_cannot_start(env):
    """The daemon for the freeze cannot start (a layer of the volume's
    chain is gone): the plugin says why, and nothing changed; with the
    layer back, the snapshot is taken."""
    p, k, vid, st = hard_linked_volume(env)
    k.unstage(vid, st)
    layer = p.path("layers", "links")
    os.rename(layer, layer + ".away")
    r = p.csi.CreateSnapshot(name="s", source_volume_id=vid)
    assert r.code == "INTERNAL" and "links" in r.details, r
    assert chain(p, vid) == ["links"] and snapshot_dirs(p) == []
    assert not daemons_of(p.root)
    os.rename(layer + ".away", layer)
    assert contents(k, vid, ["a", "b"]) == {"a": "changed\n", "b": "changed\n"}
    sid = snap(p.csi, "s", vid)
    assert chain(p, vid) == ["@" + sid, "links"]


def test_unstaged_volume_served_by_a_stray_daemon(env, tmp_path):
    """No node record, but a stratafs someone started by hand serves the
    volume's upper: no rename under it. FAILED_PRECONDITION, nothing
    changed; once it is gone, the snapshot is taken."""
    p = env.plugin(root=env.new_root("stray", layers={"base": {"l": "lower\n"}}))
    k = Kubelet(env, p)
    vid = k.create("v")
    mnt = tmp_path / "by-hand"
    mnt.mkdir()
    d = subprocess.Popen(
        [stratafs_binary(), "-f", "-o",
         f"lowerdir={p.path('layers', 'base')},"
         f"upperdir={p.path('volumes', vid, 'upper')},"
         f"workdir={p.path('volumes', vid, 'work')}", str(mnt)],
        stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        poll(lambda: os.path.ismount(mnt), 30, what="the stray mount")
        write_file(os.path.join(mnt, "f"), "by hand\n")
        r = p.csi.CreateSnapshot(name="s", source_volume_id=vid)
        assert r.code == "FAILED_PRECONDITION", r
        assert "no node record names" in r.details, r
        assert chain(p, vid) == ["base"] and snapshot_dirs(p) == []
        assert open(p.path("volumes", vid, "upper", "f")).read() == "by hand\n"
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        d.wait(30)
    sid = snap(p.csi, "s", vid)
    assert chain(p, vid) == ["@" + sid, "base"]
    with open(p.path("snapshots", sid, "layer", "f")) as f:
        assert f.read() == "by hand\n"


def test_copied_up_hard_links_in_a_live_snapshot(env):
    """Staged, the daemon links every name up before the freeze: the
    snapshot holds the file under both names, and so does a clone."""
    p, k, vid, st = hard_linked_volume(env)
    sid = snap(p.csi, "s", vid)
    layer = p.path("snapshots", sid, "layer")
    a, b = (os.lstat(os.path.join(layer, n)) for n in "ab")
    assert (a.st_ino, a.st_nlink) == (b.st_ino, 2)
    assert open(os.path.join(layer, "b")).read() == "changed\n"
    # written again through the other name: a second snapshot as well
    write_file(os.path.join(st, "b"), "again\n")
    assert open(os.path.join(st, "a")).read() == "again\n"
    second = snap(p.csi, "t", vid)
    k.unstage(vid, st)
    assert chain(p, vid) == ["@" + second, "@" + sid, "links"]
    assert contents(k, vid, ["a", "b"]) == {"a": "again\n", "b": "again\n"}
    r = clone(p.csi, "c", snapshot=sid)
    assert r.code == "OK", r
    assert contents(k, r.reply.volume.volume_id, ["a", "b"]) == {
        "a": "changed\n", "b": "changed\n"}


def test_staged_volume_whose_daemon_does_not_answer(csi, kubelet, strata):
    """No control channel to freeze through (its socket gone): UNAVAILABLE,
    and nothing changed."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "f"), "x\n")
    os.unlink(strata.path("node", vid + ".ctl"))
    r = csi.CreateSnapshot(name="s", source_volume_id=vid)
    assert r.code == "UNAVAILABLE" and "does not answer" in r.details, r
    assert chain(strata, vid) == ["base"] and snapshot_dirs(strata) == []
    assert open(os.path.join(st, "f")).read() == "x\n"
    kubelet.unstage(vid, st)
