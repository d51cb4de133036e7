# SPDX-License-Identifier: Apache-2.0
"""Read-only unions, userxattr, command line, refusals, mount helpers."""

import errno
import fcntl
import os
import signal
import stat
import subprocess
import threading
import time

import pytest

from stratatest import (STRATAFS_FSTYPE, build_tree, errno_of, is_mounted,
                        is_whiteout, lazy_umount, mounts_at, read_bytes, run,
                        snapshot_tree, snapshot_upper, stratafs_binary)


# ---------------------------------------------------------------- read-only

def _erofs_ops(u):
    p = u.path
    return {
        "create": lambda: os.open(p("new"), os.O_CREAT | os.O_WRONLY, 0o644),
        "open_wronly": lambda: os.open(p("a"), os.O_WRONLY),
        "open_rdwr": lambda: os.open(p("a"), os.O_RDWR),
        "open_trunc": lambda: os.open(p("a"), os.O_RDONLY | os.O_TRUNC),
        "truncate": lambda: os.truncate(p("a"), 0),
        "unlink": lambda: os.unlink(p("a")),
        "mkdir": lambda: os.mkdir(p("newdir")),
        "rmdir": lambda: os.rmdir(p("empty")),
        "rename": lambda: os.rename(p("a"), p("b")),
        "symlink": lambda: os.symlink("a", p("sl")),
        "link": lambda: os.link(p("a"), p("hl")),
        "mknod": lambda: os.mkfifo(p("fifo")),
        "chmod": lambda: os.chmod(p("a"), 0o600),
        "chown": lambda: os.chown(p("a"), 1, 1),
        "utime": lambda: os.utime(p("a"), (1, 1)),
        "setxattr": lambda: os.setxattr(p("a"), "user.x", b"1"),
        "removexattr": lambda: os.removexattr(p("a"), "user.keep"),
    }


def test_readonly_union_gives_erofs(union):
    # kernel overlayfs needs two lower layers when there is no upper
    u = union.make(lowers=[{"a": ("file", "top", {"xattrs": {"user.keep": "1"}}),
                            "empty": ("dir",)},
                           {"a": "bottom", "d/x": "x"}], readonly=True)
    before = [snapshot_tree(l, ctime=True, mtime=True) for l in u.lowers]
    for name, op in _erofs_ops(u).items():
        assert errno_of(op) == errno.EROFS, name
    # reading works and shows the union
    assert read_bytes(u.path("a")) == b"top"
    assert sorted(os.listdir(u.mnt)) == ["a", "d", "empty"]
    assert os.getxattr(u.path("a"), "user.keep") == b"1"
    with open(u.path("d", "x"), "rb") as f:
        assert f.read() == b"x"
    assert [snapshot_tree(l, ctime=True, mtime=True) for l in u.lowers] == before


def test_readonly_union_with_single_lower(stratafs_only):
    u = stratafs_only.make(lowers=[{"a": "only", "empty": ("dir",)}], readonly=True)
    assert read_bytes(u.path("a")) == b"only"
    for name, op in _erofs_ops(u).items():
        if name == "removexattr":
            continue
        assert errno_of(op) == errno.EROFS, name


def test_colon_in_layer_path(union):
    d0 = union.new_dir("layer:with:colons")
    d1 = union.new_dir("plain")
    u = union.make(lowers=[{"a": "colon layer"}, {"b": "plain layer"}],
                   layer_dirs=[d0, d1])
    assert read_bytes(u.path("a")) == b"colon layer"
    assert read_bytes(u.path("b")) == b"plain layer"


# ---------------------------------------------------------------- userxattr

def test_userxattr_mode_uses_user_namespace(union):
    u = union.make(lowers=[{"d/x": "x", "o": ("opaque_dir",), "o/new": "n", "f": "f"},
                           {"o/old": "hidden", "d/y": "y"}],
                   userxattr=True)
    # a lower dir marked with user.overlay.opaque is opaque
    assert os.listdir(u.path("o")) == ["new"]
    os.unlink(u.path("d", "x"))
    os.unlink(u.path("d", "y"))
    os.rmdir(u.path("d"))
    os.mkdir(u.path("d"))
    assert os.listdir(u.path("d")) == []
    assert os.getxattr(u.upath("d"), "user.overlay.opaque") == b"y"
    assert errno_of(os.getxattr, u.upath("d"), "trusted.overlay.opaque") == errno.ENODATA
    os.unlink(u.path("f"))
    assert is_whiteout(os.lstat(u.upath("f")))
    # user.overlay.* is private in this mode
    assert [x for x in os.listxattr(u.path("d")) if x.startswith("user.overlay.")] == []
    assert [x for x in os.listxattr(u.path("o")) if x.startswith("user.overlay.")] == []
    # an ordinary user xattr still works
    os.setxattr(u.path("d"), "user.mine", b"1")
    assert os.listxattr(u.path("d")) == ["user.mine"]
    u.remount()
    assert os.listdir(u.path("d")) == []
    assert sorted(os.listdir(u.mnt)) == ["d", "o"]


