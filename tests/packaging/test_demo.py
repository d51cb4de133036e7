# SPDX-License-Identifier: Apache-2.0
"""The README's first command, scripts/demo.sh, run as written: it builds
(nothing to do after the suite's build), drives the plugin through
stratactl, and must end with everything torn down. It once failed at
NodeStageVolume (its socket sat in the directory its staging path was
in, which the plugin refuses) with no test noticing."""

import os
import subprocess

TOP = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_demo_runs_as_written():
    r = subprocess.run([os.path.join(TOP, "scripts", "demo.sh")],
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for step in ("stage it (NodeStageVolume", "copy-up:", "whiteout:",
                 "tear down:", "done: stopping the plugin"):
        assert step in out, (step, out[-4000:])
    assert "c--------- 1 root root 0, 0" in out, "no whiteout in the upper"
    assert not os.path.exists("/tmp/strata-demo"), "the demo left its files"
    with open("/proc/mounts") as f:
        assert "/tmp/strata-demo" not in f.read()
