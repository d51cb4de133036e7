# SPDX-License-Identifier: Apache-2.0
"""Helpers for the stratafs integration suite (layer builders, snapshots,
mount management).  Imported by conftest.py and the test modules."""

import ctypes
import ctypes.util
import errno
import hashlib
import os
import signal
import stat
import subprocess
import time

import pytest

from strata_common import (  # noqa: F401  (re-exported to the tests)
    SANITIZER_MARKERS, errno_of, fuse_abort, is_mounted, is_sanitizer_build,
    lazy_umount, mounts_at, mounts_under, program, read_mountinfo,
    sanitizer_findings, wait_exit, write_all)

# --------------------------------------------------------------------------
# constants / configuration

STRATAFS_ENV = "STRATAFS"
# The fs type stratafs mounts show in /proc/self/mountinfo.  Overridable only
# to self-test this harness against another FUSE overlay (see README).
STRATAFS_FSTYPE = os.environ.get("STRATA_FSTYPE", "fuse.stratafs")
MOUNT_TIMEOUT = 10.0
EXIT_TIMEOUT = 10.0
# Per-test watchdog: after this many seconds every stratafs FUSE connection of
# the test is aborted so that a hung daemon turns into ENOTCONN failures
# instead of a hung suite.  Override per test with @pytest.mark.timeout(N).
DEFAULT_TEST_TIMEOUT = float(os.environ.get("STRATA_TEST_TIMEOUT", "180"))

WHITEOUT_DEV = os.makedev(0, 0)

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                            ctypes.c_char_p, ctypes.c_uint]
_libc.renameat2.restype = ctypes.c_int


_prctl = _libc.prctl
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # preexec_fn for daemons: SIGTERM them (libfuse then unmounts and
    # exits) if the test process dies without tearing down
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def renameat2(src, dst, flags=0, src_dir_fd=AT_FDCWD, dst_dir_fd=AT_FDCWD):
    """renameat2(2); raises OSError like os.rename does."""
    r = _libc.renameat2(src_dir_fd, os.fsencode(src), dst_dir_fd,
                        os.fsencode(dst), flags)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), src, None, dst)


def run_as(uid, gid, dirpath, action):
    """Runs action(dir_fd) in a child with uid/gid and no groups; returns
    the errno it raised (0 on success, 255 on anything else).  The dir fd
    is opened before dropping privileges: pytest's tmp dirs are 0700."""
    dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            action(dfd)
        except OSError as e:
            code = e.errno
        except BaseException:
            code = 255
        os._exit(code)
    os.close(dfd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def stratafs_binary():
    """Absolute path of the stratafs binary; fails the test if unusable."""
    return program(STRATAFS_ENV, ".  To run only the kernel overlayfs "
                   "variants use:  -m 'not stratafs'")


# --------------------------------------------------------------------------
# /proc/self/mountinfo

def wait_for_mount(path, fstype, proc=None, stderr_path=None, timeout=MOUNT_TIMEOUT):
    """Poll mountinfo until `path` carries an `fstype` mount."""
    deadline = time.monotonic() + timeout
    while True:
        if is_mounted(path, fstype):
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"stratafs exited early with status {proc.returncode} "
                        f"before {path} was mounted; stderr:\n{_read(stderr_path)}",
                        pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"no {fstype} mount appeared at {path} within {timeout}s; "
                        f"stderr:\n{_read(stderr_path)}", pytrace=False)
        time.sleep(0.02)


def _read(path):
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        return f"<cannot read {path}: {e}>"


def run(cmd, check=True, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 60)
    r = subprocess.run(cmd, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"command {cmd} failed with {r.returncode}:\n"
                             f"stdout: {r.stdout}\nstderr: {r.stderr}")
    return r


# --------------------------------------------------------------------------
# building layer trees

def _opts(entry, idx):
    if len(entry) > idx and isinstance(entry[idx], dict):
        return entry[idx]
    return {}


