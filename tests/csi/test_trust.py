# SPDX-License-Identifier: Apache-2.0
"""The Node service's trust boundary: what a hostile or buggy kubelet (or
anything else on the socket) can make the plugin do with the paths and
ids it sends. Each case checks the status code CSI v1.12 asks for, and
that every other volume, every foreign mount and every directory the
plugin did not make is left exactly as it was.

Nothing here points the plugin at the real /etc: "etc" is a scratch
directory standing in for it, so that a regression mounts over a test
directory, not over the machine's."""

import os
import stat
import subprocess

import pytest

from csitest import (STRATAFS_FSTYPE, Kubelet, answers, cap, daemons_of,
                     is_mounted, mount_id, mounts_at, mounts_under, poll,
                     read_file, snapshot, write_file)


def stage_req(vid, path, capability=None):
    return dict(volume_id=vid, staging_target_path=path,
                volume_capability=capability or cap())


def pub_req(vid, st, tgt, capability=None, readonly=False):
    return dict(volume_id=vid, staging_target_path=st, target_path=tgt,
                volume_capability=capability or cap(), readonly=readonly)


@pytest.fixture
def two(env, kubelet):
    """Volume B staged and published with a file in it; volume A created."""
    b = kubelet.create("b")
    b_st = kubelet.stage(b)
    b_t = kubelet.publish(b, b_st, env.target("pod-b"))
    write_file(os.path.join(b_t, "b.txt"), "B's data\n")
    a = kubelet.create("a")
    return a, b, b_st, b_t


def assert_b_intact(two):
    _, b, b_st, b_t = two
    assert is_mounted(b_st, STRATAFS_FSTYPE) and answers(b_st)
    assert is_mounted(b_t, STRATAFS_FSTYPE)
    assert read_file(os.path.join(b_t, "b.txt")) == b"B's data\n"


def fake_etc(env):
    """A directory standing in for /etc, and its contents."""
    d = os.path.join(env.base, "etc")
    os.makedirs(d, exist_ok=True)
    write_file(os.path.join(d, "passwd"), "root:x:0:0\n")
    return d


# --------------------------------------------------------------------------
# ownership: a call acts only on what the plugin recorded for that volume

def test_unpublish_of_another_volumes_target_touches_nothing(env, kubelet, csi, two):
    a, b, b_st, b_t = two
    for path in (b_t, b_st):
        r = csi.NodeUnpublishVolume(volume_id=a, target_path=path)
        assert r.code == "OK", r          # A is not published there
        assert_b_intact(two)
    r = csi.NodeUnstageVolume(volume_id=a, staging_target_path=b_st)
    assert r.code == "OK", r              # A is not staged there
    assert_b_intact(two)


def test_stage_at_another_volumes_staging_path_refused(env, kubelet, csi, two):
    a, b, b_st, b_t = two
    before = len(mounts_at(b_st))
    r = csi.NodeStageVolume(**stage_req(a, b_st))
    assert r.code == "FAILED_PRECONDITION", r
    assert "not this volume's" in r.details
    assert len(mounts_at(b_st)) == before
    assert env.plugins[0].node_record(a) is None
    assert_b_intact(two)