# ---------------------------------------------------------------- command line

def test_help_and_version(stratafs_bin):
    for arg in ("--help", "--version"):
        r = run([stratafs_bin, arg], check=False, timeout=10)
        assert r.returncode == 0, f"{arg}: status {r.returncode}, stderr {r.stderr}"
        assert r.stdout.strip(), f"{arg} printed nothing on stdout"
    r = run([stratafs_bin, "--help"], check=False, timeout=10)
    assert "lowerdir" in r.stdout


def _layers(tmp, name="x"):
    base = os.path.join(tmp, name)
    for d in ("l0", "l1", "upper", "work", "mnt"):
        os.makedirs(os.path.join(base, d), exist_ok=True)
    build_tree(os.path.join(base, "l0"), {"f": "l0"})
    return base


def _refuse(binary, opts, mnt, foreground=True):
    cmd = [binary] + (["-f"] if foreground else []) + ["-o", opts, mnt]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=10)
    except subprocess.TimeoutExpired:
        mounted = is_mounted(mnt)
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        lazy_umount(mnt)
        pytest.fail(f"stratafs did not exit within 10s (mounted: {mounted}): {cmd}")
    mounted = is_mounted(mnt)
    if mounted:
        subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
        lazy_umount(mnt)
    assert r.returncode != 0, f"stratafs accepted {opts!r} (stderr {r.stderr!r})"
    assert not mounted, f"stratafs refused {opts!r} but left a mount at {mnt}"
    assert any(line.startswith("stratafs:") for line in r.stderr.splitlines()), \
        f"no 'stratafs:' message on stderr: {r.stderr!r}"
    for marker in ("AddressSanitizer", "runtime error:", "LeakSanitizer"):
        assert marker not in r.stderr
    return r


REFUSALS = ["missing_lowerdir_option", "missing_lower", "missing_second_lower",
            "lower_not_a_directory", "missing_upper", "upper_work_different_fs",
            "lower_is_mountpoint", "lower_inside_mountpoint",
            "lower_contains_mountpoint", "upper_contains_mountpoint", "unknown_option"]


@pytest.mark.parametrize("case", REFUSALS)
def test_refusal(stratafs_only, case):
    fac = stratafs_only
    b = _layers(fac.tmp)
    l0, l1, up, wk, mnt = (os.path.join(b, d) for d in ("l0", "l1", "upper", "work", "mnt"))
    rw = f"upperdir={up},workdir={wk}"
    if case == "missing_lowerdir_option":
        opts = rw
    elif case == "missing_lower":
        opts = f"lowerdir={b}/nope,{rw}"
    elif case == "missing_second_lower":
        opts = f"lowerdir={l0}:{b}/nope,{rw}"
    elif case == "lower_not_a_directory":
        opts = f"lowerdir={l0}/f,{rw}"
    elif case == "missing_upper":
        opts = f"lowerdir={l0},upperdir={b}/nope,workdir={wk}"
    elif case == "upper_work_different_fs":
        t = fac.mount_tmpfs("tmpfs_upper", "4m")
        os.mkdir(os.path.join(t, "upper"))
        opts = f"lowerdir={l0},upperdir={t}/upper,workdir={wk}"
    elif case == "lower_is_mountpoint":
        opts = f"lowerdir={mnt},{rw}"
    elif case == "lower_inside_mountpoint":
        os.mkdir(os.path.join(mnt, "sub"))
        opts = f"lowerdir={l0}:{mnt}/sub,{rw}"
    elif case == "lower_contains_mountpoint":
        mnt = os.path.join(l1, "m")
        os.mkdir(mnt)
        opts = f"lowerdir={l0}:{l1},{rw}"
    elif case == "upper_contains_mountpoint":
        mnt = os.path.join(up, "m")
        os.mkdir(mnt)
        opts = f"lowerdir={l0},{rw}"
    elif case == "unknown_option":
        opts = f"lowerdir={l0},{rw},no_such_option_xyz"
    else:
        raise AssertionError(case)
    _refuse(stratafs_binary(), opts, mnt)


def test_refusal_in_daemon_mode_reports_failure(stratafs_only):
    b = _layers(stratafs_only.tmp)
    _refuse(stratafs_binary(), f"lowerdir={b}/nope", os.path.join(b, "mnt"), foreground=False)


