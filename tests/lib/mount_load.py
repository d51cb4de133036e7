#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Load on a mount while something is done to its daemon (workers killed,
replaced, upgraded): run as a program, one process per load, so that each
has its own current directory and descriptors.

    mount_load.py KIND DIR SECONDS RESULT

KIND is one of:
  writer  -- current directory DIR (inside the mount); appends numbered
             records to a file held open, fsyncs each, and counts them in
             RESULT: every record counted must be there at the end
  reader  -- reads the files DIR/r/* (made before, their contents named
             by their names) over and over, from descriptors held open
             and from new ones
  lister  -- lists DIR/r, and a directory it changes itself, over and over
  fsx     -- random writes, truncates, reads and fsyncs on DIR/fsx, checked
             against a copy in memory
  churn   -- creates (O_EXCL), renames, links, unlinks, mkdirs and rmdirs
             in a directory of its own, each checked against what it
             expects to be there
  probe   -- asks the daemon about DIR over and over (listxattr: the
             kernel caches no answer to it) and records each wait over
             a millisecond, with when it began

Every failed call is an error, with its errno. RESULT is JSON:
{"errors": [...], "ops": N, "longest": seconds, "records": N,
 "slow": [[CLOCK_MONOTONIC start, seconds], ...]}.

Imported, start() and results() run a set of loads on a mount.
"""

import errno
import json
import os
import random
import subprocess
import sys
import time

PROGRAM = os.path.abspath(__file__)


def start(kinds, mnt, seconds, resdir):
    """One process of this program per load of KINDS on the mount MNT for
    SECONDS, the writer in MNT/w (made by the caller), each with its result
    in RESDIR/KIND.json: [(kind, process, result path)]."""
    loads = []
    for k in kinds:
        res = os.path.join(resdir, f"{k}.json")
        d = os.path.join(mnt, "w") if k == "writer" else mnt
        loads.append((k, subprocess.Popen([sys.executable, PROGRAM, k, d,
                                           str(seconds), res]), res))
    return loads


def results(loads):
    """The result of each load of start(), once it has exited: {kind: ...}."""
    got = {}
    for k, p, res in loads:
        p.wait()
        with open(res) as f:
            got[k] = json.load(f)
    return got


class Load:
    def __init__(self, kind, d, seconds):
        self.kind, self.d, self.end = kind, d, time.monotonic() + seconds
        self.errors, self.ops, self.longest, self.records = [], 0, 0.0, 0
        self.slow = []
        self.rng = random.Random(os.getpid())

    def running(self):
        return time.monotonic() < self.end and len(self.errors) < 20

    def call(self, what, fn, *args):
        """fn(*args), or the OSError it raised, which is an error."""
        t = time.monotonic()
        try:
            return fn(*args)
        except OSError as e:
            self.errors.append(f"{self.kind}: {what}: "
                               f"{errno.errorcode.get(e.errno, e.errno)} {e}")
            return e
        finally:
            took = time.monotonic() - t
            self.longest = max(self.longest, took)
            if took > 0.001:
                self.slow.append([t, took])
            self.ops += 1

    def result(self):
        return {"errors": self.errors, "ops": self.ops,
                "longest": self.longest, "records": self.records,
                "slow": self.slow}


def writer(ld):
    os.chdir(ld.d)
    fd = os.open("log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seq = 0
    while ld.running():
        rec = f"{seq:08d} {'x' * (seq % 97)}\n".encode()
        if isinstance(ld.call("write", os.write, fd, rec), OSError):
            break
        if isinstance(ld.call("fsync", os.fsync, fd), OSError):
            break
        seq += 1
        ld.records = seq
        # a relative name through the current directory, now and then
        if seq % 50 == 0:
            ld.call("stat", os.stat, "log")
    os.close(fd)


def reader(ld):
    base = os.path.join(ld.d, "r")
    names = sorted(os.listdir(base))
    held = {n: os.open(os.path.join(base, n), os.O_RDONLY) for n in names[:4]}
    while ld.running():
        n = ld.rng.choice(names)
        want = (n * 64).encode()
        if n in held and ld.rng.random() < 0.5:
            got = ld.call("pread", os.pread, held[n], len(want) + 1, 0)
        else:
            got = ld.call("read", _read, os.path.join(base, n))
        if not isinstance(got, OSError) and got != want:
            ld.errors.append(f"reader: {n}: read {got[:40]!r}")
    for fd in held.values():
        os.close(fd)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def lister(ld):
    base = os.path.join(ld.d, "r")
    want = set(os.listdir(base))
    own = os.path.join(ld.d, f"lister.{os.getpid()}")
    os.makedirs(own)
    mine = set()
    i = 0
    while ld.running():
        got = ld.call("listdir", os.listdir, base)
        if not isinstance(got, OSError) and set(got) != want:
            ld.errors.append(f"lister: {base}: {sorted(set(got) ^ want)[:5]}")
        name = f"e{i % 40}"
        i += 1
        if name in mine:
            r = ld.call("unlink", os.unlink, os.path.join(own, name))
            if not isinstance(r, OSError):
                mine.discard(name)
        else:
            r = ld.call("mknod", os.mknod, os.path.join(own, name))
            if not isinstance(r, OSError):
                mine.add(name)
        got = ld.call("listdir", os.listdir, own)
        if not isinstance(got, OSError) and set(got) != mine:
            ld.errors.append(f"lister: {own}: {sorted(set(got) ^ mine)[:5]}")


def differs(got, want):
    """What a read got wrong, for the error: its length and where the
    first wrong byte is."""
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                min(len(got), len(want)))
    return f"got {len(got)} bytes of {len(want)}, first difference at +{same}"


def fsx(ld):
    path = os.path.join(ld.d, "fsx")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    shadow = bytearray()
    limit = 256 * 1024
    log = []            # the last calls, for the error message
    while ld.running():
        op = ld.rng.random()
        off = ld.rng.randrange(0, limit)
        n = ld.rng.randrange(1, 16384)
        log = log[-12:] + [(round(op, 2), off, n, len(shadow))]
        if op < 0.45:
            data = os.urandom(n)
            if isinstance(ld.call("pwrite", os.pwrite, fd, data, off), OSError):
                break
            if len(shadow) < off:
                shadow.extend(b"\0" * (off - len(shadow)))
            shadow[off:off + n] = data
        elif op < 0.55:
            if isinstance(ld.call("ftruncate", os.ftruncate, fd, off), OSError):
                break
            if len(shadow) < off:
                shadow.extend(b"\0" * (off - len(shadow)))
            del shadow[off:]
        elif op < 0.6:
            ld.call("fsync", os.fsync, fd)
        else:
            got = ld.call("pread", os.pread, fd, n, off)
            want = bytes(shadow[off:off + n])
            if not isinstance(got, OSError) and got != want:
                ld.errors.append(f"fsx: read {n} at {off} differs: "
                                 f"{differs(got, want)}; last calls (op, "
                                 f"offset, size, file size before): {log}")
    got = ld.call("pread", os.pread, fd, limit * 2, 0)
    if not isinstance(got, OSError) and got != bytes(shadow):
        ld.errors.append("fsx: the file differs from its copy at the end")
    os.close(fd)


def churn(ld):
    """Namespace calls whose answers are known: a call the kernel sent again
    after a worker died must answer as if it had been sent once."""
    base = os.path.join(ld.d, f"churn.{os.getpid()}")
    os.makedirs(base)
    have = {}           # name -> "d", or the file's number (links share it)
    log = []            # the last calls, for the error message
    dumped = False
    i = 0
    while ld.running():
        i += 1
        name = f"n{ld.rng.randrange(24)}"
        other = f"n{ld.rng.randrange(24)}"
        p, q = os.path.join(base, name), os.path.join(base, other)
        kind = have.get(name)
        op = ld.rng.random()
        log = log[-30:] + [(name, other, kind, round(op, 2))]
        if kind is None and op < 0.5:
            r = ld.call("create", os.open, p,
                        os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            if not isinstance(r, OSError):
                os.close(r)
                have[name] = i
        elif kind is None:
            if not isinstance(ld.call("mkdir", os.mkdir, p), OSError):
                have[name] = "d"
        elif kind == "d":
            if not isinstance(ld.call("rmdir", os.rmdir, p), OSError):
                del have[name]
        elif op < 0.3:
            if not isinstance(ld.call("unlink", os.unlink, p), OSError):
                del have[name]
        elif op < 0.6:
            if have.get(other) != "d" and \
                    not isinstance(ld.call("rename", os.rename, p, q), OSError):
                # two names of one file: rename(2) leaves both
                if have.get(other) != kind:
                    del have[name]
                    have[other] = kind
        elif other not in have:
            if not isinstance(ld.call("link", os.link, p, q), OSError):
                have[other] = kind
        if ld.errors and not dumped:
            dumped = True
            ld.errors.append(f"churn: after {log}")
        if i % 20 == 0:
            got = ld.call("listdir", os.listdir, base)
            if not isinstance(got, OSError) and set(got) != set(have):
                ld.errors.append(f"churn: {sorted(set(got) ^ set(have))} "
                                 f"after {log}")


def probe(ld):
    while ld.running():
        ld.call("listxattr", os.listxattr, ld.d)
        time.sleep(0.001)


def main():
    kind, d, seconds, result = sys.argv[1:5]
    ld = Load(kind, d, float(seconds))
    try:
        globals()[kind](ld)
    except OSError as e:
        ld.errors.append(f"{kind}: set-up: {e}")
    with open(result, "w") as f:
        json.dump(ld.result(), f)


if __name__ == "__main__":
    main()
