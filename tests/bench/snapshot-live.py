#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A snapshot of a big volume in use: staged, with a writer running.

Starts strata-csi on a temporary store, creates and stages one volume,
fills it through the mount with --files fallocate'd files of --size in
all, starts a writer that appends 4 KiB and fsyncs in a loop to a file
of its own (opened once, before the first snapshot), and takes --rounds
snapshots (CreateSnapshot: the daemon freezes its upper live through its
control channel). For each it prints:

  seconds      CreateSnapshot's reply time
  growth       what the store grew by during the call and the sync after
               it (du), less what the writer appended meanwhile
  log          the writer's file at the snapshot: its next write copies
               it up into the new upper whole, which is part of growth
  stall        the writer's slowest write+fsync around the call

A benchmark, not a test: nothing here asserts a time.

    tests/bench/snapshot-live.py --bin build [--size 10G] [--files 10]
                                 [--rounds 5] [--dir /var/tmp]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from snapshot import du, load_pb, size_arg  # noqa: E402


def call(ch, pb, service, method, req):
    f = ch.unary_unary(f"/csi.v1.{service}/{method}",
                       request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=getattr(pb, method + "Response").FromString)
    return f(req, timeout=600)


class Writer(threading.Thread):
    """Appends 4 KiB and fsyncs, recording each call's time."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.stop = threading.Event()
        self.written = 0
        self.lat = []          # (start, seconds)
        self.error = None

    def run(self):
        block = b"w" * 4096
        try:
            while not self.stop.is_set():
                t = time.monotonic()
                os.write(self.fd, block)
                os.fsync(self.fd)
                self.lat.append((t, time.monotonic() - t))
                self.written += len(block)
        except OSError as e:
            self.error = e
        finally:
            os.close(self.fd)

    def worst(self, since, until):
        return max((s for t, s in self.lat if since - 0.5 <= t <= until),
                   default=0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--size", type=size_arg, default=10 << 30,
                    help="bytes in the volume (default 10G)")
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the temporary store goes (one filesystem)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="strata-snap-live.", dir=args.dir)
    pb = load_pb(tmp)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "layers", "base"))
    staging = os.path.join(tmp, "staging")
    os.makedirs(staging)
    # the socket's directory is one the plugin never mounts in
    os.makedirs(os.path.join(tmp, "sock"))
    sock = os.path.join(tmp, "sock", "csi.sock")
    log = open(os.path.join(tmp, "plugin.log"), "w")
    plugin = subprocess.Popen(
        [os.path.join(args.bin, "strata-csi"), "--endpoint", f"unix://{sock}",
         "--nodeid", "bench", "--root", root, "-v", "0",
         "--stratafs", os.path.join(args.bin, "stratafs")],
        stdout=log, stderr=log)
    ch = grpc.insecure_channel(f"unix://{sock}")
    writer = vid = None
    try:
        grpc.channel_ready_future(ch).result(timeout=15)
        cap = pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(),
            access_mode=pb.VolumeCapability.AccessMode(mode=1))
        vid = call(ch, pb, "Controller", "CreateVolume", pb.CreateVolumeRequest(
            name="live", volume_capabilities=[cap],
            parameters={"layers": "base"})).volume.volume_id
        call(ch, pb, "Node", "NodeStageVolume", pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging,
            volume_capability=cap))
        each = args.size // args.files
        for i in range(args.files):
            subprocess.run(["fallocate", "-l", str(each),
                            os.path.join(staging, f"f{i}")], check=True)
        os.sync()
        writer = Writer(os.path.join(staging, "log"))
        writer.start()
        time.sleep(1)
        print(f"volume of {args.size} bytes in {args.files} fallocate'd "
              f"files, staged, a writer appending 4 KiB + fsync; {args.dir}")
        print(f"{'snapshot':<10}{'seconds':>10}{'growth (bytes)':>16}"
              f"{'log (bytes)':>14}{'stall (s)':>11}")
        for n in range(args.rounds):
            os.sync()
            before, wrote = du(root), writer.written
            logsize = os.stat(os.path.join(staging, "log")).st_size
            t0 = time.monotonic()
            call(ch, pb, "Controller", "CreateSnapshot", pb.CreateSnapshotRequest(
                name=f"s{n}", source_volume_id=vid))
            t1 = time.monotonic()
            time.sleep(0.5)    # the writer's next write copies its file up
            os.sync()
            grew = du(root) - before - (writer.written - wrote)
            print(f"{n + 1:<10}{t1 - t0:10.4f}{grew:16d}{logsize:14d}"
                  f"{writer.worst(t0, t1):11.4f}", flush=True)
        if writer.error:
            sys.exit(f"snapshot-live: the writer failed: {writer.error}")
    finally:
        if writer:
            writer.stop.set()
            writer.join(timeout=30)
        if vid:
            call(ch, pb, "Node", "NodeUnstageVolume", pb.NodeUnstageVolumeRequest(
                volume_id=vid, staging_target_path=staging))
        ch.close()
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
