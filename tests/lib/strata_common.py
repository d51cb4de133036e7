# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the stratafs integration suite (tests/integration) and
the strata-csi suite (tests/csi): /proc/self/mountinfo, unmounting and
aborting FUSE connections, sanitizer reports, errno checks, the per-test
watchdog, and a daemon's control channel and capacity.  Each suite's conftest.py puts this folder on sys.path; the
suites' own helper modules (stratatest.py, csitest.py) re-export these
names, so test modules import them from there."""

import errno
import os
import socket
import subprocess
import sys
import threading

import pytest

# --------------------------------------------------------------------------
# the programs, files and errors

def program(env, hint=""):
    """Absolute path of the program named by environment variable `env`;
    fails (never skips) the test when it is unusable.  `hint` ends the
    message that `env` is not set."""
    path = os.environ.get(env)
    if not path:
        pytest.fail(f"{env} environment variable is not set: it must name the "
                    f"{env.lower().replace('_', '-')} binary (absolute path){hint}",
                    pytrace=False)
    if not os.path.isabs(path):
        pytest.fail(f"{env}={path!r} is not an absolute path", pytrace=False)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"{env}={path!r} is not an executable file", pytrace=False)
    return path


SANITIZER_MARKERS = ("AddressSanitizer", "runtime error:", "LeakSanitizer",
                     "ThreadSanitizer")


def is_sanitizer_build(binary):
    """True if the binary carries an ASan runtime (static or dynamic)."""
    try:
        with open(binary, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"AddressSanitizer" in data or b"libasan.so" in data


def sanitizer_findings(text):
    return [m for m in SANITIZER_MARKERS if m in text]


def write_all(fd, data):
    """os.write until all of `data` is written."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def wait_exit(proc, timeout, kill):
    """The exit status of the Popen `proc`, or None when it does not exit
    within `timeout` seconds (then `kill()` is called)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill()
        return None


def errno_of(fn, *args, **kw):
    """Run fn; return 0 on success or the OSError's errno."""
    try:
        fn(*args, **kw)
        return 0
    except OSError as e:
        return e.errno


# --------------------------------------------------------------------------
# /proc/self/mountinfo

def _unescape_mountinfo(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def read_mountinfo():
    """List of dicts: id, majmin, root, mountpoint, mntopts, fstype, source, superopts."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            lf = left.split(" ")
            rf = right.split(" ")
            res.append({
                "id": lf[0], "majmin": lf[2], "root": _unescape_mountinfo(lf[3]),
                "mountpoint": _unescape_mountinfo(lf[4]), "mntopts": lf[5],
                "fstype": rf[0],
                "source": _unescape_mountinfo(rf[1]) if len(rf) > 1 else "",
                "superopts": rf[2] if len(rf) > 2 else "",
            })
    return res


def mounts_at(path):
    path = os.path.realpath(path)
    return [m for m in read_mountinfo() if m["mountpoint"] == path]


def mounts_under(base):
    """The mounts at `base` and below it."""
    base = os.path.realpath(base)
    return [m for m in read_mountinfo()
            if m["mountpoint"] == base or m["mountpoint"].startswith(base + "/")]


def is_mounted(path, fstype=None):
    return any(fstype is None or m["fstype"] == fstype for m in mounts_at(path))


def lazy_umount(path):
    subprocess.run(["umount", "-l", path], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def fuse_abort(mountpoint):
    """Abort the FUSE connection behind `mountpoint` (unsticks hung syscalls)."""
    conns = "/sys/fs/fuse/connections"
    if not os.path.isdir(conns) or not os.listdir(conns):
        subprocess.run(["mount", "-t", "fusectl", "none", conns],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for m in mounts_at(mountpoint):
        if m["fstype"].startswith("fuse"):
            minor = m["majmin"].split(":")[1]
            try:
                with open(f"{conns}/{minor}/abort", "w") as f:
                    f.write("1")
            except OSError:
                pass


# --------------------------------------------------------------------------
# the per-test watchdog

class Watchdog:
    """Starts a timer for the test `node`: its limit is the test's
    @pytest.mark.timeout(N), else `default` seconds.  When it fires it says
    so on stderr (`what`: what it does about it) and calls `action`, which
    should turn the hung test into a failure (kill, abort connections).
    Call cancel() when the test is over, then check() to fail the test if
    it fired."""

    def __init__(self, node, default, what, action):
        m = node.get_closest_marker("timeout")
        self.limit = float(m.args[0]) if m else default
        self.fired = False
        self._nodeid, self._what, self._action = node.nodeid, what, action
        self._timer = threading.Timer(self.limit, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        self.fired = True
        sys.stderr.write(f"\n*** watchdog: {self._nodeid} exceeded "
                         f"{self.limit}s; {self._what}\n")
        self._action()

    def cancel(self):
        self._timer.cancel()

    def check(self):
        if self.fired:
            pytest.fail(f"test exceeded its {self.limit}s time limit (watchdog fired)",
                        pytrace=False)


_STATX_MNT_ID_UNIQUE = 0x4000
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_STATX_DONT_SYNC = 0x4000


def mount_id(path):
    """(unique mount id, "major:minor" of its superblock) of the mount
    `path` is on, without calling into the filesystem (a dead FUSE
    mount answers too): what strata-csi records of its mounts."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    r = libc.statx(-100, path.encode(), _AT_SYMLINK_NOFOLLOW | _AT_STATX_DONT_SYNC,
                   _STATX_MNT_ID_UNIQUE, buf)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)
    raw = buf.raw
    mask = int.from_bytes(raw[0:4], "little")
    assert mask & _STATX_MNT_ID_UNIQUE, "the kernel has no unique mount ids"
    dev = (int.from_bytes(raw[136:140], "little"), int.from_bytes(raw[140:144], "little"))
    return int.from_bytes(raw[144:152], "little"), f"{dev[0]}:{dev[1]}"


