# SPDX-License-Identifier: Apache-2.0
"""The kubelet's sequence end to end, and plugin restarts in the middle of
it: volumes keep working, state is reconciled, dead daemons are healed."""

import errno
import os
import signal

import pytest

from csitest import (STRATAFS_FSTYPE, answers, assert_daemon_gone,
                     daemon_options, errno_of, is_mounted, mount_id, mounts_under,
                     pid_alive, poll, proc_state, read_file, snapshot,
                     write_file)
from strata_common import control_call


def assert_all_gone(env, strata, vid, pid):
    assert [m["mountpoint"] for m in mounts_under(env.base)] == [], \
        "mounts left under the test dir"
    assert_daemon_gone(pid, strata)
    assert strata.node_record(vid) is None
    assert not os.path.exists(strata.path("volumes", vid))
    for suffix in (".json", ".stats", ".ctl"):
        assert not os.path.exists(strata.path("node", vid + suffix))


def tear_down(env, kubelet, strata, vid, st, targets, pid):
    """Unpublish `targets`, unstage and delete the volume, as kubelet and the
    provisioner do; then nothing of it (mounts, daemon `pid`, records) is left."""
    for tgt in targets:
        kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)
    kubelet.delete(vid)
    assert_all_gone(env, strata, vid, pid)


@pytest.mark.timeout(90)
def test_kubelet_sequence(env, kubelet, strata):
    lower_before = snapshot(strata.path("layers", "base"))
    vid = kubelet.create("pvc-life", layers="base,extra")
    st = kubelet.stage(vid)
    pid = strata.daemon_pid(vid)
    t1 = kubelet.publish(vid, st, env.target("pod-a"))
    t2 = kubelet.publish(vid, st, env.target("pod-b"), readonly=True)

    # a write through one pod is read through the other
    write_file(os.path.join(t1, "hello.txt"), "from pod a")
    assert read_file(os.path.join(t2, "hello.txt")) == b"from pod a"
    # a copy-up of a lower file is visible through both; the layer stays as it was
    with open(os.path.join(t1, "lower.txt"), "a") as f:
        f.write("appended by pod a\n")
    expect = b"from the lower layer\nappended by pod a\n"
    assert read_file(os.path.join(t1, "lower.txt")) == expect
    assert read_file(os.path.join(t2, "lower.txt")) == expect
    assert read_file(strata.path("volumes", vid, "upper", "lower.txt")) == expect
    os.unlink(os.path.join(t1, "dir", "inner.txt"))
    assert not os.path.exists(os.path.join(t2, "dir", "inner.txt"))
    assert snapshot(strata.path("layers", "base")) == lower_before
    # the read-only pod cannot write
    assert errno_of(write_file, os.path.join(t2, "x"), "x") == errno.EROFS

    rec = strata.node_record(vid)
    assert t1 in str(rec) and t2 in str(rec)
    # the plugin's line to the daemon (fuse/control.c)
    status, text = control_call(strata.path("node", vid + ".ctl"), "ping")
    assert status == 0 and text.startswith("pong pid=")

    kubelet.unpublish(vid, t1)
    kubelet.unpublish(vid, t2)
    assert not os.path.exists(t1) and not os.path.exists(t2)
    tear_down(env, kubelet, strata, vid, st, [], pid)
    assert snapshot(strata.path("layers", "base")) == lower_before


@pytest.mark.timeout(60)
def test_passthrough_volume(env, kubelet, strata):
    """passthrough=true in the class: the daemon runs with -o passthrough
    and the kernel does the volume's upper file I/O; others say
    nopassthrough (the daemon's default is passthrough)."""
    vid = kubelet.create("pvc-pt", params={"passthrough": "true"})
    plain = kubelet.create("pvc-plain")
    st, st2 = kubelet.stage(vid), kubelet.stage(plain)
    pid = strata.daemon_pid(vid)
    assert "passthrough" in daemon_options(pid)
    plain_opts = daemon_options(strata.daemon_pid(plain))
    assert "passthrough" not in plain_opts and "nopassthrough" in plain_opts
    assert "passthrough: the kernel reads and writes" not in \
        open(strata.path("node", plain + ".log")).read()
    log = open(strata.path("node", vid + ".log")).read()
    assert "passthrough: the kernel reads and writes upper files itself" in log
    t = kubelet.publish(vid, st, env.target("pod-pt"))
    write_file(os.path.join(t, "new.txt"), "written by the kernel\n")
    with open(os.path.join(t, "lower.txt"), "a") as f:
        f.write("appended\n")
    assert read_file(os.path.join(t, "new.txt")) == b"written by the kernel\n"
    assert read_file(strata.path("volumes", vid, "upper", "lower.txt")) == \
        b"from the lower layer\nappended\n"
    kubelet.unstage(plain, st2)
    kubelet.delete(plain)
    tear_down(env, kubelet, strata, vid, st, [t], pid)


