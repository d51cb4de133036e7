# SPDX-License-Identifier: Apache-2.0
"""Differential testing: the same random operations on kernel overlayfs and on
stratafs, over the same fresh layers, must give the same outcomes (success or
errno), the same merged tree and an equivalent upper layer. The kernel runs
with index=on, as stratafs keeps lower hard links.

Seeds: STRATA_SEEDS=1,2,3 (default 1..12); ops per seed: STRATA_OPS (default 150).
A "remount" op (both sides) now and then checks that what is on disk gives
the view that was in memory. Even seeds stack an old upper on the lower
layers: the kernel's upper after random operations (directory renames,
whiteouts, hard links), frozen as the top lower layer. At the end each
implementation mounts the other's upper and must show what its writer did.
"""

import ctypes
import ctypes.util
import errno
import mmap
import os
import random
import shutil
import stat

import pytest

from stratatest import (RENAME_EXCHANGE, RENAME_NOREPLACE, build_tree,
                        diff_snapshots, renameat2, sha256, semantic_upper,
                        snapshot_tree, walk_fd)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
AT_FDCWD, AT_EMPTY_PATH = -100, 0x1000
PAGE = 4096
KERNEL_OPTS = ["index=on"]


def _seeds():
    env = os.environ.get("STRATA_SEEDS")
    if env:
        return [int(s) for s in env.replace(" ", "").split(",") if s]
    return list(range(1, 13))


NOPS = int(os.environ.get("STRATA_OPS", "150"))
NAMES = ["a", "b", "c", "d", "f1", "f2", "n1", "n2", "x", "y"]
UIDS = [0, 1000, 1001]
MODES = [0o644, 0o600, 0o755, 0o700, 0o640, 0o4755, 0o2775, 0o1777]
# symlink targets never lead out of the mount (no ".."); the absolute one
# cannot be created (it is below /proc)
SYMLINK_TARGETS = ["f1", "x", "a", "a/x", ".", "/proc/strata-nonexistent/t"]


# ---------------------------------------------------------------- layers

def make_layers(rng):
    """Two lower layers with overlapping names: files, dirs, symlinks,
    a whiteout and an opaque dir in the top lower.  No hard links."""
    def meta():
        o = {"mode": rng.choice([0o644, 0o600, 0o755]), "uid": rng.choice(UIDS),
             "gid": rng.choice(UIDS), "mtime": 1000000000 + rng.randrange(10**6)}
        if rng.random() < 0.3:
            o["xattrs"] = {"user.l": rng.choice(["1", "two", "three"])}
        return o

    def content():
        return rng.randbytes(rng.choice([0, 1, 10, 100, 5000]))

    layers = []
    for layer in range(2):
        spec = {}
        for d in rng.sample(["a", "b", "c", "d"], 3):
            spec[d] = ("dir", meta())
            for sub in rng.sample(["x", "y", "a"], 2):
                p = f"{d}/{sub}"
                r = rng.random()
                if r < 0.2:
                    spec[p] = ("dir", meta())
                    spec[f"{p}/{rng.choice(NAMES)}"] = ("file", content(), meta())
                elif r < 0.3:
                    spec[p] = ("symlink", rng.choice(SYMLINK_TARGETS))
                else:
                    spec[p] = ("file", content(), meta())
        for f in rng.sample(["f1", "f2", "x", "y"], 2):
            if f not in spec:
                spec[f] = ("file", content(), meta())
        if layer == 0:
            # a whiteout and an opaque dir in the top lower
            spec["y"] = ("whiteout",)
            spec["d"] = ("opaque_dir", meta())
            spec["d/n1"] = ("file", content(), meta())
        layers.append(spec)
    return layers


# ---------------------------------------------------------------- operations

def entries(root):
    """[(relpath, type)] of the merged tree, root excluded, sorted."""
    out = []
    for rel, _, _, st in walk_fd(root):
        if rel == ".":
            continue
        m = st.st_mode
        t = "dir" if stat.S_ISDIR(m) else "link" if stat.S_ISLNK(m) else \
            "file" if stat.S_ISREG(m) else "other"
        out.append((rel, t))
    return out


