# SPDX-License-Identifier: Apache-2.0
"""strata-csi under valgrind: a volume lifecycle plus a few refused
requests, then SIGTERM; the plugin must exit 0 with no memory errors and no
definite leaks.  Deselect with -k 'not valgrind' (slow); skipped for a
sanitizer build, which valgrind cannot run.

Valgrind 3.19 (bookworm) does not know the new mount API (fsopen,
fsmount, open_tree, move_mount, statmount) and fails those calls with
ENOSYS. So a plugin without valgrind stages and publishes the volume, and
the plugin under valgrind adopts it after a restart, serves it, refuses a
stage with a clear error, and tears everything down. The ASan pass
(LeakSanitizer) covers the stage and publish paths.
"""

import os
import shutil
import signal

import pytest

from csitest import Kubelet, cap, is_sanitizer_build, strata_csi_binary

SUPPRESSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "valgrind.supp")
VALGRIND = ["valgrind", "--leak-check=full", "--show-leak-kinds=definite",
            "--errors-for-leak-kinds=definite", "--error-exitcode=9",
            "--child-silent-after-fork=yes", "--trace-children=no",
            f"--suppressions={SUPPRESSIONS}"]


def require_valgrind():
    """Skips a sanitizer build, fails where valgrind is missing."""
    if is_sanitizer_build(strata_csi_binary()):
        pytest.skip("strata-csi is a sanitizer (ASan) build: valgrind cannot "
                    "run it; the sanitizer itself checks memory in that pass")
    assert shutil.which("valgrind"), "valgrind is not installed (scripts/deps.sh)"


def valgrind_plugin(env, root):
    """A plugin on the store ROOT under valgrind, ready; its logs are
    env.base/valgrind.PID.log."""
    vlog = os.path.join(env.base, "valgrind.%p.log")
    p = env.plugin(root=root, prefix=VALGRIND + [f"--log-file={vlog}"],
                   start=False)
    p.start(wait="ready", timeout=120)
    return p


def assert_valgrind_clean(env, p):
    """Stops P (valgrind_plugin's) with SIGTERM: it must exit 0, and its
    logs show no memory error and no definite leak."""
    rc = p.stop(signal.SIGTERM, timeout=60)
    logs = ""
    for n in os.listdir(env.base):
        if n.startswith("valgrind.") and n.endswith(".log"):
            with open(os.path.join(env.base, n), errors="replace") as f:
                logs += f"==== {n}\n" + f.read()
    assert rc == 0, f"strata-csi under valgrind exited {rc}:\n{logs[-8000:]}"
    assert "definitely lost: 0 bytes" in logs or "no leaks are possible" in logs, \
        logs[-8000:]
    assert "ERROR SUMMARY: 0 errors" in logs, logs[-8000:]


@pytest.mark.valgrind
@pytest.mark.timeout(300)
def test_plugin_valgrind_clean(env, strata):
    require_valgrind()
    kube = Kubelet(env, strata)
    vid = kube.create("vg", layers="base,extra", capacity=8 << 20)
    st = kube.stage(vid)
    t1 = kube.publish(vid, st, env.target("a"))
    t2 = kube.publish(vid, st, env.target("b"), readonly=True)
    strata.stop()
    p = valgrind_plugin(env, strata.root)
    kube = Kubelet(env, p)
    csi = p.csi

    with open(os.path.join(t1, "f"), "w") as f:
        f.write("x")
    assert csi.NodeGetVolumeStats(volume_id=vid, volume_path=t1).code == "OK"
    assert csi.ListVolumes(max_entries=1).code == "OK"
    assert csi.GetCapacity().code == "OK"
    assert csi.NodeGetInfo().code == "OK"
    assert csi.ValidateVolumeCapabilities(volume_id=vid,
                                          volume_capabilities=[cap()]).code == "OK"
    # idempotent repeats of the adopted volume's stage and publish
    kube.stage(vid, st)
    kube.publish(vid, st, t1)
    # refusals walk the error paths
    other = kube.create("vg2")
    r = csi.NodeStageVolume(volume_id=other, staging_target_path=env.staging("o"),
                            volume_capability=cap())
    assert r.code == "INTERNAL" and "mount API" in r.details, r
    assert csi.CreateVolume(name="bad", volume_capabilities=[cap()],
                            parameters={"layers": "../etc"}).code == "INVALID_ARGUMENT"
    assert csi.CreateVolume(name="bad", volume_capabilities=[cap()],
                            parameters={"colour": "x"}).code == "INVALID_ARGUMENT"
    assert csi.call_path("/csi.v1.Node/NodeStageVolume", b"\x0a\x05ab").code == \
        "INVALID_ARGUMENT"
    assert csi.call_path("/csi.v1.Foo/Bar", b"").code == "UNIMPLEMENTED"
    assert csi.DeleteVolume(volume_id=vid).code == "FAILED_PRECONDITION"
    assert csi.ListVolumes(starting_token="bogus").code == "ABORTED"
    kube.unpublish(vid, t1)
    kube.unpublish(vid, t2)
    kube.unstage(vid, st)
    kube.delete(vid)
    kube.delete(other)

    assert_valgrind_clean(env, p)
