#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""How long the mount stalls when stratafs's worker dies or is replaced:
a mount under load (a writer that fsyncs, a reader, a lister, fsx, a
namespace churner and a probe that asks the daemon something every
millisecond), whose worker is SIGKILLed N times, then replaced N times
by SIGHUP (an upgrade in place: the supervisor execs the binary again).

For each event it prints the probe's longest wait that began within a
second before it; then the median, p90 and max per kind, the load's
calls and errors (there must be none), and the fsync'd records checked.
A benchmark, not a test: tests/integration/test_worker.py asserts that
nothing fails, never a time.

    tests/bench/worker-restart.py [--bin build/stratafs] [--events 20]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "bench", "lib"))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))

import mount_load  # noqa: E402
from percentile import pct  # noqa: E402

KINDS = ("writer", "reader", "lister", "fsx", "churn", "probe")


def worker(sup, old=None):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        with open(f"/proc/{sup}/task/{sup}/children") as f:
            kids = [int(x) for x in f.read().split()]
        if len(kids) == 1 and kids[0] != old:
            return kids[0]
        time.sleep(0.002)
    sys.exit(f"worker-restart: no new worker under {sup}")


def mount(binary, base):
    lower, upper, work, mnt = (os.path.join(base, n) for n in "luwm")
    for d in (lower, upper, work, mnt, os.path.join(lower, "r")):
        os.makedirs(d, exist_ok=True)
    for n in range(12):
        with open(os.path.join(lower, "r", f"f{n}"), "w") as f:
            f.write(f"f{n}" * 64)
    os.makedirs(os.path.join(upper, "w"))
    log = open(os.path.join(base, "stratafs.log"), "wb")
    proc = subprocess.Popen(
        [binary, "-f", "-o", f"lowerdir={lower},upperdir={upper},"
         f"workdir={work}", mnt], stdout=log, stderr=log,
        stdin=subprocess.DEVNULL, start_new_session=True)
    for _ in range(500):
        if os.path.ismount(mnt):
            return proc, mnt
        time.sleep(0.01)
    sys.exit("worker-restart: the mount did not come up")


def run(args, base):
    proc, mnt = mount(args.bin, base)
    events = []
    loads = mount_load.start(KINDS, mnt, 2 * args.events * args.interval + 3,
                             base)
    try:
        time.sleep(1)
        w = worker(proc.pid)
        for kind in ("kill", "replace"):
            for _ in range(args.events):
                time.sleep(args.interval)
                events.append((kind, time.monotonic()))
                if kind == "kill":
                    os.kill(w, signal.SIGKILL)
                else:
                    os.kill(proc.pid, signal.SIGHUP)
                w = worker(proc.pid, old=w)
        results = mount_load.results(loads)
    finally:
        subprocess.run(["fusermount3", "-u", mnt], check=False)
        proc.wait(30)
    return events, results, mnt


def report(events, results):
    slow = results["probe"]["slow"]
    stalls = {"kill": [], "replace": []}
    for kind, at in events:
        waits = [d for t, d in slow if at - 1.0 <= t <= at + 0.2]
        stalls[kind].append(max(waits, default=0.0) * 1000)
        print(f"{kind:8s} probe waited {stalls[kind][-1]:7.1f} ms")
    for kind, ms in stalls.items():
        print(f"{kind}: {len(ms)} events, longest wait median "
              f"{pct(ms, 50):.1f} ms, p90 {pct(ms, 90):.1f} ms, "
              f"max {max(ms):.1f} ms")
    errors = [e for r in results.values() for e in r["errors"]]
    print(f"load: {sum(r['ops'] for r in results.values())} calls, "
          f"{len(errors)} errors, {results['writer']['records']} fsync'd "
          f"records")
    for e in errors[:20]:
        print("  " + e)
    return not errors


def check_records(mnt_upper, n):
    with open(os.path.join(mnt_upper, "w", "log"), "rb") as f:
        lines = f.read().splitlines()
    lost = [i for i in range(n)
            if i >= len(lines) or lines[i] != f"{i:08d} {'x' * (i % 97)}".encode()]
    print(f"fsync'd records lost: {len(lost)}")
    return not lost


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "stratafs"))
    ap.add_argument("--events", type=int, default=20,
                    help="kills, and as many replacements")
    ap.add_argument("--interval", type=float, default=1.2,
                    help="seconds between events (a worker dying younger "
                         "than 1 s counts towards giving up)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("worker-restart: mounting needs root")
    base = tempfile.mkdtemp(prefix="strata-restart-")
    try:
        events, results, _ = run(args, base)
        ok = report(events, results)
        ok = check_records(os.path.join(base, "u"),
                           results["writer"]["records"]) and ok
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
