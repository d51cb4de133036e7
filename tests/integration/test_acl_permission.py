# SPDX-License-Identifier: Apache-2.0
"""POSIX ACLs: enforced, inherited and shown as on kernel overlayfs.

Every case builds the same layers for kernel overlayfs and for stratafs,
does the same things on both, and compares what came of them: which
accesses a non-root user was refused, the modes and ACLs new entries got,
what setfacl left of setgid. Each case also checks that the kernel's
outcome is the one the case is about, so that a case cannot pass by
testing nothing. The checks run as non-root users in forked children:
root passes every permission check, ACL or not.
"""

import errno
import json
import os
import shutil
import stat
import subprocess

import pytest

from stratatest import run

KINDS = ("kernel", "stratafs")
USER, USER2 = 3001, 3002
GROUP, GROUP2 = 3101, 3102

# the default ACL of the cases below: a named user and group, a mask
DEFAULT_ACL = f"u::rwx,g::r-x,o::---,u:{USER2}:rw-,g:{GROUP}:r--,m::rwx"
# one with the base entries alone: it cuts the mode and is no access ACL
BASE_ACL = "u::rw-,g::r--,o::---"


def setfacl(*args):
    run(["setfacl", *args])


def getfacl(path):
    return run(["getfacl", "-n", "--omit-header", path]).stdout


def mode_of(path):
    return oct(os.lstat(path).st_mode)


def as_user(u, fn, uid=USER, gid=GROUP2, groups=()):
    """fn(root_fd) in a child with these ids (no groups but GROUPS); its
    JSON-able result, or the errno's name it raised.  The mount's root is
    opened first: pytest's tmp dirs are 0700."""
    rfd, wfd = os.pipe()
    dfd = os.open(u.mnt, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(rfd)
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                res = fn(dfd)
            except OSError as e:
                res = errno.errorcode.get(e.errno, str(e.errno))
            os.write(wfd, json.dumps(res).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    os.close(dfd)
    with os.fdopen(rfd, "rb") as f:
        out = f.read()
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert status == 0, f"child failed with status {status}"
    return json.loads(out)


def both(make_union, case, lowers, upper=None, prepare=None, **kw):
    """case(u) on each kind over the same layers; prepare(u) sets the
    layers' ACLs before the mount. The kernel's outcome, once both agree."""
    got = {}
    for kind in KINDS:
        u = make_union(kind).make(lowers=lowers, upper=upper, mount=False,
                                  **kw)
        if prepare:
            prepare(u)
        u.mount()
        got[kind] = case(u)
    assert got["stratafs"] == got["kernel"]
    return got["kernel"]


# ------------------------------------------------------------ reading

def opens(name, flags, mode=0o644):
    def fn(dfd):
        os.close(os.open(name, flags, mode, dir_fd=dfd))
        return 0
    return fn


def read(name):
    return opens(name, os.O_RDONLY)


def write(name):
    return opens(name, os.O_WRONLY)


def listdir(name):
    def fn(dfd):
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)
    return fn


def lookup(path):
    def fn(dfd):
        os.stat(path, dir_fd=dfd)
        return 0
    return fn


def create(name):
    return opens(name, os.O_CREAT | os.O_WRONLY)


# What each access case sets, on what, and what comes of it: the checks
# and the outcomes the kernel gives.
ACCESS = {
    "deny_user": (
        ("file", "x", 0o644), f"u:{USER}:---",
        [(USER, GROUP2, (), read("f"), "EACCES"),
         (USER2, GROUP2, (), read("f"), 0)]),
    "grant_user": (
        ("file", "x", 0o600), f"u:{USER}:rw-",
        [(USER, GROUP2, (), read("f"), 0),
         (USER, GROUP2, (), write("f"), 0),
         (USER2, GROUP2, (), read("f"), "EACCES")]),
    "grant_group": (
        ("file", "x", 0o600), f"g:{GROUP}:r--",
        [(USER, GROUP, (), read("f"), 0),
         (USER2, GROUP2, (GROUP,), read("f"), 0),
         (USER, GROUP, (), write("f"), "EACCES"),
         (USER2, GROUP2, (), read("f"), "EACCES")]),
    "mask_limits": (
        ("file", "x", 0o600), f"u:{USER}:rw-,m::r--",
        [(USER, GROUP2, (), read("f"), 0),
         (USER, GROUP2, (), write("f"), "EACCES")]),
    "deny_dir": (
        ("dir", {"mode": 0o755}), f"u:{USER}:---",
        [(USER, GROUP2, (), listdir("f"), "EACCES"),
         (USER, GROUP2, (), lookup("f/in"), "EACCES"),
         (USER2, GROUP2, (), listdir("f"), ["in"])]),
    "grant_dir": (
        ("dir", {"mode": 0o700}), f"u:{USER}:rwx",
        [(USER, GROUP2, (), listdir("f"), ["in"]),
         (USER, GROUP2, (), create("f/new"), 0),
         (USER2, GROUP2, (), lookup("f/in"), "EACCES")]),
}


def _access_layers(entry):
    if entry[0] == "dir":
        return {"f": entry, "f/in": "in"}
    return {"f": ("file", entry[1], {"mode": entry[2]})}


@pytest.mark.parametrize("where", ["mount", "lower", "lower_copied_up"])
@pytest.mark.parametrize("case", sorted(ACCESS))
def test_access(make_union, case, where):
    """An ACL set through the mount, or on the lower file before the
    mount, seen before and after the file is copied up."""
    entry, acl, checks = ACCESS[case]

    def prepare(u):
        if where != "mount":
            setfacl("-m", acl, u.lpath(0, "f"))

    def run_case(u):
        if where == "mount":
            setfacl("-m", acl, u.path("f"))
        elif where == "lower_copied_up":
            os.utime(u.path("f"))   # copy-up by root, the ACL with it
            assert os.path.lexists(u.upath("f"))
        return [as_user(u, fn, uid, gid, groups)
                for uid, gid, groups, fn, _ in checks]

    got = both(make_union, run_case, [_access_layers(entry)], prepare=prepare)
    assert got == [want for *_, want in checks]


# ------------------------------------------------------------ inheritance

def _make(kind, name, mode):
    """Creates NAME as the caller, with umask 022 and 077, as NAME.022
    and NAME.077."""
    def fn(dfd):
        for mask in (0o022, 0o077):
            os.umask(mask)
            path = f"{name}.{mask:03o}"
            if kind == "file":
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                                 mode, dir_fd=dfd))
            elif kind == "dir":
                os.mkdir(path, mode, dir_fd=dfd)
            elif kind == "fifo":
                os.mkfifo(path, mode, dir_fd=dfd)
            elif kind == "chardev":
                os.mknod(path, stat.S_IFCHR | mode, os.makedev(1, 3),
                         dir_fd=dfd)
            else:   # an O_TMPFILE, named afterwards
                parent = os.path.dirname(path)
                fd = os.open(parent, os.O_TMPFILE | os.O_RDWR, mode,
                             dir_fd=dfd)
                try:
                    os.link(f"/proc/self/fd/{fd}", path, dst_dir_fd=dfd)
                finally:
                    os.close(fd)
        return 0
    return fn