def test_two_volumes_are_independent(env, kubelet, strata):
    v1, v2 = kubelet.create("one"), kubelet.create("two")
    s1, s2 = kubelet.stage(v1), kubelet.stage(v2)
    t1, t2 = kubelet.publish(v1, s1), kubelet.publish(v2, s2)
    write_file(os.path.join(t1, "only-in-one"), "1")
    assert not os.path.exists(os.path.join(t2, "only-in-one"))
    assert strata.daemon_pid(v1) != strata.daemon_pid(v2)
    kubelet.unpublish(v1, t1)
    kubelet.unstage(v1, s1)
    assert answers(t2) and is_mounted(s2, STRATAFS_FSTYPE)


# --------------------------------------------------------------------------
# restarts

@pytest.mark.timeout(90)
def test_restart_after_stage(env, kubelet, strata):
    vid = kubelet.create("r1")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "staged-data"), "before the crash")
    pid = strata.daemon_pid(vid)
    strata.restart()                       # SIGKILL, start again
    assert pid_alive(pid) and strata.daemon_pid(vid) == pid, "daemon replaced"
    # kubelet carries on where it was: publish, use, tear down
    kubelet.stage(vid, st)
    tgt = kubelet.publish(vid, st)
    assert read_file(os.path.join(tgt, "staged-data")) == b"before the crash"
    tear_down(env, kubelet, strata, vid, st, [tgt], pid)


def two_targets(env, kubelet, name):
    """A volume staged and published at two targets: (id, staging, t1, t2)."""
    vid = kubelet.create(name)
    st = kubelet.stage(vid)
    return (vid, st, kubelet.publish(vid, st, env.target(name + "-1")),
            kubelet.publish(vid, st, env.target(name + "-2")))


@pytest.mark.timeout(90)
def test_restart_after_publish(env, kubelet, strata):
    vid, st, t1, t2 = two_targets(env, kubelet, "r2")
    write_file(os.path.join(t1, "data"), "written before the restart")
    pid = strata.daemon_pid(vid)
    strata.restart()
    assert read_file(os.path.join(t2, "data")) == b"written before the restart"
    write_file(os.path.join(t2, "more"), "after")
    assert read_file(os.path.join(t1, "more")) == b"after"
    # a re-sent publish is still idempotent after the restart
    kubelet.publish(vid, st, t1)
    code, r = kubelet.csi.NodeGetVolumeStats(volume_id=vid, volume_path=t1)
    assert code == "OK", r
    tear_down(env, kubelet, strata, vid, st, [t1, t2], pid)


@pytest.mark.timeout(90)
def test_restart_sigterm_then_teardown(env, kubelet, strata):
    vid = kubelet.create("r3")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    pid = strata.daemon_pid(vid)
    strata.restart(hard=False)
    assert strata.daemon_pid(vid) == pid
    tear_down(env, kubelet, strata, vid, st, [tgt], pid)


def _heal_setup(env, kubelet, strata):
    vid = kubelet.create("heal")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    write_file(os.path.join(tgt, "precious"), "survives the daemon")
    pid = strata.daemon_pid(vid)
    strata.kill()                         # the plugin is down ...
    os.kill(pid, signal.SIGKILL)          # ... and then the daemon dies
    poll(lambda: errno_of(os.listdir, st) == errno.ENOTCONN, 5,
         what="ENOTCONN on the staging path")
    strata.start()
    return vid, st, tgt, pid


@pytest.mark.timeout(90)
def test_restart_heals_dead_daemon(env, kubelet, strata):
    vid, st, tgt, pid = _heal_setup(env, kubelet, strata)
    poll(lambda: answers(st), 15, what="the staging mount to answer again")
    assert is_mounted(st, STRATAFS_FSTYPE)
    new = strata.daemon_pid(vid)
    assert new != pid and pid_alive(new)
    assert read_file(os.path.join(st, "precious")) == b"survives the daemon"
    # one live FUSE mount at the staging path (the dead one is gone)
    assert len([m for m in mounts_under(st)]) == 1
    tear_down(env, kubelet, strata, vid, st, [tgt], new)


@pytest.mark.timeout(90)
def test_restart_heals_published_targets(env, kubelet, strata):
    """Healing the staging mount alone leaves pods on a dead connection:
    the plugin also re-binds the targets it has on record."""
    vid, st, tgt, pid = _heal_setup(env, kubelet, strata)
    poll(lambda: answers(st), 15, what="the staging mount to answer again")
    poll(lambda: answers(tgt), 15, what="the published target to answer again")
    assert read_file(os.path.join(tgt, "precious")) == b"survives the daemon"
    assert len(mounts_under(tgt)) == 1
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)


@pytest.mark.timeout(90)
def test_heal_after_daemon_death_while_running(env, kubelet, strata):
    """With the plugin up, a dead daemon is noticed (pidfd) and restarted,
    or at the latest healed by the next call on the volume."""
    vid = kubelet.create("heal-live")
    st = kubelet.stage(vid)
    write_file(os.path.join(st, "f"), "x")
    pid = strata.daemon_pid(vid)
    os.kill(pid, signal.SIGKILL)
    # a signal is delivered when its target next runs: until then the
    # daemon is alive and its mount answers, and a stage rightly finds
    # nothing to heal
    poll(lambda: (proc_state(pid) or ("X",))[0] in ("Z", "X"), 10,
         what="the daemon to die")
    poll(lambda: errno_of(os.listdir, st) in (errno.ENOTCONN, 0), 5)
    # kubelet re-sends stage after a pod restart: the volume works again
    kubelet.stage(vid, st)
    assert answers(st)
    assert read_file(os.path.join(st, "f")) == b"x"
    assert strata.daemon_pid(vid) != pid
    kubelet.unstage(vid, st)
    assert not is_mounted(st)


