# SPDX-License-Identifier: Apache-2.0
"""Races on the daemon's node lifetimes.

Each test runs storms of operations from several processes at once while
the kernel forgets inodes under them (drop_caches in a loop), so that
FORGETs arrive between a reply and the end of its handler, renames move
parents under walks, and opens race copy-ups. What must hold: no
operation sees an error the storm cannot explain, the merged view is
right afterwards, and the daemon exits cleanly with no sanitizer report
(the unmount in teardown checks that, and the ASan and TSan passes of
scripts/test.sh run these tests on those builds).

They prove nothing on a quiet machine alone: scripts/test.sh also runs
this file twice at once (tests/race-pair.sh).
"""

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from stratatest import read_bytes

pytestmark = pytest.mark.stratafs

STORM_SECONDS = float(os.environ.get("STRATA_RACE_SECONDS", "6"))


class Forgetter:
    """Makes the kernel drop its dentries and inodes in a loop: each
    drop sends FORGETs for every node nobody holds."""

    def __init__(self):
        self.stop = threading.Event()
        self.drops = 0
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("2")
            self.drops += 1
            time.sleep(0.002)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join(30)
        assert self.drops > 0


def run_workers(script, args_list, timeout=STORM_SECONDS * 10 + 60):
    """Runs one python process per args list; each prints a count and
    exits 0, or prints why it failed on stderr."""
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)] +
                              [str(a) for a in args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for args in args_list]
    counts = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-4000:]
        counts.append(int(out.strip() or 0))
    return counts


def deep_tree(depth, width, files):
    spec = {}
    for w in range(width):
        path = "/".join(f"d{w}_{i}" for i in range(depth))
        for f in range(files):
            spec[f"{path}/f{f}"] = f"{w}:{f}\n"
    return spec


LOOKUP_WORKER = r"""
import os, sys, time
root, width, depth, files, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
end = time.monotonic() + secs
n = 0
while time.monotonic() < end:
    for w in range(width):
        path = os.path.join(root, *[f"d{w}_{i}" for i in range(depth)])
        for f in range(files):
            p = os.path.join(path, f"f{f}")
            st = os.stat(p)
            with open(p) as fh:
                if fh.read() != f"{w}:{f}\n":
                    sys.exit(f"{p}: wrong content")
            n += 1
        os.listdir(path)
print(n)
"""


def test_lookups_against_forgets(stratafs_only):
    """Deep lookups and opens while the kernel forgets everything idle:
    the lookup that replied and then released its child must not touch
    a parent that the child's release freed."""
    width, depth, files = 6, 6, 8
    u = stratafs_only.make(lowers=[deep_tree(depth, width, files)])
    with Forgetter() as fg:
        counts = run_workers(LOOKUP_WORKER,
                             [[u.path(), width, depth, files, STORM_SECONDS]] * 3)
    assert sum(counts) > 0 and fg.drops > 10


NAMESPACE_WORKER = r"""
import errno, os, random, sys, time
root, w, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(w)
end = time.monotonic() + secs
n = 0
mine = os.path.join(root, f"w{w}")
os.makedirs(mine, exist_ok=True)
dirs = [mine]
while time.monotonic() < end:
    op = rng.choice(["mkdir", "create", "rename_dir", "unlink", "readdir", "stat", "rmdir"])
    d = rng.choice(dirs)
    try:
        if op == "mkdir" and len(dirs) < 40:
            nd = os.path.join(d, f"s{n}")
            os.mkdir(nd)
            dirs.append(nd)
        elif op == "create":
            with open(os.path.join(d, f"f{n}"), "w") as f:
                f.write("x" * rng.randrange(1, 5000))
        elif op == "rename_dir" and len(dirs) > 1:
            # move a directory (and all below it) under another of ours
            src = rng.choice(dirs[1:])
            dst_parent = rng.choice(dirs)
            if dst_parent == src or dst_parent.startswith(src + "/"):
                continue
            dst = os.path.join(dst_parent, f"m{n}")
            os.rename(src, dst)
            dirs = [dst + x[len(src):] if x == src or x.startswith(src + "/") else x
                    for x in dirs]
        elif op == "unlink":
            names = [x for x in os.listdir(d) if x.startswith("f")]
            if names:
                os.unlink(os.path.join(d, rng.choice(names)))
        elif op == "readdir":
            for e in os.scandir(d):
                e.stat(follow_symlinks=False)
        elif op == "stat":
            os.stat(d)
        elif op == "rmdir" and len(dirs) > 1:
            v = rng.choice(dirs[1:])
            if not os.listdir(v):
                os.rmdir(v)
                dirs.remove(v)
    except FileNotFoundError as e:
        # a readdir racing our own unlink in another step cannot happen:
        # each worker owns its tree; so nothing may vanish
        sys.exit(f"op {op}: {e}")
    n += 1
print(n)
"""


