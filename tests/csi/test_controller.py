# SPDX-License-Identifier: Apache-2.0
"""Controller service: CreateVolume, DeleteVolume, ValidateVolumeCapabilities,
ListVolumes, GetCapacity, ControllerGetCapabilities."""

import json
import os

import pytest

from csitest import (DEFAULT_NODE, MiB, VOLUME_ID_RE, cap, pb, rpc_capabilities,
                     snapshot, statvfs_free, topology)


def create(csi, name="vol", layers="base", **kw):
    kw.setdefault("volume_capabilities", [cap()])
    params = kw.pop("parameters", {})
    if layers is not None:
        params = dict(params, layers=layers)
    return csi.CreateVolume(name=name, parameters=params, **kw)


def crange(required=0, limit=0):
    return pb().CapacityRange(required_bytes=required, limit_bytes=limit)


def volume_dirs(strata):
    try:
        return sorted(os.listdir(strata.path("volumes")))
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------
# CreateVolume: the happy path

def test_create_volume_makes_store_entries(csi, strata):
    code, r = create(csi, "pvc-1", layers="base,extra")
    assert code == "OK", r
    v = r.volume
    assert VOLUME_ID_RE.match(v.volume_id), v.volume_id
    d = strata.path("volumes", v.volume_id)
    assert os.path.isdir(os.path.join(d, "upper"))
    assert os.path.isdir(os.path.join(d, "work"))
    rec = strata.volume_record(v.volume_id)
    assert "pvc-1" in json.dumps(rec)
    assert "extra" in json.dumps(rec)
    assert v.capacity_bytes == 0
    assert [dict(t.segments) for t in v.accessible_topology] == \
        [{"strata.csi.dev/node": DEFAULT_NODE}]


def test_create_volume_without_layers(csi, strata):
    code, r = create(csi, "nolayers", layers=None)
    assert code == "OK", r
    assert os.path.isdir(strata.path("volumes", r.volume.volume_id, "upper"))


def test_create_volume_topology_uses_driver_name(env):
    p = env.plugin(root=env.layered_root(), driver="other.strata.io", node="worker-7")
    code, r = create(p.csi, "topo")
    assert code == "OK", r
    assert [dict(t.segments) for t in r.volume.accessible_topology] == \
        [{"other.strata.io/node": "worker-7"}]


def test_create_volume_ids_unique(csi):
    ids = set()
    for i in range(5):
        code, r = create(csi, f"u{i}")
        assert code == "OK"
        ids.add(r.volume.volume_id)
    assert len(ids) == 5


# --------------------------------------------------------------------------
# CreateVolume: required fields

def test_create_volume_requires_name(csi, strata):
    r = create(csi, "")
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


def test_create_volume_requires_capabilities(csi, strata):
    r = create(csi, "nocaps", volume_capabilities=[])
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


# --------------------------------------------------------------------------
# CreateVolume: layers

def test_unknown_layer_named_in_message(csi, strata):
    r = create(csi, "x", layers="base,no-such-layer")
    assert r.code == "INVALID_ARGUMENT", r
    assert "no-such-layer" in r.details
    assert volume_dirs(strata) == []


HOSTILE = ["../etc", "/etc", "a/b", ".", "..", "a,,b", ",a", "a,", ".hidden",
           "bad\x01name", "tab\tname", "new\nline", "del\x7f", "x" * 129,
           "../layers/base", "base/../base", " base"]


@pytest.mark.parametrize("layers", HOSTILE, ids=lambda s: repr(s)[:24])
def test_hostile_layer_names_refused(csi, strata, layers):
    # make every name that could exist as a directory exist, so only the
    # name rules can refuse it
    for n in ("a", "b", ".hidden", "x" * 129):
        strata.make_layer(n, {"f": "x"})
    r = create(csi, "hostile", layers=layers)
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


def test_layer_name_with_nul_refused(csi, strata):
    """"a\\0b" must not be taken for the layer "a" (C strings stop at NUL)."""
    strata.make_layer("a", {"f": "x"})
    r = create(csi, "nul", layers="a\x00b")
    assert r.code == "INVALID_ARGUMENT", r


def test_layer_name_length_limit(csi, strata):
    strata.make_layer("y" * 128, {"f": "x"})
    assert create(csi, "len128", layers="y" * 128).code == "OK"


@pytest.mark.parametrize("target", ["/etc", "base", "../volumes", "../../.."])
def test_symlinked_layer_refused(csi, strata, target):
    os.symlink(target, strata.path("layers", "evil"))
    r = create(csi, "evil", layers="evil")
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


def test_layer_that_is_a_file_refused(csi, strata):
    with open(strata.path("layers", "plain"), "w") as f:
        f.write("not a dir")
    assert create(csi, "file", layers="plain").code == "INVALID_ARGUMENT"


