# SPDX-License-Identifier: Apache-2.0
"""The daemons outlive the plugin's container (issue 11, item 3).

A container is simulated as a container runtime makes one: the plugin
runs in a mount namespace of its own (unshare -m, with the kubelet
directory a shared mount, as mountPropagation: Bidirectional makes it)
and in a cgroup of its own below the host's cgroup v2, and the container
ends as runc ends it, by writing 1 to that cgroup's cgroup.kill. With
--daemon-mount-namespace, --daemon-cgroup and --daemon-binary-dir the
daemons are elsewhere: in the test's (the host's) mount namespace, in a
cgroup per volume, running a copy of stratafs and its libraries. So every
volume keeps serving, and a new plugin, in a new "container", adopts them
and tears them down, leaving no cgroup, mount or process.

Needs cgroup v2 at /sys/fs/cgroup/unified (this platform is hybrid) or
/sys/fs/cgroup; the tests fail, never skip, without it.
"""

import itertools
import os
import shutil
import signal
import subprocess
import time

import pytest

from csitest import (EPH, Kubelet, STRATAFS_FSTYPE, answers, cap, daemons_of,
                     is_mounted, mounts_under, poll, read_file,
                     sanitizer_findings, write_file)

_seq = itertools.count()


def cgroup2_root():
    for path in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(path, "cgroup.kill")) or \
                os.path.exists(os.path.join(path, "cgroup.procs")) and \
                os.path.exists(os.path.join(path, "cgroup.subtree_control")):
            return path
    pytest.fail("no cgroup v2 hierarchy at /sys/fs/cgroup/unified or "
                "/sys/fs/cgroup", pytrace=False)


def pids_in(cg):
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def subdirs(path):
    return sorted(n for n in os.listdir(path)
                  if os.path.isdir(os.path.join(path, n)))