def gen_op(rng, ents, exclude=()):
    """Pick the next operation from the current (kernel) merged tree."""
    files = [p for p, t in ents if t == "file"]
    dirs = [""] + [p for p, t in ents if t == "dir"]
    allp = [p for p, _ in ents]
    nondirs = [p for p, t in ents if t != "dir"]
    parents = {os.path.dirname(p) for p, _ in ents}
    empty_dirs = [p for p in dirs if p and p not in parents]

    def existing(pool=None):
        pool = pool if pool else allp
        return rng.choice(pool) if pool and rng.random() < 0.85 else newpath()

    def newpath():
        d = rng.choice(dirs)
        return (d + "/" if d else "") + rng.choice(NAMES)

    def data():
        return rng.randbytes(rng.choice([1, 7, 100, 3000]))

    kind = rng.choices(
        ["create", "write", "append", "truncate", "unlink", "rename", "mkdir",
         "rmdir", "link", "symlink", "chmod", "chown", "setxattr", "removexattr",
         "utimes", "read", "listdir", "remount", "rename_dir", "tmpfile",
         "direct_write", "direct_read"],
        weights=[8, 6, 5, 4, 8, 10, 6, 5, 3, 3, 4, 4, 4, 2, 3, 4, 3, 1,
                 4, 2, 2, 2])[0]
    if kind in exclude:
        kind = "read"
    if kind == "remount":
        return ("remount",)
    if kind == "rename_dir":
        # directories, most of them from the lower layers, moved anywhere
        src = existing([p for p in dirs if p])
        return ("rename", src, newpath(), 0)
    if kind == "tmpfile":
        return ("tmpfile", rng.choice(dirs),
                rng.choice(NAMES) if rng.random() < 0.6 else None, data())
    if kind == "direct_write":
        return ("direct_write", existing(files), rng.randrange(0, 3),
                rng.randbytes(PAGE * rng.choice([1, 2])))
    if kind == "direct_read":
        return ("direct_read", existing(files), rng.randrange(0, 2),
                rng.choice([1, 2]))
    if kind == "create":
        return ("create", newpath() if rng.random() < 0.7 else existing(files),
                rng.choice(["excl", "trunc"]), data())
    if kind == "write":
        return ("write", existing(files), rng.randrange(0, 6000), data())
    if kind == "append":
        return ("append", existing(files), data())
    if kind == "truncate":
        return ("truncate", existing(files), rng.choice([0, 1, 50, 4096, 10000]))
    if kind == "unlink":
        return ("unlink", existing(nondirs if rng.random() < 0.8 else None))
    if kind == "rename":
        src = existing()
        dst = existing() if rng.random() < 0.4 else newpath()
        flags = rng.choices([0, RENAME_NOREPLACE, RENAME_EXCHANGE], weights=[6, 1, 1])[0]
        return ("rename", src, dst, flags)
    if kind == "mkdir":
        return ("mkdir", newpath(), rng.choice([0o755, 0o700, 0o1777]))
    if kind == "rmdir":
        pool = empty_dirs if empty_dirs and rng.random() < 0.6 else [p for p in dirs if p]
        return ("rmdir", existing(pool))
    if kind == "link":
        return ("link", existing(files), newpath())
    if kind == "symlink":
        return ("symlink", rng.choice(SYMLINK_TARGETS), newpath())
    if kind == "chmod":
        return ("chmod", existing(), rng.choice(MODES))
    if kind == "chown":
        return ("chown", existing(), rng.choice(UIDS), rng.choice(UIDS), rng.random() < 0.5)
    if kind == "setxattr":
        return ("setxattr", existing(), rng.choice(["user.a", "user.b"]),
                rng.choice([b"1", b"value", rng.randbytes(64)]))
    if kind == "removexattr":
        return ("removexattr", existing(), rng.choice(["user.a", "user.b", "user.l"]))
    if kind == "utimes":
        return ("utimes", existing(), 1500000000 + rng.randrange(10**6),
                rng.randrange(10**9), rng.random() < 0.5)
    if kind == "read":
        return ("read", existing(files))
    return ("listdir", existing([p for p in dirs]))


