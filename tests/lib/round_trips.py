# SPDX-License-Identifier: Apache-2.0
"""How many FUSE requests an operation costs, by opcode: counted, not
timed, from the log of a stratafs daemon started with -o debug, where
libfuse names every request it reads ("unique: N, opcode: NAME (n),
nodeid: ..., pid: P"). The statistics file (-o statsfile) has no
counter for IOCTL, ACCESS, the lock requests or INTERRUPT: the log has
them all. Shared by tests/integration/test_round_trips.py (which pins the
counts) and tests/bench/round-trips.py (which prints them).

A measurement is a window between two barriers: a GETXATTR of a
security.* name on the mount's root, which the kernel sends with no
permission check and no other request. The kernel numbers requests as it
queues them, so every request the operation made (the RELEASE of a close,
sent in the background, too) has a number below the second barrier's;
the window is read once the log has every number between the two.

FORGET and BATCH_FORGET get no reply and are numbered when the daemon
reads them, not when the kernel queues them: they are counted apart
(forgets()), never as round trips.

The mount is anything with path(*parts), stderr_path (the daemon's
log, which a remount may change), remount() and base (a scratch
directory outside the mount): stratatest.Union, or the benchmark's own.
"""

import collections
import errno
import io
import os
import re
import subprocess
import tarfile
import time

LINE = re.compile(r"^unique: (\d+), opcode: (\w+) \(\d+\), nodeid: (\d+), "
                  r"insize: \d+, pid: (\d+)$", re.M)
BARRIER_XATTR = "security.strata-round-trips"
NO_REPLY = ("FORGET", "BATCH_FORGET")
WAIT = 30       # seconds for the log to hold every request of a window


def _requests(u):
    """{unique: (opcode, nodeid, pid)} of the daemon's log so far."""
    with open(u.stderr_path) as f:
        text = f.read()
    return {int(m[1]): (m[2], int(m[3]), int(m[4]))
            for m in LINE.finditer(text)}


def _barrier(u):
    """A request that fences the ones before it; returns its number.
    The root's dentry is never revalidated, the last component of a path
    is not searched, and a security.* name needs no permission: one
    GETXATTR and nothing else."""
    try:
        os.getxattr(u.path(), BARRIER_XATTR)
    except OSError as e:
        if e.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
            raise
    me = os.getpid()
    return max(k for k, (op, node, pid) in _requests(u).items()
               if op == "GETXATTR" and node == 1 and pid == me)


def window(u, fn):
    """Counter of opcodes of the requests fn() caused, FORGETs included;
    from one barrier to the next, once the log holds all of them."""
    first = _barrier(u)
    fn()
    last = _barrier(u)
    deadline = time.monotonic() + WAIT
    while True:
        reqs = _requests(u)
        # odd numbers are INTERRUPTs (the request's number | 1)
        missing = [k for k in range(first + 2, last, 2) if k not in reqs]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"requests {missing[:10]} never reached "
                                 f"the log {u.stderr_path}")
        time.sleep(0.05)
    return collections.Counter(reqs[k][0] for k in reqs if first < k < last)


def round_trips(c):
    return collections.Counter({k: v for k, v in c.items()
                                if k not in NO_REPLY and v})


def forgets(c):
    return sum(c[k] for k in NO_REPLY)


def _create(path, data=b""):
    # os.open, not open(): Python asks isatty() of a new file, an IOCTL
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if data:
            os.write(fd, data)
    finally:
        os.close(fd)


def _files(d, n):
    os.mkdir(d)
    for i in range(n):
        _create(os.path.join(d, f"f{i}"))


def _fresh(u, name):
    """A name under the mount not used before (repetitions run again)."""
    i = 0
    while os.path.lexists(u.path(f"{name}{i}")):
        i += 1
    return u.path(f"{name}{i}")


# Every operation below runs once before its window (its warm-up),
# so that the window starts in the state the operation leaves behind: the
# parent's attributes invalidated by the last create, the opcodes the
# kernel learns to skip (OPENDIR answered ENOSYS) already skipped.
# windows() returns the Counters of its windows; per() makes of them
# (requests, operations) for a per-operation figure. An operation run by
# a program (tar, ls) is measured at n and at 2n entries, so that what the
# program does once per run (open its directory, read to the end) drops
# out of the difference.

class Op:
    name = unit = ""
    # opcodes whose count per operation is not a whole number: the
    # listing requests of a big directory, one per buffer the kernel fills
    fractional = ()

    def windows(self, u, n):
        raise NotImplementedError

    @staticmethod
    def per(ws, n):
        return ws[0], n


def _each(u, d, n, fn):
    """fn on d/f<n> (the warm-up), then a window of fn on d/f0 to f<n-1>."""
    fn(os.path.join(d, f"f{n}"))
    return [window(u, lambda: [fn(os.path.join(d, f"f{i}"))
                               for i in range(n)])]