class Host:
    """What a test made on the host, removed in teardown even on failure:
    cgroups (their processes killed first), mounts and the plugin's
    container cgroups."""

    def __init__(self, env):
        self.env = env
        self.cgroups = []
        self.mounts = []
        self.v2 = cgroup2_root()
        self.tag = f"strata-test-{os.getpid()}-{next(_seq)}"

    def cgroup(self, name, hierarchy=None):
        path = os.path.join(hierarchy or self.v2, f"{self.tag}-{name}")
        os.mkdir(path)
        self.cgroups.append(path)
        return path

    def mount(self, *args, target):
        os.makedirs(target, exist_ok=True)
        subprocess.run(["mount", *args, target], check=True)
        self.mounts.append(target)
        return target

    def shared(self, path):
        """A directory as mountPropagation: Bidirectional makes it: a mount
        of its own, shared, so that mounts made below it in the plugin's
        namespace reach this one (the kubelet directory, and the store's
        ephemeral/, where inline volumes are staged)."""
        os.makedirs(path, exist_ok=True)
        self.mount("--bind", path, target=path)
        subprocess.run(["mount", "--make-shared", path], check=True)
        return path

    def container(self, cg):
        """argv prefix: the plugin joins cgroup cg, then gets a mount
        namespace of its own; exec keeps the pid the plugin's."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg,
                "unshare", "-m", "--propagation", "unchanged"]

    def cleanup(self):
        for cg in reversed(self.cgroups):
            for d, _, _ in sorted(os.walk(cg), key=lambda w: -len(w[0])):
                if pids_in(d) and os.path.exists(os.path.join(d, "cgroup.kill")):
                    with open(os.path.join(d, "cgroup.kill"), "w") as f:
                        f.write("1")
                for pid in pids_in(d):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                try:
                    poll(lambda: not pids_in(d), 10, what=f"{d} to empty")
                    os.rmdir(d)
                except (OSError, AssertionError):
                    pass
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)


@pytest.fixture
def host(env):
    h = Host(env)
    try:
        yield h
    finally:
        env.kill_everything()
        h.cleanup()


def ns_of(pid, kind="mnt"):
    return os.stat(f"/proc/{pid}/ns/{kind}").st_ino


def cgroups_of(pid):
    """{hierarchy controllers: path} from /proc/<pid>/cgroup."""
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrl, path = line.rstrip("\n").split(":", 2)
            out[ctrl] = path
    return out


def mapped_files(pid):
    out = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            # a memfd (the daemon's shared state) is memory, not a file
            if len(parts) == 6 and parts[5].startswith("/") and \
                    not parts[5].startswith("/memfd:"):
                out.add(parts[5].strip())
    return out


def outside_flags(host, strata_cg, bindir):
    return ["--daemon-mount-namespace", f"/proc/{os.getpid()}/ns/mnt",
            "--daemon-cgroup", strata_cg, "--daemon-binary-dir", bindir]


@pytest.mark.timeout(180)
def test_daemons_outlive_the_plugin_container(env, host):
    root = env.layered_root("root")
    shared = [host.shared(os.path.join(env.base, "kubelet")),
              host.shared(os.path.join(root, "ephemeral"))]
    bindir = os.path.join(env.base, "hostbin")
    strata_cg = os.path.join(host.v2, f"{host.tag}-strata")
    flags = outside_flags(host, strata_cg, bindir)
    c1 = host.cgroup("container1")
    host.cgroups.insert(0, strata_cg)   # made by the plugin, removed last
    p = env.plugin(root=root, prefix=host.container(c1), extra=flags)
    assert pids_in(c1) == [p.proc.pid]
    assert ns_of(p.proc.pid) != ns_of(os.getpid())

    k = Kubelet(env, p)
    vols = {}
    for name, layers in (("a", "base"), ("b", "extra,base")):
        vid = k.create(name, layers=layers)
        st = k.stage(vid, env.staging(name))
        tgt = k.publish(vid, st, env.target(name))
        write_file(os.path.join(tgt, "kept"), f"{name} before the kill\n")
        vols[vid] = (st, tgt)
    kid, itgt = "csi-" + "0123abcd" * 4, env.target("inline")
    r = p.csi.NodePublishVolume(volume_id=kid, target_path=itgt,
                                volume_capability=cap(),
                                volume_context={EPH: "true", "layers": "base"})
    assert r.code == "OK", r
    write_file(os.path.join(itgt, "kept"), "inline before the kill\n")
    targets = [t for _, t in vols.values()] + [itgt]

    # where the daemons are: none in the plugin's cgroup or namespace
    daemons = sorted(daemons_of(root))
    assert len(daemons) == 3, daemons
    assert pids_in(c1) == [p.proc.pid]
    bundle = [os.path.join(bindir, d) for d in os.listdir(bindir)
              if d != "current"]
    assert len(bundle) == 1 and os.path.basename(bundle[0]).startswith("stratafs-")
    assert os.readlink(os.path.join(bindir, "current")) == os.path.basename(bundle[0])
    for pid in daemons:
        assert ns_of(pid) == ns_of(os.getpid()), "daemon not in the host's namespace"
        cg = cgroups_of(pid)[""]
        assert os.path.dirname(cg) == "/" + os.path.basename(strata_cg), cg
        assert os.path.basename(cg).startswith("sv-"), cg
        # the copy runs, through the copy's interpreter (PT_INTERP rewritten)
        assert os.readlink(f"/proc/{pid}/exe") == os.path.join(bundle[0], "stratafs")
        # no file of the "image": only the copy, and the store's stats file
        foreign = {f for f in mapped_files(pid)
                   if not f.startswith(bundle[0] + "/") and
                   not f.startswith(root + "/")}
        assert foreign == set(), f"daemon {pid} maps {foreign}"
    assert subdirs(strata_cg) == sorted(os.path.basename(cgroups_of(d)[""])
                                        for d in daemons)

    # the container ends as a runtime ends it
    with open(os.path.join(c1, "cgroup.kill"), "w") as f:
        f.write("1")
    assert p.proc.wait(20) == -signal.SIGKILL
    assert pids_in(c1) == []
    assert sorted(daemons_of(root)) == daemons
    for t in targets:
        assert answers(t), f"{t} stopped serving with the plugin's container"
        assert read_file(os.path.join(t, "kept")).endswith(b"before the kill\n")
        write_file(os.path.join(t, "after"), "written while no plugin ran\n")

    # a new container: the new plugin adopts the daemons, heals nothing
    c2 = host.cgroup("container2")
    p2 = env.plugin(root=root, prefix=host.container(c2), extra=flags)
    assert "adopted" in p2.log(), p2.log()[-3000:]
    time.sleep(2.5)     # two rounds of the watcher: a heal would show
    assert sorted(daemons_of(root)) == daemons, p2.log()[-3000:]
    for vid in vols:
        assert p2.daemon_pid(vid) in daemons
    for t in targets:
        assert read_file(os.path.join(t, "after")) == b"written while no plugin ran\n"

    # and tears them down: no cgroup, mount or process left
    k2 = Kubelet(env, p2)
    for vid, (st, tgt) in vols.items():
        k2.unpublish(vid, tgt)
        k2.unstage(vid, st)
        # DeleteVolume removes the daemon's log: a sanitizer's report first
        log = open(os.path.join(root, "node", vid + ".log"), errors="replace").read()
        assert sanitizer_findings(log) == [], log[-3000:]
        k2.delete(vid)
    assert p2.csi.NodeUnpublishVolume(volume_id=kid, target_path=itgt).code == "OK"
    poll(lambda: not daemons_of(root), 15, what="every daemon to exit")
    assert [m for m in mounts_under(env.base) if m["fstype"] == STRATAFS_FSTYPE] == []
    assert sorted(m["mountpoint"] for m in mounts_under(env.base)) == sorted(shared)
    poll(lambda: subdirs(strata_cg) == [], 5, what="the volumes' cgroups to go")
    assert os.listdir(root + "/volumes") == []


def test_each_v1_hierarchy_found(env, host):
    """Below a directory of hierarchies (a v1 or hybrid host's
    /sys/fs/cgroup) the daemon gets a cgroup in each. Built here from a
    cgroup2 mount and the pids v1 hierarchy, mounted again below a tmpfs
    of the test's, so that no other hierarchy is touched."""
    tree = host.mount("-t", "tmpfs", "tmpfs", target=os.path.join(env.base, "cg"))
    os.mkdir(os.path.join(tree, "unified"))
    os.mkdir(os.path.join(tree, "pids"))
    host.mount("-t", "cgroup2", "none", target=os.path.join(tree, "unified"))
    host.mount("-t", "cgroup", "-o", "pids", "none",
               target=os.path.join(tree, "pids"))
    name = f"{host.tag}-strata"
    for h in ("unified", "pids"):
        host.cgroups.append(os.path.join(tree, h, name))
    p = env.plugin(root=env.layered_root("root"),
                   extra=["--daemon-cgroup", os.path.join(tree, name)])
    k = Kubelet(env, p)
    vid = k.create("v1")
    st = k.stage(vid)
    cg = cgroups_of(p.daemon_pid(vid))
    assert cg[""] == f"/{name}/{vid}" and cg["pids"] == f"/{name}/{vid}", cg
    k.unstage(vid, st)
    for h in ("unified", "pids"):
        assert subdirs(os.path.join(tree, h, name)) == []