# where the parent and its default ACL are
PARENTS = {
    # made through the mount, its default ACL set through the mount
    "upper": (DEFAULT_ACL, {}),
    # only in the lower layer: copied up to hold the new entry
    "lower": (DEFAULT_ACL, {"d": ("dir", {"mode": 0o777})}),
    # the new entry replaces a whiteout: it is built in the workdir
    "whiteout": (DEFAULT_ACL, {"d": ("dir", {"mode": 0o777})}),
    # base entries only: the mode is cut and no access ACL is set
    "base_only": (BASE_ACL, {}),
    # no default ACL: the umask counts
    "none": (None, {}),
}
OBJECTS = {"file": 0o666, "dir": 0o777, "fifo": 0o666, "chardev": 0o666,
           "tmpfile": 0o666}


@pytest.mark.parametrize("obj", sorted(OBJECTS))
@pytest.mark.parametrize("parent", sorted(PARENTS))
def test_inherit(make_union, parent, obj):
    acl, lower = PARENTS[parent]
    names = [f"d/n.{m}" for m in ("022", "077")]
    if parent == "whiteout":
        lower = dict(lower, **{n: ("dir",) if obj == "dir" else "old"
                               for n in names})

    def prepare(u):
        if parent in ("lower", "whiteout"):
            setfacl("-d", "-m", acl, u.lpath(0, "d"))

    def run_case(u):
        if parent in ("upper", "base_only", "none"):
            os.mkdir(u.path("d"))
            os.chmod(u.path("d"), 0o777)
            if acl:
                setfacl("-d", "-m", acl, u.path("d"))
        for n in names:
            if parent == "whiteout":
                (os.rmdir if obj == "dir" else os.unlink)(u.path(n))
        # device nodes take root; the rest are made by a user
        uid = 0 if obj == "chardev" else USER
        assert as_user(u, _make(obj, "d/n", OBJECTS[obj]), uid, GROUP) == 0
        return {n: (mode_of(u.path(n)), getfacl(u.path(n))) for n in names}

    got = both(make_union, run_case, [lower], prepare=prepare)
    # what the case is about, in the kernel's outcome
    modes = {n: int(m, 8) & 0o777 for n, (m, _) in got.items()}
    if acl is None:
        want = OBJECTS[obj]
        assert modes == {"d/n.022": want & ~0o022, "d/n.077": want & ~0o077}
    else:
        assert modes["d/n.022"] == modes["d/n.077"]
        if acl == DEFAULT_ACL:
            assert all(f"user:{USER2}:rw-" in a for _, a in got.values())
        else:
            assert all(f"user:{USER2}" not in a for _, a in got.values())
        if obj == "dir":
            assert all("default:user::" in a for _, a in got.values())


