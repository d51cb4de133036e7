# SPDX-License-Identifier: Apache-2.0
"""stratafs's messages to an operator (issue 15): an unknown option is
refused by its name before anything is opened, and a detached daemon's
messages reach somebody where there is no syslog."""

import os
import signal
import subprocess
import time

import pytest

from stratatest import build_tree, is_mounted, stratafs_binary

from test_readonly_and_options import daemon_mount  # noqa: F401 (a fixture)


def _dirs(tmp):
    for d in ("l0", "upper", "work", "mnt"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    build_tree(os.path.join(tmp, "l0"), {"f": "l0"})
    return [os.path.join(tmp, d) for d in ("l0", "upper", "work", "mnt")]


def _stratafs(*args, timeout=10):
    return subprocess.run([stratafs_binary()] + list(args), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=timeout)


@pytest.mark.parametrize("make_args,name", [
    (lambda l0, up, wk, mnt: ["--bogus", "-o", f"lowerdir={l0}", mnt], "--bogus"),
    # a typo beside workdir= is named, not taken for a missing upperdir=
    (lambda l0, up, wk, mnt: ["-o", f"lowerdir={l0},uperdir={up},workdir={wk}", mnt],
     f"uperdir={{up}}"),
    (lambda l0, up, wk, mnt: ["-o", f"lowerdir={l0},frobnicate", mnt], "frobnicate"),
    # refused before the layers are looked at: the missing one is not the news
    (lambda l0, up, wk, mnt: ["-o", f"lowerdir={l0}/nope,frobnicate", mnt], "frobnicate"),
])
def test_unknown_option_is_refused_by_name(stratafs_only, make_args, name):
    l0, up, wk, mnt = _dirs(stratafs_only.tmp)
    r = _stratafs(*make_args(l0, up, wk, mnt))
    assert r.returncode != 0
    assert not is_mounted(mnt)
    assert r.stderr.splitlines() == [
        f"stratafs: unknown option '{name.format(up=up)}'",
        "stratafs: see 'stratafs --help'"], r.stderr


def test_a_bad_max_read_is_named(stratafs_only):
    """max_read= is libfuse's, but stratafs reads it too (INIT must echo
    it): a bad value is named by stratafs."""
    l0, _, _, mnt = _dirs(stratafs_only.tmp)
    r = _stratafs("-o", f"lowerdir={l0},max_read=lots", mnt)
    assert r.returncode != 0
    assert r.stderr.splitlines()[0] == (
        "stratafs: max_read=lots: expected a size in bytes"), r.stderr


def test_libfuse_options_still_pass(stratafs_only, daemon_mount):
    """The check asks libfuse, so its own options (and the kernel's mount
    flags it knows) are still taken."""
    l0, up, wk, mnt = _dirs(stratafs_only.tmp)
    daemon_mount(mnt)
    r = _stratafs("-o", f"lowerdir={l0},upperdir={up},workdir={wk},nodev,noexec",
                  mnt, timeout=20)
    assert r.returncode == 0, r.stderr
    with open("/proc/self/mounts") as f:
        opts = [l.split()[3].split(",") for l in f if l.split()[1] == mnt]
    assert opts and {"nodev", "noexec"} <= set(opts[-1]), opts


def test_read_only_view_is_ro_in_proc_mounts(stratafs_only, daemon_mount):
    """Without an upper, /proc/mounts says ro, as for kernel overlayfs."""
    l0, _, _, mnt = _dirs(stratafs_only.tmp)
    daemon_mount(mnt)
    r = _stratafs("-o", f"lowerdir={l0}", mnt, timeout=20)
    assert r.returncode == 0, r.stderr
    with open("/proc/self/mounts") as f:
        opts = [l.split()[3] for l in f if l.split()[1] == mnt]
    assert opts and opts[-1].split(",")[0] == "ro", opts


@pytest.mark.skipif(os.path.exists("/dev/log"),
                    reason="with a /dev/log socket the detached daemon logs to "
                    "syslog, as documented; this machine has one")
def test_detached_daemon_logs_to_its_stderr_without_dev_log(stratafs_only, daemon_mount):
    """No /dev/log (most containers): what the daemon says once detached
    goes to the stderr it was started with, not to /dev/null."""
    l0, up, wk, mnt = _dirs(stratafs_only.tmp)
    log = os.path.join(stratafs_only.tmp, "daemon.log")
    daemon_mount(mnt)
    with open(log, "w") as err:
        r = subprocess.run([stratafs_binary(), "-o",
                            f"lowerdir={l0},upperdir={up},workdir={wk}", mnt],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=err, timeout=20)
    assert r.returncode == 0
    deadline = time.monotonic() + 10
    while "serves the mount" not in open(log).read():
        assert time.monotonic() < deadline, open(log).read()
        time.sleep(0.05)
    # and what it says later, too: a worker replaced on SIGHUP
    pid = int(subprocess.run(["pgrep", "-o", "-f", f"stratafs -o lowerdir={l0}"],
                             capture_output=True, text=True).stdout.split()[0])
    os.kill(pid, signal.SIGHUP)
    while "SIGHUP: replacing the worker" not in open(log).read():
        assert time.monotonic() < deadline, open(log).read()
        time.sleep(0.05)


@pytest.mark.skipif(os.path.exists("/dev/log"),
                    reason="with a /dev/log socket the detached daemon logs to "
                    "syslog, as documented; this machine has one")
def test_detached_daemon_on_a_pipe_says_its_messages_are_lost(stratafs_only,
                                                              daemon_mount):
    """A pipe is not kept (its reader would wait for ever): the daemon says
    so before it detaches, and the command returns."""
    l0, up, wk, mnt = _dirs(stratafs_only.tmp)
    daemon_mount(mnt)
    r = _stratafs("-o", f"lowerdir={l0},upperdir={up},workdir={wk}", mnt,
                  timeout=20)
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        "stratafs: warning: no syslog here (/dev/log) and stderr is no file: "
        "what the daemon says once detached is lost; run it with -f, or with "
        "2>>FILE"], r.stderr