def start_fails(env, root, extra, prefix=()):
    p = env.plugin(root=root, extra=extra, prefix=list(prefix), start=False)
    p.start(wait=None)
    assert p.proc.wait(30) == 1, p.log()
    return p.log()


def test_startup_refuses_what_cannot_work(env, host):
    """Each mistake is one clear error at start, and nothing is made."""
    root = env.layered_root("root")
    log = start_fails(env, root, ["--daemon-mount-namespace", "/proc/self/ns/net"])
    assert "--daemon-mount-namespace /proc/self/ns/net: not a mount namespace" in log
    log = start_fails(env, root, ["--daemon-mount-namespace", "/nonexistent/ns"])
    assert "--daemon-mount-namespace /nonexistent/ns: No such file" in log
    plain = os.path.join(env.base, "not-cgroups")
    os.mkdir(plain)
    log = start_fails(env, root, ["--daemon-cgroup", plain + "/strata"])
    assert "neither a cgroup filesystem nor a directory of cgroup hierarchies" in log
    assert os.listdir(plain) == []
    ro = host.mount("-t", "cgroup2", "-o", "ro", "none",
                    target=os.path.join(env.base, "cg-ro"))
    log = start_fails(env, root, ["--daemon-cgroup", ro + "/strata"])
    assert "cannot make the cgroup" in log and "read-only" in log, log
    # a full disk under the binary directory: no copy, no half of one
    full = host.mount("-t", "tmpfs", "-o", "size=256k", "tmpfs",
                      target=os.path.join(env.base, "full"))
    log = start_fails(env, root, ["--daemon-binary-dir", full])
    assert f"--daemon-binary-dir {full}: copying the daemon into {full}" in log
    assert "No space left on device" in log, log
    assert os.listdir(full) == []
    # the store at another directory in the daemons' namespace than here
    other = env.layered_root("other")
    log = start_fails(env, root, [
        "--daemon-mount-namespace", f"/proc/{os.getpid()}/ns/mnt"],
        prefix=["unshare", "-m", "sh", "-c",
                f'mount --bind "$0" {root} && exec "$@"', other])
    assert f"the store {root} is another directory in the daemons' mount namespace" in log
    assert "mount it at the same path" in log


