#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What one NodeGetVolumeStats costs on a volume holding many files.

Starts the plugin on a temporary store, creates and stages one volume
with a capacity, writes --files small files into it through the mount,
then calls NodeGetVolumeStats --runs times and prints the median, p90 and
max latency and the plugin's CPU time per call (its utime+stime from
/proc before and after). A plugin that walks the upper layer per call
(before issue 13) pays for every file; one that asks the daemon's
counters does not. A benchmark, not a test: nothing here asserts a time.

    tests/bench/stats-cost.py --bin build [--files 20000] [--runs 50]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import grpc

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from csiplugin import Plugin  # noqa: E402
from percentile import pct  # noqa: E402


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("stats-cost: mounting needs root")

    tmp = tempfile.mkdtemp(prefix="strata-stats.")
    os.makedirs(os.path.join(tmp, "root", "layers", "base"))
    plugin = Plugin(args.bin, tmp, timeout=120)
    pb = plugin.pb
    staging = os.path.join(tmp, "staging")
    vid = None
    try:
        vid = plugin.create_volume(
            "bench", parameters={"layers": "base"},
            capacity_range=pb.CapacityRange(required_bytes=1 << 30))
        plugin.stage(vid, staging)
        for d in range(args.files // 1000 + 1):
            os.makedirs(os.path.join(staging, f"d{d}"), exist_ok=True)
        for i in range(args.files):
            with open(os.path.join(staging, f"d{i // 1000}", f"f{i}"), "w") as f:
                f.write("x" * 100)
        req = pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=staging)
        plugin.call("Node", "NodeGetVolumeStats", req)
        lat = []
        cpu0 = cpu_seconds(plugin.proc.pid)
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = plugin.call("Node", "NodeGetVolumeStats", req)
            lat.append((time.perf_counter() - t0) * 1e3)
        cpu = (cpu_seconds(plugin.proc.pid) - cpu0) / args.runs * 1e3
        used = {u.unit: u.used for u in r.usage}
        print(f"{args.files} files, {args.runs} calls of NodeGetVolumeStats "
              f"(milliseconds, Python gRPC client, round trip included)")
        print(f"median {statistics.median(lat):.2f}  p90 {pct(lat, 90):.2f}  "
              f"max {max(lat):.2f}  plugin CPU/call {cpu:.2f}")
        print(f"reported: {used.get(1)} bytes, {used.get(2)} inodes used")
    finally:
        if vid:
            try:
                plugin.unstage(vid, staging)
            except grpc.RpcError as e:
                print(f"unstage: {e.details()}", file=sys.stderr)
        plugin.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