class CreateClose(Op):
    name, unit = "create+close", "file"

    def windows(self, u, n):
        d = _fresh(u, "create")
        os.mkdir(d)
        return _each(u, d, n, _create)


class Unlink(Op):
    name, unit = "unlink", "file"

    def windows(self, u, n):
        d = _fresh(u, "unlink")
        _files(d, n + 1)
        return _each(u, d, n, os.unlink)


class ColdStat(Op):
    name, unit = "cold stat", "file"

    def windows(self, u, n):
        d = _fresh(u, "stat")
        _files(d, n + 1)
        u.remount()
        return _each(u, d, n, os.stat)


class Pwrite(Op):
    name, unit = "4 KiB pwrite, upper file", "write"

    def windows(self, u, n):
        p = _fresh(u, "pwrite")
        _create(p, b"x" * 4096 * n)
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, b"w" * 4096, 0)
            return [window(u, lambda: [os.pwrite(fd, b"y" * 4096, 4096 * i)
                                       for i in range(n)])]
        finally:
            os.close(fd)


def _tarball(path, n):
    """n files of 100 bytes, root's, as an image layer would hold them."""
    with tarfile.open(path, "w") as t:
        for i in range(n):
            ti = tarfile.TarInfo(f"f{i}")
            ti.size, ti.mode, ti.mtime = 100, 0o644, 1_000_000_000
            t.addfile(ti, io.BytesIO(b"t" * 100))


class _Program(Op):
    """Two windows, at n and at 2n entries, each on a directory made for
    it alike: the difference is what n more entries cost."""

    @staticmethod
    def per(ws, n):
        c = collections.Counter(ws[1])
        c.subtract(ws[0])
        return c, n


class TarEntry(_Program):
    name, unit = "tar -x", "entry"

    def windows(self, u, n):
        tars = {}
        for k in (1, n, 2 * n):
            tars[k] = os.path.join(u.base, f"round-trips-{k}.tar")
            if not os.path.exists(tars[k]):
                _tarball(tars[k], k)

        def extract(k):
            d = _fresh(u, "tar")
            os.mkdir(d)
            return lambda: subprocess.run(["tar", "-C", d, "-xf", tars[k]],
                                          check=True)
        extract(1)()
        return [window(u, extract(k)) for k in (n, 2 * n)]


def _ls(d):
    return lambda: subprocess.run(["ls", "-l", d], check=True,
                                  stdout=subprocess.DEVNULL,
                                  env=dict(os.environ, LC_ALL="C"))


class ColdLsL(_Program):
    name, unit = "cold ls -l", "entry"
    fractional = ("READDIRPLUS", "READDIR")

    def windows(self, u, n):
        dirs = [_fresh(u, "lsl")]
        _files(dirs[0], 1)
        for k in (n, 2 * n):
            dirs.append(_fresh(u, "lsl"))
            _files(dirs[-1], k)
        u.remount()
        _ls(dirs[0])()
        return [window(u, _ls(d)) for d in dirs[1:]]


class ColdListing(Op):
    name, unit = "cold listing, 5 entries", "listing"

    def windows(self, u, n):
        top = _fresh(u, "list")
        os.mkdir(top)
        for j in range(n + 1):
            _files(os.path.join(top, f"f{j}"), 5)
        u.remount()
        return _each(u, top, n, os.listdir)


OPS = [CreateClose(), Unlink(), ColdStat(), Pwrite(), TarEntry(),
       ColdListing(), ColdLsL()]


def _drops():
    """How often anyone has written drop_caches since boot."""
    with open("/proc/vmstat") as f:
        return sum(int(line.split()[1]) for line in f
                   if line.startswith(("drop_pagecache ", "drop_slab ")))


def measure(u, op, n, reps=1, patience=60):
    """(requests, forgets, operations) of op at n, from `reps` runs that
    no drop_caches crossed (other tests drop caches, some in a loop: the
    kernel then forgets and looks up again, and may look a directory up
    where it would have refreshed its attributes), tried for up to
    `patience` seconds; from every run made when too few were quiet. Each
    window's count of each opcode is its least over those runs: what else
    the machine does (memory pressure) can only add requests to a quiet
    run."""
    runs = []
    deadline = time.monotonic() + patience
    while True:
        before = _drops()
        ws = op.windows(u, n)
        runs.append((_drops() == before, ws))
        quiet = [w for q, w in runs if q]
        if len(quiet) >= reps or time.monotonic() > deadline:
            break
    best = None
    for ws in quiet or [w for _, w in runs]:
        best = ws if best is None else [a & b for a, b in zip(best, ws)]
    total, ops = op.per(best, n)
    return round_trips(total), forgets(total), ops