def apply_op(root, op):
    """Run op below root; return a comparable outcome."""
    P = lambda rel: os.path.join(root, rel) if rel else root  # noqa: E731
    kind = op[0]
    try:
        if kind == "create":
            _, p, mode, data = op
            flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if mode == "excl" else os.O_TRUNC)
            fd = os.open(P(p), flags, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            return ("ok", os.lstat(P(p)).st_size)
        if kind == "write":
            _, p, off, data = op
            fd = os.open(P(p), os.O_WRONLY)
            try:
                os.pwrite(fd, data, off)
            finally:
                os.close(fd)
            return ("ok", os.lstat(P(p)).st_size)
        if kind == "append":
            _, p, data = op
            fd = os.open(P(p), os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            return ("ok", os.lstat(P(p)).st_size)
        if kind == "truncate":
            os.truncate(P(op[1]), op[2])
            return ("ok", os.lstat(P(op[1])).st_size)
        if kind == "unlink":
            os.unlink(P(op[1]))
        elif kind == "rename":
            renameat2(P(op[1]), P(op[2]), op[3])
        elif kind == "mkdir":
            os.mkdir(P(op[1]), op[2])
            return ("ok", oct(stat.S_IMODE(os.lstat(P(op[1])).st_mode)))
        elif kind == "rmdir":
            os.rmdir(P(op[1]))
        elif kind == "link":
            os.link(P(op[1]), P(op[2]))
        elif kind == "symlink":
            os.symlink(op[1], P(op[2]))
        elif kind == "chmod":
            os.chmod(P(op[1]), op[2])
            return ("ok", oct(os.stat(P(op[1])).st_mode))
        elif kind == "chown":
            os.chown(P(op[1]), op[2], op[3], follow_symlinks=op[4])
            st = os.stat(P(op[1]), follow_symlinks=op[4])
            return ("ok", st.st_uid, st.st_gid, oct(st.st_mode))
        elif kind == "setxattr":
            os.setxattr(P(op[1]), op[2], op[3], follow_symlinks=False)
            return ("ok", os.getxattr(P(op[1]), op[2], follow_symlinks=False).hex())
        elif kind == "removexattr":
            os.removexattr(P(op[1]), op[2], follow_symlinks=False)
        elif kind == "utimes":
            _, p, sec, ns, follow = op
            t = sec * 10**9 + ns
            os.utime(P(p), ns=(t, t), follow_symlinks=follow)
            return ("ok", os.stat(P(p), follow_symlinks=follow).st_mtime_ns)
        elif kind == "read":
            with open(P(op[1]), "rb") as f:
                return ("ok", sha256(f.read()))
        elif kind == "listdir":
            return ("ok", sorted(os.listdir(P(op[1]))))
        elif kind == "tmpfile":
            _, d, name, data = op
            fd = os.open(P(d), os.O_TMPFILE | os.O_RDWR, 0o644)
            try:
                os.write(fd, data)
                if name:
                    dst = os.fsencode(os.path.join(P(d), name))
                    if _libc.linkat(fd, b"", AT_FDCWD, dst, AT_EMPTY_PATH):
                        e = ctypes.get_errno()
                        raise OSError(e, os.strerror(e))
                return ("ok", os.fstat(fd).st_nlink, os.pread(fd, 10, 0))
            finally:
                os.close(fd)
        elif kind == "direct_write":
            _, p, page, data = op
            buf = mmap.mmap(-1, len(data))
            buf[:] = data
            fd = os.open(P(p), os.O_WRONLY | os.O_DIRECT)
            try:
                return ("ok", os.pwrite(fd, buf, page * PAGE),
                        os.fstat(fd).st_size)
            finally:
                os.close(fd)
        elif kind == "direct_read":
            _, p, page, npages = op
            buf = mmap.mmap(-1, npages * PAGE)
            fd = os.open(P(p), os.O_RDONLY | os.O_DIRECT)
            try:
                n = os.preadv(fd, [buf], page * PAGE)
                return ("ok", n, sha256(bytes(buf[:n])))
            finally:
                os.close(fd)
        else:
            raise AssertionError(op)
        return ("ok",)
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno, e.errno))


def fmt(op):
    return "(" + ", ".join(repr(a) if not isinstance(a, bytes) else f"<{len(a)} bytes>"
                           for a in op) + ")"


# ---------------------------------------------------------------- driver

def merged(root):
    # nlink differs by design (kernel index=off breaks hard links, kernel
    # reports nlink 1 for merged dirs); directory mtimes are not compared
    return snapshot_tree(root, xattr_prefixes=("user.",), nlink=False)


