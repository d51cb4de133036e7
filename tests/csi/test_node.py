# SPDX-License-Identifier: Apache-2.0
"""Node service: stage, publish, unpublish, unstage, stats, capabilities,
info; real FUSE mounts and bind mounts checked in /proc/self/mountinfo."""

import errno
import os
import signal
import stat

import pytest

from csitest import (DEFAULT_NODE, MiB, STRATAFS_FSTYPE, Kubelet, answers,
                     assert_daemon_gone, cap, errno_of, is_mounted, mount_opts,
                     mounts_at, mounts_under, pb, pid_alive, poll, read_file,
                     rpc_capabilities, write_file)

UNKNOWN_ID = "sv-" + "f" * 32
MALFORMED_IDS = ["", "sv-xyz", "../volumes", "sv-" + "F" * 32, "sv-" + "0" * 33]


def stage_req(vid, staging, capability=None):
    return dict(volume_id=vid, staging_target_path=staging,
                volume_capability=capability if capability is not None else cap())


def fuse_mounts(env):
    return [m for m in mounts_under(env.base) if m["fstype"] == STRATAFS_FSTYPE]


# --------------------------------------------------------------------------
# NodeStageVolume

@pytest.mark.parametrize("missing", ["volume_id", "staging_target_path",
                                     "volume_capability"])
def test_stage_requires_fields(env, kubelet, csi, missing):
    vid = kubelet.create("v")
    req = stage_req(vid, env.staging())
    del req[missing]
    r = csi.NodeStageVolume(**req)
    assert r.code == "INVALID_ARGUMENT", r
    assert fuse_mounts(env) == []


def test_stage_unknown_volume_not_found(env, csi):
    r = csi.NodeStageVolume(**stage_req(UNKNOWN_ID, env.staging()))
    assert r.code == "NOT_FOUND", r


@pytest.mark.parametrize("vid", MALFORMED_IDS[1:], ids=lambda s: s[:12])
def test_stage_malformed_volume_not_found(env, csi, vid):
    r = csi.NodeStageVolume(**stage_req(vid, env.staging()))
    assert r.code == "NOT_FOUND", r
    assert fuse_mounts(env) == []


def test_stage_relative_path_invalid(env, kubelet, csi):
    vid = kubelet.create("v")
    os.makedirs(os.path.join(env.base, "rel"), exist_ok=True)
    r = csi.NodeStageVolume(**stage_req(vid, "rel"))
    assert r.code == "INVALID_ARGUMENT", r
    assert fuse_mounts(env) == []


def test_stage_block_invalid(env, kubelet, csi):
    vid = kubelet.create("v")
    r = csi.NodeStageVolume(**stage_req(vid, env.staging(), cap(block=True)))
    assert r.code == "INVALID_ARGUMENT", r


def test_stage_mounts_stratafs(env, kubelet, strata):
    vid = kubelet.create("v", layers="base,extra")
    st = kubelet.stage(vid)
    # the call returned: the mount answers right away
    assert sorted(os.listdir(st)) == ["big.bin", "dir", "extra.txt", "lower.txt"]
    assert read_file(os.path.join(st, "lower.txt")) == b"from the lower layer\n"
    ms = mounts_at(st)
    assert [m["fstype"] for m in ms] == [STRATAFS_FSTYPE]
    opts = mount_opts(st)
    assert "allow_other" in opts and "default_permissions" in opts, opts
    rec = strata.node_record(vid)
    assert rec is not None
    assert st in str(rec)
    pid = strata.daemon_pid(vid)
    assert pid_alive(pid)
    # the daemon is detached from the plugin's session
    assert os.getsid(pid) != os.getsid(strata.proc.pid)
    assert os.path.exists(strata.path("node", vid + ".log"))


def test_stage_writes_go_to_upper(env, kubelet, strata):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "new.txt"), "hello")
    assert read_file(strata.path("volumes", vid, "upper", "new.txt")) == b"hello"
    assert not os.path.exists(strata.path("layers", "base", "new.txt"))