def build_tree(root, spec, *, userxattr=False):
    """Create the tree `spec` under `root` (created if missing).

    `spec` maps relative paths to entries (parents are created as needed,
    in insertion order):

    * ``"text"`` / ``b"bytes"``          regular file with that content
    * ``("file", content[, opts])``      regular file
    * ``("sparse", size, {off: data}[, opts])`` sparse file of `size` bytes
    * ``("dir"[, opts])``                directory
    * ``("opaque_dir"[, opts])``         dir marked opaque (trusted./user.overlay.opaque=y)
    * ``("symlink", target[, opts])``    symlink
    * ``("whiteout",)``                  overlay whiteout: char device 0/0
    * ``("oci_whiteout",)``              AUFS/OCI whiteout: empty file ``.wh.NAME``
                                         (the spec key is NAME's path)
    * ``("oci_opaque"[, opts])``         dir containing ``.wh..wh..opq``
    * ``("fifo"[, opts])``, ``("chardev", major, minor[, opts])``,
      ``("socket"[, opts])``
    * ``("hardlink", other_path)``       hard link to an entry created earlier

    opts: ``mode``, ``uid``, ``gid``, ``xattrs`` ({name: bytes|str}),
    ``mtime`` (seconds, float or int; also sets atime).  Directory
    metadata is applied after all children exist so mtimes stick.
    """
    os.makedirs(root, exist_ok=True)
    opaque_name = ("user" if userxattr else "trusted") + ".overlay.opaque"
    meta = []
    for rel, entry in spec.items():
        rel = rel.strip("/")
        path = os.path.join(root, rel)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if isinstance(entry, (str, bytes)):
            entry = ("file", entry)
        kind = entry[0]
        opts = {}
        if kind == "file":
            data = entry[1].encode() if isinstance(entry[1], str) else entry[1]
            with open(path, "wb") as f:
                f.write(data)
            opts = _opts(entry, 2)
        elif kind == "sparse":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for off, data in entry[2].items():
                    os.pwrite(fd, data.encode() if isinstance(data, str) else data, off)
                os.ftruncate(fd, entry[1])
            finally:
                os.close(fd)
            opts = _opts(entry, 3)
        elif kind in ("dir", "opaque_dir", "oci_opaque"):
            os.makedirs(path, exist_ok=True)
            if kind == "opaque_dir":
                os.setxattr(path, opaque_name, b"y")
            elif kind == "oci_opaque":
                open(os.path.join(path, ".wh..wh..opq"), "wb").close()
            opts = _opts(entry, 1)
        elif kind == "symlink":
            os.symlink(entry[1], path)
            opts = _opts(entry, 2)
        elif kind == "whiteout":
            os.mknod(path, stat.S_IFCHR | 0o000, WHITEOUT_DEV)
        elif kind == "oci_whiteout":
            d, n = os.path.split(path)
            open(os.path.join(d, ".wh." + n), "wb").close()
        elif kind == "fifo":
            os.mkfifo(path)
            opts = _opts(entry, 1)
        elif kind == "chardev":
            os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(entry[1], entry[2]))
            opts = _opts(entry, 3)
        elif kind == "socket":
            import socket
            s = socket.socket(socket.AF_UNIX)
            try:
                s.bind(path)
            finally:
                s.close()
            opts = _opts(entry, 1)
        elif kind == "hardlink":
            os.link(os.path.join(root, entry[1].strip("/")), path)
        else:
            raise ValueError(f"unknown spec entry {entry!r} for {rel}")
        if opts:
            meta.append((path, kind, opts))
    # apply metadata deepest first so that a directory's mtime is set after
    # its children were created
    for path, kind, opts in sorted(meta, key=lambda m: -m[0].count("/")):
        nofollow = kind == "symlink"
        # chown first: it clears suid/sgid and security.capability
        if "uid" in opts or "gid" in opts:
            os.chown(path, opts.get("uid", -1), opts.get("gid", -1),
                     follow_symlinks=not nofollow)
        if "mode" in opts and not nofollow:
            os.chmod(path, opts["mode"])
        for name, value in opts.get("xattrs", {}).items():
            value = value.encode() if isinstance(value, str) else value
            os.setxattr(path, name, value, follow_symlinks=not nofollow)
        if "mtime" in opts:
            t = opts["mtime"]
            os.utime(path, (t, t), follow_symlinks=not nofollow)


# --------------------------------------------------------------------------
# snapshots

PRIVATE_XATTR_PREFIXES = ("trusted.overlay.", "user.overlay.")