def make_stack(fac, seed, rng):
    """The lower layers, built once and shared by both implementations
    (so that origins name the same files); on even seeds with an old
    upper on top: the kernel's, after random operations."""
    stack = fac.new_dir("stack")
    dirs = []
    for i, spec in enumerate(make_layers(rng)):
        d = os.path.join(stack, f"lower{i}")
        build_tree(d, spec)
        dirs.append(d)
    if seed % 2:
        return dirs
    old = fac.make(lowers=[{} for _ in dirs], layer_dirs=dirs,
                   upper_dir=os.path.join(stack, "old"),
                   work_dir=os.path.join(stack, "old.work"),
                   kernel_opts=KERNEL_OPTS)
    orng = random.Random(seed * 7919)
    for _ in range(40):
        apply_op(old.mnt, gen_op(orng, entries(old.mnt),
                                 exclude=("remount", "tmpfile")))
    old.unmount()
    shutil.rmtree(old.work)
    return [old.upper] + dirs


def mount(fac, dirs, upper=None, work=None):
    return fac.make(lowers=[{} for _ in dirs], layer_dirs=dirs,
                    upper_dir=upper, work_dir=work, kernel_opts=KERNEL_OPTS)


def run_differential(fac_a, fac_b, seed, nops):
    """fac_a drives the op generation (the oracle); fac_b must agree."""
    rng = random.Random(seed)
    dirs = make_stack(fac_a, seed, rng)
    a = mount(fac_a, dirs)
    b = mount(fac_b, dirs)
    names = (fac_a.kind, fac_b.kind)
    if names[0] == names[1]:
        names = (names[0] + "#1", names[1] + "#2")
    history = []
    ctx = lambda: (f"seed {seed} (STRATA_SEEDS={seed} STRATA_OPS={nops}); "  # noqa: E731
                   "ops so far:\n  " + "\n  ".join(history))
    assert_trees(merged(a.mnt), merged(b.mnt), names, "initial merged trees differ", ctx)
    old = os.umask(0o022)
    try:
        for i in range(nops):
            op = gen_op(rng, entries(a.mnt))
            if op[0] == "remount":
                # what is on disk must give the view that was in memory
                history.append(f"#{i} {fmt(op)}")
                before = merged(a.mnt)
                a.remount()
                b.remount()
                assert_trees(before, merged(a.mnt), (names[0], names[0] + " remounted"),
                             f"op #{i}: merged tree changed over a remount", ctx)
                assert_trees(before, merged(b.mnt), (names[0], names[1] + " remounted"),
                             f"op #{i}: merged trees differ after a remount", ctx)
                continue
            ra = apply_op(a.mnt, op)
            rb = apply_op(b.mnt, op)
            history.append(f"#{i} {fmt(op)} -> {ra}")
            if ra != rb:
                raise AssertionError(f"op #{i} {fmt(op)}: {names[0]} gave {ra}, "
                                     f"{names[1]} gave {rb}\n{ctx()}")
    finally:
        os.umask(old)
    ta, tb = merged(a.mnt), merged(b.mnt)
    assert_trees(ta, tb, names, "merged trees differ after the sequence", ctx)
    ua = semantic_upper(a.upper, a.lowers, work=a.work)
    ub = semantic_upper(b.upper, b.lowers, work=b.work)
    assert_trees(ua, ub, names, "upper layers differ (whiteouts, opaque dirs, files)", ctx)
    a.remount()
    b.remount()
    assert_trees(ta, merged(a.mnt), (names[0], names[0] + " remounted"),
                 "merged tree changed over a remount", ctx)
    assert_trees(tb, merged(b.mnt), (names[1], names[1] + " remounted"),
                 "merged tree changed over a remount", ctx)
    # each reads the other's upper (and workdir, with its index) as written
    a.unmount()
    b.unmount()
    for fac, writer, want in ((fac_a, b, tb), (fac_b, a, ta)):
        r = mount(fac, dirs, writer.upper, writer.work)
        assert_trees(want, merged(r.mnt), (writer.kind + " wrote", fac.kind + " read"),
                     f"{fac.kind} reads the upper {writer.kind} wrote differently", ctx)
        r.unmount()
    return len(history)


def assert_trees(x, y, names, what, ctx):
    d = diff_snapshots(x, y, names)
    if d:
        raise AssertionError(f"{what}:\n" + "\n".join(d[:40]) + "\n" + ctx())


@pytest.mark.stratafs
@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed{s}")
def test_differential(make_union, seed):
    run_differential(make_union("kernel"), make_union("stratafs"), seed, NOPS)