def test_stage_idempotent_one_daemon(env, kubelet, strata):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    pid = strata.daemon_pid(vid)
    for _ in range(3):
        assert kubelet.csi.NodeStageVolume(**stage_req(vid, st)).code == "OK"
    assert strata.daemon_pid(vid) == pid
    assert len(mounts_at(st)) == 1
    assert len(fuse_mounts(env)) == 1


def test_stage_other_path_already_exists(env, kubelet, strata):
    vid = kubelet.create("v")
    kubelet.stage(vid, env.staging("first"))
    other = env.staging("second")
    r = kubelet.csi.NodeStageVolume(**stage_req(vid, other))
    assert r.code == "ALREADY_EXISTS", r
    assert not is_mounted(other)
    assert len(fuse_mounts(env)) == 1


def test_stage_failing_daemon_reports_its_error(env):
    fake = env.script("fake-stratafs", "#!/bin/sh\n"
                      "echo 'fake-stratafs: cannot open layer XYZZY-4711' >&2\n"
                      "exit 1\n")
    p = env.plugin(root=env.layered_root(), stratafs=fake)
    kube = Kubelet(env, p)
    vid = kube.create("v")
    st = env.staging()
    r = p.csi.NodeStageVolume(**stage_req(vid, st))
    assert r.code == "INTERNAL", r
    assert "XYZZY-4711" in r.details, r.details
    assert not is_mounted(st)
    assert p.node_record(vid) is None
    assert fuse_mounts(env) == []
    assert p.alive()
    # the volume is not left staged: it can be deleted
    assert p.csi.DeleteVolume(volume_id=vid).code == "OK"


@pytest.mark.timeout(90)
def test_stage_daemon_that_never_mounts(env):
    """A daemon that neither mounts nor exits: the stage fails (within the
    plugin's stage timeout) and the daemon is stopped."""
    marker = os.path.join(env.base, "hung.pid")
    fake = env.script("hung-stratafs", "#!/bin/sh\n"
                      f"echo $$ > {marker}\n"
                      "exec sleep 600\n")
    p = env.plugin(root=env.layered_root(), stratafs=fake)
    vid = Kubelet(env, p).create("v")
    st = env.staging()
    r = p.csi.NodeStageVolume(**stage_req(vid, st), timeout=40)
    assert r.code not in ("OK", "DEADLINE_EXCEEDED"), r
    pid = int(read_file(marker))
    assert_daemon_gone(pid, p)
    assert p.node_record(vid) is None
    assert not is_mounted(st)


def test_volume_mount_group(env, kubelet, strata):
    vid = kubelet.create("v")
    lower = os.stat(strata.path("layers", "base"))
    c = cap(group="1234")
    st = kubelet.stage(vid, capability=c)
    s = os.stat(st)
    assert s.st_gid == 1234
    assert s.st_mode & stat.S_ISGID, oct(s.st_mode)
    assert s.st_mode & stat.S_IWGRP, oct(s.st_mode)
    tgt = kubelet.publish(vid, st, capability=c)
    assert os.stat(tgt).st_gid == 1234
    # the lower layer itself is untouched
    after = os.stat(strata.path("layers", "base"))
    assert (after.st_gid, after.st_mode) == (lower.st_gid, lower.st_mode)


@pytest.mark.parametrize("group", ["abc", "-1", "12x", "0x10"])
def test_volume_mount_group_non_numeric_invalid(env, kubelet, csi, group):
    vid = kubelet.create("v")
    st = env.staging()
    r = csi.NodeStageVolume(**stage_req(vid, st, cap(group=group)))
    assert r.code == "INVALID_ARGUMENT", r
    assert not is_mounted(st)


def test_max_volumes(env):
    p = env.plugin(root=env.layered_root(), max_volumes=2)
    kube = Kubelet(env, p)
    vids = [kube.create(f"v{i}") for i in range(3)]
    kube.stage(vids[0])
    kube.stage(vids[1])
    st = env.staging("third")
    r = p.csi.NodeStageVolume(**stage_req(vids[2], st))
    assert r.code == "RESOURCE_EXHAUSTED", r
    assert not is_mounted(st)
    # a staged one may still be re-staged (idempotent), and freeing a slot works
    assert p.csi.NodeStageVolume(**stage_req(vids[0], env.staging(vids[0]))).code == "OK"
    kube.unstage(vids[1], env.staging(vids[1]))
    kube.stage(vids[2], st)


