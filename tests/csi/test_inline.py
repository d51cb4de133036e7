# SPDX-License-Identifier: Apache-2.0
"""Inline (ephemeral) volumes, as kubelet drives them: NodePublishVolume
with its own volume id and csi.storage.k8s.io/ephemeral=true, no
CreateVolume and no stage; NodeUnpublishVolume ends the volume. And
GetCapacity steering claims away from nodes without a class's layers."""

import os

from csitest import (STRATAFS_FSTYPE, answers, cap, daemon_options,
                     is_mounted, poll, read_file, write_file)

EPH = "csi.storage.k8s.io/ephemeral"


def inline_ctx(**extra):
    ctx = {EPH: "true", "csi.storage.k8s.io/pod.name": "web-0",
           "csi.storage.k8s.io/pod.namespace": "default", "layers": "base"}
    ctx.update(extra)
    return ctx


def publish_inline(csi, kid, target, **ctx):
    return csi.NodePublishVolume(volume_id=kid, target_path=target,
                                 volume_capability=cap(),
                                 volume_context=inline_ctx(**ctx))


def store_volumes(strata):
    return sorted(os.listdir(strata.path("volumes")))


def test_inline_volume_lives_with_its_pod(env, strata, csi):
    kid = "csi-" + "ab12" * 16
    target = env.target("inline")
    assert publish_inline(csi, kid, target).code == "OK"
    assert is_mounted(target) and answers(target)
    assert read_file(os.path.join(target, "lower.txt")) == b"from the lower layer\n"
    write_file(os.path.join(target, "private.txt"), "mine\n")
    # repeated publish: the same volume, still one daemon
    assert publish_inline(csi, kid, target).code == "OK"
    vols = store_volumes(strata)
    assert len(vols) == 1
    vid = vols[0]
    rec = strata.node_record(vid)
    assert rec["staging_path"] == strata.path("ephemeral", vid)
    assert is_mounted(rec["staging_path"], STRATAFS_FSTYPE)
    assert read_file(strata.path("volumes", vid, "upper", "private.txt")) == b"mine\n"
    # not the CO's volume: ListVolumes does not show it
    r = csi.ListVolumes()
    assert r.code == "OK" and not r.reply.entries
    # a CreateVolume with kubelet's id as its name is another volume
    r = csi.CreateVolume(name=kid, volume_capabilities=[cap()],
                         parameters={"layers": "base"})
    assert r.code == "OK" and r.reply.volume.volume_id != vid

    pid = strata.daemon_pid(vid)
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=target).code == "OK"
    assert not os.path.exists(target)
    assert not is_mounted(rec["staging_path"])
    poll(lambda: not os.path.exists(f"/proc/{pid}") or
         open(f"/proc/{pid}/stat").read().split()[2] == "Z", 10,
         what="the inline volume's daemon to exit")
    assert vid not in store_volumes(strata)
    assert not os.path.exists(strata.path("node", vid + ".json"))
    # a retry (the reply was lost) is OK, as the spec's idempotency asks:
    # kubelet's teardown fails on any error, NOT_FOUND included
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=target).code == "OK"
    assert not os.path.exists(target)
    # an id that never was an inline volume here, at a path nothing is
    # mounted on, is the same: nothing to undo
    assert csi.NodeUnpublishVolume(volume_id="csi-" + "ef56" * 16,
                                   target_path=env.target("never")).code == "OK"


def test_inline_volume_refusals(env, strata, csi):
    target = env.target("bad")
    for kid in ("../etc", "a/b", "", "x" * 200):
        r = publish_inline(csi, kid, target)
        assert r.code == "INVALID_ARGUMENT", (kid, r)
    r = publish_inline(csi, "csi-1", target, layers="../etc")
    assert r.code == "INVALID_ARGUMENT" and "../etc" in r.details
    r = publish_inline(csi, "csi-2", target, layers="missing")
    assert r.code == "INVALID_ARGUMENT" and "missing" in r.details
    r = publish_inline(csi, "csi-3", target, evil="1")
    assert r.code == "INVALID_ARGUMENT" and "evil" in r.details
    r = publish_inline(csi, "csi-4", target, passthrough="yes")
    assert r.code == "INVALID_ARGUMENT" and "passthrough" in r.details
    assert not os.path.exists(target)
    # nothing was created for any of them
    assert store_volumes(strata) == []


def test_inline_volume_survives_plugin_restart(env, strata, csi):
    kid = "csi-restart"
    target = env.target("inline-r")
    assert publish_inline(csi, kid, target).code == "OK"
    write_file(os.path.join(target, "f"), "kept\n")
    strata.restart()
    assert read_file(os.path.join(target, "f")) == b"kept\n"
    assert strata.csi.NodeUnpublishVolume(volume_id=kid,
                                          target_path=target).code == "OK"
    assert store_volumes(strata) == []


def test_capacity_is_zero_without_the_class_layers(strata, csi):
    here = csi.GetCapacity(parameters={"layers": "base,extra"})
    assert here.code == "OK" and here.reply.available_capacity > 0
    missing = csi.GetCapacity(parameters={"layers": "base,nothere"})
    assert missing.code == "OK" and missing.reply.available_capacity == 0
    hostile = csi.GetCapacity(parameters={"layers": "../etc"})
    assert hostile.code == "OK" and hostile.reply.available_capacity == 0


def test_inline_volume_with_passthrough(env, strata, csi):
    kid = "csi-" + "cd34" * 16
    target = env.target("inline-pt")
    assert publish_inline(csi, kid, target, passthrough="true").code == "OK"
    vid = store_volumes(strata)[0]
    assert strata.volume_record(vid)["passthrough"] == 1
    assert "passthrough" in daemon_options(strata.daemon_pid(vid))
    write_file(os.path.join(target, "f"), "through the kernel\n")
    assert read_file(strata.path("volumes", vid, "upper", "f")) == b"through the kernel\n"
    assert csi.NodeUnpublishVolume(volume_id=kid, target_path=target).code == "OK"
    assert store_volumes(strata) == []


def test_inline_volume_whose_daemon_never_started(env, strata, csi):
    """A publish that failed to start the daemon leaves nothing behind:
    no store volume, no record; the pod's unpublish answers OK."""
    kid = "csi-" + "9a8b" * 16
    target = env.target("inline-broken")
    strata.stop()
    p = env.plugin(root=strata.root, stratafs="/bin/false")
    assert publish_inline(p.csi, kid, target).code == "INTERNAL"
    assert store_volumes(p) == []
    assert os.listdir(p.path("node")) == [] or \
        all(not n.endswith(".json") for n in os.listdir(p.path("node")))
    assert not os.path.exists(target)
    assert p.csi.NodeUnpublishVolume(volume_id=kid, target_path=target).code == "OK"
    assert store_volumes(p) == []
