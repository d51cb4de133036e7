# SPDX-License-Identifier: Apache-2.0
"""The systemd units in packaging/systemd, checked and run by hand.

systemd need not be PID 1 here: `systemd-analyze verify` checks the units
offline, and the rest runs the exact commands the units would run, with
the environment systemd would give them (Environment=, EnvironmentFile=,
specifiers, $VAR and ${VAR} expansion, $$), and NoNewPrivileges= applied
with setpriv(1):

- stratafs@.service: a sample /etc/strata/<instance>.conf made from
  packaging/systemd/stratafs-example.conf, ExecStartPre/ExecStart/
  ExecStartPost mount it, ExecStop unmounts it and the daemon exits 0;
  a read-only instance; a daemon killed -9 is healed by the next start.
- strata-csi.service: the plugin started from ExecStart and
  /etc/default/strata-csi, a staged volume, then what KillMode=process
  does on stop (SIGTERM to the plugin alone): the volume's daemon keeps
  serving, and the next plugin unstages it.

Programs come from $STRATAFS, $STRATA_CSI and $STRATACTL (the tests fail
when unset). Mounting needs root and /dev/fuse.

Run: STRATAFS=... STRATA_CSI=... STRATACTL=... /usr/bin/python3 -m pytest tests/packaging/test_systemd.py
"""
import errno
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "packaging" / "systemd"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Settings that give a service a mount namespace of its own (whose mounts
# would not reach the host), or take away /dev/fuse, mounting, or setuid
# files and device nodes: none may appear in a unit that mounts.
NO_MOUNT_NAMESPACE = {
    "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
    "PrivateMounts", "PrivateNetwork", "PrivateUsers", "PrivateIPC",
    "ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "ExecPaths",
    "NoExecPaths", "TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths",
    "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
    "ProtectControlGroups", "ProtectClock", "ProtectHostname", "ProtectProc",
    "ProcSubset", "MountFlags", "MountAPIVFS", "RootDirectory", "RootImage",
    "DynamicUser", "LogNamespace", "DevicePolicy", "DeviceAllow",
    "CapabilityBoundingSet", "AmbientCapabilities", "RestrictSUIDSGID",
    "User", "Group",
}


def program(var):
    path = os.environ.get(var)
    if not path:
        pytest.fail(f"${var} is not set: point it at the built program")
    if not os.access(path, os.X_OK):
        pytest.fail(f"${var}={path} is not an executable")
    return os.path.abspath(path)


def need_mounts():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        pytest.skip("mounting needs root and /dev/fuse")


# --- what systemd does with a unit file, done by hand -------------------

def unit_source(name, bindir):
    """What make installs: the unit with @bindir@ filled in."""
    return (UNITS / f"{name}.in").read_text().replace("@bindir@", bindir)


def parse_unit(text):
    """{section: [(key, value), ...]}, continuation lines joined."""
    sections, cur = {}, None
    text = re.sub(r"\\\n", " ", text)
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            cur = sections.setdefault(line.strip("[]"), [])
            continue
        key, _, value = line.partition("=")
        cur.append((key.strip(), value.strip()))
    return sections


def values(unit, key, section="Service"):
    return [v for k, v in unit.get(section, []) if k == key]


def specifiers(value, instance):
    def one(m):
        c = m.group(1)
        table = {"%": "%", "i": instance, "I": instance,
                 "H": socket.gethostname()}
        if c not in table:
            raise AssertionError(f"specifier %{c} is not emulated here")
        return table[c]
    return re.sub(r"%(.)", one, value)


def parse_env_file(text):
    """systemd's EnvironmentFile= syntax: KEY=VALUE lines, # and ;
    comments; a value in '' is literal, in "" a backslash escapes only
    \\ " ` $, unquoted a backslash escapes any character."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        assert eq, f"not KEY=VALUE: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        elif len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r'\\([\\"`$])', r"\1", value[1:-1])
        else:
            value = re.sub(r"\\(.)", r"\1", value)
        env[key.strip()] = value
    return env


def service_env(unit, instance, env_file_text=None):
    """Environment= first, then the EnvironmentFile= (which overrides)."""
    env = {"PATH": SYSTEMD_PATH}
    for v in values(unit, "Environment"):
        for word in shlex.split(specifiers(v, instance)):
            k, _, val = word.partition("=")
            env[k] = val
    if env_file_text is not None:
        env.update(parse_env_file(env_file_text))
    return env


def exec_argv(line, env, instance):
    """An Exec*= line as argv: prefix '-' (failure ignored) noted,
    words split as systemd does, then $VAR (a word of its own, split on
    whitespace), ${VAR} (in place, one word) and $$ (a dollar)."""
    line = specifiers(line, instance)
    ignore = line.startswith("-")
    line = line.lstrip("-@:+!")
    argv = []
    for word in shlex.split(line):
        m = re.fullmatch(r"\$(\w+)", word)
        if m:
            argv += env.get(m.group(1), "").split()
            continue
        argv.append(re.sub(r"\$\$|\$\{(\w+)\}",
                           lambda m: env.get(m.group(1), "") if m.group(1) else "$",
                           word))
    return ignore, argv


def run_exec(unit, key, env, instance, timeout=30):
    """Runs every KEY= command of the unit in order, as root with
    NoNewPrivileges= applied; a failure fails unless prefixed with '-'."""
    for line in values(unit, key):
        ignore, argv = exec_argv(line, env, instance)
        r = subprocess.run(nnp(unit) + argv, env=env, capture_output=True,
                           text=True, timeout=timeout)
        assert ignore or r.returncode == 0, \
            f"{key}={line}: exit {r.returncode}: {r.stderr}"


def nnp(unit):
    return ["setpriv", "--no-new-privs"] if values(unit, "NoNewPrivileges") == ["yes"] else []


def mounted(path):
    """Whether path is a mount point in the mount table (without stat,
    which a dead FUSE mount answers with ENOTCONN)."""
    want = str(path).replace("\\", "\\134").replace(" ", "\\040")
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == want for line in f)


# --- static checks ------------------------------------------------------

@pytest.mark.parametrize("name", ["strata-csi.service", "stratafs@.service"])
def test_verify(name, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    bindir = os.path.dirname(program("STRATAFS"))
    assert os.path.dirname(program("STRATA_CSI")) == bindir, \
        "$STRATAFS and $STRATA_CSI must be in one directory, as installed"
    unit = tmp_path / name
    unit.write_text(unit_source(name, bindir))
    # Documentation=man:... is checked with man(1): give it our pages
    for page in (ROOT / "man").glob("*.in"):
        section = page.stem.rsplit(".", 1)[1]
        (tmp_path / "man" / f"man{section}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "man" / f"man{section}" / page.stem).write_text(
            page.read_text().replace("@VERSION@", "test"))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)],
                       capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "MANPATH": str(tmp_path / "man")})
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


@pytest.mark.parametrize("name", ["strata-csi.service", "stratafs@.service"])
def test_hardening_leaves_mounts_alone(name):
    unit = parse_unit(unit_source(name, "/usr/bin"))
    keys = {k for k, _ in unit["Service"]}
    assert not keys & NO_MOUNT_NAMESPACE, \
        f"{name}: {sorted(keys & NO_MOUNT_NAMESPACE)} would hide its mounts or block FUSE"
    assert values(unit, "NoNewPrivileges") == ["yes"]
    assert values(unit, "Restart") == ["on-failure"]
    assert values(unit, "WantedBy", "Install") == ["multi-user.target"]


def test_csi_unit_settings():
    unit = parse_unit(unit_source("strata-csi.service", "/usr/bin"))
    # the daemons of staged volumes must outlive a plugin stop/restart
    assert values(unit, "KillMode") == ["process"]
    assert values(unit, "EnvironmentFile") == ["-/etc/default/strata-csi"]
    (start,) = values(unit, "ExecStart")
    defaults = {w.partition("=")[0] for v in values(unit, "Environment")
                for w in shlex.split(v)}
    in_file = set(parse_env_file((UNITS / "strata-csi.default").read_text()))
    assert in_file <= defaults, "every setting of the file has a default"
    for key in defaults | {"NODEID"}:
        assert re.search(r"\$\{?" + key + r"\b", start), f"ExecStart ignores {key}"


def test_template_settings():
    unit = parse_unit(unit_source("stratafs@.service", "/usr/bin"))
    assert values(unit, "EnvironmentFile") == ["/etc/strata/%i.conf"]
    (stop,) = values(unit, "ExecStop")
    assert re.match(r"/bin/fusermount3 -u \$\{MOUNTPOINT\}$", stop)
    conf = parse_env_file((UNITS / "stratafs-example.conf").read_text())
    assert set(conf) == {"LOWERDIR", "UPPERDIR", "WORKDIR", "MOUNTPOINT", "OPTIONS"}
    (start,) = values(unit, "ExecStart")
    for key in conf:
        assert "$${" + key + "}" in start, f"ExecStart ignores {key}"


def test_env_file_parsing():
    env = parse_env_file('# c\nA=/x\\:y\nB="/my data"\nC=\'/a\\:b\'\n; c\nD=\n')
    assert env == {"A": "/x:y", "B": "/my data", "C": "/a\\:b", "D": ""}
    ignore, argv = exec_argv("-/bin/x --a ${A} $OPTS 'q $${B}' %i%%",
                             {"A": "1 2", "OPTS": "--p  --q"}, "inst")
    assert ignore and argv == ["/bin/x", "--a", "1 2", "--p", "--q", "q ${B}", "inst%"]


# --- stratafs@.service, run by hand --------------------------------------

class Instance:
    """stratafs@<name>.service as systemd would run it."""

    def __init__(self, tmp_path, name, conf):
        self.unit = parse_unit(unit_source("stratafs@.service",
                                           os.path.dirname(program("STRATAFS"))))
        self.name = name
        # the unit reads /etc/strata/%i.conf; the test's copy sits in tmp
        (path,) = values(self.unit, "EnvironmentFile")
        assert specifiers(path, name) == f"/etc/strata/{name}.conf"
        self.conf = tmp_path / f"{name}.conf"
        self.conf.write_text(conf)
        self.env = service_env(self.unit, name, conf)
        self.mountpoint = Path(self.env["MOUNTPOINT"])
        self.proc = None

    def start(self):
        run_exec(self.unit, "ExecStartPre", self.env, self.name)
        (line,) = values(self.unit, "ExecStart")
        _, argv = exec_argv(line, self.env, self.name)
        self.proc = subprocess.Popen(nnp(self.unit) + argv, env=self.env,
                                     stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        # systemd reaps its main process at once; so does this thread
        threading.Thread(target=self.proc.wait, daemon=True).start()
        env = {**self.env, "MAINPID": str(self.proc.pid)}
        run_exec(self.unit, "ExecStartPost", env, self.name)
        assert self.proc.poll() is None, self.proc.stderr.read()

    def stop(self):
        env = {**self.env, "MAINPID": str(self.proc.pid)}
        run_exec(self.unit, "ExecStop", env, self.name)
        return self.proc.wait(timeout=15)

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)])


@pytest.fixture
def layers(tmp_path):
    need_mounts()
    for d in ("layers/app", "layers/base", "vol/upper", "vol/work"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "layers/app/a.txt").write_text("app\n")
    (tmp_path / "layers/base/a.txt").write_text("base\n")
    (tmp_path / "layers/base/b.txt").write_text("base b\n")
    return tmp_path


def sample_conf(tmp_path, **changes):
    """stratafs-example.conf with its paths moved under tmp_path (and
    values changed or, given None, left out)."""
    text = (UNITS / "stratafs-example.conf").read_text()
    new = {
        "LOWERDIR": f"{tmp_path}/layers/app:{tmp_path}/layers/base",
        "UPPERDIR": f"{tmp_path}/vol/upper",
        "WORKDIR": f"{tmp_path}/vol/work",
        # a space: the quoting of the conf and of every Exec line counts
        "MOUNTPOINT": f'"{tmp_path}/merged data"',
        "OPTIONS": "allow_other",
        **changes,
    }
    for key, value in new.items():
        text, n = re.subn(rf"^{key}=.*$", "" if value is None else f"{key}={value}",
                          text, flags=re.M)
        assert n == 1, f"stratafs-example.conf has no {key}="
    return text


@pytest.fixture
def instances():
    made = []
    yield made
    for i in made:
        i.cleanup()


def test_template_mounts_and_unmounts(layers, instances):
    inst = Instance(layers, "data", sample_conf(layers))
    instances.append(inst)
    mnt = inst.mountpoint
    assert not mnt.exists()          # ExecStartPre makes it
    inst.start()
    assert mounted(mnt)
    with open("/proc/self/mountinfo") as f:
        line = next(l for l in f if l.split()[4] == str(mnt).replace(" ", "\\040"))
    assert " - fuse.stratafs " in line
    assert (mnt / "a.txt").read_text() == "app\n"      # top layer wins
    assert (mnt / "b.txt").read_text() == "base b\n"
    (mnt / "new.txt").write_text("written\n")
    (mnt / "b.txt").unlink()
    assert inst.stop() == 0
    assert not mounted(mnt)
    assert (layers / "vol/upper/new.txt").read_text() == "written\n"
    assert (layers / "layers/base/b.txt").exists()      # a whiteout hides it


def test_template_read_only_instance(layers, instances):
    inst = Instance(layers, "ro", sample_conf(layers, UPPERDIR=None, WORKDIR=None,
                                              OPTIONS=""))
    instances.append(inst)
    inst.start()
    assert (inst.mountpoint / "a.txt").read_text() == "app\n"
    with pytest.raises(OSError) as e:
        (inst.mountpoint / "new.txt").write_text("x")
    assert e.value.errno == 30      # EROFS
    assert inst.stop() == 0
    assert not mounted(inst.mountpoint)


def test_template_start_heals_a_dead_mount(layers, instances):
    """After the daemon is killed the mountpoint answers ENOTCONN (or
    ECONNABORTED, to a request that reached the connection before the
    worker, which the supervisor's death kills, was gone); the next start
    (what Restart=on-failure does) detaches it and mounts."""
    inst = Instance(layers, "data", sample_conf(layers))
    instances.append(inst)
    inst.start()
    (inst.mountpoint / "kept.txt").write_text("kept\n")
    os.kill(inst.proc.pid, signal.SIGKILL)
    inst.proc.wait()
    with pytest.raises(OSError) as e:
        os.stat(inst.mountpoint)
    assert e.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    inst.start()
    assert (inst.mountpoint / "kept.txt").read_text() == "kept\n"
    assert inst.stop() == 0
    assert not mounted(inst.mountpoint)


def test_template_start_fails_when_the_daemon_does(layers, instances):
    """ExecStartPost gives up when the daemon exits instead of mounting."""
    inst = Instance(layers, "bad", sample_conf(layers, LOWERDIR=f"{layers}/missing"))
    instances.append(inst)
    with pytest.raises(AssertionError, match="ExecStartPost"):
        inst.start()
    assert inst.proc.wait(timeout=5) == 1
    assert "missing" in inst.proc.stderr.read()
    assert not mounted(inst.mountpoint)


# --- strata-csi.service, run by hand ------------------------------------

def ctl(endpoint, *args, check=True):
    r = subprocess.run([program("STRATACTL"), "--endpoint", endpoint, *args],
                       capture_output=True, text=True, timeout=60)
    assert not check or r.returncode == 0, f"stratactl {args}: {r.stderr}"
    return r


class Plugin:
    def __init__(self, unit, env, log):
        self.unit, self.env, self.log = unit, env, log
        self.proc = None

    def start(self):
        (line,) = values(self.unit, "ExecStart")
        _, argv = exec_argv(line, self.env, "")
        self.proc = subprocess.Popen(nnp(self.unit) + argv, env=self.env,
                                     stderr=open(self.log, "a"),
                                     start_new_session=True)
        deadline = time.monotonic() + 20
        while ctl(self.env["CSI_ENDPOINT"], "probe", check=False).returncode:
            assert self.proc.poll() is None, Path(self.log).read_text()
            assert time.monotonic() < deadline, "the plugin never became ready"
            time.sleep(0.1)

    def stop_as_killmode_process(self):
        """systemctl stop with KillMode=process: SIGTERM to the main
        process only, never to the rest of the cgroup."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def test_csi_unit_runs_and_its_volumes_survive_a_restart(tmp_path):
    need_mounts()
    bindir = os.path.dirname(program("STRATA_CSI"))
    assert os.path.exists(os.path.join(bindir, "stratafs")), \
        "the plugin runs the stratafs beside it"
    unit = parse_unit(unit_source("strata-csi.service", bindir))
    # /etc/default/strata-csi as an admin would edit it
    # the socket's directory is the plugin's own: volumes go elsewhere
    (tmp_path / "plugin").mkdir()
    endpoint = f"unix://{tmp_path}/plugin/csi.sock"
    text = (UNITS / "strata-csi.default").read_text()
    text = re.sub(r"^CSI_ENDPOINT=.*$", f"CSI_ENDPOINT={endpoint}", text, flags=re.M)
    text = re.sub(r"^STRATA_ROOT=.*$", f"STRATA_ROOT={tmp_path}/store", text, flags=re.M)
    text = re.sub(r"^STRATA_CSI_OPTS=.*$", 'STRATA_CSI_OPTS="--log-format json --mode node,controller"',
                  text, flags=re.M)
    env = service_env(unit, "", text)
    assert env["NODEID"] == socket.gethostname()        # %H, unless set
    (tmp_path / "store/layers/base").mkdir(parents=True)
    (tmp_path / "store/layers/base/hello").write_text("hello\n")
    staging = tmp_path / "staging"
    plugin = Plugin(unit, env, tmp_path / "plugin.log")
    vol = None
    try:
        plugin.start()
        out = ctl(endpoint, "create-volume", "svc-test", "--layers", "base").stdout
        vol = re.search(r"volume (sv-[0-9a-f]+)", out).group(1)
        ctl(endpoint, "stage", vol, "--staging-path", str(staging))
        assert (staging / "hello").read_text() == "hello\n"

        assert plugin.stop_as_killmode_process() == 0
        # the volume's daemon was not signalled: the mount still serves
        (staging / "written").write_text("after the plugin stopped\n")
        assert (staging / "hello").read_text() == "hello\n"
        logs = [json.loads(l) for l in Path(plugin.log).read_text().splitlines() if l]
        assert logs, "the plugin logged nothing"

        plugin.start()          # adopts the daemon
        ctl(endpoint, "unstage", vol, "--staging-path", str(staging))
        assert not mounted(staging)
        ctl(endpoint, "delete-volume", vol)
        vol = None
        assert plugin.stop_as_killmode_process() == 0
    finally:
        if plugin.proc and plugin.proc.poll() is None:
            plugin.proc.kill()
            plugin.proc.wait()
        # a daemon the test left behind (it runs in a session of its
        # own): its pid is in the node record
        for record in (tmp_path / "store/node").glob("*.json"):
            try:
                os.kill(json.loads(record.read_text())["pid"], signal.SIGTERM)
            except (OSError, ValueError, KeyError):
                pass
        if mounted(staging):
            subprocess.run(["fusermount3", "-u", "-z", str(staging)])