# --------------------------------------------------------------------------
# NodePublishVolume

def pub_req(vid, st, tgt, readonly=False, capability=None):
    return dict(volume_id=vid, staging_target_path=st, target_path=tgt,
                readonly=readonly,
                volume_capability=capability if capability is not None else cap())


@pytest.mark.parametrize("missing", ["volume_id", "staging_target_path",
                                     "target_path", "volume_capability"])
def test_publish_requires_fields(env, kubelet, csi, missing):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = env.target()
    req = pub_req(vid, st, tgt)
    del req[missing]
    r = csi.NodePublishVolume(**req)
    # CSI v1.12's table: a staging plugin given no staging path is
    # FAILED_PRECONDITION; every other missing field is INVALID_ARGUMENT
    want = "FAILED_PRECONDITION" if missing == "staging_target_path" else \
        "INVALID_ARGUMENT"
    assert r.code == want, r
    assert not os.path.exists(tgt) or not is_mounted(tgt)


def test_publish_not_staged(env, kubelet, csi):
    vid = kubelet.create("v")
    tgt = env.target()
    r = csi.NodePublishVolume(**pub_req(vid, env.staging(), tgt))
    assert r.code == "FAILED_PRECONDITION", r
    assert not is_mounted(tgt)


def test_publish_wrong_staging_path(env, kubelet, csi):
    vid = kubelet.create("v")
    kubelet.stage(vid)
    tgt = env.target()
    r = csi.NodePublishVolume(**pub_req(vid, env.staging("elsewhere"), tgt))
    assert r.code == "FAILED_PRECONDITION", r
    assert not is_mounted(tgt)


def test_publish_unknown_volume(env, csi):
    r = csi.NodePublishVolume(**pub_req(UNKNOWN_ID, env.staging(), env.target()))
    assert r.code in ("NOT_FOUND",), r


def test_publish_creates_target_and_binds(env, kubelet):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = env.target()
    assert not os.path.exists(tgt)
    kubelet.publish(vid, st, tgt)
    assert os.path.isdir(tgt)
    assert is_mounted(tgt, STRATAFS_FSTYPE)
    assert read_file(os.path.join(tgt, "lower.txt")) == b"from the lower layer\n"
    write_file(os.path.join(tgt, "via-target"), "t")
    assert read_file(os.path.join(st, "via-target")) == b"t"


def test_publish_readonly(env, kubelet):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st, readonly=True)
    assert "ro" in mount_opts(tgt)
    assert errno_of(write_file, os.path.join(tgt, "nope"), "x") == errno.EROFS
    assert errno_of(os.unlink, os.path.join(tgt, "lower.txt")) == errno.EROFS
    # the staging mount stays writable
    write_file(os.path.join(st, "yes"), "x")
    assert read_file(os.path.join(tgt, "yes")) == b"x"


def test_publish_ro_mount_flag(env, kubelet):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st, capability=cap(flags=["ro"]))
    assert errno_of(write_file, os.path.join(tgt, "nope"), "x") == errno.EROFS


def test_publish_idempotent(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    assert csi.NodePublishVolume(**pub_req(vid, st, tgt)).code == "OK"
    assert len(mounts_at(tgt)) == 1


def test_publish_same_target_other_args_already_exists(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt, readonly=True))
    assert r.code == "ALREADY_EXISTS", r
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt, capability=cap(flags=["noexec"])))
    assert r.code == "ALREADY_EXISTS", r
    assert len(mounts_at(tgt)) == 1
    assert "ro" not in mount_opts(tgt)


