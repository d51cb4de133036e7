# SPDX-License-Identifier: Apache-2.0
"""Daemon memory stays bounded over a big tree (stratafs only).

Prints lines starting with ``RSS:`` (run with -s to see them).
"""

import os
import subprocess
import time

import pytest

from stratatest import is_sanitizer_build, stratafs_binary

DIRS, FILES = 100, 1000
MiB = 1 << 20


def daemon_memory(pid):
    """Bytes the daemon PID and its children use (stratafs: the supervisor
    and the worker it cloned, which holds the nodes in the shared-memory
    arena): the sum of their Pss, so that a page both map counts once, as
    tests/bench does (tests/bench/README.md)."""
    pids = [pid]
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids += [int(c) for c in f.read().split()]
    total = 0
    for p in pids:
        with open(f"/proc/{p}/smaps_rollup") as f:
            pss = [line for line in f if line.startswith("Pss:")]
        assert pss, f"no Pss for pid {p}"
        total += int(pss[0].split()[1]) * 1024
    return total


def build_big_lower(root):
    os.makedirs(root, exist_ok=True)
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL
    for d in range(DIRS):
        dd = os.path.join(root, f"dir{d:03d}")
        os.mkdir(dd)
        dfd = os.open(dd, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(FILES):
                os.close(os.open(f"file{i:04d}", flags, 0o644, dir_fd=dfd))
        finally:
            os.close(dfd)


def find_all(mnt):
    # %s needs an lstat of every entry, so every inode is looked up (find
    # takes %i from the directory entries alone: 325 lstat calls of 100,101)
    r = subprocess.run(["find", mnt, "-printf", "%i %s\n"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0, r.stderr
    n = r.stdout.count(b"\n")
    assert n == 1 + DIRS + DIRS * FILES, f"find saw {n} entries"


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


@pytest.mark.timeout(170)
def test_rss_bounded_after_forget(stratafs_only):
    sanitizer = is_sanitizer_build(stratafs_binary())
    env = None
    bound = 64 * MiB
    if sanitizer:
        # ASan parks freed memory in a 256 MiB quarantine and keeps shadow
        # memory; shrink the quarantine and allow a looser bound
        env = dict(os.environ)
        extra = "quarantine_size_mb=8:allocator_release_to_os_interval_ms=100"
        env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":" + extra).lstrip(":")
        bound = 160 * MiB
    t0 = time.monotonic()
    u = stratafs_only.make(lowers=[{}], mount=False, env=env)
    build_big_lower(u.lowers[0])
    t_build = time.monotonic() - t0
    u.mount()
    pid = u.pid
    rss = {"mounted": daemon_memory(pid)}
    find_all(u.mnt)
    find_all(u.mnt)
    rss["after_find"] = daemon_memory(pid)
    drop_caches()
    # FORGETs arrive asynchronously: poll for up to 10 s for the bound
    low = daemon_memory(pid)
    deadline = time.monotonic() + 10
    while low >= bound and time.monotonic() < deadline:
        time.sleep(0.2)
        low = min(low, daemon_memory(pid))
    rss["after_forget"] = low
    # a second round of lookups after forgetting must not keep growing
    find_all(u.mnt)
    drop_caches()
    time.sleep(1)
    find_all(u.mnt)
    drop_caches()
    time.sleep(1)
    rss["after_3_rounds"] = daemon_memory(pid)
    elapsed = time.monotonic() - t0
    line = "RSS: " + " ".join(f"{k}={v // 1024}KiB" for k, v in rss.items()) + \
        f" bound={bound // MiB}MiB sanitizer={sanitizer} files={DIRS * FILES}" \
        f" build={t_build:.1f}s total={elapsed:.1f}s"
    print("\n" + line)
    with open(os.path.join(stratafs_only.tmp, "rss.txt"), "w") as f:
        f.write(line + "\n")
    assert rss["after_forget"] < bound, line
    assert rss["after_3_rounds"] < bound, line
    assert rss["after_3_rounds"] <= rss["after_forget"] + 16 * MiB, line