_FTYPES = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
           stat.S_IFIFO: "fifo", stat.S_IFCHR: "chr", stat.S_IFBLK: "blk",
           stat.S_IFSOCK: "sock"}


def _ftype(mode):
    return _FTYPES.get(stat.S_IFMT(mode), "?")


def _hash_fd(fd):
    h = hashlib.sha256()
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        h.update(b)
    return h.hexdigest()


def _xattrs_at(dfd, name, keep):
    p = f"/proc/self/fd/{dfd}/{name}" if name else f"/proc/self/fd/{dfd}"
    try:
        names = os.listxattr(p, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EPERM):
            return {}
        raise
    out = {}
    for n in sorted(names):
        if not keep(n):
            continue
        try:
            out[n] = os.getxattr(p, n, follow_symlinks=False).hex()
        except OSError as e:
            out[n] = f"<errno {errno.errorcode.get(e.errno, e.errno)}>"
    return out


def walk_fd(root):
    """Yield (relpath, dir_fd, name, lstat) for every entry under root
    (root itself first as ".", with name None).  Uses dir fds so that
    paths longer than PATH_MAX work.  Children are yielded sorted."""
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield ".", rfd, None, os.stat(rfd)
        yield from _walk_dir(rfd, "")
    finally:
        os.close(rfd)


def _walk_dir(dfd, prefix):
    names = sorted(os.listdir(dfd))
    for n in names:
        st = os.lstat(n, dir_fd=dfd)
        rel = prefix + n
        yield rel, dfd, n, st
        if stat.S_ISDIR(st.st_mode):
            cfd = os.open(n, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                yield from _walk_dir(cfd, rel + "/")
            finally:
                os.close(cfd)


def snapshot_tree(root, *, xattrs=True, private_xattrs=False, mtime=False,
                  dir_mtime=False, ctime=False, nlink=False, ino=False,
                  content=True, exclude=(), xattr_prefixes=None):
    """Describe every entry under `root` as {relpath: {field: value}}.

    Fields: type, mode (permission bits incl. suid/sgid/sticky), uid, gid,
    size+sha256 (regular files), target (symlinks), rdev (devices),
    xattrs (name -> hex value; private overlay xattrs left out unless
    private_xattrs=True), optionally mtime_ns (non-dirs; dirs with
    dir_mtime=True), ctime_ns, nlink, ino.
    `exclude` is a collection of relpaths (and their subtrees) to skip.
    `xattr_prefixes` (tuple) keeps only xattrs with those prefixes.
    """
    if xattr_prefixes is not None:
        keep = lambda n: n.startswith(tuple(xattr_prefixes))  # noqa: E731
    elif private_xattrs:
        keep = lambda n: True  # noqa: E731
    else:
        keep = lambda n: not n.startswith(PRIVATE_XATTR_PREFIXES)  # noqa: E731
    snap = {}
    for rel, dfd, name, st in walk_fd(root):
        if any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in exclude):
            continue
        t = _ftype(st.st_mode)
        rec = {"type": t, "mode": oct(stat.S_IMODE(st.st_mode)),
               "uid": st.st_uid, "gid": st.st_gid}
        if t == "file":
            rec["size"] = st.st_size
            if content:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd) if name \
                    else None
                try:
                    rec["sha256"] = _hash_fd(fd)
                finally:
                    os.close(fd)
        elif t == "symlink":
            rec["target"] = os.readlink(name, dir_fd=dfd)
        elif t in ("chr", "blk"):
            rec["rdev"] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        if xattrs:
            rec["xattrs"] = _xattrs_at(dfd, name, keep)
        if mtime and (t != "dir" or dir_mtime):
            rec["mtime_ns"] = st.st_mtime_ns
        if ctime:
            rec["ctime_ns"] = st.st_ctime_ns
        if nlink:
            rec["nlink"] = st.st_nlink
        if ino:
            rec["ino"] = st.st_ino
        snap[rel] = rec
    return snap


def is_whiteout(st):
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == WHITEOUT_DEV


def _getx(dfd, name, attr):
    p = f"/proc/self/fd/{dfd}/{name}" if name else f"/proc/self/fd/{dfd}"
    try:
        return os.getxattr(p, attr, follow_symlinks=False)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EPERM):
            return None
        raise


