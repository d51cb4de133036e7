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
  fs growth    the same from the filesystem's free space: data a reflink
               shares counts once (du counts it in each file); meaningful
               on a filesystem of its own (--dir on a dedicated mount)
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
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from csiplugin import Plugin  # noqa: E402
from snapshot import du, fs_used, volume_args  # noqa: E402


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
    volume_args(ap)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="strata-snap-live.", dir=args.dir)
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "layers", "base"))
    staging = os.path.join(tmp, "staging")
    os.makedirs(staging)
    plugin = Plugin(args.bin, tmp, timeout=600)
    writer = vid = None
    try:
        vid = plugin.create_volume("live", parameters={"layers": "base"})
        plugin.stage(vid, staging)
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
              f"{'fs growth':>14}{'log (bytes)':>14}{'stall (s)':>11}")
        for n in range(args.rounds):
            os.sync()
            before, fs_before, wrote = du(root), fs_used(root), writer.written
            logsize = os.stat(os.path.join(staging, "log")).st_size
            t0 = time.monotonic()
            plugin.call("Controller", "CreateSnapshot", plugin.pb.CreateSnapshotRequest(
                name=f"s{n}", source_volume_id=vid))
            t1 = time.monotonic()
            time.sleep(0.5)    # the writer's next write copies its file up
            os.sync()
            appended = writer.written - wrote
            grew = du(root) - before - appended
            fs_grew = fs_used(root) - fs_before - appended
            print(f"{n + 1:<10}{t1 - t0:10.4f}{grew:16d}{fs_grew:14d}{logsize:14d}"
                  f"{writer.worst(t0, t1):11.4f}", flush=True)
        if writer.error:
            sys.exit(f"snapshot-live: the writer failed: {writer.error}")
    finally:
        if writer:
            writer.stop.set()
            writer.join(timeout=30)
        if vid:
            plugin.unstage(vid, staging)
        plugin.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
