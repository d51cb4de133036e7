# SPDX-License-Identifier: Apache-2.0
"""Helpers for the strata-csi test suite: the programs, the generated CSI
messages, a stub-free gRPC client, the plugin process, kubelet-like paths,
layer builders, mount and process inspection, and the cleanup that runs
after every test (even a failed one).

Imported by conftest.py and the test modules."""

import errno
import importlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import strata_common
from strata_common import (  # noqa: F401  (re-exported to the tests)
    SANITIZER_MARKERS, errno_of, fuse_abort, is_mounted, is_sanitizer_build,
    lazy_umount, mount_id, mounts_at, mounts_under, read_mountinfo, sanitizer_findings,
    wait_exit, write_all)

# --------------------------------------------------------------------------
# configuration

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROTO = os.path.join(REPO, "csi", "csi.proto")

DEFAULT_DRIVER = "strata.csi.dev"
DEFAULT_NODE = "node-1"
STRATAFS_FSTYPE = "fuse.stratafs"
# the volume_context key that makes a publish an inline volume
EPH = "csi.storage.k8s.io/ephemeral"
VOLUME_ID_RE = re.compile(r"^sv-[0-9a-f]{32}$")
# the plugin waits up to 15 s for a daemon's mount; leave room above it
RPC_TIMEOUT = float(os.environ.get("STRATA_CSI_RPC_TIMEOUT", "30"))
START_TIMEOUT = 15.0
EXIT_TIMEOUT = 10.0
# Per-test watchdog (seconds); @pytest.mark.timeout(N) overrides it.  When it
# fires, the test's plugins are SIGKILLed and its FUSE connections aborted,
# so a hung call turns into a failure instead of a hung suite.
DEFAULT_TEST_TIMEOUT = float(os.environ.get("STRATA_TEST_TIMEOUT", "60"))

MiB = 1 << 20

# the layers every standard store root gets
BASE_LAYER = {"lower.txt": "from the lower layer\n",
              "dir/inner.txt": "inner\n",
              "big.bin": b"L" * 65536}
EXTRA_LAYER = {"extra.txt": "extra\n"}


def program(env):
    """Absolute path of the program named by environment variable `env`;
    fails (never skips) the test when it is unusable."""
    return strata_common.program(
        env, f", e.g. {env}=/tmp/b-test/{env.lower().replace('_', '-')}")


def strata_csi_binary():
    return program("STRATA_CSI")


def stratactl_binary():
    return program("STRATACTL")


def stratafs_binary():
    return program("STRATAFS")


# --------------------------------------------------------------------------
# the CSI messages, generated from the project's proto at session start

_pb = None
_pb_lock = threading.Lock()


def pb():
    """The csi_pb2 module, generated once per session with protoc."""
    global _pb
    with _pb_lock:
        if _pb is None:
            if not shutil.which("protoc"):
                pytest.fail("protoc not found (Debian package protobuf-compiler)",
                            pytrace=False)
            out = tempfile.mkdtemp(prefix="strata-csi-pb-")
            r = subprocess.run(["protoc", f"--python_out={out}",
                                f"-I{os.path.dirname(PROTO)}", PROTO],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=60)
            if r.returncode != 0:
                pytest.fail(f"protoc failed on {PROTO}:\n{r.stderr}", pytrace=False)
            sys.path.insert(0, out)
            try:
                _pb = importlib.import_module("csi_pb2")
            finally:
                sys.path.remove(out)
                shutil.rmtree(out, ignore_errors=True)
        return _pb


# --------------------------------------------------------------------------
# the client

# method -> (service, request message, response message)
METHODS = {
    "GetPluginInfo": "Identity",
    "GetPluginCapabilities": "Identity",
    "Probe": "Identity",
    "CreateVolume": "Controller",
    "DeleteVolume": "Controller",
    "ControllerPublishVolume": "Controller",
    "ControllerUnpublishVolume": "Controller",
    "ValidateVolumeCapabilities": "Controller",
    "ListVolumes": "Controller",
    "GetCapacity": "Controller",
    "ControllerGetCapabilities": "Controller",
    "CreateSnapshot": "Controller",
    "DeleteSnapshot": "Controller",
    "ListSnapshots": "Controller",
    "GetSnapshot": "Controller",
    "ControllerExpandVolume": "Controller",
    "ControllerGetVolume": "Controller",
    "ControllerModifyVolume": "Controller",
    "NodeStageVolume": "Node",
    "NodeUnstageVolume": "Node",
    "NodePublishVolume": "Node",
    "NodeUnpublishVolume": "Node",
    "NodeGetVolumeStats": "Node",
    "NodeExpandVolume": "Node",
    "NodeGetCapabilities": "Node",
    "NodeGetInfo": "Node",
}