def test_inherit_nested_dirs(make_union):
    """A directory that inherited a default ACL hands it on."""
    def run_case(u):
        os.mkdir(u.path("d"))
        setfacl("-d", "-m", DEFAULT_ACL, u.path("d"))
        os.makedirs(u.path("d", "a", "b"))
        with open(u.path("d", "a", "b", "f"), "w"):
            pass
        return {p: (mode_of(u.path(p)), getfacl(u.path(p)))
                for p in ("d/a", "d/a/b", "d/a/b/f")}

    got = both(make_union, run_case, [{}])
    assert f"default:user:{USER2}:rw-" in got["d/a/b"][1]
    assert f"user:{USER2}:rw-" in got["d/a/b/f"][1]


# ------------------------------------------------------------ setgid

# who sets or removes the access ACL of a setgid entry owned by USER in
# GROUP, and whether setgid stays: (uid, gid, groups, drop CAP_FSETID)
SGID_CALLERS = {
    "owner_outside_group": (USER, GROUP2, (), False, False),
    "owner_in_group": (USER, GROUP2, (GROUP,), False, True),
    "root": (0, GROUP2, (), False, True),
    "root_without_cap_fsetid": (0, GROUP2, (), True, False),
}


def _setfacl_as(u, path, args, uid, gid, groups, drop_fsetid):
    """setfacl ARGS on PATH (in the mount) as that caller; its status."""
    dfd = os.open(u.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
        cmd += [f"--groups={','.join(map(str, groups))}"] if groups \
            else ["--clear-groups"]
        if drop_fsetid:
            cmd += ["--inh-caps=-fsetid", "--bounding-set=-fsetid"]
        cmd += ["setfacl", *args, f"/proc/self/fd/{dfd}/{path}"]
        r = subprocess.run(cmd, pass_fds=(dfd,), capture_output=True,
                           text=True, timeout=60)
        return r.returncode, r.stderr.rsplit(": ", 1)[-1].strip()
    finally:
        os.close(dfd)


@pytest.mark.parametrize("op", ["set", "remove"])
@pytest.mark.parametrize("obj", ["file", "dir"])
@pytest.mark.parametrize("caller", sorted(SGID_CALLERS))
def test_setgid_on_setfacl(make_union, caller, obj, op):
    uid, gid, groups, drop, keeps = SGID_CALLERS[caller]
    entry = ("dir",) if obj == "dir" else ("file", "x")
    meta = {"mode": 0o2775 if obj == "dir" else 0o2764, "uid": USER,
            "gid": GROUP}

    def prepare(u):
        if op == "remove":
            setfacl("-m", f"u:{USER2}:r--", u.lpath(0, "f"))

    def run_case(u):
        args = ["-b"] if op == "remove" else ["-m", f"u:{USER2}:r--"]
        res = _setfacl_as(u, "f", args, uid, gid, groups, drop)
        return res, mode_of(u.path("f")), getfacl(u.path("f"))

    (status, _), mode, _ = both(make_union, run_case,
                                [{"f": entry + (meta,)}], prepare=prepare)
    assert status == 0
    assert bool(int(mode, 8) & stat.S_ISGID) == keeps


# ------------------------------------------------------------ getfacl

def test_getfacl_tree(make_union):
    """getfacl -R of a tree with ACLs in the lower layer and the upper,
    before and after copy-up."""
    lower = {"a/f": "f", "a/g": ("file", "g", {"mode": 0o640}),
             "a/sub/h": "h", "b": ("dir",), "l": ("symlink", "a/f")}

    def prepare(u):
        setfacl("-m", f"u:{USER}:rwx,g:{GROUP}:r-x", u.lpath(0, "a", "f"))
        setfacl("-d", "-m", DEFAULT_ACL, u.lpath(0, "a", "sub"))
        setfacl("-m", "m::r--", u.lpath(0, "a", "g"))

    def tree(u):
        # one block per entry, in the order of the listing: sorted
        out = run(["getfacl", "-R", "-n", "-p", "."], cwd=u.mnt).stdout
        return sorted(b for b in out.split("\n\n") if b.strip())

    def run_case(u):
        before = tree(u)
        os.chmod(u.path("a", "f"), 0o750)
        setfacl("-m", f"u:{USER2}:r--", u.path("a", "g"))
        setfacl("-d", "-m", f"u:{USER}:rwx", u.path("b"))
        with open(u.path("a", "sub", "new"), "w"):
            pass
        setfacl("-x", f"u:{USER}", u.path("a", "f"))
        return before, tree(u)

    before, after = both(make_union, run_case, [lower], upper={"u": "u"},
                         prepare=prepare)
    assert any(f"user:{USER}:rwx" in b for b in before)
    assert any(f"user:{USER2}:r--" in b for b in after)


# ------------------------------------------------------------ the workdir

def test_workdir_default_acl_not_inherited(make_union):
    """A default ACL on the workdir reaches nothing: not a copy-up of a
    file that has no ACL, not an entry built there over a whiteout. Nor
    does a copy-up take its new parent's default ACL: it is a copy."""
    def prepare(u):
        setfacl("-d", "-m", f"u:{USER}:rwx", u.work)

    def run_case(u):
        os.chmod(u.path("f"), 0o600)          # copy-up
        os.unlink(u.path("w"))                # a whiteout...
        with open(u.path("w"), "w"):          # ...replaced
            pass
        os.mkdir(u.path("n"))
        setfacl("-d", "-m", f"u:{USER2}:rwx", u.path("d"))
        os.chmod(u.path("d", "g"), 0o640)     # copy-up into d
        return {p: (mode_of(u.path(p)), getfacl(u.path(p)))
                for p in ("f", "w", "n", "d/g")}

    got = both(make_union, run_case, [{"f": "f", "w": "w", "d/g": "g"}],
               prepare=prepare)
    assert all(f"user:{USER}" not in a and f"user:{USER2}" not in a
               for _, a in got.values())


# ------------------------------------------------------------ no ACLs

@pytest.fixture
def noacl_fs(tmp_path):
    """A btrfs mounted noacl: xattrs, but no POSIX ACLs. Ask for it
    before make_union, whose mounts must go first."""
    if not shutil.which("mkfs.btrfs") or not os.path.exists("/dev/loop-control"):
        pytest.skip("needs mkfs.btrfs and loop devices")
    img = str(tmp_path / "noacl.img")
    with open(img, "wb") as f:
        f.truncate(128 << 20)
    run(["mkfs.btrfs", "-q", "-f", img])
    mnt = str(tmp_path / "noacl")
    os.makedirs(mnt)
    r = run(["mount", "-o", "loop,noacl", img, mnt], check=False)
    if r.returncode:
        pytest.skip(f"cannot mount btrfs noacl: {r.stderr.strip()}")
    yield mnt
    r = run(["umount", mnt], check=False)
    if r.returncode:
        run(["umount", "-l", mnt], check=False)


def test_lower_without_acls(noacl_fs, make_union):
    """A lower filesystem without ACLs: permission checks go by the mode
    (the kernel would take any error but ENODATA as their answer)."""
    lower = {"g": ("file", "g", {"mode": 0o640, "gid": GROUP}),
             "d": ("dir", {"mode": 0o750, "gid": GROUP}), "d/in": "in"}

    def run_case(u):
        return ([as_user(u, fn, uid, gid) for uid, gid, fn in
                 [(USER, GROUP, read("g")), (USER, GROUP2, read("g")),
                  (USER, GROUP, listdir("d")), (USER, GROUP2, listdir("d"))]],
                getfacl(u.path("g")), getfacl(u.path("d")))

    got = {}
    for kind in KINDS:
        layer = os.path.join(noacl_fs, kind)
        u = make_union(kind).make(lowers=[lower], layer_dirs=[layer])
        got[kind] = run_case(u)
    assert got["stratafs"] == got["kernel"]
    assert got["kernel"][0] == [0, "EACCES", ["in"], "EACCES"]


def test_upper_without_acls(noacl_fs, make_union):
    """An upper filesystem without ACLs: creating in a lower directory
    whose default ACL it cannot keep still works, by the umask. (Kernel
    overlayfs refuses to copy such a directory up at all.)"""
    f = make_union("stratafs")
    u = f.make(lowers=[{"d": ("dir", {"mode": 0o777})}], mount=False,
               upper_dir=os.path.join(noacl_fs, "upper"),
               work_dir=os.path.join(noacl_fs, "work"))
    setfacl("-d", "-m", DEFAULT_ACL, u.lpath(0, "d"))
    u.mount()
    assert as_user(u, _make("file", "d/n", 0o666), USER, GROUP) == 0
    assert as_user(u, _make("dir", "d/m", 0o777), USER, GROUP) == 0
    assert stat.S_IMODE(os.lstat(u.path("d/n.077")).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(u.path("d/m.022")).st_mode) == 0o755
    assert f"user:{USER2}" not in getfacl(u.path("d/n.022"))
