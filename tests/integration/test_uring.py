# SPDX-License-Identifier: Apache-2.0
"""FUSE over io_uring as the transport (fuse/uring.c, -o transport=).

That requests really come over the rings (the daemon's counter of them,
its io_uring descriptors, a thread pinned to each CPU), that /dev/fuse
takes over when the kernel, its module parameter or the options say no,
and what a worker's death does to requests on a ring on this kernel:
the reason a supervised mount is served through /dev/fuse.

The module parameter fuse.enable_uring is the machine's: each test sets
what it needs and puts back what it found."""

import errno
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

import pytest

from stratatest import _live_unions, run, stratafs_binary
from strata_common import fuse_abort

PARAM = "/sys/module/fuse/parameters/enable_uring"
LOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib",
                    "mount_load.py")
# lib/strata.h: enum strata_stat
ST_CREATE, ST_FORGET, ST_NOPS, ST_URING_REQUESTS = 11, 31, 32, 34
IN_USE = "transport: FUSE over io_uring"


@pytest.fixture
def enable_uring(request):
    """set(value): the module parameter, restored after the test."""
    if not os.path.exists(PARAM):
        pytest.skip("this kernel has no FUSE over io_uring")
    with open(PARAM) as f:
        found = f.read().strip()

    def put(value):
        with open(PARAM, "w") as f:
            f.write(value)

    request.addfinalizer(lambda: put(found))
    return put


def counters(path):
    with open(path, "rb") as f:
        data = f.read()
    _, count = struct.unpack_from("II", data)
    return struct.unpack_from(f"{count}Q", data, 8)


def possible_cpus():
    with open("/sys/devices/system/cpu/possible") as f:
        spec = f.read().strip()
    cpus = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        cpus += range(int(a), int(b or a) + 1)
    return cpus


def churn(u, n):
    # os.open, not open(): Python asks isatty(), an IOCTL no counter counts
    for i in range(n):
        p = u.path(f"f{i}")
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, b"x" * i)
        os.close(fd)
        os.stat(p)
    for i in range(n):
        os.unlink(u.path(f"f{i}"))


def uring_fds(pid):
    """The io_uring descriptors of pid; one closed while listed is none."""
    d = f"/proc/{pid}/fd"
    out = []
    for fd in os.listdir(d):
        try:
            if os.readlink(os.path.join(d, fd)) == "anon_inode:[io_uring]":
                out.append(fd)
        except FileNotFoundError:
            pass
    return out


def rings_up(u):
    """Waits until every serving thread has registered: before that,
    requests come through /dev/fuse. A wait, not a measure (slow under
    ThreadSanitizer beside other load)."""
    deadline = time.monotonic() + 60
    while IN_USE not in u.stderr() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert IN_USE in u.stderr(), u.stderr()


def mount(factory, tmp_path, opts, env=None):
    stats = os.path.join(str(tmp_path), f"s{len(factory.unions)}.stats")
    u = factory.make([{"a": "lower"}], extra_opts=[*opts, f"statsfile={stats}"],
                     env=env)
    return u, stats