class Result(tuple):
    """(code, reply): code is the status code name ("OK", "NOT_FOUND", ...),
    reply the response message on OK and None otherwise; .details holds
    the status message."""

    def __new__(cls, code, reply, details=""):
        t = super().__new__(cls, (code, reply))
        t.details = details or ""
        return t

    @property
    def code(self):
        return self[0]

    @property
    def reply(self):
        return self[1]

    def __repr__(self):
        return f"Result(code={self[0]}, details={self.details!r}, reply={self[1]!r})"


def _grpc():
    import grpc
    return grpc


def raw(b):
    return b


class CsiClient:
    """One channel to a plugin socket; one method per CSI RPC.

        code, reply = csi.CreateVolume(name="v", volume_capabilities=[cap()])
        csi.NodeStageVolume(req=pb().NodeStageVolumeRequest(...))

    Keyword arguments build the request message; `req` passes a prebuilt
    one; `timeout` overrides the deadline."""

    def __init__(self, sock):
        grpc = _grpc()
        self.sock = sock
        self.target = "unix://" + sock
        self.channel = grpc.insecure_channel(self.target)

    def close(self):
        self.channel.close()

    def call_path(self, path, req_bytes_or_msg, resp_cls=None, timeout=None):
        """Call any method path with a message or raw bytes."""
        grpc = _grpc()
        if isinstance(req_bytes_or_msg, (bytes, bytearray)):
            ser = raw
        else:
            ser = lambda m: m.SerializeToString()  # noqa: E731
        des = resp_cls.FromString if resp_cls is not None else raw
        fn = self.channel.unary_unary(path, request_serializer=ser,
                                      response_deserializer=des)
        try:
            reply = fn(req_bytes_or_msg, timeout=timeout or RPC_TIMEOUT)
            return Result("OK", reply)
        except grpc.RpcError as e:
            return Result(e.code().name, None, e.details())

    def call(self, method, req=None, timeout=None, **kw):
        m = pb()
        service = METHODS[method]
        req_cls = getattr(m, method + "Request")
        resp_cls = getattr(m, method + "Response")
        if req is None:
            req = req_cls(**kw)
        else:
            assert not kw, "pass either req or keyword fields"
        return self.call_path(f"/csi.v1.{service}/{method}", req, resp_cls,
                              timeout)

    def __getattr__(self, name):
        if name in METHODS:
            return lambda req=None, timeout=None, **kw: self.call(
                name, req, timeout, **kw)
        raise AttributeError(name)

    # -- conveniences that assert success ---------------------------------
    def ok(self, method, **kw):
        r = self.call(method, **kw)
        assert r.code == "OK", f"{method} failed: {r.code}: {r.details}"
        return r.reply


def cap(mode="SINGLE_NODE_MULTI_WRITER", *, block=False, flags=(), group="",
        fs_type=""):
    """A VolumeCapability: mount access (or block) with an access mode.

    The default is what kubelet sends for a ReadWriteOnce volume to a
    plugin with the SINGLE_NODE_MULTI_WRITER capability, as this one has
    (ReadWriteOncePod becomes SINGLE_NODE_SINGLE_WRITER): several pods of
    one node may share the volume."""
    m = pb()
    VC = m.VolumeCapability
    c = VC(access_mode=VC.AccessMode(mode=getattr(VC.AccessMode, mode)))
    if block:
        c.block.SetInParent()
    else:
        c.mount.fs_type = fs_type
        c.mount.mount_flags.extend(flags)
        c.mount.volume_mount_group = group
    return c


def rpc_capabilities(csi, method, capability):
    """The RPC type names in the reply of a Controller/NodeGetCapabilities
    `method`; `capability` is its ...ServiceCapability message class."""
    code, r = csi.call(method)
    assert code == "OK", r
    T = capability.RPC.Type
    return {T.Name(c.rpc.type) for c in r.capabilities}


def topology(node, driver=DEFAULT_DRIVER):
    return pb().Topology(segments={f"{driver}/node": node})