def test_publish_target_of_another_volume_refused(env, kubelet, csi):
    """Another volume's mount at the target is not this volume published
    there with other options (ALREADY_EXISTS): the path is not usable,
    FAILED_PRECONDITION, and nothing is mounted over it."""
    v1, v2 = kubelet.create("v1"), kubelet.create("v2")
    s1, s2 = kubelet.stage(v1), kubelet.stage(v2)
    tgt = kubelet.publish(v1, s1)
    r = csi.NodePublishVolume(**pub_req(v2, s2, tgt))
    assert r.code == "FAILED_PRECONDITION", r
    assert len(mounts_at(tgt)) == 1


def test_two_targets_share_data(env, kubelet):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    t1 = kubelet.publish(vid, st, env.target("pod-a"))
    t2 = kubelet.publish(vid, st, env.target("pod-b"))
    write_file(os.path.join(t1, "shared"), "from a")
    assert read_file(os.path.join(t2, "shared")) == b"from a"
    os.mkdir(os.path.join(t2, "sub"))
    assert os.path.isdir(os.path.join(t1, "sub"))


def test_publish_mount_flags_applied(env, kubelet):
    vid = kubelet.create("v")
    flags = ["noexec", "nosuid", "nodev", "noatime"]
    c = cap(flags=flags)
    st = kubelet.stage(vid, capability=c)
    tgt = kubelet.publish(vid, st, capability=c)
    opts = mount_opts(tgt)
    for f in flags:
        assert f in opts, (f, opts)


@pytest.mark.parametrize("flags", [["relatime"], ["nodiratime"], ["ro", "nosuid"]])
def test_publish_other_accepted_flags(env, kubelet, flags):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    kubelet.publish(vid, st, capability=cap(flags=flags))


@pytest.mark.parametrize("flag", ["remount", "bind", "rbind", "uid=0", "suid",
                                  "x-foo", "noexec,dev", "", "rw,remount"])
def test_publish_bad_mount_flags_invalid(env, kubelet, csi, flag):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = env.target()
    r = csi.NodePublishVolume(**pub_req(vid, st, tgt, capability=cap(flags=[flag])))
    assert r.code == "INVALID_ARGUMENT", r
    assert not is_mounted(tgt)


