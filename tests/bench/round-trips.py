#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""FUSE requests per operation, by opcode: create+close, unlink, a cold
stat, a 4 KiB pwrite to an upper file, tar -x and cold ls -l per entry,
a cold listing. Counted from the daemon's debug log (tests/lib/
round_trips.py says how), so the numbers are the same on an idle machine
and a loaded one: a count, not a timing. Each option set (-o) gets a
table; the default runs the default options and -o nopassthrough.
FORGET gets no reply and is shown apart from the round trips.

    sudo tests/bench/round-trips.py [--bin build/stratafs] [-n 200]
                                    [--reps 3] [-o OPTS ...]
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "lib"))

import round_trips  # noqa: E402
from strata_common import is_mounted, lazy_umount  # noqa: E402

# the order of the columns; opcodes not listed go after them
ORDER = ["LOOKUP", "GETATTR", "SETATTR", "CREATE", "MKDIR", "UNLINK", "OPEN",
         "OPENDIR", "READ", "WRITE", "RELEASE", "READDIRPLUS", "READDIR",
         "GETXATTR", "LISTXATTR", "IOCTL"]


class Mount:
    """One stratafs mount over an empty lower layer, with -o debug: what
    round_trips wants of a mount (path, stderr_path, remount, base)."""

    def __init__(self, binary, base, opts):
        self.binary, self.base = binary, base
        for d in ("lower", "upper", "work", "mnt"):
            os.makedirs(os.path.join(base, d))
        self.mnt = os.path.join(base, "mnt")
        o = [f"lowerdir={base}/lower", f"upperdir={base}/upper",
             f"workdir={base}/work", "debug"]
        self.opts = ",".join(o + ([opts] if opts else []))
        self.proc = None
        self.n = 0
        self.mount()

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def mount(self):
        self.n += 1
        self.stderr_path = os.path.join(self.base, f"stratafs.{self.n}.log")
        with open(self.stderr_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-f", "-o", self.opts, self.mnt],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while not is_mounted(self.mnt, "fuse.stratafs"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"round-trips: stratafs did not mount; see "
                         f"{self.stderr_path}")
            time.sleep(0.05)

    def unmount(self):
        subprocess.run(["fusermount3", "-u", self.mnt], check=False)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if is_mounted(self.mnt):
            lazy_umount(self.mnt)

    def remount(self):
        self.unmount()
        self.mount()


def cell(v):
    return str(int(v)) if v == int(v) else f"{v:.3f}"


def table(rows):
    cols = sorted({k for _, _, c, _ in rows for k in c},
                  key=lambda k: (ORDER.index(k) if k in ORDER else len(ORDER), k))
    out = ["| operation | per | round trips | " + " | ".join(cols) +
           " | FORGET (no reply) |",
           "| --- | --- | ---: | " + " | ".join("---:" for _ in cols) + " | ---: |"]
    for name, unit, c, forget in rows:
        out.append(f"| {name} | {unit} | {cell(sum(c.values()))} | " +
                   " | ".join(cell(c.get(k, 0)) for k in cols) +
                   f" | {cell(forget)} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "stratafs"))
    ap.add_argument("-n", type=int, default=200, help="operations per count")
    ap.add_argument("--reps", type=int, default=3,
                    help="repetitions; each opcode's least count is kept")
    ap.add_argument("-o", dest="opts", action="append",
                    help="stratafs options of a table (repeatable; "
                         "default: the defaults, then nopassthrough)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("round-trips: mounting needs root")
    print(f"stratafs {args.bin}, Linux {platform.release()}, n = {args.n}, "
          f"least of {args.reps} repetitions; load average "
          f"{os.getloadavg()[0]:.1f} (counts do not depend on it)")
    for opts in args.opts or ["", "nopassthrough"]:
        base = tempfile.mkdtemp(prefix="strata-round-trips.")
        m = None
        try:
            m = Mount(args.bin, base, opts)
            rows = []
            for op in round_trips.OPS:
                c, forget, ops = round_trips.measure(m, op, args.n, args.reps)
                rows.append((op.name, op.unit,
                             {k: v / ops for k, v in c.items()}, forget / ops))
            print(f"\n-o {opts or '(defaults)'}\n")
            print(table(rows))
        finally:
            if m:
                m.unmount()
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
