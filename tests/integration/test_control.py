# SPDX-License-Identifier: Apache-2.0
"""The control channel (fuse/control.c): -o control=SOCKET, one request per
connection, "STATUS TEXT" replies; it outlives workers and upgrades, and
only root (or the daemon's user) may ask."""

import errno
import os
import pty
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time

import pytest

from strata_common import control_call
from stratatest import is_mounted, stratafs_binary
from test_worker import worker_of


def mount_ctl(stratafs_only, sock, opts=(), **kw):
    return stratafs_only.make([{"f": "x"}],
                              extra_opts=[f"control={sock}", *opts], **kw)


def raw_call(path, payload, timeout=10):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.send(payload)
        return s.recv(65536).decode()


def supervised():
    return "nosupervisor" not in os.environ.get("STRATAFS_OPTS", "")


def server_pid(u):
    return worker_of(u) if supervised() else u.pid


def kill_worker(u, sock):
    """SIGKILLs u's worker; the new one's pid, once it answers on sock."""
    w = worker_of(u)
    os.kill(w, signal.SIGKILL)
    w2 = worker_of(u, old=w)
    deadline = time.monotonic() + 30
    while control_call(sock, "ping")[1] != f"pong pid={w2}":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return w2


def test_ping_and_errors(stratafs_only, tmp_path):
    sock = str(tmp_path / "c.sock")
    u = mount_ctl(stratafs_only, sock)
    st = os.lstat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert control_call(sock, "ping") == (0, f"pong pid={server_pid(u)}")
    status, text = control_call(sock, "nope")
    assert status == -errno.EOPNOTSUPP and "unknown verb 'nope'" in text
    status, text = control_call(sock, "ping", "extra")
    assert status == -errno.EINVAL and "takes 0 to 0 arguments" in text
    assert raw_call(sock, b"").startswith(f"{-errno.EINVAL} an empty request")
    assert raw_call(sock, b"\0".join([b"ping"] * 12)).startswith(
        f"{-errno.EINVAL} too many arguments")
    assert raw_call(sock, b"p" * 9000).startswith(f"{-errno.EMSGSIZE} ")
    # a client that sends nothing holds the channel only for a while
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    idle.connect(sock)
    try:
        assert control_call(sock, "ping", timeout=30)[0] == 0
    finally:
        idle.close()
    u.unmount()
    assert not os.path.exists(sock)


def test_other_users_refused(stratafs_only, tmp_path):
    # pytest's own directories are closed to other users
    pub = tempfile.mkdtemp(prefix="strata-ctl-", dir="/tmp")
    os.chmod(pub, 0o755)
    sock = os.path.join(pub, "c.sock")
    u = mount_ctl(stratafs_only, sock)
    # past the socket's mode, the daemon still checks who asks
    os.chmod(sock, 0o666)
    code = ("import socket,sys; s=socket.socket(socket.AF_UNIX,"
            "socket.SOCK_SEQPACKET); s.connect(sys.argv[1]); s.send(b'ping');"
            "print(s.recv(9000).decode())")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534",
                          "--clear-groups", "/usr/bin/python3", "-c", code,
                          sock], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{-errno.EPERM} only root")
    u.unmount()
    os.rmdir(pub)


