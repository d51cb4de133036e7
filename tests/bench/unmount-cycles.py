#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Unmount and the layers: N cycles of mount, work, fusermount3 -u and an
immediate umount2(2) of the tmpfs that holds the layers, per I/O engine.
Prints how many of those umounts were EBUSY (the daemon still held the
layers' mount) and how long the daemon took to exit after fusermount3
returned (median, p90, p99, max). A benchmark, not a test: nothing here
asserts a time; tests/integration/test_unmount.py runs a few cycles.

    tests/bench/unmount-cycles.py [--bin build/stratafs] [--cycles 500]
"""

import argparse
import os
import shutil
import sys
import tempfile

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))

from layer_cycles import run_cycle  # noqa: E402
from percentile import pct  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "stratafs"))
    ap.add_argument("--cycles", type=int, default=500)
    ap.add_argument("--files", type=int, default=300,
                    help="lower files looked up in each cycle")
    ap.add_argument("--engines", default="uring,sync")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("unmount-cycles: mounting needs root")
    base = tempfile.mkdtemp(prefix="strata-umount-")
    try:
        for engine in args.engines.split(","):
            busy, release, failed = 0, [], 0
            for i in range(args.cycles):
                d = os.path.join(base, f"{engine}{i}")
                c = run_cycle(args.bin, d, f"io={engine}", args.files)
                busy += c.ebusy
                failed += c.status != 0
                release.append(c.release * 1000)
                shutil.rmtree(d, ignore_errors=True)
            print(f"io={engine}: {args.cycles} cycles, EBUSY {busy}, "
                  f"daemon exit status != 0: {failed}; release after "
                  f"fusermount3 -u returned: median {pct(release, 50):.1f} ms, "
                  f"p90 {pct(release, 90):.1f} ms, p99 {pct(release, 99):.1f} ms, "
                  f"max {max(release):.1f} ms", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
