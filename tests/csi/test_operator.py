# SPDX-License-Identifier: Apache-2.0
"""What an operator sees: refusals that name what is wrong, start-up
lines that tell the truth, and the state of every volume at a glance
(issue 15). Each test pins one message or signal, as the programs print
it."""

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from csitest import (poll, pid_alive, strata_csi_binary, stratactl_binary,
                     stratafs_binary)

ID = re.compile(r"sv-[0-9a-f]{32}")


def ctl(plugin, *args, timeout=60):
    argv = [stratactl_binary(), "--endpoint", plugin.endpoint] + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def run_csi(*args, timeout=20):
    return subprocess.run([strata_csi_binary()] + list(args),
                          capture_output=True, text=True, timeout=timeout)


# ---- strata-csi's command line ---------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--bogus"], "strata-csi: unknown option '--bogus'"),
    (["--nodeid"], "strata-csi: option '--nodeid' needs a value"),
    (["-x"], "strata-csi: unknown option '-x'"),
    (["--log-format", "yaml"], "strata-csi: --log-format is text or json, not 'yaml'"),
    (["--max-volumes", "ten"], "strata-csi: --max-volumes takes a count from 0, not 'ten'"),
    (["--fuse-uring", "yes"], "strata-csi: --fuse-uring is off, on or leave, not 'yes'"),
    ([], "strata-csi: --endpoint (or CSI_ENDPOINT) and --nodeid are required"),
])
def test_usage_errors_say_one_thing(args, message):
    """A usage error is the one line that names it and a pointer to
    --help, not buried under the whole help text."""
    env = dict(os.environ)
    env.pop("CSI_ENDPOINT", None)
    r = subprocess.run([strata_csi_binary()] + args, capture_output=True,
                       text=True, env=env, timeout=20)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [message, "Try 'strata-csi --help'."], r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("args,message", [
    (["--bogus", "info"], ["stratactl: unknown option '--bogus'",
                           "Try 'stratactl --help'."]),
    (["info", "--bogus"], ["stratactl: info: unknown option '--bogus'",
                           "Try 'stratactl info --help'."]),
    (["volume", "list", "--bogus"], ["stratactl: volume list: unknown option '--bogus'",
                                     "Try 'stratactl volume list --help'."]),
])
def test_stratactl_refuses_unknown_flags_by_name(args, message):
    r = subprocess.run([stratactl_binary(), "--endpoint", "unix:///nonexistent.sock"]
                       + args, capture_output=True, text=True, timeout=20)
    assert (r.returncode, r.stderr.splitlines(), r.stdout) == (2, message, "")


def test_unusable_stratafs_is_not_ready_in_the_log(env):
    p = env.plugin(root=env.layered_root(), stratafs="/nonexistent/stratafs",
                   wait="serving")
    poll(lambda: "not ready" in p.log(), what="the not-ready line")
    log = p.log()
    assert ("strata-csi: error: not ready: the stratafs daemon "
            "/nonexistent/stratafs is unusable (No such file or directory): "
            "give --stratafs the path of a stratafs binary") in log, log
    assert "info: ready" not in log


def test_ready_comes_after_serving(strata):
    log = strata.log()
    assert log.index("serving CSI on") < log.index("info: ready"), log