# --------------------------------------------------------------------------
# /proc: mounts and processes

def mount_opts(path):
    """The options of the top mount at path: mount options + super options."""
    ms = mounts_at(path)
    assert ms, f"nothing is mounted at {path}"
    m = ms[-1]
    return set(m["mntopts"].split(",")) | set(m["superopts"].split(","))


def proc_state(pid):
    """(state letter, ppid) of a process, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    rest = s[s.rindex(")") + 2:].split()
    return rest[0], int(rest[1])


def daemon_options(pid):
    """The -o list a stratafs daemon was started with, as a list."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return argv[argv.index("-o") + 1].split(",")


def pid_alive(pid):
    st = proc_state(pid)
    return st is not None and st[0] not in ("Z", "X")


def pids_referencing(base):
    """Pids (other than ours) whose command line, cwd or open files name
    something below `base`."""
    base = os.path.realpath(base)
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        hit = False
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if base.encode() in f.read():
                    hit = True
        except OSError:
            continue
        if not hit:
            try:
                links = [os.readlink(f"/proc/{pid}/cwd")]
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    try:
                        links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
                    except OSError:
                        pass
            except OSError:
                continue
            hit = any(l == base or l.startswith(base + "/") for l in links)
        if hit and pid_alive(pid):
            out.append(pid)
    return out


def is_worker(pid):
    """Whether pid is a stratafs worker (the child of a supervisor)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "stratafs-worker"
    except OSError:
        return False


def daemons_of(root):
    """Live stratafs processes serving a volume of the store at `root`."""
    out = []
    for pid in pids_referencing(os.path.join(root, "volumes")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue
        # A supervised daemon's worker shares its supervisor's
        # descriptors; the supervisor alone stands for the volume.
        if os.path.basename(argv0) == b"stratafs" and not is_worker(pid):
            out.append(pid)
    return out


def poll(fn, timeout=10.0, interval=0.02, what="condition"):
    """Call fn until it returns a truthy value; return it, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def answers(path):
    """True when a directory (a mount) answers a listing."""
    try:
        os.listdir(path)
        return True
    except OSError:
        return False


def write_file(path, data, sync=True):
    data = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def build_tree(root, spec):
    """Create `spec` ({relpath: content | ("dir",) | ("symlink", target)})
    under root."""
    os.makedirs(root, exist_ok=True)
    for rel, entry in spec.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if isinstance(entry, (str, bytes)):
            write_file(path, entry, sync=False)
        elif entry[0] == "dir":
            os.makedirs(path, exist_ok=True)
        elif entry[0] == "symlink":
            os.symlink(entry[1], path)
        else:
            raise ValueError(entry)


