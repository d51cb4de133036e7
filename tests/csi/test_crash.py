# SPDX-License-Identifier: Apache-2.0
"""The plugin killed (SIGKILL, as an OOM kill or a node failure would) at
every named step of every RPC that changes something, and at every step
of a heal. After a restart and kubelet's retries of the call that was cut
short, the volume's lifecycle runs to its end, and nothing is left: no
daemon, no mount, no record, no volume. A daemon started by a call that
was cut short before its mount was attached dies with the plugin."""

import os
import signal
import time

import pytest

from csitest import (EPH, Kubelet, STRATAFS_FSTYPE, answers, cap, daemons_of,
                     is_mounted, mounts_under, poll, read_file, write_file)

STEPS = ["create", "stage", "publish", "write", "heal", "unpublish", "unstage",
         "delete"]

# kill point -> the step during which it fires
POINTS = {
    "create.build": "create", "create.done": "create",
    "stage.dir": "stage", "stage.daemon": "stage", "stage.record": "stage",
    "stage.attach": "stage",
    "publish.dir": "publish", "publish.record": "publish",
    "publish.attach": "publish",
    "heal.daemon": "heal", "heal.record": "heal", "heal.staging": "heal",
    "heal.target": "heal",
    "unpublish.detach": "unpublish", "unpublish.record": "unpublish",
    "unstage.detach": "unstage", "unstage.daemon": "unstage",
    "unstage.record": "unstage",
    "delete.rename": "delete",
}


class Run:
    """One volume's lifecycle through a plugin that may die on the way."""

    def __init__(self, env, plugin):
        self.env, self.p = env, plugin
        self.vid = self.st = self.tgt = None
        self.deaths = 0

    def call(self, method, **kw):
        """The call, retried as kubelet retries: after ABORTED, and after a
        plugin that died (then restarted, unarmed)."""
        for _ in range(200):
            r = self.p.csi.call(method, **kw)
            if r.code == "OK":
                return r
            if not self.p.alive():
                self.deaths += 1
                self.p.environ.pop("STRATA_CSI_KILL_AT", None)
                self.p.start()
                continue
            # a heal in progress holds the volume: kubelet backs off
            assert r.code in ("ABORTED", "UNAVAILABLE"), (method, r)
            time.sleep(0.05)
        raise AssertionError(f"{method} never succeeded: {r}")

    def step(self, name):
        if name == "create":
            r = self.call("CreateVolume", name="crash", volume_capabilities=[cap()],
                          parameters={"layers": "base"})
            self.vid = r.reply.volume.volume_id
        elif name == "stage":
            self.st = self.env.staging("crash")
            self.call("NodeStageVolume", volume_id=self.vid,
                      staging_target_path=self.st, volume_capability=cap())
        elif name == "publish":
            self.tgt = self.env.target("crash")
            self.call("NodePublishVolume", volume_id=self.vid,
                      staging_target_path=self.st, target_path=self.tgt,
                      volume_capability=cap())
        elif name == "write":
            write_file(os.path.join(self.tgt, "kept"), "before any crash\n")
        elif name == "heal":
            pid = self.p.daemon_pid(self.vid)
            os.kill(pid, signal.SIGKILL)
            # the watcher heals; an armed heal point kills the plugin first
            poll(lambda: not self.p.alive() or
                 (self.p.daemon_pid(self.vid) != pid and answers(self.tgt)),
                 20, what="a heal, or the plugin's death in it")
            if not self.p.alive():
                self.deaths += 1
                self.p.environ.pop("STRATA_CSI_KILL_AT", None)
                self.p.start()
            poll(lambda: answers(self.tgt) and answers(self.st), 20,
                 what="the restarted plugin to finish the heal")
            assert read_file(os.path.join(self.tgt, "kept")) == b"before any crash\n"
        elif name == "unpublish":
            self.call("NodeUnpublishVolume", volume_id=self.vid, target_path=self.tgt)
        elif name == "unstage":
            self.call("NodeUnstageVolume", volume_id=self.vid,
                      staging_target_path=self.st)
        elif name == "delete":
            self.call("DeleteVolume", volume_id=self.vid)


def assert_nothing_left(env, p, vid):
    assert [m["mountpoint"] for m in mounts_under(env.base)] == []
    poll(lambda: not daemons_of(p.root), 10, what="every daemon to exit")
    assert p.node_record(vid) is None
    assert sorted(os.listdir(p.path("volumes"))) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", sorted(POINTS))
def test_killed_at(env, strata, point):
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": point})
    run = Run(env, p)
    for step in STEPS:
        run.step(step)
        if step == POINTS[point] and point.startswith("stage."):
            # whatever the crash left, the volume serves exactly once
            assert [m["fstype"] for m in mounts_under(run.st)] == [STRATAFS_FSTYPE]
            assert len(daemons_of(p.root)) == 1
    assert run.deaths == 1, f"kill point {point} was never reached"
    assert_nothing_left(env, p, run.vid)
    assert "kill point " + point in open(p.log_path.replace(
        f".{p.nstarts}.log", f".{p.nstarts - 1}.log")).read()


@pytest.mark.timeout(60)
def test_a_daemon_whose_mount_was_never_attached_dies_with_the_plugin(env, strata):
    """Killed after the daemon answered but before its mount was recorded
    and attached: the detached mount goes with the plugin, and with it the
    daemon's connection. Nothing needs the next plugin to clean up."""
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": "stage.daemon"})
    k = Kubelet(env, p)
    vid = k.create("orphan")
    st = env.staging("orphan")
    r = p.csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                              volume_capability=cap())
    assert r.code == "UNAVAILABLE", r
    poll(lambda: not p.alive(), 10, what="the plugin to die at the kill point")
    poll(lambda: not daemons_of(p.root), 10, what="the daemon to die with the plugin")
    assert not is_mounted(st) and p.node_record(vid) is None


@pytest.mark.timeout(60)
def test_inline_volume_killed_after_create(env, strata):
    """An inline volume created, then the plugin killed before staging:
    kubelet's retried publish finds and uses it, and its unpublish removes
    it; nothing is left."""
    strata.stop()
    p = env.plugin(root=strata.root, environ={"STRATA_CSI_KILL_AT": "inline.create"})
    run = Run(env, p)
    kid = "csi-" + "dead" * 16
    tgt = env.target("inline")
    ctx = {EPH: "true", "layers": "base"}
    run.call("NodePublishVolume", volume_id=kid, target_path=tgt,
             volume_capability=cap(), volume_context=ctx)
    assert run.deaths == 1 and is_mounted(tgt, STRATAFS_FSTYPE)
    assert len(os.listdir(p.path("volumes"))) == 1
    run.call("NodeUnpublishVolume", volume_id=kid, target_path=tgt)
    assert [m["mountpoint"] for m in mounts_under(env.base)] == []
    poll(lambda: not daemons_of(p.root), 10, what="the inline daemon to exit")
    assert os.listdir(p.path("volumes")) == []