def test_namespace_storm_with_forgets(stratafs_only):
    """Creates, unlinks, directory renames (parent pointers swapped under
    walks), readdirplus and rmdir in four trees at once, with FORGETs for
    everything idle."""
    u = stratafs_only.make(lowers=[{"base/x": "x"}])
    with Forgetter() as fg:
        counts = run_workers(NAMESPACE_WORKER,
                             [[u.path(), w, STORM_SECONDS] for w in range(4)])
    assert sum(counts) > 100 and fg.drops > 10
    u.remount()
    assert sorted(os.listdir(u.path())) == ["base", "w0", "w1", "w2", "w3"]


REDIRECT_WORKER = r"""
import os, sys, time
root, w, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + secs
n = 0
# lower directories moved back and forth: each move writes a redirect,
# which walks the parents of the moved directory
a, b = os.path.join(root, f"t{w}", "a", "deep"), os.path.join(root, f"t{w}", "b", "deep")
while time.monotonic() < end:
    os.rename(a, b)
    if os.listdir(os.path.join(b, "inner")) != ["f"]:
        sys.exit("lower content lost in move")
    os.rename(b, a)
    n += 1
print(n)
"""


def test_directory_moves_walk_parents(stratafs_only):
    """Moves of lower directories build redirects from parent walks while
    the parents themselves are forgotten and looked up again."""
    spec = {}
    for w in range(3):
        spec[f"t{w}/a/deep/inner/f"] = "f"
        spec[f"t{w}/b/keep"] = "k"
    u = stratafs_only.make(lowers=[spec])
    with Forgetter():
        counts = run_workers(REDIRECT_WORKER,
                             [[u.path(), w, STORM_SECONDS] for w in range(3)])
    assert sum(counts) > 0
    u.remount()
    for w in range(3):
        assert read_bytes(u.path(f"t{w}", "a", "deep", "inner", "f")) == b"f"


COPYUP_WORKER = r"""
import os, sys, time
root, w, nfiles, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + secs
n = 0
base = os.path.join(root, "d")
while time.monotonic() < end:
    for i in range(nfiles):
        p = os.path.join(base, f"f{i}")
        if w % 2 == 0:
            # readers: a handle opened before a copy-up must keep reading
            with open(p, "rb") as f:
                data = f.read()
            if not data.startswith(b"lower%d:" % i):
                sys.exit(f"{p}: {data[:40]!r}")
        else:
            # writers: the first write copies the file up
            with open(p, "r+b") as f:
                f.seek(0, 2)
                f.write(b"+")
            os.setxattr(p, "user.w", b"%d" % n)
        n += 1
print(n)
"""


def test_opens_across_copy_up(stratafs_only):
    """Readers and writers on the same lower files: opens, xattrs and
    copy-ups race, with forgets dropping the nodes in between."""
    nfiles = 40
    u = stratafs_only.make(lowers=[{f"d/f{i}": f"lower{i}:" + "." * 3000
                                    for i in range(nfiles)}])
    with Forgetter():
        counts = run_workers(COPYUP_WORKER,
                             [[u.path(), w, nfiles, STORM_SECONDS] for w in range(4)])
    assert sum(counts) > nfiles
    u.remount()
    for i in range(nfiles):
        data = read_bytes(u.path("d", f"f{i}"))
        assert data.startswith(b"lower%d:" % i) and data.endswith(b"+"), i


HARDLINK_WORKER = r"""
import errno, os, sys, time
root, w, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + secs
n = 0
src = os.path.join(root, "src", f"f{w}")
while time.monotonic() < end:
    # a hard link into another directory (dir and the file are separate
    # nodes, either may be forgotten right after the reply), then unlink
    for k in range(5):
        dst = os.path.join(root, f"links{k}", f"w{w}")
        os.link(src, dst)
        os.utime(dst)            # a setattr through the new name
        os.unlink(dst)
    n += 1
print(n)
"""


def test_link_and_setattr_against_forgets(stratafs_only):
    """sfs_op_link and sfs_op_setattr replied before they let go of
    their nodes."""
    spec = {f"src/f{w}": f"{w}" for w in range(3)}
    spec.update({f"links{k}/.keep": "" for k in range(5)})
    u = stratafs_only.make(lowers=[spec])
    with Forgetter():
        counts = run_workers(HARDLINK_WORKER,
                             [[u.path(), w, STORM_SECONDS] for w in range(3)])
    assert sum(counts) > 0
    for k in range(5):
        assert os.listdir(u.path(f"links{k}")) == [".keep"]