def snapshot(root):
    """{relpath: (mode, content-or-None)} of a tree, for unchanged checks."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            data = read_file(p) if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_uid, st.st_gid, data)
    return out


# --------------------------------------------------------------------------
# the plugin process

_live_plugins = []        # Plugin objects of the current test


class Plugin:
    """One strata-csi process on a root and a socket.  `csi` is a client."""

    def __init__(self, env, *, root, sock, node=DEFAULT_NODE, driver=None,
                 mode=None, max_volumes=None, stratafs=None, extra=(),
                 prefix=(), use_env_endpoint=False, name="plugin",
                 environ=None):
        self.env = env
        self.root = root
        self.sock = sock
        self.node = node
        self.driver = driver or DEFAULT_DRIVER
        self.mode = mode
        self.max_volumes = max_volumes
        self.stratafs = stratafs
        self.extra = list(extra)
        self.prefix = list(prefix)
        self.use_env_endpoint = use_env_endpoint
        self.name = name
        self.environ = dict(environ or {})   # added to the environment
        self.proc = None
        self.csi = None
        self.nstarts = 0
        self.log_path = None

    @property
    def endpoint(self):
        return "unix://" + self.sock

    def argv(self):
        a = self.prefix + [strata_csi_binary()]
        if not self.use_env_endpoint:
            a += ["--endpoint", self.endpoint]
        a += ["--nodeid", self.node, "--root", self.root]
        if self.driver != DEFAULT_DRIVER:
            a += ["--driver-name", self.driver]
        if self.mode:
            a += ["--mode", self.mode]
        if self.max_volumes is not None:
            a += ["--max-volumes", str(self.max_volumes)]
        a += ["--stratafs", self.stratafs or stratafs_binary()]
        return a + self.extra

    def start(self, wait="ready", timeout=START_TIMEOUT):
        """Start the process; wait="ready": until Probe says ready,
        "serving": until any RPC status arrives, None: not at all."""
        assert self.proc is None or self.proc.poll() is not None
        self.nstarts += 1
        self.log_path = os.path.join(self.env.base, f"{self.name}.{self.nstarts}.log")
        envv = dict(os.environ, **self.environ)
        if self.use_env_endpoint:
            envv["CSI_ENDPOINT"] = self.endpoint
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=envv,
                                         start_new_session=True)
        _live_plugins.append(self)
        if self.csi is not None:
            self.csi.close()
        self.csi = CsiClient(self.sock)
        if wait:
            self.wait(wait, timeout)
        return self

    def wait(self, what="ready", timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        last = None
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"strata-csi exited with status {self.proc.returncode} "
                            f"while starting ({' '.join(self.argv())}); log:\n"
                            f"{self.log()[-6000:]}", pytrace=False)
            if os.path.exists(self.sock):
                last = self.csi.Probe(timeout=2)
                if what == "serving" and last.code != "UNAVAILABLE":
                    return last
                if (what == "ready" and last.code == "OK"
                        and last.reply.HasField("ready") and last.reply.ready.value):
                    return last
            if time.monotonic() > deadline:
                pytest.fail(f"strata-csi not {what} within {timeout}s "
                            f"(last Probe: {last!r}); log:\n{self.log()[-6000:]}",
                            pytrace=False)
            time.sleep(0.02)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=EXIT_TIMEOUT):
        """Send `sig` and wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"strata-csi did not exit within {timeout}s of "
                                 f"signal {sig}; killed. log:\n{self.log()[-4000:]}")

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait(10)

    def restart(self, wait="ready", hard=True):
        """SIGKILL (hard) or SIGTERM the plugin and start it again."""
        if hard:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        else:
            assert self.stop() == 0
        return self.start(wait)

    # -- store ------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def node_record(self, vid):
        """node/<id>.json as a dict, or None when absent."""
        try:
            with open(self.path("node", vid + ".json")) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def daemon_pid(self, vid):
        rec = self.node_record(vid)
        assert rec is not None, f"no node record for {vid}"
        pid = find_key(rec, "pid")
        assert isinstance(pid, int) and pid > 0, f"no daemon pid in {rec}"
        return pid

    def volume_record(self, vid):
        with open(self.path("volumes", vid, "volume.json")) as f:
            return json.load(f)

    def make_layer(self, name, spec=None):
        d = self.path("layers", name)
        build_tree(d, spec or {})
        return d