def test_refusal_of_workdir_in_use(stratafs_only):
    u = stratafs_only.make(lowers=[{"f": "x"}])
    mnt2 = stratafs_only.new_dir("second_mnt")
    _refuse(stratafs_binary(), u.options(), mnt2)
    # same workdir with another upper on the same fs is refused too
    up2 = stratafs_only.new_dir("second_upper")
    _refuse(stratafs_binary(), f"lowerdir={u.lowers[0]},upperdir={up2},workdir={u.work}", mnt2)
    # the first mount is unharmed
    with open(u.path("new"), "w") as f:
        f.write("still works")
    assert read_bytes(u.upath("new")) == b"still works"


def test_a_workdir_let_go_of_soon_is_waited_for(stratafs_only):
    """The daemon of a mount just unmounted holds the workdir's lock until
    it has exited: a mount again at once waits for it rather than fail."""
    u = stratafs_only.make(lowers=[{"f": "x"}], mount=False)
    fd = os.open(u.work, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    t = threading.Timer(0.5, os.close, (fd,))
    t.start()
    try:
        u.mount()
    finally:
        t.join()
    assert read_bytes(u.path("f")) == b"x"
    # unmounted and mounted again at once, over and over: the daemon
    # before may still be exiting when the next one starts
    before = []
    for _ in range(5):
        subprocess.run(["fusermount3", "-u", u.mnt], check=True)
        before.append(u.proc)
        u.mounted = False
        u.mount()
        assert read_bytes(u.path("f")) == b"x"
    for p in before:
        assert p.wait(30) == 0


# ---------------------------------------------------------------- other calling forms

def daemon_pids(mnt):
    """pids of processes whose command line names `mnt`."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(mnt.encode() in a for a in args) and \
                not any(a.endswith(b"fusermount3") for a in args):
            pids.append(int(d))
    return pids


def _unmount_daemon(mnt):
    """Unmount a daemonized stratafs and wait for its process to go."""
    pids = daemon_pids(mnt)
    r = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True)
    if r.returncode != 0:
        lazy_umount(mnt)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and
                 _state(p) != "Z"]
        if not alive:
            break
        time.sleep(0.05)
    else:
        for p in alive:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        pytest.fail(f"daemon(s) {alive} still running 10s after unmounting {mnt}")
    assert r.returncode == 0, f"fusermount3 -u failed: {r.stderr}"
    assert not is_mounted(mnt)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


@pytest.fixture
def daemon_mount(request):
    """Registers mountpoints of daemonized stratafs for teardown."""
    mnts = []

    def fin():
        problems = []
        for m in mnts:
            if is_mounted(m):
                try:
                    _unmount_daemon(m)
                except BaseException as e:  # noqa: BLE001
                    problems.append(str(e))
        if problems:
            pytest.fail("\n".join(problems))
    request.addfinalizer(fin)
    return mnts.append


def _check_rw_mount(mnt, up):
    assert any(m["fstype"] == STRATAFS_FSTYPE for m in mounts_at(mnt)), mounts_at(mnt)
    assert read_bytes(os.path.join(mnt, "f")) == b"l0"
    with open(os.path.join(mnt, "w"), "w") as f:
        f.write("written")
    assert read_bytes(os.path.join(up, "w")) == b"written"


def test_daemon_mode_returns_when_mounted(stratafs_only, daemon_mount):
    b = _layers(stratafs_only.tmp)
    mnt = os.path.join(b, "mnt")
    daemon_mount(mnt)
    r = run([stratafs_binary(), "-o", f"lowerdir={b}/l0:{b}/l1,upperdir={b}/upper,"
             f"workdir={b}/work", mnt], check=False, timeout=20)
    assert r.returncode == 0, r.stderr
    # no polling: the mount must be live when the command returns
    _check_rw_mount(mnt, f"{b}/upper")
    _unmount_daemon(mnt)


def test_mount_fuse3_calling_form(stratafs_only, daemon_mount):
    b = _layers(stratafs_only.tmp)
    mnt = os.path.join(b, "mnt")
    daemon_mount(mnt)
    r = run([stratafs_binary(), "stratafs", mnt, "-o",
             f"lowerdir={b}/l0:{b}/l1,upperdir={b}/upper,workdir={b}/work"],
            check=False, timeout=20)
    assert r.returncode == 0, r.stderr
    _check_rw_mount(mnt, f"{b}/upper")
    _unmount_daemon(mnt)


def _env_with_stratafs_on_path():
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(stratafs_binary()) + ":" + env.get("PATH", "/usr/bin:/bin")
    return env


HELPER_LINK = "/usr/local/sbin/stratafs"


def _same_binary(a, b):
    try:
        if os.path.samefile(a, b):
            return True
        with open(a, "rb") as fa, open(b, "rb") as fb:
            return fa.read() == fb.read()
    except OSError:
        return False


@pytest.fixture
def stratafs_for_mount_helper(request):
    """Make `stratafs` findable by /sbin/mount.fuse3 when run by mount(8).

    mount(8) drops PATH from the environment (util-linux sanitize_env)
    before it runs /sbin/mount.fuse3, whose `/bin/sh -c stratafs ...` then
    searches the shell's default PATH (/usr/local/sbin first).  So putting
    the binary's directory on PATH is not enough: for the duration of the
    test /usr/local/sbin/stratafs is made a symlink to $STRATAFS (unless it
    already is the same binary), and removed afterwards."""
    binary = stratafs_binary()
    if os.path.lexists(HELPER_LINK):
        if not _same_binary(HELPER_LINK, binary):
            pytest.fail(f"{HELPER_LINK} exists and is not $STRATAFS ({binary}); "
                        "mount -t fuse.stratafs would run it instead")
        return _env_with_stratafs_on_path()
    os.makedirs(os.path.dirname(HELPER_LINK), exist_ok=True)
    os.symlink(binary, HELPER_LINK)
    request.addfinalizer(lambda: os.unlink(HELPER_LINK))
    return _env_with_stratafs_on_path()


def test_mount_t_fuse_stratafs(stratafs_only, daemon_mount, stratafs_for_mount_helper):
    b = _layers(stratafs_only.tmp)
    mnt = os.path.join(b, "mnt")
    daemon_mount(mnt)
    r = run(["mount", "-t", "fuse.stratafs", "stratafs", mnt, "-o",
             f"lowerdir={b}/l0:{b}/l1,upperdir={b}/upper,workdir={b}/work"],
            check=False, timeout=20, env=stratafs_for_mount_helper)
    assert r.returncode == 0, r.stderr
    _check_rw_mount(mnt, f"{b}/upper")
    _unmount_daemon(mnt)


def test_mount_t_fuse_stratafs_readonly(stratafs_only, daemon_mount,
                                        stratafs_for_mount_helper):
    b = _layers(stratafs_only.tmp)
    mnt = os.path.join(b, "mnt")
    daemon_mount(mnt)
    r = run(["mount", "-t", "fuse.stratafs", "stratafs", mnt, "-o",
             f"lowerdir={b}/l0:{b}/l1"],
            check=False, timeout=20, env=stratafs_for_mount_helper)
    assert r.returncode == 0, r.stderr
    assert read_bytes(os.path.join(mnt, "f")) == b"l0"
    assert errno_of(os.open, os.path.join(mnt, "new"), os.O_CREAT | os.O_WRONLY) == errno.EROFS
    _unmount_daemon(mnt)


def test_fstab_line(union, request):
    b = _layers(union.tmp)
    mnt = os.path.join(b, "mnt")
    opts = f"lowerdir={b}/l0:{b}/l1,upperdir={b}/upper,workdir={b}/work"
    fstab = os.path.join(b, "fstab")
    env = None
    if union.kind == "kernel":
        line = f"overlay {mnt} overlay {opts},redirect_dir=on,index=off 0 0\n"
    else:
        line = f"stratafs {mnt} fuse.stratafs {opts} 0 0\n"
        env = request.getfixturevalue("stratafs_for_mount_helper")
    with open(fstab, "w") as f:
        f.write("# test fstab\n" + line)

    def fin():
        if is_mounted(mnt):
            if union.kind == "kernel":
                subprocess.run(["umount", mnt], capture_output=True)
            else:
                _unmount_daemon(mnt)
    request.addfinalizer(fin)
    r = run(["mount", "-T", fstab, mnt], check=False, timeout=20, env=env)
    assert r.returncode == 0, r.stderr
    assert read_bytes(os.path.join(mnt, "f")) == b"l0"
    with open(os.path.join(mnt, "w"), "w") as f:
        f.write("written")
    assert read_bytes(os.path.join(b, "upper", "w")) == b"written"
    if union.kind == "kernel":
        run(["umount", mnt])
    else:
        assert any(m["fstype"] == STRATAFS_FSTYPE for m in mounts_at(mnt))
        _unmount_daemon(mnt)
    assert not is_mounted(mnt)
    assert snapshot_upper(os.path.join(b, "upper"))["w"][0] == "file"
    assert stat.S_ISDIR(os.stat(mnt).st_mode)