def test_publish_relative_target_invalid(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    r = csi.NodePublishVolume(**pub_req(vid, st, "relative/target"))
    assert r.code == "INVALID_ARGUMENT", r


# --------------------------------------------------------------------------
# NodeUnpublishVolume

def published_req_without(kubelet, path_field, missing):
    """(request fields, target) for a published volume: volume_id and
    `path_field` (the target), less the field `missing`."""
    vid = kubelet.create("v")
    tgt = kubelet.publish(vid, kubelet.stage(vid))
    req = {"volume_id": vid, path_field: tgt}
    del req[missing]
    return req, tgt


@pytest.mark.parametrize("missing", ["volume_id", "target_path"])
def test_unpublish_requires_fields(env, kubelet, csi, missing):
    req, tgt = published_req_without(kubelet, "target_path", missing)
    assert csi.NodeUnpublishVolume(**req).code == "INVALID_ARGUMENT"
    assert is_mounted(tgt)


def test_unpublish_removes_target(env, kubelet, strata, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    t1 = kubelet.publish(vid, st, env.target("a"))
    t2 = kubelet.publish(vid, st, env.target("b"))
    kubelet.unpublish(vid, t1)
    assert not os.path.exists(t1)
    assert os.path.isdir(os.path.dirname(t1)), "the kubelet's parent dir was removed"
    assert is_mounted(t2) and answers(t2)
    assert is_mounted(st)
    assert t1 not in str(strata.node_record(vid))
    assert t2 in str(strata.node_record(vid))
    # repeated: OK
    kubelet.unpublish(vid, t1)


def test_unpublish_missing_target_ok(env, kubelet, csi):
    vid = kubelet.create("v")
    assert csi.NodeUnpublishVolume(volume_id=vid,
                                   target_path=env.target("never")).code == "OK"


def test_unpublish_unknown_volume(env, kubelet, csi):
    """The spec lists NOT_FOUND for a volume that does not exist; OK (already
    unpublished) is the idempotent reading.  Either way nothing is touched."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    r = csi.NodeUnpublishVolume(volume_id=UNKNOWN_ID, target_path=tgt)
    assert r.code in ("OK", "NOT_FOUND"), r
    assert is_mounted(tgt) and answers(tgt)


def test_unpublish_after_daemon_killed(env, kubelet, strata):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    pid = strata.daemon_pid(vid)
    os.kill(pid, signal.SIGKILL)
    poll(lambda: errno_of(os.listdir, tgt) == errno.ENOTCONN, 5,
         what="ENOTCONN on the target")
    kubelet.unpublish(vid, tgt)
    assert not os.path.exists(tgt)
    assert not is_mounted(tgt)
    kubelet.unstage(vid, st)
    assert not is_mounted(st)
    assert strata.node_record(vid) is None


def test_unpublish_leaves_foreign_mount_alone(env, kubelet, csi):
    """A target that is not this volume's publish is not unmounted."""
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    other = env.target("foreign")
    os.makedirs(other)
    import subprocess
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", other], check=True)
    r = csi.NodeUnpublishVolume(volume_id=vid, target_path=other)
    assert r.code in ("OK", "NOT_FOUND", "FAILED_PRECONDITION"), r
    assert is_mounted(other, "tmpfs"), f"{r.code}: a foreign mount was unmounted"
    assert os.path.isdir(other)


# --------------------------------------------------------------------------
# NodeUnstageVolume

@pytest.mark.parametrize("missing", ["volume_id", "staging_target_path"])
def test_unstage_requires_fields(env, kubelet, csi, missing):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    req = dict(volume_id=vid, staging_target_path=st)
    del req[missing]
    assert csi.NodeUnstageVolume(**req).code == "INVALID_ARGUMENT"
    assert is_mounted(st)


def test_unstage_stops_daemon(env, kubelet, strata):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    pid = strata.daemon_pid(vid)
    kubelet.unstage(vid, st)
    assert not is_mounted(st)
    assert os.path.isdir(st), "the kubelet's staging dir was removed"
    assert_daemon_gone(pid, strata)
    assert strata.node_record(vid) is None
    kubelet.unstage(vid, st)       # repeated: OK
    # the data stays in the volume
    assert os.path.isdir(strata.path("volumes", vid, "upper"))


def test_unstage_unknown_volume_not_found(env, kubelet, csi):
    """CSI v1.12's error table: a volume that does not exist is NOT_FOUND;
    a volume that exists but is not staged (any more) is OK."""
    st = env.staging()
    r = csi.NodeUnstageVolume(volume_id=UNKNOWN_ID, staging_target_path=st)
    assert r.code == "NOT_FOUND", r
    vid = kubelet.create("v")
    assert csi.NodeUnstageVolume(volume_id=vid, staging_target_path=st).code == "OK"


def test_unstage_malformed_id_touches_nothing(env, kubelet, strata, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    r = csi.NodeUnstageVolume(volume_id="../node/" + vid, staging_target_path=st)
    assert r.code in ("OK", "NOT_FOUND", "INVALID_ARGUMENT"), r
    assert is_mounted(st) and answers(st)
    assert strata.node_record(vid) is not None


def test_restage_after_unstage(env, kubelet, strata):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "kept"), "across stages")
    kubelet.unstage(vid, st)
    st2 = kubelet.stage(vid, env.staging("again"))
    assert read_file(os.path.join(st2, "kept")) == b"across stages"


# --------------------------------------------------------------------------
# NodeGetVolumeStats

def usage(reply):
    U = pb().VolumeUsage.Unit
    return {U.Name(u.unit): u for u in reply.usage}


@pytest.mark.parametrize("missing", ["volume_id", "volume_path"])
def test_stats_requires_fields(env, kubelet, csi, missing):
    req, _ = published_req_without(kubelet, "volume_path", missing)
    assert csi.NodeGetVolumeStats(**req).code == "INVALID_ARGUMENT"


def test_stats_wrong_path_not_found(env, kubelet, csi):
    v1, v2 = kubelet.create("v1"), kubelet.create("v2")
    s1, s2 = kubelet.stage(v1), kubelet.stage(v2)
    t2 = kubelet.publish(v2, s2)
    assert csi.NodeGetVolumeStats(volume_id=v1, volume_path=t2).code == "NOT_FOUND"
    assert csi.NodeGetVolumeStats(volume_id=v1, volume_path=env.base).code == "NOT_FOUND"
    assert csi.NodeGetVolumeStats(volume_id=UNKNOWN_ID, volume_path=t2).code == "NOT_FOUND"


def test_stats_usage_grows(env, kubelet, csi):
    vid = kubelet.create("v")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    assert code == "OK", r
    u = usage(r)
    assert set(u) >= {"BYTES", "INODES"}, u
    before_b, before_i = u["BYTES"].used, u["INODES"].used
    assert u["BYTES"].total > 0 and u["INODES"].total > 0
    write_file(os.path.join(tgt, "ten"), os.urandom(10 * MiB))
    for i in range(10):
        write_file(os.path.join(tgt, f"f{i}"), "x")
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    assert code == "OK"
    u = usage(r)
    grown = u["BYTES"].used - before_b
    assert 9 * MiB <= grown <= 12 * MiB, grown
    assert u["INODES"].used - before_i >= 10
    # the staging path works too
    assert csi.NodeGetVolumeStats(volume_id=vid, volume_path=st).code == "OK"


def test_stats_total_is_capacity(env, kubelet, csi):
    vid = kubelet.create("v", capacity=64 * MiB)
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    write_file(os.path.join(tgt, "one"), os.urandom(MiB))
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    assert code == "OK", r
    b = usage(r)["BYTES"]
    assert b.total == 64 * MiB
    assert b.used >= MiB
    assert 0 <= b.available <= 64 * MiB - MiB


# --------------------------------------------------------------------------
# NodeGetCapabilities, NodeGetInfo

def test_node_capabilities(csi):
    got = rpc_capabilities(csi, "NodeGetCapabilities", pb().NodeServiceCapability)
    assert {"STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS", "VOLUME_MOUNT_GROUP",
            "SINGLE_NODE_MULTI_WRITER", "VOLUME_CONDITION"} <= got
    assert "EXPAND_VOLUME" not in got


def test_node_info(csi):
    code, r = csi.NodeGetInfo()
    assert code == "OK"
    assert r.node_id == DEFAULT_NODE
    assert r.max_volumes_per_node == 0
    assert dict(r.accessible_topology.segments) == {"strata.csi.dev/node": DEFAULT_NODE}


def test_node_info_flags(env):
    p = env.plugin(root=env.layered_root(), node="worker-3", driver="x.strata.io",
                   max_volumes=17)
    code, r = p.csi.NodeGetInfo()
    assert code == "OK"
    assert r.node_id == "worker-3"
    assert r.max_volumes_per_node == 17
    assert dict(r.accessible_topology.segments) == {"x.strata.io/node": "worker-3"}


@pytest.mark.timeout(90)
def test_reader_only_stage_is_read_only(env, kubelet, strata):
    """A reader-only capability mounts the staging path read-only too, as
    /proc/mounts says; a heal keeps it so, and a writer stage does not."""
    vid = kubelet.create("pvc-reader")
    reader = cap("SINGLE_NODE_READER_ONLY")
    st = kubelet.stage(vid, capability=reader)
    assert "ro" in mount_opts(st)
    assert errno_of(write_file, os.path.join(st, "x"), "x") == errno.EROFS
    tgt = kubelet.publish(vid, st, capability=reader)
    assert "ro" in mount_opts(tgt)
    # the same stage again is the same capability: OK
    kubelet.stage(vid, st, capability=reader)
    pid = strata.daemon_pid(vid)
    os.kill(pid, signal.SIGKILL)
    poll(lambda: strata.daemon_pid(vid) not in (None, pid), timeout=60,
         what="a healed daemon")
    poll(lambda: answers(st), timeout=30, what="the healed staging mount")
    assert "ro" in mount_opts(st)
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)
    writer = kubelet.create("pvc-writer")
    st2 = kubelet.stage(writer)
    assert "rw" in mount_opts(st2)
    kubelet.unstage(writer, st2)
