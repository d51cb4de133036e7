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
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from percentile import pct  # noqa: E402


def load_pb(tmp):
    subprocess.run(["protoc", f"--python_out={tmp}", f"-I{REPO}/csi",
                    f"{REPO}/csi/csi.proto"], check=True)
    sys.path.insert(0, tmp)
    import csi_pb2
    return csi_pb2


def rpc(ch, pb, service, method, req):
    f = ch.unary_unary(f"/csi.v1.{service}/{method}",
                       request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=getattr(pb, method + "Response").FromString)
    return f(req, timeout=120)


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
    pb = load_pb(tmp)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "layers", "base"))
    # the plugin never mounts in or above its socket's directory
    os.makedirs(os.path.join(tmp, "run"))
    sock = os.path.join(tmp, "run", "csi.sock")
    log = open(os.path.join(tmp, "plugin.log"), "w")
    plugin = subprocess.Popen(
        [os.path.join(args.bin, "strata-csi"), "--endpoint", f"unix://{sock}",
         "--nodeid", "bench", "--root", root, "-v", "0",
         "--stratafs", os.path.join(args.bin, "stratafs")],
        stdout=log, stderr=log)
    ch = grpc.insecure_channel(f"unix://{sock}")
    staging = os.path.join(tmp, "staging")
    vid = None
    try:
        grpc.channel_ready_future(ch).result(timeout=15)
        cap = pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(),
            access_mode=pb.VolumeCapability.AccessMode(mode=1))
        vid = rpc(ch, pb, "Controller", "CreateVolume", pb.CreateVolumeRequest(
            name="bench", volume_capabilities=[cap], parameters={"layers": "base"},
            capacity_range=pb.CapacityRange(required_bytes=1 << 30))).volume.volume_id
        rpc(ch, pb, "Node", "NodeStageVolume", pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging, volume_capability=cap))
        for d in range(args.files // 1000 + 1):
            os.makedirs(os.path.join(staging, f"d{d}"), exist_ok=True)
        for i in range(args.files):
            with open(os.path.join(staging, f"d{i // 1000}", f"f{i}"), "w") as f:
                f.write("x" * 100)
        req = pb.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=staging)
        rpc(ch, pb, "Node", "NodeGetVolumeStats", req)
        lat = []
        cpu0 = cpu_seconds(plugin.pid)
        for _ in range(args.runs):
            t0 = time.perf_counter()
            r = rpc(ch, pb, "Node", "NodeGetVolumeStats", req)
            lat.append((time.perf_counter() - t0) * 1e3)
        cpu = (cpu_seconds(plugin.pid) - cpu0) / args.runs * 1e3
        used = {u.unit: u.used for u in r.usage}
        print(f"{args.files} files, {args.runs} calls of NodeGetVolumeStats "
              f"(milliseconds, Python gRPC client, round trip included)")
        print(f"median {statistics.median(lat):.2f}  p90 {pct(lat, 90):.2f}  "
              f"max {max(lat):.2f}  plugin CPU/call {cpu:.2f}")
        print(f"reported: {used.get(1)} bytes, {used.get(2)} inodes used")
    finally:
        if vid:
            try:
                rpc(ch, pb, "Node", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
                    volume_id=vid, staging_target_path=staging))
            except grpc.RpcError as e:
                print(f"unstage: {e.details()}", file=sys.stderr)
        ch.close()
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