def find_key(obj, key):
    """The first value under `key` anywhere in a JSON structure."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            r = find_key(v, key)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find_key(v, key)
            if r is not None:
                return r
    return None


# --------------------------------------------------------------------------
# one test's world: tmp dirs, kubelet-like paths, plugins, cleanup

class Env:
    """The test's directories and everything it started.

    base      the test's tmp dir (root, kubelet dirs and logs below it)
    sockdir   a short dir for sockets (unix paths are limited to 107 bytes)
    """

    def __init__(self, tmp_path):
        self.base = os.path.realpath(str(tmp_path))
        self.sockdir = tempfile.mkdtemp(prefix="scsi-", dir="/tmp")
        self.plugins = []
        self._n = 0

    def new_root(self, name="root", layers=None):
        """A store root with layers/ made by the admin: {name: spec}."""
        root = os.path.join(self.base, name)
        os.makedirs(os.path.join(root, "layers"), exist_ok=True)
        for lname, spec in (layers or {}).items():
            build_tree(os.path.join(root, "layers", lname), spec)
        return root

    def layered_root(self, name=None):
        """A fresh root with the standard layers base and extra (a plugin
        locks its store: a second plugin needs a root of its own)."""
        self._nroots = getattr(self, "_nroots", 0) + 1
        return self.new_root(name or f"root-{self._nroots}",
                             layers={"base": BASE_LAYER, "extra": EXTRA_LAYER})

    def tmpfs_root(self, name="root", size="64m", layers=None):
        """A store root on a tmpfs of its own (known free space, and it can
        be remounted read-only under a running plugin)."""
        root = os.path.join(self.base, name)
        os.makedirs(root, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                        root], check=True)
        return self.new_root(name, layers)

    def plugin(self, *, root=None, sock=None, start=True, wait="ready", **kw):
        """A strata-csi on `root` (default: <base>/root) and `sock`
        (default: a fresh socket); started unless start=False."""
        self._n += 1
        root = root or self.new_root()
        sock = sock or os.path.join(self.sockdir, f"csi{self._n}.sock")
        p = Plugin(self, root=root, sock=sock, name=f"plugin{self._n}", **kw)
        self.plugins.append(p)
        if start:
            p.start(wait)
        return p

    def staging(self, name="stage"):
        """A staging dir as kubelet makes it (the dir exists)."""
        d = os.path.join(self.base, "kubelet", "plugins", name, "globalmount")
        os.makedirs(d, exist_ok=True)
        return d

    def target(self, name="pod"):
        """A publish target as kubelet gives it (only the parent exists)."""
        parent = os.path.join(self.base, "kubelet", "pods", name, "volumes")
        os.makedirs(parent, exist_ok=True)
        return os.path.join(parent, "mount")

    def script(self, name, text):
        p = os.path.join(self.base, name)
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, 0o755)
        return p

    def kill_everything(self):
        """SIGKILL plugins, abort FUSE connections, kill daemons (for the
        watchdog and teardown)."""
        for p in list(self.plugins):
            try:
                p.kill()
            except Exception:
                pass
        for m in mounts_under(self.base):
            if m["fstype"].startswith("fuse"):
                fuse_abort(m["mountpoint"])
        self._kill_daemons()

    def _kill_daemons(self):
        pids = set(pids_referencing(self.base))
        for p in self.plugins:
            try:
                for n in os.listdir(p.path("node")):
                    if n.endswith(".json"):
                        try:
                            with open(p.path("node", n)) as f:
                                pid = find_key(json.load(f), "pid")
                            if isinstance(pid, int) and pid > 1 and pid_alive(pid):
                                pids.add(pid)
                        except (OSError, ValueError):
                            pass
            except OSError:
                pass
        pids.discard(os.getpid())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return pids

    def close_clients(self):
        """Close every plugin's client connection (an idle one makes the
        server's shutdown wait)."""
        for p in self.plugins:
            if p.csi is not None:
                try:
                    p.csi.close()
                except Exception:
                    pass

    def stop_plugins(self):
        """SIGTERM every live plugin (so a sanitizer build reports leaks);
        return the problems: a plugin that did not exit 0."""
        problems = []
        self.close_clients()
        for p in self.plugins:
            if p.alive():
                p.proc.send_signal(signal.SIGTERM)
        for p in self.plugins:
            if p.proc is None or p.proc.returncode is not None:
                continue
            rc = wait_exit(p.proc, EXIT_TIMEOUT, p.kill)
            if rc is None:
                problems.append(f"{p.name} did not exit within {EXIT_TIMEOUT}s "
                                f"of SIGTERM:\n{p.log()[-2000:]}")
                continue
            if rc != 0:
                problems.append(f"{p.name} exited {rc} on SIGTERM:\n{p.log()[-3000:]}")
        return problems

    def sanitizer_reports(self):
        """Sanitizer reports in every plugin log and daemon log of the test."""
        out = []
        paths = [os.path.join(self.base, n) for n in os.listdir(self.base)
                 if n.startswith("plugin") and n.endswith(".log")]
        for p in self.plugins:
            try:
                paths += [p.path("node", n) for n in os.listdir(p.path("node"))
                          if n.endswith(".log")]
            except OSError:
                pass
        for path in sorted(set(paths)):
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            found = sanitizer_findings(text)
            if found:
                i = min(text.find(m) for m in found if m in text)
                out.append(f"{path}: {found}\n{text[max(0, i - 200):i + 4000]}")
        return out

    def cleanup(self):
        """Kill what the test started and unmount what it mounted; return
        a list of problems worth a teardown note (processes still alive)."""
        problems = []
        self.close_clients()
        self.kill_everything()
        for _ in range(3):
            ms = mounts_under(self.base)
            if not ms:
                break
            for m in sorted(ms, key=lambda m: -len(m["mountpoint"])):
                lazy_umount(m["mountpoint"])
        left = mounts_under(self.base)
        if left:
            problems.append("mounts left: " + ", ".join(m["mountpoint"] for m in left))
        try:
            poll(lambda: not [p for p in pids_referencing(self.base)], 5,
                 what="processes to die")
        except AssertionError:
            problems.append(f"processes left: {pids_referencing(self.base)}")
        shutil.rmtree(self.sockdir, ignore_errors=True)
        for p in self.plugins:
            if p in _live_plugins:
                _live_plugins.remove(p)
        return problems