def test_publish_over_any_mount_refused(env, kubelet, csi):
    """A target that already holds a mount (here a tmpfs, not the
    plugin's) gets nothing stacked on it."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = env.target("taken")
    os.makedirs(tgt)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", tgt], check=True)
    write_file(os.path.join(tgt, "theirs"), "x")
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt))
    assert r.code == "FAILED_PRECONDITION", r
    assert [m["fstype"] for m in mounts_at(tgt)] == ["tmpfs"]
    assert read_file(os.path.join(tgt, "theirs")) == b"x"


def test_records_name_the_mounts_for_certain(env, kubelet, strata, two):
    """The node record holds each mount's unique id and device, as the
    kernel reports them for the paths."""
    a, b, b_st, b_t = two
    rec = strata.node_record(b)
    mid, dev = mount_id(b_st)
    assert rec["mount"] == {"id": mid, "dev": dev}
    (t,) = rec["targets"]
    tid, tdev = mount_id(b_t)
    assert t["mount"] == {"id": tid, "dev": tdev} and tid != mid and tdev == dev
    assert t["created"] is True


def test_foreign_mount_over_our_target_is_left_alone(env, kubelet, strata, csi):
    """Something mounted over the volume's target after the publish: the
    unpublish answers OK (the volume is not what is mounted there), the
    foreign mount stays, and the volume's own bind is kept for later."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", tgt], check=True)
    try:
        assert csi.NodeUnpublishVolume(volume_id=vid, target_path=tgt).code == "OK"
        assert [m["fstype"] for m in mounts_at(tgt)] == [STRATAFS_FSTYPE, "tmpfs"]
        assert "covers" in strata.log()
        # still published underneath: unstaging it now would pull it away
        r = csi.NodeUnstageVolume(volume_id=vid, staging_target_path=st)
        assert r.code == "FAILED_PRECONDITION", r
    finally:
        subprocess.run(["umount", tgt], check=True)
    kubelet.unpublish(vid, tgt)
    assert not os.path.exists(tgt)
    kubelet.unstage(vid, st)


def test_unpublish_removes_only_directories_it_made(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    # a directory someone else made, empty: never published there
    other = env.target("other")
    os.makedirs(other)
    assert csi.NodeUnpublishVolume(volume_id=vid, target_path=other).code == "OK"
    assert os.path.isdir(other)
    # a directory that existed before the publish stays after the unpublish
    pre = env.target("premade")
    os.makedirs(pre)
    kubelet.publish(vid, st, pre)
    kubelet.unpublish(vid, pre)
    assert os.path.isdir(pre) and not is_mounted(pre)
    # the one the plugin made goes
    made = kubelet.publish(vid, st, env.target("made"))
    kubelet.unpublish(vid, made)
    assert not os.path.exists(made)


def test_unstage_removes_only_a_staging_dir_it_made(env, kubelet, csi):
    vid = kubelet.create("v")
    st = env.staging("kubelets")          # kubelet made it
    kubelet.stage(vid, st)
    kubelet.unstage(vid, st)
    assert os.path.isdir(st)
    vid2 = kubelet.create("v2")
    st2 = os.path.join(os.path.dirname(env.staging("x")), "made-by-plugin")
    kubelet.stage(vid2, st2)
    kubelet.unstage(vid2, st2)
    assert not os.path.exists(st2)


# --------------------------------------------------------------------------
# paths: absolute, canonical, no symlinks, never the plugin's own

@pytest.mark.parametrize("kind", ["last", "middle"])
def test_symlinked_staging_path_refused(env, kubelet, csi, kind):
    vid = kubelet.create("v")
    etc = fake_etc(env)
    before = snapshot(etc)
    base = os.path.dirname(env.staging("x"))
    if kind == "last":
        path = os.path.join(base, "evil")
        os.symlink(etc, path)
    else:
        os.symlink(os.path.dirname(etc), os.path.join(base, "hop"))
        path = os.path.join(base, "hop", "etc")
    r = csi.NodeStageVolume(**stage_req(vid, path))
    assert r.code == "INVALID_ARGUMENT" and "symlink" in r.details, r
    assert not is_mounted(etc) and snapshot(etc) == before
    assert env.plugins[0].node_record(vid) is None


def test_symlinked_target_refused(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    etc = fake_etc(env)
    before = snapshot(etc)
    tgt = env.target("evil")
    os.symlink(etc, tgt)
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt))
    assert r.code == "INVALID_ARGUMENT" and "symlink" in r.details, r
    assert not is_mounted(etc) and snapshot(etc) == before
    # an unpublish through the link touches nothing either
    r = csi.NodeUnpublishVolume(volume_id=vid, target_path=tgt)
    assert r.code == "OK", r
    assert os.path.islink(tgt) and snapshot(etc) == before


