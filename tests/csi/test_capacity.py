# SPDX-License-Identifier: Apache-2.0
"""Capacity through the real plugin: the daemon enforces a volume's capacity
(ENOSPC in the pod's path, statfs of the volume's size), NodeGetVolumeStats
answers from the daemon's counters without a walk, and online expansion
(ControllerExpandVolume, NodeExpandVolume, stratactl expand-volume) raises
the limit of a published volume at once."""

import os
import signal
import subprocess

import pytest

from csitest import (Kubelet, MiB, answers, pb, poll, read_file,
                     stratactl_binary, stratafs_binary)
from strata_common import control_usage, fill_to_enospc

UNKNOWN_ID = "sv-" + "f" * 32


def usage(reply):
    U = pb().VolumeUsage.Unit
    return {U.Name(u.unit): u for u in reply.usage}


def daemon_usage(p, vid):
    return control_usage(p.path("node", f"{vid}.ctl"))


def expand(csi, vid, required, limit=0):
    return csi.ControllerExpandVolume(
        volume_id=vid,
        capacity_range=pb().CapacityRange(required_bytes=required,
                                          limit_bytes=limit))


def size_of(path):
    sv = os.statvfs(path)
    return sv.f_blocks * sv.f_frsize


@pytest.fixture
def published(env, kubelet, strata):
    vid = kubelet.create("cap", capacity=10 * MiB)
    st = kubelet.stage(vid)
    return vid, st, kubelet.publish(vid, st)


def test_capacity_enforced_in_the_pod(strata, csi, published):
    vid, st, tgt = published
    assert "capacity=10485760" in " ".join(
        open(f"/proc/{strata.daemon_pid(vid)}/cmdline").read().split("\0"))
    assert size_of(tgt) == size_of(st) == 10 * MiB
    done = fill_to_enospc(os.path.join(tgt, "eleven"), limit=11 * MiB)
    assert 9 * MiB < done <= 10 * MiB
    assert read_file(os.path.join(tgt, "eleven")) == b"d" * done

    def same():
        # the RELEASE after close(2) may still settle the file's count
        code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
        assert code == "OK", r
        b, i = usage(r)["BYTES"], usage(r)["INODES"]
        d = daemon_usage(strata, vid)
        assert b.total == 10 * MiB and not r.volume_condition.abnormal
        return (b.used, i.used, b.available) == \
            (d["used"], d["inodes"], max(0, 10 * MiB - d["used"]))
    poll(same, 10, what="NodeGetVolumeStats to agree with the daemon")


def test_stats_come_from_the_counters_not_a_walk(strata, csi, published):
    vid, st, tgt = published
    with open(os.path.join(tgt, "one"), "wb") as f:
        f.write(b"1" * MiB)
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    before = usage(r)["BYTES"].used
    # a file put in the upper behind the daemon's back: a walk would see it
    with open(strata.path("volumes", vid, "upper", "behind"), "wb") as f:
        f.write(b"b" * (2 * MiB))
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=st)
    assert code == "OK" and usage(r)["BYTES"].used == before


def test_stats_from_the_usage_file_when_the_daemon_is_silent(strata, csi,
                                                              published):
    vid, st, tgt = published
    with open(os.path.join(tgt, "one"), "wb") as f:
        f.write(b"1" * MiB)
    used = daemon_usage(strata, vid)["used"]
    # the daemon saves every few seconds: wait for its file to say so
    ufile = strata.path("volumes", vid, "usage")
    poll(lambda: f"bytes={used}\n" in open(ufile).read(), 15,
         what="the daemon to save its usage")
    worker = int(open(f"/proc/{strata.daemon_pid(vid)}/task/"
                      f"{strata.daemon_pid(vid)}/children").read().split()[0])
    os.kill(worker, signal.SIGSTOP)
    try:
        code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert code == "OK", r
    assert usage(r)["BYTES"].used == used
    assert r.volume_condition.abnormal
    assert "its usage is as last saved: its daemon did not answer" \
        in r.volume_condition.message