def control_call(path, *args, timeout=10):
    """One request on a daemon's control socket (fuse/control.c):
    (status, text), status 0 or a negative errno."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        # through the directory: a deep path outgrows sun_path
        d = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
        try:
            s.connect(f"/proc/self/fd/{d}/{os.path.basename(path)}")
        finally:
            os.close(d)
        s.send(b"\0".join(a.encode() if isinstance(a, str) else a
                           for a in args))
        reply = s.recv(65536).decode()
    status, _, text = reply.partition(" ")
    return int(status), text


# --------------------------------------------------------------------------
# a daemon's capacity and usage (fuse/usage.c)

FILL_CHUNK = 64 * 1024


def control_usage(path):
    """A daemon's counters, asked with `usage` on its control socket `path`:
    {"used": bytes, "inodes": n, "capacity": bytes}."""
    status, text = control_call(path, "usage")
    assert status == 0, text
    return {k: int(v) for k, v in (f.split("=") for f in text.split())}


def fill_to_enospc(path, limit=64 << 20, byte=b"d"):
    """Appends FILL_CHUNK bytes at a time to `path` until ENOSPC; returns
    the bytes written. Fails the test when `limit` bytes go in without it."""
    done = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while done < limit:
            try:
                done += os.write(fd, byte * FILL_CHUNK)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                return done
    finally:
        os.close(fd)
    pytest.fail(f"{limit} bytes went into {path} without ENOSPC")


def walk_usage(*dirs):
    """What the daemon's start-up walk counts: st_blocks*512 and inodes,
    each inode with several names once."""
    seen, used, inodes = set(), 0, 0
    for d in dirs:
        for root, dnames, fnames in os.walk(d):
            for name in [None] + dnames + fnames:
                if name is None and root != d:
                    continue
                st = os.lstat(root if name is None else os.path.join(root, name))
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                used += st.st_blocks * 512
                inodes += 1
    return used, inodes


def assert_layer_size(counted, layer):
    """COUNTED, a daemon's count of what the frozen LAYER allocates, is
    what a walk of it finds within one block per directory: the count
    leaves out a directory's growth by entries moved into it, and the
    fresh upper's own directory (fuse/usage.c)."""
    walked = walk_usage(layer)[0]
    dirs = sum(1 for _ in os.walk(layer))
    block = os.statvfs(layer).f_bsize
    assert abs(counted - walked) <= dirs * block, \
        (counted, walked, dirs)
