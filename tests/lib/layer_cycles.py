# SPDX-License-Identifier: Apache-2.0
"""Mount, work, unmount, and unmount the layers' filesystem at once: the
cycle that finds a daemon still holding its layers after the unmount
returned (issue 12). Shared by tests/integration/test_unmount.py (a few
cycles) and tests/bench/unmount-cycles.py (500, with the numbers)."""

import ctypes
import ctypes.util
import errno
import os
import subprocess
import time

from strata_common import is_mounted, lazy_umount, sanitizer_findings

FSTYPE = "fuse.stratafs"

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _umount(path):
    """umount2(2) straight from here: a umount(8) process would take
    milliseconds to start, time in which the daemon may finish anyway."""
    if _libc.umount2(os.fsencode(path), 0) != 0:
        return ctypes.get_errno()
    return 0


def _run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=60)


def _work(m, files):
    """What a short-lived volume does: lookups of many lower entries,
    reads, a copy-up, new files and directories, a rename."""
    for i in range(files):
        os.stat(os.path.join(m, "tree", f"f{i}"))
    with open(os.path.join(m, "tree", "f0"), "rb") as f:
        f.read()
    with open(os.path.join(m, "tree", "f1"), "ab") as f:
        f.write(b"+")
    os.makedirs(os.path.join(m, "new", "sub"), exist_ok=True)
    with open(os.path.join(m, "new", "sub", "n"), "wb") as f:
        f.write(os.urandom(8192))
    os.rename(os.path.join(m, "new"), os.path.join(m, "renamed"))
    os.listdir(os.path.join(m, "tree"))


class Cycle:
    """Outcome of one cycle."""

    def __init__(self):
        self.ebusy = False      # the layers' filesystem was still busy
        self.release = None     # seconds from unmount's return to daemon exit
        self.status = None      # daemon exit status
        self.stderr = ""


def run_cycle(binary, base, opts="", files=300):
    """One cycle under `base` (an empty directory): a tmpfs at base/t holds
    the lower, upper and work directories; stratafs mounts them at base/m."""
    t, m = os.path.join(base, "t"), os.path.join(base, "m")
    os.makedirs(t, exist_ok=True)
    os.makedirs(m, exist_ok=True)
    out = Cycle()
    r = _run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", t])
    if r.returncode:
        raise RuntimeError(f"mount tmpfs: {r.stderr}")
    proc = None
    try:
        for d in ("l/tree", "u", "w"):
            os.makedirs(os.path.join(t, d))
        for i in range(files):
            with open(os.path.join(t, "l", "tree", f"f{i}"), "wb") as f:
                f.write(b"lower %d" % i)
        o = f"lowerdir={t}/l,upperdir={t}/u,workdir={t}/w"
        if opts:
            o += "," + opts
        err = os.path.join(base, "stderr")
        with open(err, "wb") as e:
            proc = subprocess.Popen([binary, "-f", "-o", o, m],
                                    stdin=subprocess.DEVNULL, stdout=e,
                                    stderr=e, start_new_session=True,
                                    cwd="/")
        deadline = time.monotonic() + 10
        while not is_mounted(m, FSTYPE):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stratafs did not mount: {open(err).read()}")
            time.sleep(0.005)
        _work(m, files)
        r = _run(["fusermount3", "-u", m])
        done = time.monotonic()
        if r.returncode:
            raise RuntimeError(f"fusermount3 -u: {r.stderr}")
        # at once, as a volume's teardown does
        e = _umount(t)
        if e:
            out.ebusy = e == errno.EBUSY
            if not out.ebusy:
                raise RuntimeError(f"umount {t}: {os.strerror(e)}")
        out.status = proc.wait(10)
        out.release = time.monotonic() - done
        out.stderr = open(err, errors="replace").read()
        if sanitizer_findings(out.stderr):
            raise RuntimeError(f"sanitizer report:\n{out.stderr}")
        return out
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_mounted(m):
            lazy_umount(m)
        if is_mounted(t):
            r = _run(["umount", t])
            if r.returncode:
                lazy_umount(t)