@pytest.mark.parametrize("where", ["layers/base", "root", "volumes", "node",
                                   "ephemeral-like", "above", "socket"])
def test_paths_in_the_plugins_own_directories_refused(env, kubelet, strata, csi, where):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    paths = {
        "layers/base": strata.path("layers", "base"),
        "root": strata.root,
        "volumes": strata.path("volumes", "newdir"),
        "node": strata.path("node", "x"),
        "ephemeral-like": strata.path("ephemeral", "x"),
        "above": os.path.dirname(strata.root),
        "socket": os.path.join(os.path.dirname(strata.sock), "target"),
    }
    path = paths[where]
    existed = os.path.exists(path)
    r = csi.NodePublishVolume(**pub_req(vid, st, path))
    assert r.code == "INVALID_ARGUMENT", r
    other = kubelet.create("other")
    r = csi.NodeStageVolume(**stage_req(other, path))
    assert r.code == "INVALID_ARGUMENT", r
    assert not mounts_at(path)
    assert os.path.exists(path) == existed, "the refused call made the directory"
    assert strata.node_record(other) is None


def test_store_reached_through_a_bind_mount_refused(env, kubelet, strata, csi):
    """The store bind-mounted elsewhere is still the store: the check is
    by device and inode, not by name."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    alias = os.path.join(env.base, "kubelet", "alias")
    os.makedirs(alias)
    subprocess.run(["mount", "--bind", strata.root, alias], check=True)
    try:
        r = csi.NodePublishVolume(**pub_req(vid, st, os.path.join(alias, "layers", "base")))
        assert r.code == "INVALID_ARGUMENT" and "lies in" in r.details, r
    finally:
        subprocess.run(["umount", alias], check=True)


@pytest.mark.parametrize("path", ["relative/path", "/a//b", "/a/./b", "/a/../b",
                                  "/a/b/", "/a/b\nc", "/", "/a/\x7fb"])
def test_malformed_paths_invalid_argument(env, kubelet, csi, path):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    assert csi.NodePublishVolume(**pub_req(vid, st, path)).code == "INVALID_ARGUMENT"
    assert csi.NodeStageVolume(**stage_req(vid, path)).code == "INVALID_ARGUMENT"
    assert csi.NodeUnpublishVolume(volume_id=vid, target_path=path).code == \
        "INVALID_ARGUMENT"
    assert csi.NodeUnstageVolume(volume_id=vid, staging_target_path=path).code == \
        "INVALID_ARGUMENT"


def test_regular_file_never_mounted_on(env, kubelet, csi):
    vid = kubelet.create("v")
    f = os.path.join(os.path.dirname(env.staging("x")), "afile")
    write_file(f, "file")
    r = csi.NodeStageVolume(**stage_req(vid, f))
    assert r.code == "INVALID_ARGUMENT" and "not a directory" in r.details, r
    st = kubelet.stage(vid)
    tgt = env.target("file")
    write_file(tgt, "file")
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt))
    assert r.code == "INVALID_ARGUMENT" and "not a directory" in r.details, r
    assert not is_mounted(f) and not is_mounted(tgt)
    assert read_file(tgt) == b"file"


def test_missing_parent_is_failed_precondition(env, kubelet, csi):
    """The CO makes the parents: a missing one is its precondition, not a
    missing volume (NOT_FOUND)."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = os.path.join(env.base, "no", "such", "mount")
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt))
    assert r.code == "FAILED_PRECONDITION", r
    other = kubelet.create("other")
    r = csi.NodeStageVolume(**stage_req(other, os.path.join(env.base, "no", "stage")))
    assert r.code == "FAILED_PRECONDITION", r
    # undoing where nothing can be: OK
    assert csi.NodeUnpublishVolume(volume_id=vid, target_path=tgt).code == "OK"


