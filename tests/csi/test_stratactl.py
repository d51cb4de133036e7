# SPDX-License-Identifier: Apache-2.0
"""stratactl as a black box ($STRATACTL) against a real plugin."""

import json
import os
import subprocess

import pytest

from csitest import (MiB, STRATAFS_FSTYPE, VOLUME_ID_RE, find_key, is_mounted,
                     read_file, stratactl_binary)


def ctl(plugin_or_endpoint, *args, as_json=False, env=None, timeout=60):
    ep = plugin_or_endpoint
    if ep is not None and not isinstance(ep, str):
        ep = ep.endpoint
    argv = [stratactl_binary()]
    if ep:
        argv += ["--endpoint", ep]
    if as_json:
        argv.append("--json")
    argv += list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=env)


def ok(r):
    assert r.returncode == 0, (f"{r.args} exited {r.returncode}\n"
                               f"stdout: {r.stdout}\nstderr: {r.stderr}")
    return r


def parse(r):
    ok(r)
    try:
        return json.loads(r.stdout)
    except ValueError:
        pytest.fail(f"--json output of {r.args[3:]} does not parse: {r.stdout!r}")


def as_int(v):
    return int(v) if v is not None else None


def test_info(strata):
    j = parse(ctl(strata, "info", as_json=True))
    assert j.get("name") == "strata.csi.dev"
    assert j.get("vendor_version")
    r = ok(ctl(strata, "info"))
    assert "strata.csi.dev" in r.stdout


def test_probe(env, strata):
    ok(ctl(strata, "probe"))
    j = parse(ctl(strata, "probe", as_json=True))
    assert find_key(j, "ready") in (True, {"value": True})
    bad = env.plugin(root=env.layered_root(), stratafs="/nonexistent", wait="serving")
    r = ctl(bad, "probe")
    assert r.returncode != 0
    assert "FAILED_PRECONDITION" in r.stderr, r.stderr


@pytest.mark.timeout(90)
def test_volume_cycle(env, strata):
    r = ctl(strata, "create-volume", "ctl-vol", "--layers", "base",
            "--capacity", "1Mi", as_json=True)
    j = parse(r)
    vid = find_key(j, "volume_id")
    assert vid and VOLUME_ID_RE.match(vid), j
    assert as_int(find_key(j, "capacity_bytes")) == MiB

    # idempotent from the command line too
    assert find_key(parse(ctl(strata, "create-volume", "ctl-vol", "--layers", "base",
                              "--capacity", "1Mi", as_json=True)),
                    "volume_id") == vid

    j = parse(ctl(strata, "list-volumes", as_json=True))
    assert vid in json.dumps(j)
    ok(ctl(strata, "list-volumes"))

    st = env.staging()
    tgt = env.target()
    ok(ctl(strata, "stage", vid, "--staging-path", st))
    assert is_mounted(st, STRATAFS_FSTYPE)
    ok(ctl(strata, "publish", vid, "--staging-path", st, "--target", tgt))
    assert is_mounted(tgt)
    assert read_file(os.path.join(tgt, "lower.txt")) == b"from the lower layer\n"

    j = parse(ctl(strata, "stats", vid, "--path", tgt, as_json=True))
    units = json.dumps(j)
    assert "BYTES" in units and "INODES" in units, j
    ok(ctl(strata, "stats", vid, "--path", tgt))

    ok(ctl(strata, "unpublish", vid, "--target", tgt))
    assert not os.path.exists(tgt)
    ok(ctl(strata, "unstage", vid, "--staging-path", st))
    assert not is_mounted(st)
    ok(ctl(strata, "delete-volume", vid))
    assert not os.path.exists(strata.path("volumes", vid))


def test_error_prints_code_name(env, strata):
    r = ctl(strata, "stage", "sv-" + "e" * 32, "--staging-path", env.staging())
    assert r.returncode != 0
    assert "NOT_FOUND" in r.stderr, r.stderr
    r = ctl(strata, "create-volume", "x", "--layers", "no-such-layer")
    assert r.returncode != 0
    assert "INVALID_ARGUMENT" in r.stderr and "no-such-layer" in r.stderr, r.stderr
    # an error with --json is still an error
    r = ctl(strata, "stage", "sv-" + "e" * 32, "--staging-path", env.staging(),
            as_json=True)
    assert r.returncode != 0 and "NOT_FOUND" in r.stderr


def test_unavailable_endpoint(env):
    r = ctl("unix://" + os.path.join(env.sockdir, "nobody.sock"), "probe")
    assert r.returncode != 0
    assert "UNAVAILABLE" in r.stderr, r.stderr


def test_csi_endpoint_env(strata):
    e = dict(os.environ, CSI_ENDPOINT=strata.endpoint)
    r = ok(ctl(None, "info", env=e))
    assert "strata.csi.dev" in r.stdout


def test_node_info_and_caps(strata):
    j = parse(ctl(strata, "node-info", as_json=True))
    assert j.get("node_id") == "node-1"
    assert "VOLUME_MOUNT_GROUP" in json.dumps(parse(ctl(strata, "node-caps",
                                                        as_json=True)))
    assert "CREATE_DELETE_VOLUME" in json.dumps(parse(ctl(strata, "controller-caps",
                                                          as_json=True)))


def test_usage_error(strata):
    r = ctl(strata, "no-such-command")
    assert r.returncode == 2, (r.returncode, r.stderr)
    r = ctl(strata, "stage")
    assert r.returncode == 2, (r.returncode, r.stderr)