def snapshot_upper(upper, *, userxattr=False, contents=True):
    """Describe an upper layer in implementation-neutral terms.

    {relpath: tuple} with tuples
      ("whiteout",)
      ("dir", opaque: bool, redirect: normalized absolute lower path or None)
      ("file", sha256, mode)      (("file", None, mode) with contents=False)
      ("symlink", target)
      ("fifo",) / ("chr", major, minor) / ("sock",) / ...
    Redirects are normalized to the absolute path they resolve to in the
    lower layers (kernel may store names relative to the parent's lower
    path); a redirect that resolves to the path the directory would have
    looked up anyway is reported as None.
    """
    return _snapshot_upper(upper, userxattr=userxattr, contents=contents)[0]


def _snapshot_upper(upper, *, userxattr=False, contents=True):
    """Returns (snapshot, {relpath of upper dir: lower lookup path})."""
    ns = "user" if userxattr else "trusted"
    opq_x, redir_x = f"{ns}.overlay.opaque", f"{ns}.overlay.redirect"
    snap = {}
    lowerpath = {".": ""}  # relpath -> lower lookup path ("" is the root)
    for rel, dfd, name, st in walk_fd(upper):
        if rel == ".":
            continue
        t = _ftype(st.st_mode)
        if is_whiteout(st):
            snap[rel] = ("whiteout",)
        elif t == "dir":
            parent = os.path.dirname(rel) or "."
            default = lowerpath[parent] + "/" + name
            r = _getx(dfd, name, redir_x)
            lp = default
            if r is not None:
                r = r.decode(errors="replace")
                lp = os.path.normpath(r) if r.startswith("/") else \
                    lowerpath[parent] + "/" + r
                if lp == "/":
                    lp = ""
            lowerpath[rel] = lp
            opaque = _getx(dfd, name, opq_x)
            snap[rel] = ("dir", opaque == b"y", lp if lp != default else None)
        elif t == "file":
            h = None
            if contents:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                try:
                    h = _hash_fd(fd)
                finally:
                    os.close(fd)
            snap[rel] = ("file", h, oct(stat.S_IMODE(st.st_mode)))
        elif t == "symlink":
            snap[rel] = ("symlink", os.readlink(name, dir_fd=dfd))
        elif t in ("chr", "blk"):
            snap[rel] = (t, os.major(st.st_rdev), os.minor(st.st_rdev))
        else:
            snap[rel] = (t,)
    return snap, lowerpath


def lower_has(lowers, lp, *, userxattr=False):
    """True if lower lookup path `lp` ("" = root, "/a/b") resolves to an
    entry in the stack of lower layers (top first), honouring overlay
    whiteouts, opaque dirs and non-directories that end a merge."""
    opq = ("user" if userxattr else "trusted") + ".overlay.opaque"
    comps = [c for c in lp.split("/") if c]
    dirs = list(lowers)
    for i, c in enumerate(comps):
        last = i == len(comps) - 1
        nxt = []
        for d in dirs:
            p = os.path.join(d, c)
            try:
                st = os.lstat(p)
            except (FileNotFoundError, NotADirectoryError):
                continue
            if is_whiteout(st):
                break
            if last:
                return True
            if not stat.S_ISDIR(st.st_mode):
                break
            nxt.append(p)
            try:
                if os.getxattr(p, opq) == b"y":
                    break
            except OSError:
                pass
        if not nxt:
            return False
        dirs = nxt
    return True