def test_allowed_path_prefix(env, strata):
    kube_dir = os.path.join(env.base, "kubelet")
    os.makedirs(kube_dir, exist_ok=True)
    strata.stop()
    p = env.plugin(root=strata.root, extra=["--allowed-path-prefix", kube_dir])
    k = Kubelet(env, p)
    vid = k.create("v")
    st = k.stage(vid)                     # below the prefix: fine
    k.publish(vid, st)
    outside = os.path.join(env.base, "elsewhere")
    os.makedirs(outside)
    r = p.csi.NodePublishVolume(**pub_req(vid, st, os.path.join(outside, "t")))
    assert r.code == "INVALID_ARGUMENT" and "allowed path prefix" in r.details, r
    r = p.csi.NodeStageVolume(**stage_req(k.create("w"), outside))
    assert r.code == "INVALID_ARGUMENT", r
    # a prefix of the name is not a parent directory
    r = p.csi.NodePublishVolume(**pub_req(vid, st, kube_dir + "-evil"))
    assert r.code == "INVALID_ARGUMENT", r


def test_allowed_path_prefix_must_exist(env, strata):
    strata.stop()
    r = subprocess.run(env.plugin(root=strata.root, start=False).argv() +
                       ["--allowed-path-prefix", "/no/such/dir"],
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 2 and "/no/such/dir" in r.stderr, r


# --------------------------------------------------------------------------
# status codes from CSI v1.12's tables

def test_unstage_where_not_staged_is_ok(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    other = env.staging("other")
    assert csi.NodeUnstageVolume(volume_id=vid, staging_target_path=other).code == "OK"
    assert is_mounted(st), "the volume's real stage was touched"


def test_stats_at_a_path_the_volume_is_not_at(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    for path in ("relative", env.target("nowhere"), "/a/../b"):
        r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=path)
        assert r.code == "NOT_FOUND", (path, r)
    assert csi.NodeGetVolumeStats(volume_id=vid, volume_path=st).code == "OK"
    assert csi.NodeGetVolumeStats(volume_id=vid, volume_path="").code == \
        "INVALID_ARGUMENT"


@pytest.mark.parametrize("mode,second", [
    ("SINGLE_NODE_MULTI_WRITER", "OK"),
    ("SINGLE_NODE_SINGLE_WRITER", "FAILED_PRECONDITION"),
    ("SINGLE_NODE_WRITER", "FAILED_PRECONDITION"),
    ("SINGLE_NODE_READER_ONLY", "FAILED_PRECONDITION"),
])
def test_second_target_by_access_mode(env, kubelet, csi, mode, second):
    """CSI v1.12's second table (the plugin has SINGLE_NODE_MULTI_WRITER):
    another target on the same node is OK only for MULTI_WRITER."""
    c = cap(mode)
    vid = kubelet.create("v", caps=[c])
    st = kubelet.stage(vid, capability=c)
    kubelet.publish(vid, st, env.target("one"), capability=c)
    t2 = env.target("two")
    r = csi.NodePublishVolume(**pub_req(vid, st, t2, capability=c))
    assert r.code == second, r
    assert is_mounted(t2) == (second == "OK")


def test_second_target_with_another_capability(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    kubelet.publish(vid, st, env.target("one"))
    r = csi.NodePublishVolume(**pub_req(vid, st, env.target("two"),
                                        capability=cap(flags=["noexec"])))
    assert r.code == "FAILED_PRECONDITION", r
    # readonly is not part of the capability: another target may differ in it
    r = csi.NodePublishVolume(**pub_req(vid, st, env.target("three"), readonly=True))
    assert r.code == "OK", r


# --------------------------------------------------------------------------
# inline volumes

EPH = "csi.storage.k8s.io/ephemeral"


def publish_inline(csi, kid, target):
    return csi.NodePublishVolume(volume_id=kid, target_path=target,
                                 volume_capability=cap(),
                                 volume_context={EPH: "true", "layers": "base"})


def nothing_left(strata):
    """No inline volume, record, mount or daemon left in the store."""
    assert os.listdir(strata.path("volumes")) == []
    assert [n for n in os.listdir(strata.path("node")) if n.endswith(".json")] == []
    assert not mounts_under(strata.root)
    poll(lambda: not daemons_of(strata.root), 10,
         what="the inline volume's daemon to exit")


def test_inline_bind_failure_leaves_nothing(env, strata, csi):
    kid = "csi-" + "f00d" * 16
    tgt = env.target("inline-file")
    write_file(tgt, "a file")
    r = publish_inline(csi, kid, tgt)
    assert r.code == "INVALID_ARGUMENT", r
    nothing_left(strata)
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=tgt).code == "OK"
    assert read_file(tgt) == b"a file"
    nothing_left(strata)


def test_inline_failure_after_staging_leaves_nothing(env, strata, csi):
    """The stage works, the bind fails (the target holds a foreign mount):
    the volume, its daemon and its record go again."""
    kid = "csi-" + "beef" * 16
    tgt = env.target("inline-taken")
    os.makedirs(tgt)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", tgt], check=True)
    try:
        r = publish_inline(csi, kid, tgt)
        assert r.code == "FAILED_PRECONDITION", r
        nothing_left(strata)
    finally:
        subprocess.run(["umount", tgt], check=True)
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=tgt).code == "OK"


def test_inline_ids_never_meet_store_ids(env, kubelet, strata, csi):
    # an inline id shaped like a store id is refused outright
    vid = kubelet.create("controller-made")
    r = publish_inline(csi, vid, env.target("x"))
    assert r.code == "INVALID_ARGUMENT", r
    r = publish_inline(csi, "sv-" + "0" * 32, env.target("y"))
    assert r.code == "INVALID_ARGUMENT", r
    assert os.listdir(strata.path("volumes")) == [vid]
    # and an inline volume cannot be reached by its store id
    kid = "csi-" + "cafe" * 16
    tgt = env.target("inline")
    assert publish_inline(csi, kid, tgt).code == "OK"
    sid = [v for v in os.listdir(strata.path("volumes")) if v != vid][0]
    rec = strata.node_record(sid)
    # its staging path is the store's own: no call may name it
    r = csi.NodeUnstageVolume(volume_id=sid, staging_target_path=rec["staging_path"])
    assert r.code == "INVALID_ARGUMENT", r
    r = csi.NodeUnstageVolume(volume_id=sid, staging_target_path=env.staging("s"))
    assert r.code == "NOT_FOUND", r
    r = csi.NodeUnpublishVolume(volume_id=sid, target_path=tgt)
    assert r.code == "NOT_FOUND", r
    assert is_mounted(tgt) and answers(tgt)
    assert csi.NodeGetVolumeStats(volume_id=kid, volume_path=tgt).code == "OK"
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=tgt).code == "OK"
    assert os.listdir(strata.path("volumes")) == [vid]


# --------------------------------------------------------------------------
# the socket and the logs

def test_socket_0660_whatever_the_umask(env, strata):
    strata.stop()
    p = env.plugin(root=strata.root,
                   prefix=["sh", "-c", 'umask 000 && exec "$@"', "sh"])
    st = os.stat(p.sock)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_names_cannot_forge_log_lines(env, strata, csi):
    forged = "strata-csi: info: volume sv-00000000000000000000000000000000 deleted"
    r = csi.CreateVolume(name="evil\n" + forged, volume_capabilities=[cap()])
    assert r.code in ("OK", "INVALID_ARGUMENT"), r
    csi.NodeStageVolume(volume_id="x\n" + forged, staging_target_path="/a\nb",
                        volume_capability=cap())
    log = strata.log()
    assert not [line for line in log.splitlines() if line.startswith(forged)], log
    assert "\\n" + forged in log
