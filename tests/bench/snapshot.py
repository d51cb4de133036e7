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
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from csiplugin import Plugin  # noqa: E402


def du(path):
    """Bytes on disk below PATH (hard links once), as du counts them."""
    out = subprocess.run(["du", "-sx", "--block-size=1", path], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def fs_used(path):
    """Bytes the filesystem holding PATH has allocated: unlike du, data
    shared by reflinks (FICLONE) counts once. Only the store's own
    growth when nothing else writes to that filesystem."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def volume_args(ap):
    """The options of both snapshot benchmarks (snapshot-live.py too):
    the build, the volume's size and files, where the store goes."""
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--size", type=size_arg, default=10 << 30,
                    help="bytes in the volume (default 10G)")
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--dir", default="/var/tmp",
                    help="where the temporary store goes (one filesystem)")


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    volume_args(ap)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="strata-snap-bench.", dir=args.dir)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "layers", "base"))
    plugin = Plugin(args.bin, tmp, timeout=600)
    pb = plugin.pb
    rows = []
    try:
        vid = plugin.create_volume("big", parameters={"layers": "base"})
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

        sid = step("CreateSnapshot", lambda: plugin.call(
            "Controller", "CreateSnapshot", pb.CreateSnapshotRequest(
                name="s", source_volume_id=vid))).snapshot.snapshot_id
        step("CreateVolume from snapshot", lambda: plugin.create_volume(
            "c1", volume_content_source=pb.VolumeContentSource(
                snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id=sid))))
        step("CreateVolume from volume", lambda: plugin.create_volume(
            "c2", volume_content_source=pb.VolumeContentSource(
                volume=pb.VolumeContentSource.VolumeSource(volume_id=vid))))
        layer = os.path.join(root, "snapshots", sid, "layer")
        step("cp -a of the upper", lambda: subprocess.run(
            ["cp", "-a", layer, os.path.join(tmp, "root", "copy")], check=True))

        print(f"volume of {args.size} bytes in {args.files} fallocate'd files; "
              f"store {base} bytes on disk before; {args.dir}")
        print(f"{'operation':<30}{'seconds':>12}{'store growth (bytes)':>24}")
        for name, secs, grew in rows:
            print(f"{name:<30}{secs:12.4f}{grew:24d}")
    finally:
        plugin.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