@pytest.mark.skipif(not supervised(), reason="needs a supervised daemon")
def test_outlives_workers_and_upgrades(stratafs_only, tmp_path):
    sock = str(tmp_path / "c.sock")
    u = mount_ctl(stratafs_only, sock)
    assert control_call(sock, "ping") == (0, f"pong pid={worker_of(u)}")
    w2 = kill_worker(u, sock)
    os.kill(u.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while True:
        try:
            status, text = control_call(sock, "ping")
            if status == 0 and text != f"pong pid={w2}":
                break
        except (ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, "no worker after the upgrade"
        time.sleep(0.05)
    assert "upgrade: serving the mount on" in u.stderr()
    with open(u.path("f")) as f:
        assert f.read() == "x"


@pytest.mark.parametrize("opts,want", [
    (["passthrough"], "transport=dev passthrough=on"),
    (["nopassthrough"], "transport=dev passthrough=off"),
    # a capacity turns the default passthrough off
    (["capacity=1073741824"], "transport=dev passthrough=off"),
])
def test_status_says_what_init_agreed(stratafs_only, tmp_path, opts, want):
    """transport=dev keeps the answer the same whatever the machine's
    fuse.enable_uring says (other tests set it): FUSE over io_uring has
    tests of its own (test_uring.py)."""
    sock = str(tmp_path / "c.sock")
    u = mount_ctl(stratafs_only, sock, ["transport=dev", *opts])
    assert control_call(sock, "status") == (0, want)
    assert ("passthrough: the kernel reads and writes upper files itself"
            in u.stderr()) == want.endswith("=on"), u.stderr()
    status, text = control_call(sock, "status", "now")
    assert status == -errno.EINVAL and "takes 0 to 0 arguments" in text


@pytest.mark.skipif(not supervised(), reason="needs a supervised daemon")
def test_status_of_a_supervised_mount(stratafs_only, tmp_path):
    """A supervised mount serves through /dev/fuse whatever the options
    and the machine's switch say (fuse/uring.c tells why); a worker that
    came after INIT answers for it all the same."""
    sock = str(tmp_path / "c.sock")
    u = mount_ctl(stratafs_only, sock, ["transport=uring", "passthrough"])
    want = (0, "transport=dev passthrough=on")
    assert control_call(sock, "status") == want
    kill_worker(u, sock)
    assert control_call(sock, "status") == want


def test_path_beyond_sun_path(stratafs_only, tmp_path):
    deep = tmp_path / ("d" * 100) / ("e" * 100)
    deep.mkdir(parents=True)
    sock = str(deep / "volume.ctl")
    assert len(sock) > 108
    mount_ctl(stratafs_only, sock)
    assert control_call(sock, "ping")[0] == 0


def test_leftover_socket_taken_live_one_not(stratafs_only, tmp_path):
    sock = str(tmp_path / "c.sock")
    # a killed daemon's socket: bound, nobody listening
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(sock)
    dead.close()
    u = mount_ctl(stratafs_only, sock)
    assert control_call(sock, "ping")[0] == 0
    # a second daemon on the same socket would steal the first's
    v = mount_ctl(stratafs_only, sock, mount=False)
    os.makedirs(v.mnt, exist_ok=True)
    r = subprocess.run([stratafs_binary(), "-f", "-o", v.options(), v.mnt],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "another daemon answers there" in r.stderr
    assert control_call(sock, "ping")[0] == 0
    u.unmount()


def test_not_a_socket_refused(stratafs_only, tmp_path):
    path = tmp_path / "c.sock"
    path.write_text("keep me")
    v = mount_ctl(stratafs_only, str(path), mount=False)
    os.makedirs(v.mnt, exist_ok=True)
    r = subprocess.run([stratafs_binary(), "-f", "-o", v.options(), v.mnt],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "exists, and is not a socket" in r.stderr
    assert path.read_text() == "keep me"
    assert not is_mounted(v.mnt)


def big_lower(u, name, size):
    """A lower file of `size` bytes of data (no holes: a copy-up copies it
    all), written straight into the layer."""
    with open(u.lpath(0, name), "wb") as f:
        block = b"s" * (1 << 20)
        for _ in range(size >> 20):
            f.write(block)


def test_progress_of_a_copy_up(stratafs_only, tmp_path):
    """`progress` lists a big copy-up while it runs, by its path in the
    layer, and nothing once it is done."""
    sock = str(tmp_path / "c.sock")
    u = stratafs_only.make([{"d": ("dir",)}], extra_opts=[f"control={sock}"])
    size = 1 << 30
    big_lower(u, "d/big file", size)
    assert control_call(sock, "progress") == (0, "copyups=0")
    seen = []
    t = threading.Thread(target=lambda: open(u.path("d", "big file"), "ab").close())
    t.start()
    while t.is_alive():
        status, text = control_call(sock, "progress")
        assert status == 0
        if text != "copyups=0":
            seen.append(text)
    t.join()
    assert seen, "the copy-up ended before one look"
    count, entry = seen[0].split(" ")
    assert count == "copyups=1"
    path, done, total = entry[len("copyup="):].split(":")
    assert path == "d/big%20file" and int(total) == size
    assert 0 <= int(done) <= size
    assert control_call(sock, "progress") == (0, "copyups=0")
    assert os.path.getsize(u.upath("d", "big file")) == size


def test_progress_on_a_terminal(stratafs_only, tmp_path):
    """In the foreground on a terminal, a big copy-up says how far it got;
    with stderr not a terminal it says nothing."""
    u = stratafs_only.make([{"big": ("file", "")}], mount=False)
    big_lower(u, "big", 128 << 20)
    master, slave = pty.openpty()
    os.makedirs(u.mnt, exist_ok=True)
    proc = subprocess.Popen([stratafs_binary(), "-f", "-o", u.options(), u.mnt],
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(u.mnt):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        with open(u.path("big"), "ab"):
            pass
        subprocess.run(["umount", u.mnt], check=True)
        assert proc.wait(60) == 0
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert b"stratafs: copying up big: 128 of 128 MiB (100%)" in out, out
    # the suite's own mounts write stderr to a file: silent there
    v = stratafs_only.make([{"big": ("file", "")}])
    big_lower(v, "big", 128 << 20)
    with open(v.path("big"), "ab"):
        pass
    assert "copying up" not in v.stderr()