@pytest.mark.timeout(90)
def test_restart_with_unstaged_record_leftovers(env, kubelet, strata):
    """A record whose mount vanished while the plugin was down (node
    reboot) does not block unstage or delete after the restart."""
    vid = kubelet.create("gone")
    st = kubelet.stage(vid)
    pid = strata.daemon_pid(vid)
    strata.kill()
    os.kill(pid, signal.SIGKILL)
    import subprocess
    subprocess.run(["umount", "-l", st], check=True)
    strata.start()
    kubelet.unstage(vid, st)
    kubelet.delete(vid)
    assert not is_mounted(st)
    assert strata.node_record(vid) is None


def bare(env, path):
    """What lies in the directory under the mounts at `path`: its parent
    bound elsewhere without the mounts below it shows the bare entry."""
    view = os.path.join(env.base, "view-" + os.path.basename(os.path.dirname(path)))
    os.makedirs(view, exist_ok=True)
    import subprocess
    subprocess.run(["mount", "--bind", os.path.dirname(path), view], check=True)
    try:
        return sorted(os.listdir(os.path.join(view, os.path.basename(path))))
    finally:
        subprocess.run(["umount", view], check=True)


@pytest.mark.timeout(120)
def test_heal_leaves_no_write_beneath(env, kubelet, strata):
    """A writer creates files through the target while its daemon is
    killed three times. The new mount goes beneath the dead one before
    the dead one is detached, so no write ever lands in the bare
    directories under the staging path or the target."""
    import threading
    vid = kubelet.create("window")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    stop = threading.Event()
    made = []

    def writer():
        n = 0
        while not stop.is_set():
            n += 1
            try:
                fd = os.open(os.path.join(tgt, f"f{n}"),
                             os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
                os.close(fd)
                made.append(n)
            except OSError:
                pass                      # ENOTCONN while the daemon is dead
    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(3):
            pid = strata.daemon_pid(vid)
            os.kill(pid, signal.SIGKILL)
            poll(lambda: strata.daemon_pid(vid) != pid and answers(tgt), 20,
                 what="the heal")
    finally:
        stop.set()
        t.join(30)
    assert made, "the writer never wrote"
    assert bare(env, tgt) == [] and bare(env, st) == []
    names = set(os.listdir(tgt))
    assert {f"f{n}" for n in made} <= names
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)


@pytest.mark.timeout(90)
def test_lost_bind_rebinds_only_that_target(env, kubelet, strata):
    """One target loses its bind mount: it is bound again, and the daemon
    and the other target are left as they were."""
    import subprocess
    vid, st, t1, t2 = two_targets(env, kubelet, "lostbind")
    write_file(os.path.join(t1, "f"), "x")
    pid = strata.daemon_pid(vid)
    t2_mount = mount_id(t2)
    subprocess.run(["umount", t1], check=True)
    poll(lambda: is_mounted(t1, STRATAFS_FSTYPE) and answers(t1), 15,
         what="the lost bind to be made again")
    assert read_file(os.path.join(t1, "f")) == b"x"
    assert strata.daemon_pid(vid) == pid
    assert mount_id(t2) == t2_mount
    assert "binding it again" in strata.log()
    kubelet.unpublish(vid, t1)
    kubelet.unpublish(vid, t2)
    kubelet.unstage(vid, st)


def test_store_root_with_option_characters(env):
    """The store root is the operator's choice: a comma, a colon and a
    backslash in it reach the daemon's -o list escaped, so the daemon
    writes into that store's upper, work and stats file, and nowhere
    else (unescaped, "a,b" would end the option at the comma)."""
    from csitest import Kubelet
    root = env.layered_root("st,o:r\\e")
    p = env.plugin(root=root)
    k = Kubelet(env, p)
    vid = k.create("v")
    st = k.stage(vid, env.staging("v"))
    tgt = k.publish(vid, st, env.target("v"))
    write_file(os.path.join(tgt, "new"), "into the right upper\n")
    assert read_file(os.path.join(root, "volumes", vid, "upper", "new")) == \
        b"into the right upper\n"
    stats = os.path.join(root, "node", vid + ".stats")
    poll(lambda: os.path.exists(stats) and os.path.getsize(stats) > 0, 5,
         what="the daemon's stats file in the store")
    strays = [n for n in os.listdir(env.base) if n.startswith("st")
              and n != os.path.basename(root)]
    assert strays == [], f"the daemon wrote outside the store: {strays}"
    pid = p.daemon_pid(vid)
    tear_down(env, k, p, vid, st, [tgt], pid)
