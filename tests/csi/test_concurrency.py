# SPDX-License-Identifier: Apache-2.0
"""Many volumes at once, and a second operation on a volume while one is in
flight."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from csitest import (STRATAFS_FSTYPE, Kubelet, cap, is_mounted, mounts_under,
                     pid_alive, poll, read_file, stratafs_binary, write_file,
                     assert_daemon_gone)

N = 20


@pytest.mark.timeout(150)
def test_twenty_volumes_in_parallel(env, kubelet, strata):
    def up(i):
        vid = kubelet.create(f"par-{i}")
        st = kubelet.stage(vid)
        tgt = kubelet.publish(vid, st)
        write_file(os.path.join(tgt, "who"), f"volume {i}")
        return vid, st, tgt

    with ThreadPoolExecutor(N) as ex:
        vols = list(ex.map(up, range(N)))
    assert len({v for v, _, _ in vols}) == N
    pids = {strata.daemon_pid(v) for v, _, _ in vols}
    assert len(pids) == N and all(pid_alive(p) for p in pids)
    for i, (vid, st, tgt) in enumerate(vols):
        assert is_mounted(st, STRATAFS_FSTYPE)
        assert read_file(os.path.join(tgt, "who")) == f"volume {i}".encode()
        assert read_file(os.path.join(tgt, "lower.txt")) == b"from the lower layer\n"
    code, r = strata.csi.ListVolumes()
    assert code == "OK" and len(r.entries) == N

    def down(v):
        vid, st, tgt = v
        kubelet.unpublish(vid, tgt)
        kubelet.unstage(vid, st)
        kubelet.delete(vid)

    with ThreadPoolExecutor(N) as ex:
        list(ex.map(down, vols))
    assert mounts_under(env.base) == []
    for p in pids:
        assert_daemon_gone(p, strata)
    assert os.listdir(strata.path("volumes")) == []
    assert [n for n in os.listdir(strata.path("node")) if n.endswith(".json")] == []


@pytest.mark.timeout(60)
def test_parallel_create_same_name_one_volume(env, kubelet, strata):
    def create(_):
        r = strata.csi.CreateVolume(name="contended", volume_capabilities=[cap()],
                                    parameters={"layers": "base"})
        return r.code, r.reply.volume.volume_id if r.reply else r.details

    with ThreadPoolExecutor(10) as ex:
        res = list(ex.map(create, range(10)))
    ok = {vid for code, vid in res if code == "OK"}
    assert len(ok) == 1, res
    assert all(code in ("OK", "ABORTED") for code, _ in res), res
    assert os.listdir(strata.path("volumes")) == list(ok)


def slow_stratafs(env):
    """A stratafs wrapper that announces itself and waits for a go-ahead,
    so a NodeStageVolume is reliably in flight."""
    started = os.path.join(env.base, "started")
    go = os.path.join(env.base, "go")
    real = stratafs_binary()
    script = env.script("slow-stratafs", f"""#!/bin/sh
touch {started}
i=0
while [ ! -e {go} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
exec {real} "$@"
""")
    return script, started, go


@pytest.mark.timeout(60)
def test_operation_in_flight_aborted(env):
    script, started, go = slow_stratafs(env)
    p = env.plugin(root=env.layered_root(), stratafs=script)
    kube = Kubelet(env, p)
    vid = kube.create("busy")
    st = env.staging()
    result = {}

    def stage():
        result["first"] = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                                                volume_capability=cap())
    t = threading.Thread(target=stage)
    t.start()
    try:
        poll(lambda: os.path.exists(started), 10, what="the daemon to start")
        second = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                                       volume_capability=cap(), timeout=10)
        unstage = p.csi.NodeUnstageVolume(volume_id=vid, staging_target_path=st,
                                          timeout=10)
        delete = p.csi.DeleteVolume(volume_id=vid, timeout=10)
        # other volumes and other methods are not blocked meanwhile
        other = kube.create("free")
        assert p.csi.NodeGetInfo(timeout=5).code == "OK"
    finally:
        with open(go, "w"):
            pass
        t.join(40)
    assert second.code == "ABORTED", second
    assert unstage.code == "ABORTED", unstage
    assert delete.code in ("ABORTED", "FAILED_PRECONDITION"), delete
    assert result["first"].code == "OK", result["first"]
    assert is_mounted(st, STRATAFS_FSTYPE)
    kube.unstage(vid, st)
    kube.delete(vid)
    kube.delete(other)


@pytest.mark.timeout(60)
def test_no_aborted_without_concurrent_calls(env, kubelet, strata):
    """Calls made one at a time never meet ABORTED: the plugin's own
    background checks of staged volumes must not make a kubelet call fail."""
    vid = kubelet.create("steady")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    codes = {}
    deadline = time.monotonic() + 6   # several check periods
    n = 0
    while time.monotonic() < deadline:
        for r in (strata.csi.NodePublishVolume(volume_id=vid, staging_target_path=st,
                                               target_path=tgt, volume_capability=cap()),
                  strata.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                                             volume_capability=cap()),
                  strata.csi.NodeGetVolumeStats(volume_id=vid, volume_path=tgt)):
            codes[r.code] = codes.get(r.code, 0) + 1
            n += 1
    assert codes == {"OK": n}, codes