def test_unknown_parameter_named(csi, strata):
    r = create(csi, "p", parameters={"colour": "blue"})
    assert r.code == "INVALID_ARGUMENT", r
    assert "colour" in r.details


def test_k8s_parameters_ignored(csi):
    r = create(csi, "k8s", parameters={
        "csi.storage.k8s.io/pvc/name": "data",
        "csi.storage.k8s.io/pvc/namespace": "default",
        "csi.storage.k8s.io/pv/name": "pvc-123"})
    assert r.code == "OK", r


# --------------------------------------------------------------------------
# CreateVolume: capabilities

@pytest.mark.parametrize("mode", ["SINGLE_NODE_WRITER", "SINGLE_NODE_READER_ONLY",
                                  "SINGLE_NODE_SINGLE_WRITER",
                                  "SINGLE_NODE_MULTI_WRITER"])
def test_single_node_modes_accepted(csi, mode):
    r = create(csi, "m-" + mode.lower(), volume_capabilities=[cap(mode)])
    assert r.code == "OK", r


@pytest.mark.parametrize("mode", ["MULTI_NODE_READER_ONLY",
                                  "MULTI_NODE_SINGLE_WRITER",
                                  "MULTI_NODE_MULTI_WRITER"])
def test_multi_node_modes_refused(csi, strata, mode):
    r = create(csi, "m", volume_capabilities=[cap(), cap(mode)])
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


def test_block_refused(csi, strata):
    r = create(csi, "blk", volume_capabilities=[cap(block=True)])
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == []


# --------------------------------------------------------------------------
# CreateVolume: capacity

@pytest.mark.parametrize("required,limit", [(-1, 0), (0, -1), (-MiB, -MiB)])
def test_negative_capacity_invalid(csi, required, limit):
    r = create(csi, "neg", capacity_range=crange(required, limit))
    assert r.code == "INVALID_ARGUMENT", r


def test_limit_below_required_out_of_range(csi):
    r = create(csi, "lim", capacity_range=crange(2 * MiB, MiB))
    assert r.code == "OUT_OF_RANGE", r


def test_required_above_free_space_out_of_range(csi, strata):
    free = statvfs_free(strata.root)
    r = create(csi, "huge", capacity_range=crange(free * 2 + (1 << 30)))
    assert r.code == "OUT_OF_RANGE", r
    assert volume_dirs(strata) == []


@pytest.mark.parametrize("required,limit,expect", [
    (MiB, 0, MiB), (0, 2 * MiB, 2 * MiB), (MiB, 4 * MiB, MiB), (0, 0, 0)])
def test_capacity_bytes(csi, required, limit, expect):
    code, r = create(csi, f"cap-{required}-{limit}",
                     capacity_range=crange(required, limit))
    assert code == "OK", r
    assert r.volume.capacity_bytes == expect


# --------------------------------------------------------------------------
# CreateVolume: topology, content source

def test_requisite_excluding_node_resource_exhausted(csi, strata):
    req = pb().TopologyRequirement(requisite=[topology("other-node")],
                                   preferred=[topology("other-node")])
    r = create(csi, "topo", accessibility_requirements=req)
    assert r.code == "RESOURCE_EXHAUSTED", r
    assert volume_dirs(strata) == []


def test_requisite_including_node_ok(csi):
    req = pb().TopologyRequirement(
        requisite=[topology("other-node"), topology(DEFAULT_NODE)],
        preferred=[topology(DEFAULT_NODE)])
    code, r = create(csi, "topo-ok", accessibility_requirements=req)
    assert code == "OK", r
    assert dict(r.volume.accessible_topology[0].segments) == \
        {"strata.csi.dev/node": DEFAULT_NODE}


@pytest.mark.parametrize("kind", ["snapshot", "volume"])
def test_content_source_refused(csi, strata, kind):
    src = pb().VolumeContentSource()
    if kind == "snapshot":
        src.snapshot.snapshot_id = "snap-1"
    else:
        code, r = create(csi, "source")
        assert code == "OK"
        src.volume.volume_id = r.volume.volume_id
    before = volume_dirs(strata)
    r = create(csi, "clone", volume_content_source=src)
    assert r.code == "INVALID_ARGUMENT", r
    assert volume_dirs(strata) == before


# --------------------------------------------------------------------------
# CreateVolume: idempotency

def test_create_idempotent(csi, strata):
    kw = dict(capacity_range=crange(MiB))
    c1, r1 = create(csi, "same", layers="base,extra", **kw)
    c2, r2 = create(csi, "same", layers="base,extra", **kw)
    assert (c1, c2) == ("OK", "OK")
    assert r1.volume.volume_id == r2.volume.volume_id
    assert r2.volume.capacity_bytes == MiB
    assert volume_dirs(strata) == [r1.volume.volume_id]


