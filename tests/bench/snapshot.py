#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A snapshot and a clone of a big volume against a copy of its upper.

Starts strata-csi on a temporary store, creates one volume and fills its
upper (the volume is not staged: its upper is a plain directory) with
--files fallocate'd files of --size in all, then times, and measures the
store's growth (du of the store) of:

  CreateSnapshot            the volume's upper renamed into a layer
  CreateVolume (snapshot)   a clone: a fresh upper over the snapshot
  CreateVolume (volume)     a clone of the volume: a hidden snapshot + clone
  cp -a of the upper        what a copying driver would do

A benchmark, not a test: nothing here asserts a time. The copy can take
minutes and writes --size to the disk; the store is removed at the end.

    tests/bench/snapshot.py --bin build [--size 10G] [--files 10] [--dir /var/tmp]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load_pb(tmp):
    subprocess.run(["protoc", f"--python_out={tmp}", f"-I{REPO}/csi",
                    f"{REPO}/csi/csi.proto"], check=True)
    sys.path.insert(0, tmp)
    import csi_pb2
    return csi_pb2


def rpc(ch, pb, method, req):
    f = ch.unary_unary(f"/csi.v1.Controller/{method}",
                       request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=getattr(pb, method + "Response").FromString)
    return f(req, timeout=600)


def du(path):
    """Bytes on disk below PATH (hard links once), as du counts them."""
    out = subprocess.run(["du", "-sx", "--block-size=1", path], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--size", type=size_arg, default=10 << 30,
                    help="bytes in the volume (default 10G)")
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the temporary store goes (one filesystem)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="strata-snap-bench.", dir=args.dir)
    pb = load_pb(tmp)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "layers", "base"))
    sock = os.path.join(tmp, "csi.sock")
    log = open(os.path.join(tmp, "plugin.log"), "w")
    plugin = subprocess.Popen(
        [os.path.join(args.bin, "strata-csi"), "--endpoint", f"unix://{sock}",
         "--nodeid", "bench", "--root", root, "-v", "0",
         "--stratafs", os.path.join(args.bin, "stratafs")],
        stdout=log, stderr=log)
    ch = grpc.insecure_channel(f"unix://{sock}")
    rows = []
    try:
        grpc.channel_ready_future(ch).result(timeout=15)
        cap = pb.VolumeCapability(
            mount=pb.VolumeCapability.MountVolume(),
            access_mode=pb.VolumeCapability.AccessMode(mode=1))
        vid = rpc(ch, pb, "CreateVolume", pb.CreateVolumeRequest(
            name="big", volume_capabilities=[cap],
            parameters={"layers": "base"})).volume.volume_id
        upper = os.path.join(root, "volumes", vid, "upper")
        each = args.size // args.files
        for i in range(args.files):
            subprocess.run(["fallocate", "-l", str(each),
                            os.path.join(upper, f"f{i}")], check=True)
        os.sync()
        base = du(root)

        def step(name, fn):
            before = du(root)
            r, secs = timed(fn)
            os.sync()
            rows.append((name, secs, du(root) - before))
            return r

        sid = step("CreateSnapshot", lambda: rpc(ch, pb, "CreateSnapshot",
                   pb.CreateSnapshotRequest(name="s", source_volume_id=vid))
                   ).snapshot.snapshot_id
        step("CreateVolume from snapshot", lambda: rpc(
            ch, pb, "CreateVolume", pb.CreateVolumeRequest(
                name="c1", volume_capabilities=[cap],
                volume_content_source=pb.VolumeContentSource(
                    snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=sid)))))
        step("CreateVolume from volume", lambda: rpc(
            ch, pb, "CreateVolume", pb.CreateVolumeRequest(
                name="c2", volume_capabilities=[cap],
                volume_content_source=pb.VolumeContentSource(
                    volume=pb.VolumeContentSource.VolumeSource(volume_id=vid)))))
        layer = os.path.join(root, "snapshots", sid, "layer")
        step("cp -a of the upper", lambda: subprocess.run(
            ["cp", "-a", layer, os.path.join(tmp, "root", "copy")], check=True))

        print(f"volume of {args.size} bytes in {args.files} fallocate'd files; "
              f"store {base} bytes on disk before; {args.dir}")
        print(f"{'operation':<30}{'seconds':>12}{'store growth (bytes)':>24}")
        for name, secs, grew in rows:
            print(f"{name:<30}{secs:12.4f}{grew:24d}")
    finally:
        ch.close()
        plugin.send_signal(signal.SIGTERM)
        plugin.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
