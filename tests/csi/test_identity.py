# SPDX-License-Identifier: Apache-2.0
"""Identity service: plugin info, capabilities, Probe."""

import os
import subprocess

from csitest import DEFAULT_DRIVER, pb, poll


def plugin_caps(reply):
    T = pb().PluginCapability.Service.Type
    return {T.Name(c.service.type) for c in reply.capabilities
            if c.HasField("service")}


def expansion(reply):
    T = pb().PluginCapability.VolumeExpansion.Type
    return {T.Name(c.volume_expansion.type) for c in reply.capabilities
            if c.HasField("volume_expansion")}


def test_plugin_info_default_name(csi):
    code, r = csi.GetPluginInfo()
    assert code == "OK"
    assert r.name == DEFAULT_DRIVER
    assert r.vendor_version, "vendor_version is empty"


def test_plugin_info_driver_name_flag(env):
    p = env.plugin(root=env.layered_root(), driver="example.strata.io")
    code, r = p.csi.GetPluginInfo()
    assert code == "OK"
    assert r.name == "example.strata.io"
    assert r.vendor_version


def test_plugin_capabilities_both_modes(csi):
    code, r = csi.GetPluginCapabilities()
    assert code == "OK"
    assert plugin_caps(r) == {"CONTROLLER_SERVICE",
                              "VOLUME_ACCESSIBILITY_CONSTRAINTS"}
    assert expansion(r) == {"ONLINE"}


def test_plugin_capabilities_node_mode(env):
    p = env.plugin(root=env.layered_root(), mode="node")
    code, r = p.csi.GetPluginCapabilities()
    assert code == "OK"
    assert plugin_caps(r) == {"VOLUME_ACCESSIBILITY_CONSTRAINTS"}
    assert expansion(r) == {"ONLINE"}


def test_probe_ready(csi):
    code, r = csi.Probe()
    assert code == "OK"
    assert r.HasField("ready") and r.ready.value is True


def test_probe_missing_stratafs(env):
    p = env.plugin(root=env.layered_root(), stratafs="/nonexistent/stratafs",
                   wait="serving")
    r = p.csi.Probe()
    assert r.code == "FAILED_PRECONDITION", r
    assert r.details, "FAILED_PRECONDITION without a message"
    # the plugin keeps serving: identity still answers
    assert p.csi.GetPluginInfo().code == "OK"


def test_probe_stratafs_not_executable(env):
    fake = os.path.join(env.base, "stratafs-noexec")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(fake, 0o644)
    p = env.plugin(root=env.layered_root(), stratafs=fake, wait="serving")
    r = p.csi.Probe()
    assert r.code == "FAILED_PRECONDITION", r


def test_probe_store_unusable(env, strata):
    """A store that turned read-only under a running plugin fails Probe,
    and Probe recovers once the store is writable again."""
    vols = strata.path("volumes")
    subprocess.run(["mount", "--bind", vols, vols], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", vols], check=True)
    r = strata.csi.Probe()
    assert r.code == "FAILED_PRECONDITION", r
    assert r.details
    subprocess.run(["umount", vols], check=True)
    poll(lambda: strata.csi.Probe().code == "OK", 5, what="Probe OK again")


def test_probe_store_dir_missing(env, strata):
    os.rename(strata.path("node"), strata.path("node.moved"))
    r = strata.csi.Probe()
    assert r.code == "FAILED_PRECONDITION", r
    assert "node" in r.details