def test_create_same_name_other_layers_already_exists(csi, strata):
    assert create(csi, "same", layers="base").code == "OK"
    r = create(csi, "same", layers="extra")
    assert r.code == "ALREADY_EXISTS", r
    assert len(volume_dirs(strata)) == 1


def test_create_same_name_other_capacity_already_exists(csi, strata):
    assert create(csi, "same", capacity_range=crange(MiB)).code == "OK"
    r = create(csi, "same", capacity_range=crange(2 * MiB))
    assert r.code == "ALREADY_EXISTS", r
    assert len(volume_dirs(strata)) == 1


@pytest.mark.parametrize("required,limit", [
    (MiB // 2, 2 * MiB),       # the existing 1 MiB lies inside the range
    (0, 2 * MiB),              # a limit alone
    (MiB, 0),                  # exactly what was asked the first time
])
def test_create_same_name_compatible_capacity_ok(csi, strata, required, limit):
    """CSI v1.12: a volume with the same name whose capacity the new range
    admits MUST be returned with OK, not ALREADY_EXISTS."""
    c1, r1 = create(csi, "same", capacity_range=crange(MiB))
    c2, r2 = create(csi, "same", capacity_range=crange(required, limit))
    assert (c1, c2) == ("OK", "OK"), r2
    assert r2.volume.volume_id == r1.volume.volume_id
    assert r2.volume.capacity_bytes == MiB
    assert len(volume_dirs(strata)) == 1


def test_create_same_name_unlimited_over_limit_already_exists(csi, strata):
    """No capacity means unlimited, which no limit_bytes admits."""
    assert create(csi, "same").code == "OK"
    r = create(csi, "same", capacity_range=crange(0, MiB))
    assert r.code == "ALREADY_EXISTS", r


def test_create_same_name_other_passthrough_already_exists(csi, strata):
    assert create(csi, "same").code == "OK"
    r = create(csi, "same", parameters={"passthrough": "true"})
    assert r.code == "ALREADY_EXISTS" and "passthrough" in r.details, r
    # "false" is the default spelled out: the same volume
    assert create(csi, "same", parameters={"passthrough": "false"}).code == "OK"
    assert len(volume_dirs(strata)) == 1


def test_create_passthrough_must_be_true_or_false(csi, strata):
    for bad in ("yes", "True", "1", ""):
        r = create(csi, "pt", parameters={"passthrough": bad})
        assert r.code == "INVALID_ARGUMENT" and "passthrough" in r.details, (bad, r)
    assert volume_dirs(strata) == []
    code, r = create(csi, "pt", parameters={"passthrough": "true"})
    assert code == "OK"
    assert strata.volume_record(r.volume.volume_id)["passthrough"] == 1


def test_create_idempotent_across_restart(csi, strata):
    code, r1 = create(csi, "persist")
    assert code == "OK"
    strata.restart()
    code, r2 = create(strata.csi, "persist")
    assert code == "OK"
    assert r1.volume.volume_id == r2.volume.volume_id


# --------------------------------------------------------------------------
# DeleteVolume

def test_delete_requires_id(csi):
    assert csi.DeleteVolume(volume_id="").code == "INVALID_ARGUMENT"


def test_delete_removes_volume(csi, strata):
    code, r = create(csi, "del")
    vid = r.volume.volume_id
    assert csi.DeleteVolume(volume_id=vid).code == "OK"
    assert not os.path.exists(strata.path("volumes", vid))
    assert csi.DeleteVolume(volume_id=vid).code == "OK"     # idempotent
    # the name is free again: a new volume, a new id
    code, r2 = create(csi, "del")
    assert code == "OK" and r2.volume.volume_id != vid


@pytest.mark.parametrize("vid", ["sv-" + "0" * 32, "../layers/base", "sv-../../layers",
                                 "sv-" + "A" * 32, "sv-" + "0" * 33, "base",
                                 "/etc", "sv-" + "0" * 31 + "/"],
                         ids=lambda s: s[:20])
def test_delete_unknown_or_malformed_ok_and_untouched(csi, strata, vid):
    code, r = create(csi, "keep")
    before = snapshot(strata.root)
    assert csi.DeleteVolume(volume_id=vid).code == "OK"
    assert snapshot(strata.root) == before


def test_delete_staged_failed_precondition(kubelet, strata):
    vid = kubelet.create("staged")
    st = kubelet.stage(vid)
    r = strata.csi.DeleteVolume(volume_id=vid)
    assert r.code == "FAILED_PRECONDITION", r
    assert os.path.isdir(strata.path("volumes", vid, "upper"))
    kubelet.unstage(vid, st)
    kubelet.delete(vid)
    assert not os.path.exists(strata.path("volumes", vid))


# --------------------------------------------------------------------------
# ValidateVolumeCapabilities

def test_validate_requires_fields(csi):
    code, r = create(csi, "v")
    vid = r.volume.volume_id
    assert csi.ValidateVolumeCapabilities(
        volume_id="", volume_capabilities=[cap()]).code == "INVALID_ARGUMENT"
    assert csi.ValidateVolumeCapabilities(
        volume_id=vid, volume_capabilities=[]).code == "INVALID_ARGUMENT"


def test_validate_unknown_not_found(csi):
    r = csi.ValidateVolumeCapabilities(volume_id="sv-" + "1" * 32,
                                       volume_capabilities=[cap()])
    assert r.code == "NOT_FOUND", r


def test_validate_supported_confirmed(csi):
    code, r = create(csi, "v")
    vid = r.volume.volume_id
    caps = [cap(), cap("SINGLE_NODE_READER_ONLY"), cap("SINGLE_NODE_MULTI_WRITER")]
    code, r = csi.ValidateVolumeCapabilities(volume_id=vid, volume_capabilities=caps)
    assert code == "OK"
    assert r.HasField("confirmed")
    assert len(r.confirmed.volume_capabilities) == 3


@pytest.mark.parametrize("bad", ["MULTI_NODE_MULTI_WRITER", "MULTI_NODE_READER_ONLY",
                                 "block"])
def test_validate_unsupported_not_confirmed(csi, bad):
    code, r = create(csi, "v")
    vid = r.volume.volume_id
    c = cap(block=True) if bad == "block" else cap(bad)
    code, r = csi.ValidateVolumeCapabilities(volume_id=vid,
                                             volume_capabilities=[cap(), c])
    assert code == "OK"
    assert not r.HasField("confirmed")
    assert r.message, "unconfirmed without a message"


# --------------------------------------------------------------------------
# ListVolumes

def test_list_volumes_pagination(csi):
    ids = set()
    for i in range(5):
        code, r = create(csi, f"l{i}")
        ids.add(r.volume.volume_id)
    seen, token, pages = [], "", 0
    while True:
        code, r = csi.ListVolumes(max_entries=2, starting_token=token)
        assert code == "OK"
        pages += 1
        assert len(r.entries) <= 2
        seen += [e.volume.volume_id for e in r.entries]
        token = r.next_token
        if not token:
            break
        assert pages < 10, "pagination does not end"
    assert pages == 3
    assert sorted(seen) == sorted(ids)


def test_list_volumes_all(csi):
    ids = set()
    for i in range(3):
        code, r = create(csi, f"a{i}", capacity_range=crange(MiB))
        ids.add(r.volume.volume_id)
    code, r = csi.ListVolumes()
    assert code == "OK"
    assert {e.volume.volume_id for e in r.entries} == ids
    assert all(e.volume.capacity_bytes == MiB for e in r.entries)
    assert r.next_token == ""


def test_list_volumes_bogus_token_aborted(csi):
    create(csi, "t")
    assert csi.ListVolumes(starting_token="bogus-token").code == "ABORTED"


def test_list_volumes_negative_max_invalid(csi):
    assert csi.ListVolumes(max_entries=-1).code == "INVALID_ARGUMENT"


# --------------------------------------------------------------------------
# GetCapacity, capabilities

def test_get_capacity_matches_statvfs(env):
    root = env.tmpfs_root(size="64m", layers={"base": {"f": "x"}})
    p = env.plugin(root=root)
    code, r = p.csi.GetCapacity(volume_capabilities=[cap()])
    assert code == "OK"
    free = statvfs_free(root)
    assert r.available_capacity > 0
    assert abs(r.available_capacity - free) <= max(MiB, free // 50), \
        (r.available_capacity, free)


def test_get_capacity_default_root(csi, strata):
    code, r = csi.GetCapacity()
    assert code == "OK"
    free = statvfs_free(strata.root)
    assert abs(r.available_capacity - free) <= max(64 * MiB, free // 20)


def test_controller_capabilities(csi):
    got = rpc_capabilities(csi, "ControllerGetCapabilities",
                           pb().ControllerServiceCapability)
    assert {"CREATE_DELETE_VOLUME", "LIST_VOLUMES", "GET_CAPACITY",
            "SINGLE_NODE_MULTI_WRITER", "GET_VOLUME", "VOLUME_CONDITION"} <= got
    # nothing it does not implement
    assert not got & {"CREATE_DELETE_SNAPSHOT", "CLONE_VOLUME", "EXPAND_VOLUME",
                      "PUBLISH_UNPUBLISH_VOLUME"}
