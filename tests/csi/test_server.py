# SPDX-License-Identifier: Apache-2.0
"""The gRPC server and the process: unknown methods, service modes, bad
bytes, the per-RPC log, secrets, the single-instance lock, signals, the
command line."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from csitest import (Kubelet, answers, cap, is_mounted,
                     pid_alive, poll, raw_socket_send, sanitizer_findings,
                     strata_csi_binary, STRATAFS_FSTYPE)


# --------------------------------------------------------------------------
# dispatch

@pytest.mark.parametrize("path", ["/csi.v1.Controller/ControllerPublishVolume",
                                  "/csi.v1.Foo/Bar", "/nothing"])
def test_unknown_method_is_unimplemented_quickly(csi, path):
    t = time.monotonic()
    r = csi.call_path(path, b"", timeout=5)
    assert r.code == "UNIMPLEMENTED", r
    assert time.monotonic() - t < 2, "UNIMPLEMENTED took too long (timeout?)"


def test_controller_methods_unimplemented_in_node_mode(env):
    p = env.plugin(root=env.layered_root(), mode="node")
    assert p.csi.CreateVolume(name="x", volume_capabilities=[cap()]).code == "UNIMPLEMENTED"
    assert p.csi.ListVolumes().code == "UNIMPLEMENTED"
    assert p.csi.ControllerGetCapabilities().code == "UNIMPLEMENTED"
    assert p.csi.NodeGetInfo().code == "OK"
    assert p.csi.GetPluginInfo().code == "OK"


def test_node_methods_unimplemented_in_controller_mode(env):
    p = env.plugin(root=env.layered_root(), mode="controller")
    st = env.staging()
    assert p.csi.NodeGetInfo().code == "UNIMPLEMENTED"
    assert p.csi.NodeGetCapabilities().code == "UNIMPLEMENTED"
    assert p.csi.NodeStageVolume(volume_id="sv-" + "0" * 32,
                                 staging_target_path=st,
                                 volume_capability=cap()).code == "UNIMPLEMENTED"
    assert p.csi.ControllerGetCapabilities().code == "OK"
    assert p.csi.GetPluginInfo().code == "OK"


# --------------------------------------------------------------------------
# bad bytes

@pytest.mark.parametrize("data", [
    b"\x0a\x05ab",                  # field 1, length 5, two bytes follow
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # overlong varint tag
    b"\x0a\xff\xff\xff\xff\x0f",    # a length of 4 GiB
    b"\x07",                         # field 0, wire type 7
], ids=["truncated", "overlong-varint", "huge-length", "bad-wiretype"])
def test_malformed_protobuf_is_invalid_argument(strata, data):
    for method in ("/csi.v1.Controller/CreateVolume",
                   "/csi.v1.Node/NodeStageVolume",
                   "/csi.v1.Node/NodePublishVolume"):
        r = strata.csi.call_path(method, data, timeout=5)
        assert r.code == "INVALID_ARGUMENT", (method, r)
    assert strata.alive()
    assert strata.csi.Probe().code == "OK"


def test_raw_garbage_on_socket_does_not_crash(strata):
    garbage = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        os.urandom(4096),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(2048),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" * 50,
        b"",
    ]
    for g in garbage:
        raw_socket_send(strata.sock, g)
    # a connection left half-open
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(strata.sock)
    s.sendall(b"PRI * HTTP/2.0\r\n")
    try:
        assert strata.alive(), f"plugin died:\n{strata.log()[-3000:]}"
        assert strata.csi.Probe().code == "OK"
        assert strata.csi.GetPluginInfo().code == "OK"
    finally:
        s.close()


# --------------------------------------------------------------------------
# the log

def _lines_with(log, *words):
    return [l for l in log.splitlines() if all(w in l for w in words)]


def test_one_log_line_per_rpc(strata):
    csi = strata.csi
    for _ in range(3):
        assert csi.NodeGetInfo().code == "OK"
    vid = "sv-" + "ab" * 16
    r = csi.NodeGetVolumeStats(volume_id=vid, volume_path="/nonexistent")
    assert r.code == "NOT_FOUND"
    line = poll(lambda: _lines_with(strata.log(), "NodeGetVolumeStats"), 3,
                what="a log line for NodeGetVolumeStats")
    log = strata.log()
    assert len(_lines_with(log, "NodeGetInfo")) == 3, log[-3000:]
    assert len(line) == 1, line
    line = line[0]
    assert vid in line, f"volume id missing from the log line: {line}"
    assert "NOT_FOUND" in line, f"status code name missing: {line}"
    assert re.search(r"\d+(\.\d+)?\s*(ns|us|µs|ms|s)\b|dur\w*[=:\" ]+\d", line), \
        f"no duration in the log line: {line}"


def test_log_format_json(env):
    p = env.plugin(root=env.layered_root(), extra=["--log-format", "json"])
    vid = "sv-" + "cd" * 16
    assert p.csi.NodeGetVolumeStats(volume_id=vid,
                                    volume_path="/nonexistent").code == "NOT_FOUND"
    poll(lambda: vid in p.log(), 3, what="the RPC's log line")
    found = False
    for line in p.log().splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)          # every line is one JSON object
        assert isinstance(obj, dict), line
        assert {"time", "level", "message"} <= set(obj), line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", obj["time"]), line
        if obj.get("method") == "NodeGetVolumeStats" and obj.get("volume") == vid:
            # the RPC's fields are members of their own, not text
            assert obj["code"] == "NOT_FOUND", line
            assert float(obj["duration_ms"]) >= 0, line
            assert obj["level"] == "warning" and obj["error"], line
            found = True
    assert found, p.log()[-3000:]


SECRET_A = "S3cret-Alpha-7f1c2e"
SECRET_B = "S3cret-Bravo-99d0aa"
SECRET_FLAG = "Fl4g-S3cret-0b5e77"


def test_secrets_never_logged(env):
    p = env.plugin(root=env.layered_root(), extra=["-v", "9"])
    kube = Kubelet(env, p)
    csi = p.csi
    secrets = {"password": SECRET_A, "token": SECRET_B}
    r = csi.CreateVolume(name="secret-vol", volume_capabilities=[cap()],
                         parameters={"layers": "base"}, secrets=secrets)
    assert r.code == "OK", r
    vid = r.reply.volume.volume_id
    # refused requests carry them too
    csi.CreateVolume(name="", volume_capabilities=[cap()], secrets=secrets)
    csi.CreateVolume(name="bad", volume_capabilities=[cap(flags=[f"password={SECRET_FLAG}"])],
                     parameters={"layers": "nosuch"}, secrets=secrets)
    st = env.staging()
    r = csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                            volume_capability=cap(), secrets=secrets)
    assert r.code == "OK", r
    # a mount flag holding a secret (refused, but never echoed into the log)
    tgt = env.target("p1")
    csi.NodePublishVolume(volume_id=vid, staging_target_path=st, target_path=tgt,
                          volume_capability=cap(flags=[f"password={SECRET_FLAG}"]),
                          secrets=secrets)
    csi.NodeStageVolume(volume_id=vid, staging_target_path=st,
                        volume_capability=cap(flags=[SECRET_FLAG]), secrets=secrets)
    tgt = kube.publish(vid, st, env.target("p2"))
    csi.NodePublishVolume(volume_id=vid, staging_target_path=st, target_path=tgt,
                          volume_capability=cap(), secrets=secrets)
    csi.DeleteVolume(volume_id=vid, secrets=secrets)
    csi.ValidateVolumeCapabilities(volume_id=vid, volume_capabilities=[cap()],
                                   secrets=secrets)
    kube.unpublish(vid, tgt)
    kube.unstage(vid, st)
    csi.DeleteVolume(volume_id=vid, secrets=secrets)
    poll(lambda: "DeleteVolume" in p.log(), 3, what="log lines")
    texts = {"plugin log": p.log()}
    for n in os.listdir(p.path("node")):
        with open(p.path("node", n), errors="replace") as f:
            texts[n] = f.read()
    for name, text in texts.items():
        for s in (SECRET_A, SECRET_B, SECRET_FLAG):
            assert s not in text, f"secret {s} appears in {name}"
    assert "NodeStageVolume" in p.log(), "no per-RPC log at all?"


# --------------------------------------------------------------------------
# one instance per socket

def assert_refused(second, what):
    """Start the plugin `second`: it must exit non-zero within 10 s."""
    second.start(wait=None)
    try:
        rc = second.proc.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second plugin on the same {what} kept running")
    assert rc != 0


def test_second_instance_on_same_socket_refused(env, strata):
    other_root = env.new_root("root2", layers={"base": {"f": "x"}})
    second = env.plugin(root=other_root, sock=strata.sock, start=False)
    assert_refused(second, "socket")
    msg = second.log()
    assert re.search(r"already|lock|in use|running|another", msg, re.I), \
        f"unclear refusal message: {msg!r}"
    # the first keeps serving its own store on that socket
    assert strata.alive()
    assert strata.csi.Probe().code == "OK"
    assert os.path.exists(strata.sock)
    r = strata.csi.CreateVolume(name="still-mine", volume_capabilities=[cap()],
                                parameters={"layers": "base"})
    assert r.code == "OK", r
    assert os.path.isdir(strata.path("volumes", r.reply.volume.volume_id))


def test_second_instance_on_same_store_refused(env, strata):
    second = env.plugin(root=strata.root, start=False)
    assert_refused(second, "store")
    assert second.log().strip(), "refused without a message"
    assert strata.csi.Probe().code == "OK"


# --------------------------------------------------------------------------
# signals

def test_sigterm_clean_exit_keeps_volumes(env, kubelet, strata):
    vid = kubelet.create("term")
    st = kubelet.stage(vid)
    tgt = kubelet.publish(vid, st)
    with open(os.path.join(tgt, "before"), "w") as f:
        f.write("data")
    pid = strata.daemon_pid(vid)
    rc = strata.stop(signal.SIGTERM)
    log = strata.log()
    assert rc == 0, f"exit status {rc}; log:\n{log[-3000:]}"
    assert not sanitizer_findings(log), log[-3000:]
    assert not re.search(r"\babort|assert|Segmentation", log, re.I), log[-3000:]
    assert not os.path.exists(strata.sock), "socket left behind"
    # the daemons are detached: they outlive the plugin
    assert pid_alive(pid)
    assert is_mounted(st, STRATAFS_FSTYPE)
    assert answers(st) and answers(tgt)
    with open(os.path.join(tgt, "before")) as f:
        assert f.read() == "data"
    # a new plugin takes over and tears everything down
    strata.start()
    kubelet.unpublish(vid, tgt)
    kubelet.unstage(vid, st)
    kubelet.delete(vid)
    assert not is_mounted(st)


def test_sigint_clean_exit(strata):
    assert strata.stop(signal.SIGINT) == 0
    assert not os.path.exists(strata.sock)


# --------------------------------------------------------------------------
# command line

def test_csi_endpoint_env(env):
    p = env.plugin(root=env.layered_root(), use_env_endpoint=True)
    assert "--endpoint" not in p.argv()
    assert p.csi.Probe().code == "OK"
    assert os.path.exists(p.sock)


def test_version(env):
    r = subprocess.run([strata_csi_binary(), "--version"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert re.search(r"\d+\.\d+", r.stdout), r.stdout


def test_help(env):
    r = subprocess.run([strata_csi_binary(), "--help"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    for opt in ("--endpoint", "--nodeid", "--root", "--mode", "--stratafs",
                "--max-volumes", "--driver-name", "--log-format"):
        assert opt in r.stdout, f"{opt} missing from --help"


@pytest.mark.parametrize("args", [
    ["--bogus-option"],
    ["--mode", "sideways"],
    ["--log-format", "xml"],
    ["--max-volumes", "-3"],
    ["--endpoint", "tcp://127.0.0.1:1"],
], ids=["unknown-option", "bad-mode", "bad-log-format", "bad-max-volumes",
        "non-unix-endpoint"])
def test_bad_command_line(env, args):
    root = env.new_root()
    sock = os.path.join(env.sockdir, "x.sock")
    argv = [strata_csi_binary(), "--endpoint", "unix://" + sock, "--nodeid",
            "n", "--root", root] + args
    r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert r.returncode != 0
    assert r.stderr.strip(), "refused without a message"


def test_missing_nodeid(env):
    root = env.new_root()
    sock = os.path.join(env.sockdir, "x.sock")
    r = subprocess.run([strata_csi_binary(), "--endpoint", "unix://" + sock,
                        "--root", root], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode != 0
    assert "nodeid" in r.stderr.lower() or "node id" in r.stderr.lower(), r.stderr
