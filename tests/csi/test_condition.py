# SPDX-License-Identifier: Apache-2.0
"""VolumeCondition (CSI v1.12, VOLUME_CONDITION on both services): what
NodeGetVolumeStats and ControllerGetVolume say about a volume's health,
through the real plugin, with each abnormal state made for real: a killed
daemon, a removed or unreadable layer, an upper that takes no writes."""

import os
import shutil
import signal
import subprocess

from csitest import Kubelet, pid_alive, poll, stratafs_binary
from test_inline import publish_inline


def get_volume(csi, vid):
    res = csi.ControllerGetVolume(volume_id=vid)
    assert res.code == "OK", (res.code, res.details)
    return res.reply


def condition(csi, vid):
    c = get_volume(csi, vid).status.volume_condition
    return c.abnormal, c.message


def stats_condition(csi, vid, path):
    res = csi.NodeGetVolumeStats(volume_id=vid, volume_path=path)
    assert res.code == "OK", (res.code, res.details)
    c = res.reply.volume_condition
    return c.abnormal, c.message


def test_a_healthy_volume_staged_or_not(kubelet, csi, strata):
    vid = kubelet.create("healthy", layers="base,extra", capacity=1 << 20)
    r = get_volume(csi, vid)
    assert r.volume.volume_id == vid and r.volume.capacity_bytes == 1 << 20
    assert dict(r.volume.volume_context) == {"layers": "base,extra"}
    assert condition(csi, vid) == (False, "the volume is healthy")
    staging = kubelet.stage(vid)
    target = kubelet.publish(vid, staging)
    assert condition(csi, vid) == (False, "the volume is healthy")
    assert stats_condition(csi, vid, target) == (False, "the volume is healthy")
    # the upper check leaves nothing behind in the volume
    assert os.listdir(strata.path("volumes", vid, "upper")) == []


def test_get_volume_errors(csi, kubelet):
    res = csi.ControllerGetVolume(volume_id="")
    assert res.code == "INVALID_ARGUMENT" and "volume_id is required" in res.details
    for vid in ("sv-00000000000000000000000000000000", "../etc", "nope"):
        res = csi.ControllerGetVolume(volume_id=vid)
        assert res.code == "NOT_FOUND", (vid, res.code)
        assert "no such volume" in res.details
    vid = kubelet.create("gone")
    kubelet.delete(vid)
    assert csi.ControllerGetVolume(volume_id=vid)[0] == "NOT_FOUND"


def test_a_dead_daemon_is_abnormal_until_healed(env):
    """The plugin starts daemons through a wrapper; while the wrapper
    fails, a killed daemon cannot be healed and stays dead."""
    real = stratafs_binary()
    wrapper = env.script("stratafs", f'#!/bin/sh\nexec {real} "$@"\n')
    p = env.plugin(root=env.layered_root(), stratafs=wrapper)
    kubelet = Kubelet(env, p)
    vid = kubelet.create("dead")
    staging = kubelet.stage(vid)
    pid = p.daemon_pid(vid)
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    os.kill(pid, signal.SIGKILL)
    poll(lambda: not pid_alive(pid), what="the daemon's death")
    abnormal, msg = condition(p.csi, vid)
    assert abnormal and f"its daemon (pid {pid}) is not running" in msg, msg
    assert stats_condition(p.csi, vid, staging) == (abnormal, msg)
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec {real} "$@"\n')
    poll(lambda: condition(p.csi, vid) == (False, "the volume is healthy"),
         timeout=30, what="the heal")
    assert stats_condition(p.csi, vid, staging) == (False, "the volume is healthy")


def test_a_removed_layer_is_abnormal(kubelet, csi, strata):
    staged = kubelet.create("staged", layers="base,extra")
    idle = kubelet.create("idle", layers="extra")
    staging = kubelet.stage(staged)
    shutil.rmtree(strata.path("layers", "extra"))
    abnormal, msg = stats_condition(csi, staged, staging)
    assert abnormal and "its lower layer 'extra' was removed" in msg, msg
    assert condition(csi, staged) == (abnormal, msg)
    # unstaged: the store's layers/ is all there is to check
    abnormal, msg = condition(csi, idle)
    assert abnormal, msg
    assert "its lower layer 'extra' cannot be opened" in msg
    assert strata.root in msg


def test_a_layer_that_is_not_a_directory_is_abnormal(kubelet, csi, strata):
    vid = kubelet.create("file", layers="extra")
    shutil.rmtree(strata.path("layers", "extra"))
    with open(strata.path("layers", "extra"), "w") as f:
        f.write("not a layer")
    abnormal, msg = condition(csi, vid)
    assert abnormal and "its lower layer 'extra' cannot be opened" in msg
    assert "Not a directory" in msg


def test_an_upper_that_takes_no_writes_is_abnormal(kubelet, csi, strata):
    vid = kubelet.create("ro")
    staging = kubelet.stage(vid)
    upper = strata.path("volumes", vid, "upper")
    # a read-only mount over the upper, as a store remounted ro would be
    subprocess.run(["mount", "--bind", upper, upper], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", upper], check=True)
        abnormal, msg = stats_condition(csi, vid, staging)
        assert abnormal, msg
        assert f"its upper layer {strata.root}/volumes/{vid}/upper cannot be written" in msg
        assert "Read-only file system" in msg
    finally:
        subprocess.run(["umount", upper], check=True)
    assert stats_condition(csi, vid, staging) == (False, "the volume is healthy")


def test_a_missing_upper_is_abnormal(kubelet, csi, strata):
    vid = kubelet.create("noupper")
    upper = strata.path("volumes", vid, "upper")
    os.rename(upper, upper + ".away")
    try:
        abnormal, msg = condition(csi, vid)
        assert abnormal and "its upper layer" in msg and "cannot be opened" in msg
    finally:
        os.rename(upper + ".away", upper)
    assert condition(csi, vid) == (False, "the volume is healthy")


def test_inline_volumes_are_not_the_controllers(env, csi, strata):
    """An inline volume belongs to its pod: ControllerGetVolume knows it
    by neither id, while NodeGetVolumeStats reports its condition."""
    kid = "csi-" + "cd34" * 16
    target = env.target("inline")
    assert publish_inline(csi, kid, target).code == "OK"
    try:
        vid, = os.listdir(strata.path("volumes"))
        for name in (kid, vid):
            assert csi.ControllerGetVolume(volume_id=name).code == "NOT_FOUND", name
        assert stats_condition(csi, kid, target) == (False, "the volume is healthy")
    finally:
        assert csi.NodeUnpublishVolume(volume_id=kid, target_path=target)[0] == "OK"