def semantic_upper(upper, lowers, *, userxattr=False, work=None):
    """An upper layer reduced to what matters for the merged view:
    whiteouts that hide something in the lower layers, opaque flags of
    directories that have something below them to hide, and every other
    non-directory entry (files with content hash).  Plain directories,
    redirects and irrelevant markers (kernel overlayfs marks every new
    directory in a merged parent opaque, for example) are left out.
    With `work`, the index (work/index) is part of it, as "index/NAME"
    entries, and an upper name linked to an index entry is not: the lower
    name finds the index entry either way (the kernel links the name it
    copied up through, stratafs does not).
    Returns {relpath: tuple}."""
    snap, lowerpath = _snapshot_upper(upper, userxattr=userxattr)
    out = {}
    indexed = set()
    idir = os.path.join(work, "index") if work else None
    if idir and os.path.isdir(idir):
        for name in os.listdir(idir):
            st = os.lstat(os.path.join(idir, name))
            if stat.S_ISREG(st.st_mode) and not name.startswith("#"):
                indexed.add((st.st_dev, st.st_ino))
                with open(os.path.join(idir, name), "rb") as f:
                    out["index/" + name] = ("file", sha256(f.read()))
    for rel in list(snap):
        if snap[rel][0] == "file" and indexed:
            st = os.lstat(os.path.join(upper, rel))
            if (st.st_dev, st.st_ino) in indexed:
                del snap[rel]
    # a path below an opaque upper dir, or below an upper dir with nothing
    # in the lower layers, never reaches the lower layers
    reaches_lower = {".": True}
    for rel in sorted(snap, key=lambda r: r.count("/")):
        v = snap[rel]
        parent = os.path.dirname(rel) or "."
        parent_reaches = reaches_lower.get(parent, False)
        if v[0] == "dir":
            below = parent_reaches and lower_has(lowers, lowerpath[rel],
                                                 userxattr=userxattr)
            reaches_lower[rel] = below and not v[1]
            if v[1] and below:
                out[rel] = ("opaque_dir",)
        elif v == ("whiteout",):
            name = os.path.basename(rel)
            if parent_reaches and lower_has(lowers, lowerpath[parent] + "/" + name,
                                            userxattr=userxattr):
                out[rel] = v
        else:
            out[rel] = v[:2] if v[0] == "file" else v
    return out


def upper_whiteouts(upper):
    return sorted(p for p, v in snapshot_upper(upper, contents=False).items()
                  if v == ("whiteout",))


def diff_snapshots(a, b, names=("a", "b")):
    """Human-readable list of differences between two snapshots."""
    lines = []
    for p in sorted(set(a) | set(b)):
        if p not in a:
            lines.append(f"only in {names[1]}: {p}: {b[p]}")
        elif p not in b:
            lines.append(f"only in {names[0]}: {p}: {a[p]}")
        elif a[p] != b[p]:
            lines.append(f"differs: {p}:\n    {names[0]}: {a[p]}\n    {names[1]}: {b[p]}")
    return lines


def assert_same(a, b, names=("expected", "actual"), context=""):
    d = diff_snapshots(a, b, names)
    if d:
        msg = (context + "\n" if context else "") + "\n".join(d[:60])
        if len(d) > 60:
            msg += f"\n... and {len(d) - 60} more differences"
        raise AssertionError(msg)