def test_requests_come_over_the_rings(stratafs_only, enable_uring, tmp_path):
    enable_uring("1")
    u, stats = mount(stratafs_only, tmp_path, ["transport=uring",
                                               "nosupervisor"])
    os.stat(u.mnt)
    rings_up(u)
    before = counters(stats)[ST_URING_REQUESTS]
    churn(u, 200)
    fd = os.open(u.path("a"), os.O_RDONLY)
    assert os.read(fd, 100) == b"lower"
    os.close(fd)
    # every request came through a ring but FORGET, which the kernel
    # sends through /dev/fuse (and INIT, which no counter counts); a
    # RELEASE may still be on its way after close(2) returned
    deadline = time.monotonic() + 5
    while True:
        c = counters(stats)
        ops = sum(c[:ST_NOPS]) - c[ST_FORGET]
        if c[ST_URING_REQUESTS] == ops or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert c[ST_URING_REQUESTS] == ops, (c, ops)
    assert c[ST_CREATE] >= 200
    assert c[ST_URING_REQUESTS] - before >= 4 * 200
    cpus = possible_cpus()
    assert f"{IN_USE}, {len(cpus)} queues" in u.stderr()
    threads = int(re.search(r"each served by (\d+) threads",
                            u.stderr()).group(1))
    assert threads > 1
    # a ring per serving thread (and the I/O engine's own)
    assert len(uring_fds(u.pid)) >= len(cpus) * threads
    # that many threads pinned to each CPU
    pinned = {}
    for t in os.listdir(f"/proc/{u.pid}/task"):
        with open(f"/proc/{u.pid}/task/{t}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    cpu = line.split()[1]
                    pinned[cpu] = pinned.get(cpu, 0) + 1
    for c in cpus:
        assert pinned.get(str(c), 0) >= threads, pinned
    u.unmount()


PINNED_OPS = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
fd = int(sys.argv[2])
for i in range(20):
    os.pwrite(fd, b"x", i)
    os.fsync(fd)
    os.fstat(fd)
"""


def test_a_waiting_handler_holds_only_its_own_request(stratafs_only,
                                                      enable_uring, tmp_path):
    """A read that waits in its handler (a lower layer on a stopped FUSE
    daemon) holds one of its CPU's serving threads: calls made on that
    CPU meanwhile are served by the others. With one thread a queue
    they waited until the read ended."""
    enable_uring("1")
    cpu = possible_cpus()[0]
    slow = stratafs_only.make([{}])          # the lower layer's filesystem
    # put in behind slow's back, so that a read must go to its daemon
    with open(os.path.join(slow.lowers[0], "big"), "wb") as f:
        f.write(os.urandom(256 << 10))
    u = stratafs_only.make([{}], layer_dirs=[slow.mnt],
                           extra_opts=["transport=uring", "nosupervisor",
                                       "nopassthrough"])
    os.stat(u.mnt)
    rings_up(u)
    # an upper file opened before: its calls need nothing of the lower
    up = os.open(u.path("up"), os.O_RDWR | os.O_CREAT, 0o644)
    reader = ops = None
    os.killpg(slow.proc.pid, signal.SIGSTOP)
    try:
        reader = subprocess.Popen(
            [sys.executable, "-c",
             "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
             "fd = os.open(sys.argv[2], os.O_RDONLY); "
             "os.read(fd, 1 << 18)", str(cpu), u.path("big")])
        # the read is in u's daemon, waiting on slow's
        time.sleep(0.5)
        assert reader.poll() is None
        ops = subprocess.Popen([sys.executable, "-c", PINNED_OPS, str(cpu),
                                str(up)], pass_fds=[up])
        # a wait, not a measure: the ops need nothing of the stopped lower
        deadline = time.monotonic() + 60
        while ops.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ops.poll() == 0, "calls on the read's CPU waited behind it"
        assert reader.poll() is None
    finally:
        os.killpg(slow.proc.pid, signal.SIGCONT)
        for p in (reader, ops):
            if p:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    os.close(up)
    assert reader.returncode == 0
    u.unmount()


def test_transport_dev_uses_no_ring(stratafs_only, enable_uring, tmp_path):
    enable_uring("1")
    u, stats = mount(stratafs_only, tmp_path, ["transport=dev",
                                               "nosupervisor"])
    churn(u, 50)
    assert counters(stats)[ST_URING_REQUESTS] == 0
    assert counters(stats)[ST_CREATE] >= 50
    assert "transport" not in u.stderr()
    u.unmount()


@pytest.mark.parametrize("asked", ["transport=uring", None])
def test_parameter_off_falls_back_to_dev(stratafs_only, enable_uring,
                                         tmp_path, asked):
    enable_uring("0")
    opts = ["nosupervisor"] + ([asked] if asked else [])
    u, stats = mount(stratafs_only, tmp_path, opts)
    churn(u, 50)
    assert counters(stats)[ST_URING_REQUESTS] == 0
    err = u.stderr()
    assert err.count("fuse.enable_uring is 0") == 1, err
    # asked for, it is a warning; by default, a note
    assert ("warning: transport=uring" in err) == bool(asked), err
    assert IN_USE not in err
    u.unmount()


def test_supervised_is_served_through_dev(stratafs_only, enable_uring,
                                          tmp_path):
    """Supervised, a worker killed under load is never seen by the
    programs using the mount: the transport is /dev/fuse, said once."""
    from test_worker import (ALL, finish_loads, kill_workers, layers,
                             start_loads)
    enable_uring("1")
    stats = os.path.join(str(tmp_path), "sup.stats")
    u = stratafs_only.make(layers(), extra_opts=["transport=uring",
                                                 f"statsfile={stats}"])
    loads = start_loads(u, ALL, 6, str(tmp_path))
    time.sleep(0.3)
    kill_workers(u, 3)
    finish_loads(loads, 60)
    err = u.stderr()
    assert err.count("worker died of signal 9") == 3
    # said by the first worker, which answered INIT; the others follow it
    assert err.count("a worker's death would fail or strand") == 1, err
    assert IN_USE not in err
    assert counters(stats)[ST_URING_REQUESTS] == 0
    u.unmount()


def test_bad_transport_is_refused(tmp_path):
    r = run([stratafs_binary(), "-o", f"lowerdir={tmp_path},transport=fast",
             str(tmp_path)], check=False)
    assert r.returncode != 0
    assert "transport=fast: expected uring or dev" in r.stderr


def test_a_dead_workers_ring_requests(stratafs_only, enable_uring, tmp_path):
    """What this kernel does with a dead worker's rings, served supervised
    over io_uring on purpose (STRATAFS_URING_SUPERVISED): a new worker
    registers its queues again and is served, but requests that the dead
    one's rings held fail with ECANCELED or are never answered, even
    after FUSE_NOTIFY_RESEND. Should a kernel send them again, this
    fails: supervised mounts could then use the rings."""
    from test_worker import worker_of
    enable_uring("1")
    env = dict(os.environ, STRATAFS_URING_SUPERVISED="1")
    u, stats = mount(stratafs_only, tmp_path, ["transport=uring"], env=env)

    # idle: the next worker registers again, and requests flow over it.
    # Killed only once its rings are registered: killed during INIT or
    # before, the worker has nothing of what this test is about
    w = worker_of(u)
    os.stat(u.mnt)
    rings_up(u)
    os.kill(w, signal.SIGKILL)
    w = worker_of(u, old=w)
    # a wait, not a measure: a ThreadSanitizer build beside other load
    # took longer than 10 s to take over and register
    deadline = time.monotonic() + 60
    while u.stderr().count(IN_USE) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert u.stderr().count(IN_USE) == 2, u.stderr()
    before = counters(stats)[ST_URING_REQUESTS]
    churn(u, 50)
    assert counters(stats)[ST_URING_REQUESTS] - before >= 4 * 50

    # under load: the requests in the dead worker's hands are lost
    lost = []
    for attempt in range(10):
        res = [os.path.join(str(tmp_path), f"l{attempt}-{i}.json")
               for i in range(4)]
        procs = [subprocess.Popen([sys.executable, LOAD, kind, u.mnt, "2", r])
                 for kind, r in zip(("churn", "probe", "churn", "probe"), res)]
        time.sleep(0.7)
        os.kill(w, signal.SIGKILL)
        w = worker_of(u, old=w)
        for p, r in zip(procs, res):
            try:
                p.wait(8)
            except subprocess.TimeoutExpired:
                lost.append("a call never answered")
                continue
            with open(r) as f:
                errors = json.load(f)["errors"]
            lost += [e for e in errors
                     if errno.errorcode[errno.ECANCELED] in e]
        if lost:
            break
    fuse_abort(u.mnt)
    for p in procs:
        p.kill()
        p.wait()
    # the aborted connection takes the daemon with it; the mount goes
    u.mounted = False
    _live_unions.remove(u)
    u._kill()
    assert lost, "every request a dead worker's ring held was answered"


def test_io_uring_disabled_falls_back_to_dev(stratafs_only, enable_uring,
                                            tmp_path):
    """kernel.io_uring_disabled=2 (io_uring off for everyone, root too),
    as a seccomp filter or a missing privilege would: /dev/fuse serves."""
    disabled = "/proc/sys/kernel/io_uring_disabled"
    enable_uring("1")
    with open(disabled) as f:
        saved = f.read().strip()
    try:
        with open(disabled, "w") as f:
            f.write("2\n")
        u, stats = mount(stratafs_only, tmp_path, ["transport=uring",
                                                   "nosupervisor"])
        churn(u, 20)
        assert counters(stats)[ST_URING_REQUESTS] == 0
        u.unmount()
    finally:
        with open(disabled, "w") as f:
            f.write(saved + "\n")
    err = u.stderr()
    assert err.count("warning: transport=uring: io_uring refused") == 1, err
    assert IN_USE not in err
