# SPDX-License-Identifier: Apache-2.0
"""Concurrent namespace operations."""

import errno
import json
import os
import subprocess
import textwrap
import threading

import pytest

from stratatest import (RENAME_EXCHANGE, read_bytes, renameat2, snapshot_upper)

WORKERS = 4
OPS = 500
LOWER_PER_WORKER = 40
SHARED = 5

WORKER = textwrap.dedent(r"""
    import errno, json, os, random, sys
    w, d, ops, nshared = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(1000 + w)
    model = json.loads(sys.argv[5])          # name -> content of this worker's names
    counter = 0
    shared_ok = 0

    def fail(msg):
        sys.stderr.write(f"worker {w}: {msg}\n")
        sys.exit(1)

    def p(n):
        return os.path.join(d, n)

    def write_new(name, content):
        fd = os.open(p(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, content.encode())
        os.close(fd)

    for i in range(ops):
        op = rng.choice(["create", "create", "unlink", "rename", "rename_over",
                         "append", "shared"])
        names = sorted(model)
        try:
            if op == "create" or not names:
                counter += 1
                n = f"w{w}_n{counter}"
                c = f"{n}:{i};"
                write_new(n, c)
                model[n] = c
            elif op == "unlink":
                n = rng.choice(names)
                os.unlink(p(n))
                del model[n]
            elif op == "rename":
                n = rng.choice(names)
                counter += 1
                m = f"w{w}_r{counter}"
                os.rename(p(n), p(m))
                model[m] = model.pop(n)
            elif op == "rename_over" and len(names) >= 2:
                a, b = rng.sample(names, 2)
                os.rename(p(a), p(b))
                model[b] = model.pop(a)
            elif op == "append":
                n = rng.choice(names)
                fd = os.open(p(n), os.O_WRONLY | os.O_APPEND)
                os.write(fd, f"+{i}".encode())
                os.close(fd)
                model[n] += f"+{i}"
            elif op == "shared":
                # atomically replace a shared name with a complete file
                counter += 1
                t = f"w{w}_t{counter}"
                content = f"shared from worker {w} op {i} " * 20
                write_new(t, content)
                os.rename(p(t), p(f"shared{rng.randrange(nshared)}"))
                shared_ok += 1
        except OSError as e:
            fail(f"op {i} {op}: {e}")
        if i % 50 == 0:
            # every own name must be visible with the right content
            for n, c in model.items():
                try:
                    with open(p(n)) as f:
                        got = f.read()
                except OSError as e:
                    fail(f"after op {i}: {n}: {e}")
                if got != c:
                    fail(f"after op {i}: {n} holds {got!r}, expected {c!r}")
    print(json.dumps({"model": model, "shared_ok": shared_ok}))
""")


def test_parallel_create_unlink_rename_in_one_directory(union):
    lower = {}
    initial = {}
    for w in range(WORKERS):
        initial[w] = {}
        for i in range(LOWER_PER_WORKER):
            n = f"w{w}_lower{i}"
            lower[f"d/{n}"] = f"{n};"
            initial[w][n] = f"{n};"
    lower["d/untouched"] = "u"
    u = union.make(lowers=[lower])
    d = u.path("d")
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", WORKER, str(w), d, str(OPS),
                               str(SHARED), json.dumps(initial[w])],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WORKERS)]
    results = []
    for pr in procs:
        out, err = pr.communicate(timeout=150)
        assert pr.returncode == 0, err
        results.append(json.loads(out))
    expected = {"untouched": "u"}
    for r in results:
        expected.update(r["model"])
    shared_contents = {f"shared from worker {w} op {i} " * 20
                       for w in range(WORKERS) for i in range(OPS)}
    nshared_writes = sum(r["shared_ok"] for r in results)

    def check():
        names = os.listdir(d)
        assert len(names) == len(set(names)), "duplicate names"
        shared = {n for n in names if n.startswith("shared")}
        if nshared_writes:
            assert shared, "no shared file survived"
        assert set(names) - shared == set(expected), \
            (sorted(set(names) - shared - set(expected)), sorted(set(expected) - set(names)))
        for n, c in expected.items():
            assert read_bytes(os.path.join(d, n)) == c.encode(), n
        for n in shared:
            assert read_bytes(os.path.join(d, n)).decode() in shared_contents, n
        # upper: whiteouts exactly for the deleted lower names
        up = snapshot_upper(u.upper, contents=False)
        wh = {p[2:] for p, v in up.items() if v == ("whiteout",) and p.startswith("d/")}
        lower_names = {k[2:] for k in lower}
        assert wh == lower_names - set(names), (sorted(wh ^ (lower_names - set(names))))
    check()
    u.remount()
    check()


@pytest.mark.parametrize("mode", ["rename_cycle", "exchange"])
def test_rename_racing_lookup(union, mode):
    A, B = b"A" * 3000, b"B" * 3000
    u = union.make(lowers=[{"d/a": A, "d/b": B, "d/other": "o"}])
    a, b, tmp = u.path("d", "a"), u.path("d", "b"), u.path("d", "tmp")
    cycles = 301
    stop = threading.Event()
    errors = []
    seen = {"ok": 0, "enoent": 0}

    def reader():
        while not stop.is_set():
            for p in (a, b):
                try:
                    os.stat(p)
                    with open(p, "rb") as f:
                        data = f.read()
                    if data not in (A, B):
                        errors.append(f"{p}: mixed content {data[:20]!r}...")
                    seen["ok"] += 1
                except OSError as e:
                    if e.errno != errno.ENOENT or mode == "exchange":
                        errors.append(f"{p}: {e}")
                    seen["enoent"] += 1
    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(cycles):
            if mode == "exchange":
                renameat2(a, b, RENAME_EXCHANGE)
            else:
                os.rename(a, tmp)
                os.rename(b, a)
                os.rename(tmp, b)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:10]
    assert seen["ok"] > 0
    # an odd number of swaps
    assert read_bytes(a) == B and read_bytes(b) == A
    assert sorted(os.listdir(u.path("d"))) == ["a", "b", "other"]
    up = snapshot_upper(u.upper, contents=False)
    assert "d/tmp" not in up, up
    u.remount()
    assert read_bytes(a) == B and read_bytes(b) == A
    assert sorted(os.listdir(u.path("d"))) == ["a", "b", "other"]


def test_parallel_readdir_during_creates(union):
    u = union.make(lowers=[{f"d/l{i:03d}": "" for i in range(300)}])
    d = u.path("d")
    errors = []
    stop = threading.Event()

    def lister():
        while not stop.is_set():
            try:
                names = os.listdir(d)
            except OSError as e:
                errors.append(str(e))
                continue
            if len(names) != len(set(names)):
                errors.append("duplicates in readdir")
            missing = {f"l{i:03d}" for i in range(300)} - set(names)
            if missing:
                errors.append(f"lower names missing from readdir: {sorted(missing)[:5]}")
    ts = [threading.Thread(target=lister) for _ in range(2)]
    for t in ts:
        t.start()
    try:
        for i in range(300):
            with open(os.path.join(d, f"n{i:03d}"), "w") as f:
                f.write("x")
            if i % 3 == 0:
                os.unlink(os.path.join(d, f"n{i:03d}"))
    finally:
        stop.set()
        for t in ts:
            t.join(30)
    assert not errors, errors[:5]
    expect = {f"l{i:03d}" for i in range(300)} | {f"n{i:03d}" for i in range(300) if i % 3}
    assert set(os.listdir(d)) == expect