def test_failures_after_start_are_statuses(env, host):
    """What breaks under a running plugin is a clear status, and a stage
    that fails leaves no daemon, mount, record or cgroup."""
    bindir = os.path.join(env.base, "hostbin")
    strata_cg = os.path.join(host.v2, f"{host.tag}-strata")
    host.cgroups.append(strata_cg)
    p = env.plugin(root=env.layered_root("root"),
                   extra=["--daemon-cgroup", strata_cg,
                          "--daemon-binary-dir", bindir])
    k = Kubelet(env, p)
    vid = k.create("v")
    st = env.staging("v")
    (bundle,) = [d for d in os.listdir(bindir) if d != "current"]
    bundle = os.path.join(bindir, bundle)
    moved = os.path.join(env.base, "moved-away")
    # the copy's interpreter gone, then the whole copy
    (interp,) = [n for n in os.listdir(bundle) if n.startswith("ld-")]
    for what, want in ((os.path.join(bundle, interp), "could not be executed"),
                       (bundle, "could not enter its binary directory")):
        os.rename(what, moved)
        r = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                                  volume_capability=cap())
        assert r.code == "INTERNAL", r
        assert f"stratafs for volume {vid} {want}" in r.details, r
        assert "No such file" in r.details, r
        assert not is_mounted(st) and p.node_record(vid) is None
        assert daemons_of(p.root) == [] and subdirs(strata_cg) == []
        if what == bundle:
            assert p.csi.Probe().code == "FAILED_PRECONDITION"
        os.rename(moved, what)
    # the cgroup parent removed under the plugin
    os.rmdir(strata_cg)
    r = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                              volume_capability=cap())
    assert r.code != "OK" and f"the daemon's cgroup {strata_cg}/{vid}" in r.details, r
    assert not is_mounted(st) and p.node_record(vid) is None
    assert daemons_of(p.root) == []
    # once it is back (a restart makes it), all works again
    p.restart()
    k.stage(vid, st)
    assert is_mounted(st, STRATAFS_FSTYPE)
    assert subdirs(strata_cg) == [vid]
    k.unstage(vid, st)
    assert subdirs(strata_cg) == []
