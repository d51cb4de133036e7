#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Soak of strata-csi: N stage/publish/write/unpublish/unstage cycles with
crashes injected, and what the node holds counted before and after.

One plugin on a temporary store serves one volume over a small layer.
Each cycle stages it, publishes it, appends a line to a file in it and
fsyncs, checks that every line of every earlier cycle is there, then
unpublishes and unstages it. Every K cycles the volume's daemon is
SIGKILLed while published (the plugin must heal it); every M cycles the
plugin itself is SIGKILLed at one of four places in the cycle, in turn,
and started again (it must adopt what its predecessor left), and the
cycle's calls are retried as kubelet retries them.

Counted after the second cycle (the first warms up) and after the last,
with nothing staged: mounts below the run's directory, stratafs
processes serving the store and their descriptors, the plugin's
children (zombies included), node records, the plugin's open
descriptors and its RSS. The daemon's descriptors on files while the
volume is published are reported too, not judged: each cycle has a new
daemon, and what it holds at a given moment depends on when FUSE's
releases and forgets arrive. A count that differs at the end is a leak: the
script prints the table and exits 1. RSS is reported, and fails the run
only if it grew by more than --rss-slack MiB.

This script becomes a child subreaper, as a node's init is for the
daemons: a daemon whose plugin was killed is reparented to it, and it
reaps the daemon once that exits (this machine's pid 1 does not).

    tests/bench/csi-soak.py --bin build [--cycles 1000] [--kill-daemon-every 10]
                            [--kill-plugin-every 100] [--outside CGROUP2]
A benchmark, not a test: nothing here asserts a time.
"""

import argparse
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path[:0] = [os.path.join(REPO, "tests", "csi"), os.path.join(REPO, "tests", "lib")]

import csitest  # noqa: E402
from csitest import (Env, answers, cap, daemons_of, mounts_under, poll,  # noqa: E402
                     write_file)

PR_SET_CHILD_SUBREAPER = 36
PLUGIN_KILL_POINTS = ["staged", "published", "written", "unpublished"]


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def proc_count(pid, what):
    """Open descriptors or RSS (KiB) of a process."""
    if what == "fds":
        return len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def daemon_files(pid):
    """The daemon's descriptors on files, once its count holds still: a
    FUSE release comes after the close that caused it, and the daemon's
    threads (each with a pipe and a /dev/fuse clone) come and go with
    load, so those are left out."""
    def files():
        out = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if not t.startswith(("pipe:", "anon_inode:", "/dev/fuse")):
                out += 1
        return out
    last, same = files(), 0
    while same < 5:
        time.sleep(0.05)
        now = files()
        same = same + 1 if now == last else 0
        last = now
    return last


def children_of(pid):
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            if int(s[s.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(name))
    return out


class Soak:
    def __init__(self, args, base):
        self.args = args
        self.env = Env(base)
        root = self.env.new_root("root", layers={"base": {
            f"dir/f{i}": "x" * 1000 for i in range(50)}})
        extra = ["-v", "0"]
        self.cgroup = None
        if args.outside:
            # the daemons outside the plugin, as the DaemonSet runs them
            self.cgroup = f"{args.outside}/strata-soak-{os.getpid()}"
            extra += ["--daemon-mount-namespace", "/proc/self/ns/mnt",
                      "--daemon-cgroup", self.cgroup,
                      "--daemon-binary-dir", os.path.join(base, "bin")]
        self.p = self.env.plugin(root=root, start=False, extra=extra)
        self.restarts = 0
        self.heals = 0
        self.lines = 0

    # -- the plugin -------------------------------------------------------
    def start(self):
        self.p.start()
        reap()

    def kill_plugin(self):
        self.p.proc.send_signal(signal.SIGKILL)
        self.p.proc.wait(10)
        self.restarts += 1
        self.start()

    def call(self, method, **kw):
        """As kubelet calls: retried after ABORTED (a heal holds the
        volume) until OK."""
        for _ in range(600):
            r = self.p.csi.call(method, **kw)
            if r.code == "OK":
                return r
            if not self.p.alive():
                raise SystemExit(f"the plugin died in {method}:\n{self.p.log()[-3000:]}")
            if r.code not in ("ABORTED", "UNAVAILABLE"):
                raise SystemExit(f"{method}: {r.code}: {r.details}")
            time.sleep(0.05)
        raise SystemExit(f"{method} never succeeded: {r}")

    # -- one cycle --------------------------------------------------------
    def cycle(self, n, vid, st, tgt, counts):
        # cycles 0 and 1 warm up and are counted: no crash in them
        kill_plugin = n > 1 and self.args.kill_plugin_every and \
            n % self.args.kill_plugin_every == 0
        where = PLUGIN_KILL_POINTS[(n // max(1, self.args.kill_plugin_every))
                                   % len(PLUGIN_KILL_POINTS)]

        def point(name):
            if kill_plugin and where == name:
                self.kill_plugin()

        self.call("NodeStageVolume", volume_id=vid, staging_target_path=st,
                  volume_capability=cap())
        point("staged")
        self.call("NodePublishVolume", volume_id=vid, staging_target_path=st,
                  target_path=tgt, volume_capability=cap())
        point("published")
        log = os.path.join(tgt, "log")
        with open(log, "a") as f:
            f.write(f"cycle {n}\n")
            f.flush()
            os.fsync(f.fileno())
        self.lines += 1
        point("written")
        if counts is not None:
            counts["daemon file fds, published*"] = daemon_files(self.p.daemon_pid(vid))
        if n > 1 and self.args.kill_daemon_every and \
                n % self.args.kill_daemon_every == 0:
            pid = self.p.daemon_pid(vid)
            os.kill(pid, signal.SIGKILL)
            poll(lambda: self.p.daemon_pid(vid) != pid and answers(tgt), 60,
                 what=f"the heal of the daemon killed in cycle {n}")
            self.heals += 1
        with open(log) as f:
            got = f.read().splitlines()
        if len(got) != self.lines or got[-1] != f"cycle {n}":
            raise SystemExit(f"cycle {n}: {len(got)} lines, want {self.lines}: "
                             f"fsync'd data lost")
        self.call("NodeUnpublishVolume", volume_id=vid, target_path=tgt)
        point("unpublished")
        self.call("NodeUnstageVolume", volume_id=vid, staging_target_path=st)
        reap()

    # -- counts -----------------------------------------------------------
    def counts(self, counts):
        reap()
        pid = self.p.proc.pid
        poll(lambda: not daemons_of(self.p.root), 10, what="the daemons to exit")
        daemons = daemons_of(self.p.root)
        counts.update({
            "mounts below the run": len(mounts_under(self.env.base)),
            "stratafs processes": len(daemons),
            "fds of all daemons": sum(proc_count(d, "fds") for d in daemons),
            "plugin children": len(children_of(pid)),
            "node records": len([n for n in os.listdir(self.p.path("node"))
                                 if n.endswith(".json")]),
            "plugin fds": proc_count(pid, "fds"),
            **({"daemon cgroups": len([d for d in os.listdir(self.cgroup)
                                       if os.path.isdir(os.path.join(self.cgroup, d))])}
               if self.cgroup else {}),
            "plugin RSS (KiB)": proc_count(pid, "rss"),
        })
        return counts

    def run(self):
        a = self.args
        self.start()
        r = self.call("CreateVolume", name="soak", volume_capabilities=[cap()],
                      parameters={"layers": "base"})
        vid = r.reply.volume.volume_id
        st, tgt = self.env.staging("soak"), self.env.target("soak")
        t0 = time.monotonic()
        before = {}
        # the first cycle warms up (the first daemon, gRPC's threads, the
        # file the cycles append to); the second is counted
        self.cycle(0, vid, st, tgt, None)
        self.cycle(1, vid, st, tgt, before)
        self.counts(before)
        after = {}
        for n in range(2, a.cycles):
            self.cycle(n, vid, st, tgt, after if n == a.cycles - 1 else None)
            if a.progress and n % a.progress == 0:
                print(f"  cycle {n}: {self.heals} heals, {self.restarts} plugin "
                      f"restarts, {time.monotonic() - t0:.0f} s", flush=True)
        self.counts(after)
        elapsed = time.monotonic() - t0
        self.call("DeleteVolume", volume_id=vid)
        return before, after, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build"),
                    help="build directory with strata-csi and stratafs")
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--kill-daemon-every", type=int, default=10, metavar="K",
                    help="SIGKILL the daemon every K cycles (0: never)")
    ap.add_argument("--kill-plugin-every", type=int, default=100, metavar="M",
                    help="SIGKILL the plugin every M cycles (0: never)")
    ap.add_argument("--rss-slack", type=float, default=16,
                    help="MiB the plugin's RSS may grow before it counts as a leak")
    ap.add_argument("--outside", metavar="CGROUP2",
                    help="run the daemons outside the plugin: --daemon-cgroup "
                    "below this cgroup v2 directory (e.g. /sys/fs/cgroup/unified), "
                    "a binary directory, the mount namespace flag")
    ap.add_argument("--progress", type=int, default=100,
                    help="print a line every N cycles (0: none)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("csi-soak: mounting needs root")
    if args.cycles < 3:
        sys.exit("csi-soak: --cycles must be 3 or more")
    for prog, var in (("strata-csi", "STRATA_CSI"), ("stratafs", "STRATAFS")):
        os.environ[var] = os.path.realpath(os.path.join(args.bin, prog))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"csi-soak: prctl: {os.strerror(ctypes.get_errno())}")
    csitest.pb()

    base = tempfile.mkdtemp(prefix="strata-soak.", dir="/var/tmp")
    soak = Soak(args, base)
    status = 0
    try:
        before, after, elapsed = soak.run()
    except BaseException as e:
        print(f"csi-soak: failed: {e}\nplugin log:\n{soak.p.log()[-3000:]}",
              file=sys.stderr)
        status = 2
    finally:
        soak.env.stop_plugins()
        problems = soak.env.cleanup()
        reap()
        if soak.cgroup:
            try:
                os.rmdir(soak.cgroup)
            except OSError as e:
                problems.append(f"{soak.cgroup}: {e}")
        # the store, logs and layer go, unless a mount is still there
        if not mounts_under(base):
            shutil.rmtree(base, ignore_errors=True)
    if status:
        return status
    print(f"\n{args.cycles} cycles in {elapsed:.0f} s "
          f"({elapsed / args.cycles * 1000:.0f} ms a cycle): "
          f"{soak.heals} daemons killed and healed, {soak.restarts} plugin "
          f"kills and restarts\n")
    print(f"| {'what':<28} | {'before':>8} | {'after':>8} |")
    print(f"| {'-' * 28} | {'-' * 7}: | {'-' * 7}: |")
    leaks = []
    for k in before:
        print(f"| {k:<28} | {before[k]:>8} | {after[k]:>8} |")
        if k == "plugin RSS (KiB)":
            if after[k] - before[k] > args.rss_slack * 1024:
                leaks.append(k)
        elif not k.endswith("*") and after[k] != before[k]:
            leaks.append(k)
    print("\n*: reported, not judged: each cycle has a new daemon, and what it "
          "holds\nat a moment depends on when FUSE's releases and forgets arrive")
    if problems:
        leaks.append("after the run: " + "; ".join(problems))
    if leaks:
        print(f"\nLEAK: {', '.join(leaks)}")
        return 1
    print("\nno leak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
