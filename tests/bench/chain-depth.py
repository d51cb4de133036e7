#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What a deep layer chain costs: lookups and readdir through stratafs
and kernel overlayfs over 1, 8, 32 (and 64) lower layers.

Snapshots and clones stack a volume's old uppers as lower layers, so a
volume snapshotted often reads through a deep chain. Every layer holds
FILES/depth files of one shared directory (a merged directory at every
depth), plus a directory of its own. Per depth and target, on a fresh
mount each time (cold dentry and attribute caches, drop_caches first):

- stat of every file in the bottom layer (each lookup misses in every
  layer above it: the worst case);
- stat of every file of the shared directory (spread over the chain);
- readdir of the shared directory (merges every layer);
- lookup of a name that is nowhere (a miss in every layer).

It prints one line per depth and target with the median of --rounds
rounds in microseconds per operation, and the ratio to the same target
at depth 1. A benchmark, never a test.

    tests/bench/chain-depth.py [--bin build/stratafs] [--files 4000]
                               [--depths 1,8,32,64] [--rounds 3]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))


def make_layers(base, depth, files):
    """depth layers, top first; returns their paths and the bottom's names."""
    layers = []
    per = max(1, files // depth)
    for k in range(depth):
        d = os.path.join(base, f"layer{k}")
        os.makedirs(os.path.join(d, "shared"))
        os.makedirs(os.path.join(d, f"own{k}"))
        for j in range(per):
            with open(os.path.join(d, "shared", f"f{k}_{j}"), "w") as f:
                f.write("x")
        layers.append(d)
    bottom = [os.path.join("shared", f"f{depth - 1}_{j}") for j in range(per)]
    return layers, bottom


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mount(target, binary, layers, base, mnt):
    upper, work = os.path.join(base, "upper"), os.path.join(base, "work")
    for d in (upper, work):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    opts = f"lowerdir={':'.join(layers)},upperdir={upper},workdir={work}"
    if target == "kernel":
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, mnt],
                       check=True)
    else:
        with open(os.path.join(base, "stratafs.log"), "ab") as log:
            subprocess.run([binary, "-o", opts, mnt], check=True,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    for _ in range(1000):
        if os.path.ismount(mnt):
            return
        time.sleep(0.01)
    sys.exit(f"chain-depth: {target} did not mount")


def umount(mnt):
    subprocess.run(["umount", mnt], check=True)


def timed(fn, n):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6 / max(1, n)


def one_round(target, binary, layers, bottom, base, mnt):
    """Microseconds per operation for each workload, each on a fresh mount."""
    out = {}
    shared = os.path.join(mnt, "shared")

    def fresh():
        drop_caches()
        mount(target, binary, layers, base, mnt)

    fresh()
    out["stat bottom"] = timed(
        lambda: [os.stat(os.path.join(mnt, p)) for p in bottom], len(bottom))
    umount(mnt)
    fresh()
    names = []
    out["readdir"] = timed(lambda: names.extend(os.listdir(shared)), 1)
    umount(mnt)
    fresh()
    out["stat all"] = timed(
        lambda: [os.stat(os.path.join(shared, n)) for n in names], len(names))
    umount(mnt)
    fresh()

    def misses():
        for j in range(len(bottom)):
            try:
                os.stat(os.path.join(shared, f"nowhere{j}"))
            except FileNotFoundError:
                pass
    out["miss"] = timed(misses, len(bottom))
    umount(mnt)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "stratafs"))
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--depths", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/strata-chain-bench")
    args = ap.parse_args()
    if os.geteuid():
        sys.exit("chain-depth: needs root (mounts, drop_caches)")
    os.makedirs(args.dir, exist_ok=True)
    base = tempfile.mkdtemp(dir=args.dir)
    mnt = os.path.join(base, "mnt")
    os.makedirs(mnt)
    first = {}
    kinds = ("stat bottom", "stat all", "readdir", "miss")
    print(f"{args.files} files over the chain; µs per operation (readdir: "
          f"µs per listing), median of {args.rounds}; (×) = against depth 1")
    print(f"{'depth':>5} {'target':>8} " + " ".join(f"{k:>20}" for k in kinds))
    try:
        for depth in (int(d) for d in args.depths.split(",")):
            lbase = os.path.join(base, f"d{depth}")
            layers, bottom = make_layers(lbase, depth, args.files)
            for target in ("kernel", "stratafs"):
                rounds = [one_round(target, args.bin, layers, bottom, lbase,
                                    mnt) for _ in range(args.rounds)]
                med = {k: statistics.median(r[k] for r in rounds)
                       for k in kinds}
                first.setdefault(target, med)
                cells = [f"{med[k]:>11.1f} ({med[k] / first[target][k]:>4.1f}×)"
                         for k in kinds]
                print(f"{depth:>5} {target:>8} " + " ".join(
                    f"{c:>20}" for c in cells), flush=True)
            shutil.rmtree(lbase)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", mnt])
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