def test_busy_metrics_port_names_the_address(env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        p = env.plugin(root=env.layered_root(), extra=["--metrics-address", addr],
                       start=False)
        p.start(wait=None)
        assert p.proc.wait(20) == 1
    log = p.log()
    assert (f"strata-csi: error: cannot serve metrics on {addr}: Address "
            "already in use: another program listens there; give "
            "--metrics-address another port") in log, log
    assert "Failed to bind" not in log


def test_failed_starts_leave_no_lock_files(env):
    """The socket's and the store's lock files exist only while a plugin
    runs: not after a failed start, nor after a clean exit."""
    root = env.layered_root()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = env.plugin(root=root, start=False,
                       extra=["--metrics-address", f"127.0.0.1:{s.getsockname()[1]}"])
        p.start(wait=None)
        assert p.proc.wait(20) == 1
    assert not os.path.exists(p.sock + ".lock")
    assert not os.path.exists(os.path.join(root, ".lock"))
    ok = env.plugin(root=root)
    assert os.path.exists(ok.sock + ".lock")
    assert os.path.exists(os.path.join(root, ".lock"))
    assert ok.stop() == 0
    assert not os.path.exists(ok.sock + ".lock")
    assert not os.path.exists(os.path.join(root, ".lock"))


def test_second_plugin_keeps_the_first_ones_locks(env):
    """A plugin refused for a held store must not remove the lock of the
    one that holds it."""
    root = env.layered_root()
    first = env.plugin(root=root)
    second = env.plugin(root=root, start=False)
    second.start(wait=None)
    assert second.proc.wait(20) == 1
    assert "another strata-csi uses it" in second.log()
    assert os.path.exists(os.path.join(root, ".lock"))
    assert first.csi.Probe().code == "OK"


def test_duration_ms_is_a_json_number(env):
    p = env.plugin(root=env.layered_root(), extra=["--log-format", "json"])
    assert ctl(p, "info").returncode == 0
    lines = [json.loads(l) for l in p.log().splitlines() if l.startswith("{")]
    rpcs = [l for l in lines if l.get("message") == "rpc"]
    assert rpcs, p.log()
    for l in rpcs:
        assert isinstance(l["duration_ms"], (int, float)), l


# ---- what the plugin answers -----------------------------------------------

def test_unknown_layer_names_its_directory(strata):
    r = ctl(strata, "create-volume", "v", "--layers", "nope")
    assert r.returncode == 1
    want = (f"stratactl: INVALID_ARGUMENT: layer 'nope': no such layer (no "
            f"directory {os.path.realpath(strata.root)}/layers/nope: place the "
            f"layer there, or fix the name)")
    assert r.stderr.strip() == want, r.stderr


@pytest.mark.parametrize("args", [
    ["replace-worker", "sv-nope"],
    ["volume", "inspect", "sv-nope"],
    ["validate", "sv-" + "0" * 32],
    ["replace-worker", "sv-" + "0" * 32],
])
def test_not_found_reads_one_way(strata, args):
    vid = args[-1]
    r = ctl(strata, *args)
    assert r.returncode == 1
    assert r.stderr.startswith(f"stratactl: NOT_FOUND: volume {vid}: no such volume"), r.stderr


def test_delete_of_a_typo_says_nothing_was_deleted(strata):
    r = ctl(strata, "delete-volume", "sv-typo")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "volume sv-typo: no such volume, nothing deleted\n"
    r = ctl(strata, "--json", "delete-volume", "sv-typo")
    assert (r.returncode, r.stdout) == (0, "{}\n")


def test_delete_of_a_volume_says_deleted(strata, kubelet):
    vid = kubelet.create("real")
    r = ctl(strata, "delete-volume", vid)
    assert (r.returncode, r.stdout) == (0, f"deleted {vid}\n"), r.stderr


@pytest.mark.parametrize("size", ["1Gb", "512mb", "100b"])
def test_capacity_in_bits_is_refused(strata, size):
    r = ctl(strata, "create-volume", "v", "--capacity", size)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"stratactl: create-volume: --capacity '{size}': a lower-case b would "
        "be bits; write 1Gi for 2^30 bytes (what Kubernetes' 1Gi means) or 1G "
        "for 10^9",
        "Try 'stratactl create-volume --help'."]


def test_volume_without_layers_prints_a_dash(strata):
    r = ctl(strata, "create-volume", "plain")
    assert r.returncode == 0, r.stderr
    assert " layers - topology " in r.stdout, r.stdout


# ---- probe --wait ----------------------------------------------------------

