#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""NodeStageVolume-to-ready and NodePublishVolume latency of strata-csi.

Starts the plugin on a temporary store with a small layer, creates one
volume, then N times: stage (timed until the RPC returns, which the plugin
does only once the new stratafs mount answers), publish (timed), unpublish
and unstage. Prints median, p90, p99 and max per RPC. A benchmark, not a
test: nothing here asserts a time.

    tests/bench/csi-latency.py --bin build [--runs 100] [--json FILE]
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from csiplugin import Plugin  # noqa: E402
from percentile import pct  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--json", help="also write the samples here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("csi-latency: mounting needs root")

    tmp = tempfile.mkdtemp(prefix="strata-csi-lat.")
    layer = os.path.join(tmp, "root", "layers", "base", "dir")
    os.makedirs(layer)
    for i in range(100):
        with open(os.path.join(layer, f"f{i}"), "w") as f:
            f.write("x" * 1000)
    plugin = Plugin(args.bin, tmp, timeout=60)
    pb = plugin.pb
    try:
        vid = plugin.create_volume("bench", parameters={"layers": "base"})
        staging = os.path.join(tmp, "staging")
        target = os.path.join(tmp, "pod", "vol")
        os.makedirs(os.path.dirname(target))
        stage, publish = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            plugin.stage(vid, staging)
            t1 = time.perf_counter()
            plugin.call("Node", "NodePublishVolume", pb.NodePublishVolumeRequest(
                volume_id=vid, staging_target_path=staging, target_path=target,
                volume_capability=plugin.cap))
            t2 = time.perf_counter()
            os.stat(os.path.join(target, "dir", "f1"))
            plugin.call("Node", "NodeUnpublishVolume", pb.NodeUnpublishVolumeRequest(
                volume_id=vid, target_path=target))
            plugin.unstage(vid, staging)
            stage.append((t1 - t0) * 1e3)
            publish.append((t2 - t1) * 1e3)
        plugin.call("Controller", "DeleteVolume",
                    pb.DeleteVolumeRequest(volume_id=vid))
        print(f"{args.runs} runs, milliseconds, from a Python gRPC client "
              f"(round trip included)")
        print(f"{'rpc':<22}{'median':>9}{'p90':>9}{'p99':>9}{'max':>9}")
        for name, xs in (("NodeStageVolume", stage), ("NodePublishVolume", publish)):
            print(f"{name:<22}{statistics.median(xs):9.2f}{pct(xs, 90):9.2f}"
                  f"{pct(xs, 99):9.2f}{max(xs):9.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"stage_ms": stage, "publish_ms": publish}, f)
    finally:
        plugin.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