def test_expand_while_published(env, strata, csi, kubelet):
    vid = kubelet.create("grow", capacity=4 * MiB)
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    done = fill_to_enospc(os.path.join(tgt, "f"))
    code, r = expand(csi, vid, 12 * MiB)
    assert code == "OK", r
    assert r.capacity_bytes == 12 * MiB and r.node_expansion_required
    assert strata.volume_record(vid)["capacity_bytes"] == 12 * MiB
    # the record alone does not reach the daemon ...
    assert size_of(tgt) == 4 * MiB
    code, r = csi.NodeExpandVolume(volume_id=vid, volume_path=tgt)
    assert code == "OK", r
    assert r.capacity_bytes == 12 * MiB
    # ... NodeExpandVolume does, at once, and the writes go on
    assert size_of(tgt) == 12 * MiB
    more = fill_to_enospc(os.path.join(tgt, "f"))
    assert more > 7 * MiB
    assert read_file(os.path.join(tgt, "f")) == b"d" * (done + more)
    # a daemon started later (a new stage) takes it from the record
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)
    st2 = kubelet.stage(vid, env.staging("again"))
    assert size_of(st2) == 12 * MiB


def test_expand_errors_and_idempotency(strata, csi, kubelet):
    vid = kubelet.create("e", capacity=8 * MiB)
    # not staged: nothing for the node to do
    code, r = expand(csi, vid, 8 * MiB)
    assert code == "OK" and r.capacity_bytes == 8 * MiB
    assert not r.node_expansion_required
    # a range the volume meets: done, unchanged
    code, r = expand(csi, vid, 4 * MiB)
    assert code == "OK" and r.capacity_bytes == 8 * MiB
    code, r = expand(csi, vid, 4 * MiB, 16 * MiB)
    assert code == "OK" and r.capacity_bytes == 8 * MiB
    # shrinking is refused
    r = expand(csi, vid, 2 * MiB, 4 * MiB)
    assert r.code == "OUT_OF_RANGE" and "never shrink" in r.details
    r = expand(csi, vid, 32 * MiB, 16 * MiB)
    assert r.code == "OUT_OF_RANGE"
    assert strata.volume_record(vid)["capacity_bytes"] == 8 * MiB
    # growing twice to the same size: the second is a no-op
    for _ in range(2):
        code, r = expand(csi, vid, 9 * MiB)
        assert code == "OK" and r.capacity_bytes == 9 * MiB
    assert expand(csi, UNKNOWN_ID, MiB).code == "NOT_FOUND"
    assert expand(csi, "", MiB).code == "INVALID_ARGUMENT"
    assert expand(csi, vid, -1).code == "INVALID_ARGUMENT"
    r = csi.ControllerExpandVolume(volume_id=vid)
    assert r.code == "INVALID_ARGUMENT" and "capacity_range" in r.details
    # an unlimited volume meets any required size, and shrinks to no limit
    free = kubelet.create("free")
    code, r = expand(csi, free, 5 * MiB)
    assert code == "OK" and r.capacity_bytes == 0
    assert expand(csi, free, MiB, 2 * MiB).code == "OUT_OF_RANGE"


def test_node_expand_errors(env, strata, csi, kubelet):
    vid = kubelet.create("n", capacity=8 * MiB)
    assert csi.NodeExpandVolume(volume_id="", volume_path="/x").code == \
        "INVALID_ARGUMENT"
    assert csi.NodeExpandVolume(volume_id=vid, volume_path="").code == \
        "INVALID_ARGUMENT"
    assert csi.NodeExpandVolume(volume_id=UNKNOWN_ID, volume_path="/x").code == \
        "NOT_FOUND"
    # not staged anywhere, then staged but asked at another path
    assert csi.NodeExpandVolume(volume_id=vid, volume_path="/x").code == "NOT_FOUND"
    st = kubelet.stage(vid)
    assert csi.NodeExpandVolume(volume_id=vid, volume_path=env.base).code == \
        "NOT_FOUND"
    # the staging path is one, and a range past the record is not granted
    code, r = csi.NodeExpandVolume(volume_id=vid, volume_path=st)
    assert code == "OK" and r.capacity_bytes == 8 * MiB
    r = csi.NodeExpandVolume(volume_id=vid, volume_path=st,
                             capacity_range=pb().CapacityRange(
                                 required_bytes=16 * MiB))
    assert r.code == "OUT_OF_RANGE" and "ControllerExpandVolume first" in r.details