# --------------------------------------------------------------------------
# a small kubelet: the usual sequence with assertions on every step

class Kubelet:
    """Drives one plugin the way kubelet and the external-provisioner do,
    asserting success; each step returns what the next one needs.

    Like kubelet, it retries a call answered ABORTED (the spec's "operation
    pending for volume", retryable) a few times, so that these sequences
    test their own subject; test_concurrency.py pins down when ABORTED may
    and may not occur."""

    ABORTED_RETRIES = 20

    def _call(self, method, **kw):
        for _ in range(self.ABORTED_RETRIES):
            r = self.csi.call(method, **kw)
            if r.code != "ABORTED":
                return r
            time.sleep(0.05)
        return r

    def __init__(self, env, plugin):
        self.env = env
        self.p = plugin

    @property
    def csi(self):
        return self.p.csi

    def create(self, name, layers="base", capacity=None, caps=None, params=None):
        params = dict(params or {})
        if layers is not None:
            params["layers"] = layers
        kw = dict(name=name, volume_capabilities=caps or [cap()],
                  parameters=params)
        if capacity is not None:
            kw["capacity_range"] = pb().CapacityRange(required_bytes=capacity)
        r = self._call("CreateVolume", **kw)
        assert r.code == "OK", f"CreateVolume {name}: {r.code}: {r.details}"
        vid = r.reply.volume.volume_id
        assert VOLUME_ID_RE.match(vid), f"volume id {vid!r} is not sv-<32 hex>"
        return vid

    def stage(self, vid, staging=None, capability=None):
        staging = staging or self.env.staging(vid)
        r = self._call("NodeStageVolume", volume_id=vid, staging_target_path=staging,
                                     volume_capability=capability or cap())
        assert r.code == "OK", (f"NodeStageVolume {vid}: {r.code}: {r.details}\n"
                                f"plugin log:\n{self.p.log()[-3000:]}")
        return staging

    def publish(self, vid, staging, target=None, readonly=False, capability=None):
        target = target or self.env.target(vid)
        r = self._call("NodePublishVolume", volume_id=vid, staging_target_path=staging,
                                       target_path=target, readonly=readonly,
                                       volume_capability=capability or cap())
        assert r.code == "OK", f"NodePublishVolume {vid}: {r.code}: {r.details}"
        return target

    def unpublish(self, vid, target):
        r = self._call("NodeUnpublishVolume", volume_id=vid, target_path=target)
        assert r.code == "OK", f"NodeUnpublishVolume {vid}: {r.code}: {r.details}"

    def unstage(self, vid, staging):
        r = self._call("NodeUnstageVolume", volume_id=vid, staging_target_path=staging)
        assert r.code == "OK", f"NodeUnstageVolume {vid}: {r.code}: {r.details}"

    def delete(self, vid):
        r = self._call("DeleteVolume", volume_id=vid)
        assert r.code == "OK", f"DeleteVolume {vid}: {r.code}: {r.details}"


def assert_daemon_gone(pid, plugin, timeout=10.0):
    """The daemon `pid` has exited and its parent, if it was the plugin,
    reaped it (the environment's pid 1 reaps no orphans, so a zombie whose
    parent is not the plugin is outside the plugin's reach)."""
    def gone():
        st = proc_state(pid)
        if st is None:
            return True
        state, ppid = st
        return state in ("Z", "X") and ppid != plugin.proc.pid
    try:
        poll(gone, timeout, what=f"daemon {pid} to exit and be reaped")
    except AssertionError:
        raise AssertionError(f"stratafs daemon {pid} still there: {proc_state(pid)} "
                             f"(plugin pid {plugin.proc.pid})")


def raw_socket_send(sock_path, data, read=True, timeout=2.0):
    """Write bytes straight to a unix socket; return what came back."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    got = b""
    try:
        s.connect(sock_path)
        s.sendall(data)
        if read:
            try:
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    got += b
            except (socket.timeout, ConnectionResetError):
                pass
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    return got


def statvfs_free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def errno_name(e):
    return errno.errorcode.get(e, str(e))
