#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""How long a live freeze (fuse/freeze.c) takes and stalls the mount: an
upper of FILES files, every one looked up (so the daemon's node table
holds them all), a writer that appends and fsyncs, a lister, and a probe
that asks the daemon something every millisecond; then EVENTS freezes
over the control channel.

For each freeze it prints the reply's latency as the client sees it, the
time requests waited at the daemon's gate (its log), and the probe's
longest wait that began around it; then median, p90 and max of each, the
load's calls and errors (there must be none), and whether every fsync'd
record is there. A benchmark, not a test: tests/integration/test_freeze.py
asserts that nothing fails, never a time.

    tests/bench/freeze-stall.py [--bin build/stratafs] [--files 100000]
                                [--events 10]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))

import mount_load  # noqa: E402
from percentile import pct  # noqa: E402
from strata_common import control_call  # noqa: E402

KINDS = ("writer", "lister", "probe")


def mount(args, base):
    lower, upper, work, mnt = (os.path.join(base, n) for n in "luwm")
    for d in (lower, upper, work, mnt, os.path.join(lower, "r"),
              os.path.join(upper, "w")):
        os.makedirs(d, exist_ok=True)
    for n in range(12):
        with open(os.path.join(lower, "r", f"f{n}"), "w") as f:
            f.write(f"f{n}" * 64)
    # the volume: FILES files in directories of 1000, made in the upper
    for n in range(args.files):
        d = os.path.join(upper, "big", f"d{n // 1000}")
        if n % 1000 == 0:
            os.makedirs(d)
        os.close(os.open(os.path.join(d, f"f{n}"), os.O_CREAT | os.O_WRONLY))
    sock = os.path.join(base, "c.sock")
    log = open(os.path.join(base, "stratafs.log"), "wb")
    proc = subprocess.Popen(
        [args.bin, "-f", "-o", f"lowerdir={lower},upperdir={upper},"
         f"workdir={work},control={sock}", mnt], stdout=log, stderr=log,
        stdin=subprocess.DEVNULL, start_new_session=True)
    for _ in range(500):
        if os.path.ismount(mnt):
            return proc, mnt, sock
        time.sleep(0.01)
    sys.exit("freeze-stall: the mount did not come up")


def run(args, base):
    proc, mnt, sock = mount(args, base)
    t = time.monotonic()
    looked = 0
    for top, ds, fs in os.walk(mnt):
        for name in fs + ds:
            os.lstat(os.path.join(top, name))
            looked += 1
    print(f"looked up {looked} entries in {time.monotonic() - t:.1f} s")
    loads = mount_load.start(KINDS, mnt, args.events * args.interval + 3, base)
    events = []
    try:
        time.sleep(1)
        for i in range(args.events):
            time.sleep(args.interval)
            at = time.monotonic()
            status, text = control_call(sock, "freeze",
                                        os.path.join(base, f"frozen{i}"),
                                        timeout=120)
            took = time.monotonic() - at
            if status != 0:
                sys.exit(f"freeze-stall: freeze {i}: {status} {text}")
            events.append((at, took))
        results = mount_load.results(loads)
        with open(os.path.join(mnt, "w", "log"), "rb") as f:
            lines = f.read().splitlines()
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        proc.wait(60)
    with open(os.path.join(base, "stratafs.log")) as f:
        gate = [int(x) / 1000 for x in
                re.findall(r"requests waited (\d+) us", f.read())]
    return events, gate, results, lines


def report(events, gate, results, lines):
    slow = results["probe"]["slow"]
    reply, stall = [], []
    for (at, took), waited in zip(events, gate):
        waits = [d for t, d in slow if at - 0.2 <= t <= at + took + 0.2]
        reply.append(took * 1000)
        stall.append(max(waits, default=0.001) * 1000)
        print(f"freeze: reply {reply[-1]:7.1f} ms, gate closed "
              f"{waited:6.2f} ms, probe's longest wait {stall[-1]:6.1f} ms")
    for what, ms in (("reply", reply), ("gate closed", gate),
                     ("probe's longest wait", stall)):
        print(f"{what}: median {pct(ms, 50):.2f} ms, p90 {pct(ms, 90):.2f} "
              f"ms, max {max(ms):.2f} ms")
    # the same probe away from any freeze: what the load alone costs
    away = [d * 1000 for t, d in slow
            if not any(at - 0.2 <= t <= at + took + 0.2
                       for at, took in events)]
    print(f"probe's waits over 1 ms away from freezes: {len(away)}, "
          f"longest {max(away, default=0):.2f} ms")
    errors = [e for r in results.values() for e in r["errors"]]
    n = results["writer"]["records"]
    lost = [i for i in range(n) if i >= len(lines) or
            lines[i] != f"{i:08d} {'x' * (i % 97)}".encode()]
    print(f"load: {sum(r['ops'] for r in results.values())} calls, "
          f"{len(errors)} errors, {n} fsync'd records, {len(lost)} lost")
    for e in errors[:20]:
        print("  " + e)
    return not errors and not lost


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "stratafs"))
    ap.add_argument("--files", type=int, default=100000)
    ap.add_argument("--events", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.5,
                    help="seconds between freezes")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("freeze-stall: mounting needs root")
    base = tempfile.mkdtemp(prefix="strata-freeze-")
    try:
        ok = report(*run(args, base))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