def test_heal_keeps_the_usage(strata, csi, published):
    vid, st, tgt = published
    with open(os.path.join(tgt, "kept"), "wb") as f:
        f.write(b"k" * (3 * MiB))
    before = daemon_usage(strata, vid)
    pid = strata.daemon_pid(vid)
    os.kill(pid, signal.SIGKILL)
    poll(lambda: strata.daemon_pid(vid) != pid and answers(tgt), 20,
         what="the plugin to heal the volume")
    # the new daemon found no clean usage file, and counted the upper
    after = daemon_usage(strata, vid)
    assert (after["used"], after["inodes"]) == (before["used"], before["inodes"])
    assert after["capacity"] == 10 * MiB
    code, r = csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)
    assert code == "OK" and usage(r)["BYTES"].used == before["used"]
    done = fill_to_enospc(os.path.join(tgt, "more"))
    assert done <= 10 * MiB - before["used"]


def test_passthrough_with_a_capacity_refused(csi, kubelet):
    r = csi.CreateVolume(name="pt", parameters={"passthrough": "true"},
                         volume_capabilities=[pb().VolumeCapability(
                             mount=pb().VolumeCapability.MountVolume(),
                             access_mode=pb().VolumeCapability.AccessMode(
                                 mode=pb().VolumeCapability.AccessMode.Mode.Value(
                                     "SINGLE_NODE_WRITER")))],
                         capacity_range=pb().CapacityRange(required_bytes=MiB))
    assert r.code == "INVALID_ARGUMENT"
    assert "passthrough=true and a capacity_range do not go together" in r.details
    # without a capacity it is made
    kubelet.create("pt", params={"passthrough": "true"})


def test_stratactl_expand_volume(strata, kubelet):
    vid = kubelet.create("ctl", capacity=4 * MiB)

    def ctl(*args):
        return subprocess.run([stratactl_binary(), "--endpoint", strata.endpoint,
                               *args], capture_output=True, text=True,
                              timeout=60)

    r = ctl("expand-volume", vid, "--capacity", "8Mi")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"expanded {vid} to {8 * MiB} bytes\n"
    assert strata.volume_record(vid)["capacity_bytes"] == 8 * MiB
    r = ctl("expand-volume", vid, "--capacity", "1Mi", "--limit", "2Mi")
    assert r.returncode == 1 and "OUT_OF_RANGE" in r.stderr
    r = ctl("expand-volume", vid)
    assert r.returncode == 2 and "--capacity" in r.stderr
    st = kubelet.stage(vid)
    r = ctl("expand-volume", vid, "--capacity", "12Mi")
    assert r.returncode == 0 and "node-expand" in r.stdout
    r = ctl("node-expand", vid, "--path", st)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{vid} serves {12 * MiB} bytes at {st}\n"
    assert size_of(st) == 12 * MiB


def test_stats_of_a_daemon_that_predates_the_count(env):
    """A daemon started before the usage count (no control channel, no
    usage file: what a plugin upgrade finds still serving) gets its upper
    walked, and the condition says so, rather than no stats at all."""
    real = stratafs_binary()
    wrapper = env.script("stratafs", f"""#!/bin/bash
args=()
for a in "$@"; do
    args+=("$(printf '%s' "$a" | sed -E 's/,(usagefile|control)=[^,]*//g')")
done
exec {real} "${{args[@]}}"
""")
    p = env.plugin(root=env.layered_root(), stratafs=wrapper)
    kubelet = Kubelet(env, p)
    vid = kubelet.create("old", capacity=8 * MiB)
    staging = kubelet.stage(vid)
    assert "control=" not in open(
        f"/proc/{p.daemon_pid(vid)}/cmdline").read()
    with open(os.path.join(staging, "one"), "wb") as f:
        f.write(b"1" * MiB)
        os.fsync(f.fileno())
    code, r = p.csi.NodeGetVolumeStats(volume_id=vid, volume_path=staging)
    assert code == "OK", r
    assert MiB <= usage(r)["BYTES"].used < 2 * MiB
    assert r.volume_condition.abnormal
    assert "nor did it ever save its usage: walked its upper" \
        in r.volume_condition.message