def assert_survives_remount(u):
    """The merged tree is the same after an unmount and a mount."""
    snap = snapshot_tree(u.mnt)
    u.remount()
    assert_same(snap, snapshot_tree(u.mnt), ("before remount", "after remount"))


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open(path, flags, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# mounts

_live_procs = []          # Popen objects of stratafs daemons started here
_live_unions = []         # mounted Union objects (for the watchdog)


def _esc_layer(p):
    return p.replace("\\", "\\\\").replace(":", "\\:")


class Union:
    """One union mount (kernel overlayfs or stratafs) over a layer set."""

    def __init__(self, kind, base, lowers, upper, work, mnt, *, userxattr=False,
                 allow_other=False, extra_opts=(), kernel_opts=(), env=None):
        self.kind = kind
        self.base = base
        self.lowers = lowers          # top first
        self.upper = upper            # None for a read-only union
        self.work = work
        self.mnt = mnt
        self.userxattr = userxattr
        self.allow_other = allow_other
        self.extra_opts = list(extra_opts)
        self.kernel_opts = list(kernel_opts)
        self.env = env
        self.proc = None
        self.pid = None
        self.stderr_path = None
        self.mounted = False
        self._nmounts = 0

    # -- helpers for tests
    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def upath(self, *parts):
        return os.path.join(self.upper, *parts)

    def lpath(self, i, *parts):
        return os.path.join(self.lowers[i], *parts)

    @property
    def opaque_xattr(self):
        return ("user" if self.userxattr else "trusted") + ".overlay.opaque"

    @property
    def redirect_xattr(self):
        return ("user" if self.userxattr else "trusted") + ".overlay.redirect"

    def options(self):
        o = ["lowerdir=" + ":".join(_esc_layer(p) for p in self.lowers)]
        if self.upper is not None:
            o += ["upperdir=" + self.upper, "workdir=" + self.work]
        if self.kind == "kernel":
            # userxattr forbids redirect_dir=on (kernel: "conflicting options")
            if not self.userxattr:
                o.append("redirect_dir=on")
            o.append("index=off")
            if self.userxattr:
                o.append("userxattr")
            o += self.kernel_opts
        else:
            if self.userxattr:
                o.append("userxattr")
            if self.allow_other:
                o.append("allow_other")
            # STRATAFS_OPTS (e.g. "io=sync") runs the whole suite with
            # other daemon settings: scripts/test.sh runs both engines
            o += [x for x in os.environ.get("STRATAFS_OPTS", "").split(",") if x]
            o += self.extra_opts
        return ",".join(o)

    def mount(self):
        assert not self.mounted
        os.makedirs(self.mnt, exist_ok=True)
        if self.kind == "kernel":
            # index=on refuses an upper whose last overlay is not gone yet:
            # its superblock can outlive umount(2) for a moment when
            # another task (a walk of the tree, on this busy machine) held
            # the mount last; under heavy load that moment outlasted 5 s
            deadline = time.monotonic() + 30
            while True:
                r = run(["mount", "-t", "overlay", "overlay", "-o",
                         self.options(), self.mnt], check=False)
                if r.returncode == 0 or "index=on" not in self.options() \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if r.returncode != 0:
                dm = run(["dmesg"], check=False).stdout.splitlines()[-5:]
                pytest.fail(f"kernel overlay mount failed: {r.stderr}\n"
                            f"options: {self.options()}\ndmesg: {dm}", pytrace=False)
            assert is_mounted(self.mnt, "overlay")
        else:
            binary = stratafs_binary()
            self._nmounts += 1
            self.stderr_path = os.path.join(self.base, f"stratafs.{self._nmounts}.stderr")
            out = open(os.path.join(self.base, f"stratafs.{self._nmounts}.stdout"), "wb")
            err = open(self.stderr_path, "wb")
            try:
                self.proc = subprocess.Popen(
                    [binary, "-f", "-o", self.options(), self.mnt],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    start_new_session=True, env=self.env,
                    preexec_fn=_die_with_parent)
            finally:
                out.close()
                err.close()
            self.pid = self.proc.pid
            _live_procs.append(self.proc)
            try:
                wait_for_mount(self.mnt, STRATAFS_FSTYPE, self.proc, self.stderr_path)
            except BaseException:
                self._kill()
                raise
        self.mounted = True
        _live_unions.append(self)
        return self

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if is_mounted(self.mnt):
            lazy_umount(self.mnt)
        if self.proc in _live_procs and self.proc.poll() is not None:
            _live_procs.remove(self.proc)

    def stderr(self):
        return _read(self.stderr_path)

    def passthrough(self):
        """Whether the kernel reads and writes upper files itself: the
        daemon's default where it can be, said when INIT agreed it (which
        the first request waits for)."""
        if self.kind != "stratafs":
            return False
        os.stat(self.mnt)
        return "passthrough: the kernel reads and writes upper files itself" \
            in self.stderr()

    def unmount(self):
        """Unmount; for stratafs also check the daemon's exit (status 0,
        no sanitizer report)."""
        assert self.mounted, "not mounted"
        self.mounted = False
        if self in _live_unions:
            _live_unions.remove(self)
        problems = []
        if self.kind == "kernel":
            for attempt in range(50):
                r = run(["umount", self.mnt], check=False)
                if r.returncode == 0:
                    break
                time.sleep(0.1)
            else:
                lazy_umount(self.mnt)
                problems.append(f"umount {self.mnt} failed: {r.stderr.strip()}")
        else:
            r = run(["fusermount3", "-u", self.mnt], check=False)
            if r.returncode != 0:
                problems.append(f"fusermount3 -u failed: {r.stderr.strip()}")
                lazy_umount(self.mnt)
            rc = wait_exit(self.proc, EXIT_TIMEOUT, self._kill)
            if rc is None:
                problems.append(f"stratafs (pid {self.pid}) did not exit within "
                                f"{EXIT_TIMEOUT}s of the unmount; killed")
            if self.proc in _live_procs:
                _live_procs.remove(self.proc)
            err = self.stderr()
            if rc is not None and rc != 0:
                problems.append(f"stratafs exited with status {rc}")
            found = sanitizer_findings(err)
            if found:
                problems.append(f"sanitizer report in stratafs stderr ({found})")
            if problems:
                problems.append(f"stratafs stderr:\n{err[-8000:]}")
        if is_mounted(self.mnt):
            lazy_umount(self.mnt)
            problems.append(f"{self.mnt} still mounted after unmount")
        if problems:
            raise AssertionError("\n".join(problems))

    def remount(self):
        self.unmount()
        return self.mount()


def close_fds_under(paths):
    """Close this process's fds that refer to files below any of `paths`."""
    prefixes = [os.path.realpath(p) for p in paths]
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.endswith(" (deleted)"):
            target = target[:-len(" (deleted)")]
        if any(target == p or target.startswith(p + "/") for p in prefixes):
            try:
                os.close(int(name))
            except OSError:
                pass


class UnionFactory:
    """Builds fresh layer sets under the test's tmp dir and mounts them."""

    def __init__(self, kind, tmp_path):
        self.kind = kind
        self.tmp = str(tmp_path)
        self.unions = []
        self.tmpfs = []
        self._n = 0

    def new_dir(self, name):
        p = os.path.join(self.tmp, name)
        os.makedirs(p, exist_ok=True)
        return p

    def mount_tmpfs(self, name, size="16m", opts=""):
        """Mount a tmpfs at tmp/name; unmounted after the unions."""
        p = self.new_dir(name)
        o = f"size={size}" + ("," + opts if opts else "")
        run(["mount", "-t", "tmpfs", "-o", o, "tmpfs", p])
        self.tmpfs.append(p)
        return p

    def make(self, lowers, upper=None, *, readonly=False, userxattr=False,
             allow_other=False, extra_opts=(), kernel_opts=(), mount=True,
             layer_dirs=None, upper_dir=None, work_dir=None, env=None):
        """Build layers (lowers: list of specs, top first; upper: spec or
        None) and mount them.  With readonly=True no upper/work is used.
        layer_dirs/upper_dir/work_dir place layers at given paths instead
        of fresh dirs (the spec still gets built there)."""
        self._n += 1
        base = self.new_dir(f"u{self._n}")
        ldirs = []
        for i, spec in enumerate(lowers):
            d = layer_dirs[i] if layer_dirs else os.path.join(base, f"lower{i}")
            build_tree(d, spec or {}, userxattr=userxattr)
            ldirs.append(d)
        up = wk = None
        if not readonly:
            up = upper_dir or os.path.join(base, "upper")
            wk = work_dir or os.path.join(base, "work")
            build_tree(up, upper or {}, userxattr=userxattr)
            os.makedirs(wk, exist_ok=True)
        else:
            assert upper is None
        u = Union(self.kind, base, ldirs, up, wk, os.path.join(base, "mnt"),
                  userxattr=userxattr, allow_other=allow_other,
                  extra_opts=extra_opts, kernel_opts=kernel_opts, env=env)
        self.unions.append(u)
        if mount:
            u.mount()
        return u

    def cleanup(self):
        problems = []
        # a failed test may have leaked fds into its mounts; they would keep
        # the mounts busy (and the daemons alive) forever
        close_fds_under([u.mnt for u in self.unions if u.mounted] + self.tmpfs)
        for u in reversed(self.unions):
            if u.mounted:
                try:
                    u.unmount()
                except AssertionError as e:
                    problems.append(f"[{u.kind} at {u.mnt}] {e}")
            elif u.proc is not None and u.proc.poll() is None:
                u._kill()
                problems.append(f"[{u.kind} at {u.mnt}] daemon still running after unmount")
        for p in reversed(self.tmpfs):
            r = run(["umount", p], check=False)
            if r.returncode != 0:
                lazy_umount(p)
                problems.append(f"umount tmpfs {p}: {r.stderr.strip()}")
        if problems:
            pytest.fail("teardown problems:\n" + "\n".join(problems), pytrace=False)