def test_probe_wait_until_ready(env):
    """--wait asks until the plugin answers ready: started after stratactl,
    the plugin is waited for."""
    root = env.layered_root()
    p = env.plugin(root=root, start=False)
    waiter = subprocess.Popen([stratactl_binary(), "--endpoint", p.endpoint,
                               "probe", "--wait=20"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    assert waiter.poll() is None
    p.start()
    out, err = waiter.communicate(timeout=20)
    assert (waiter.returncode, out, err) == (0, "ready\n", "")


def test_probe_wait_gives_up_with_the_last_answer(env):
    sock = os.path.join(env.sockdir, "nobody.sock")
    start = time.monotonic()
    r = subprocess.run([stratactl_binary(), "--endpoint", "unix://" + sock,
                        "probe", "--wait=1"], capture_output=True, text=True,
                       timeout=20)
    assert 1 <= time.monotonic() - start < 10
    assert r.returncode == 1
    assert r.stderr.startswith(f"stratactl: probe: the plugin at unix://{sock} "
                               "was not ready within 1.0 s: UNAVAILABLE:"), r.stderr


def test_probe_wait_value_is_checked(strata):
    r = ctl(strata, "probe", "--wait=soon")
    assert r.returncode == 2
    assert "--wait takes seconds" in r.stderr and "'soon'" in r.stderr


# ---- progress, on a terminal only ------------------------------------------

def _on_a_tty(argv, timeout=30):
    """Runs argv with stderr on a pseudo-terminal; returns (status, what
    the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout)
    os.close(master)
    return proc.returncode, got.decode(errors="replace")


def test_stage_waiting_for_its_daemon_shows_progress_on_a_terminal(env, kubelet, strata):
    """A daemon slow to serve: the terminal sees the stage wait; a pipe
    sees nothing of it."""
    slow = env.script("slow-stratafs", f"#!/bin/sh\nsleep 2.5\nexec {stratafs_binary()} \"$@\"\n")
    p = env.plugin(root=env.layered_root(), stratafs=slow)
    vid = ctl(p, "--json", "create-volume", "slow", "--layers", "base")
    vid = json.loads(vid.stdout)["volume"]["volume_id"]
    staging = env.staging("slow")
    status, tty = _on_a_tty([stratactl_binary(), "--endpoint", p.endpoint,
                             "stage", vid, "--staging-path", staging])
    assert status == 0, tty
    assert f"stratactl: stage {vid}: waiting for its daemon to serve the mount (1s)" in tty, tty
    assert tty.endswith("\r\x1b[K"), repr(tty)   # wiped once done
    r = ctl(p, "unstage", vid, "--staging-path", staging)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r = ctl(p, "stage", vid, "--staging-path", staging)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # piped: silent


# ---- which daemon serves which volume --------------------------------------

def test_volume_list_and_inspect(env, strata, kubelet):
    a = kubelet.create("a", layers="base,extra", capacity=1 << 20)
    b = kubelet.create("b")
    staging = kubelet.stage(a)
    target = kubelet.publish(a, staging, readonly=True)
    pid = strata.daemon_pid(a)

    rows = ctl(strata, "volume", "list").stdout.splitlines()
    assert rows[0].split() == ["VOLUME", "STATE", "PID", "UPTIME", "RESTARTS",
                               "USED", "LAYERS", "CONDITION"]
    by_id = {r.split()[0]: r.split() for r in rows[1:]}
    assert by_id[a][1:3] == ["published", str(pid)]
    assert by_id[a][6:] == ["base,extra", "normal"]
    assert by_id[b][1:5] == ["created", "-", "-", "0"]

    lines = ctl(strata, "volume", "inspect", a).stdout.splitlines()
    assert f"staging_path {staging}" in lines
    assert f"target {target} read-only" in lines
    assert f"daemon_pid {pid}" in lines
    assert "state published" in lines and "restarts 0" in lines
    assert "condition normal" in lines

    j = json.loads(ctl(strata, "--json", "volume", "inspect", a).stdout)["volume"]
    assert (j["state"], j["staging_path"], j["daemon_pid"]) == ("published", staging, pid)
    assert j["targets"] == [{"path": target, "readonly": True}]
    assert j["layers"] == ["base", "extra"] and j["capacity_bytes"] == 1 << 20
    assert j["uptime_seconds"] >= 0 and j["abnormal"] is False

    listed = json.loads(ctl(strata, "--json", "volume", "list").stdout)["volumes"]
    assert sorted(v["volume_id"] for v in listed) == sorted([a, b])

    kubelet.unpublish(a, target)
    assert "state staged" in ctl(strata, "volume", "inspect", a).stdout


def test_a_healed_daemon_counts_as_a_restart(strata, kubelet):
    vid = kubelet.create("heal")
    kubelet.stage(vid)
    old = strata.daemon_pid(vid)
    os.kill(old, signal.SIGKILL)
    poll(lambda: strata.daemon_pid(vid) != old and pid_alive(strata.daemon_pid(vid)),
         timeout=20, what="the heal")
    poll(lambda: "restarts 1" in ctl(strata, "volume", "inspect", vid).stdout,
         timeout=20, what="restarts 1")


def test_a_removed_layer_is_an_abnormal_condition(strata, kubelet):
    vid = kubelet.create("gone", layers="base,extra")
    kubelet.stage(vid)
    shutil.rmtree(strata.path("layers", "extra"))
    j = json.loads(ctl(strata, "--json", "volume", "inspect", vid).stdout)["volume"]
    assert j["abnormal"] is True
    assert "its lower layer 'extra' was removed" in j["condition"], j
    row = [r for r in ctl(strata, "volume", "list").stdout.splitlines()
           if r.startswith(vid)]
    assert "its lower layer 'extra' was removed" in row[0]


def test_the_volume_id_is_in_the_mount_source_and_the_process_title(strata, kubelet):
    vid = kubelet.create("named")
    staging = kubelet.stage(vid)
    with open("/proc/self/mountinfo") as f:
        sources = [l.split(" - ")[1].split()[1] for l in f
                   if l.split()[4] == staging]
    assert sources == [f"strata:{vid}"]
    with open(f"/proc/{strata.daemon_pid(vid)}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    assert argv[1] == f"strata:{vid}", argv


def test_volume_needs_a_subcommand(strata):
    r = ctl(strata, "volume")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == ("stratactl: volume takes a subcommand: "
                                        "volume list, volume inspect ID")
    r = ctl(strata, "volume", "frob")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == ("stratactl: unknown command 'volume frob' "
                                        "(volume list, volume inspect ID)")


@pytest.mark.timeout(120)
def test_inspect_shows_a_copy_up_in_progress(strata, kubelet):
    """A write to a big lower file waits for its copy-up: `volume inspect`
    says how far it has got, from the daemon (fuse/progress.c)."""
    size = 1 << 30
    strata.make_layer("bigbase")
    with open(strata.path("layers", "bigbase", "big.bin"), "wb") as f:
        for _ in range(size >> 20):
            f.write(b"b" * (1 << 20))
    vid = kubelet.create("copying", layers="bigbase")
    staging = kubelet.stage(vid)
    seen = []
    t = threading.Thread(target=lambda: open(os.path.join(staging, "big.bin"),
                                             "ab").close())
    t.start()
    while t.is_alive():
        r = ctl(strata, "--json", "volume", "inspect", vid)
        assert r.returncode == 0, r.stderr
        ups = json.loads(r.stdout)["volume"].get("copy_ups", [])
        if not ups:
            continue
        # the text look comes after the JSON one: the copy-up may have
        # ended in between, so look again until both saw it
        text = ctl(strata, "volume", "inspect", vid).stdout
        if "copy_up" in text:
            seen.append((ups, text))
            break
    t.join()
    assert seen, "the copy-up ended before two looks saw it"
    ups, text = seen[0]
    assert ups[0]["path"] == "big.bin" and int(ups[0]["total_bytes"]) == size
    assert 0 <= int(ups[0].get("done_bytes", 0)) <= size
    assert re.search(r"^copy_up big\.bin \S+ of 1\.0Gi \(\d+%\)$", text, re.M), text
    r = ctl(strata, "--json", "volume", "inspect", vid)
    assert json.loads(r.stdout)["volume"]["copy_ups"] == []
