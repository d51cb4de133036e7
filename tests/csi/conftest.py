# SPDX-License-Identifier: Apache-2.0
"""Fixtures and hooks for the strata-csi suite.

Every test talks to a real `strata-csi` process ($STRATA_CSI) over a real
unix socket, and the plugin starts real `stratafs` daemons ($STRATAFS) on
real mounts.  The fixtures:

* ``env``      -- the test's world (csitest.Env): tmp dirs, kubelet-like
                  staging and target paths, ``env.plugin(...)`` to start
                  more plugins (other roots, modes, flags, fake daemons);
* ``strata``   -- a plugin (both modes) on ``<tmp>/root`` with the layers
                  ``base`` ({"lower.txt", "dir/inner.txt"}) and ``extra``,
                  ready (Probe said ready=true);
* ``csi``      -- ``strata.csi``: one method per RPC, each returning
                  ``(code, reply)`` with ``.details``;
* ``kubelet``  -- csitest.Kubelet over ``strata``: create/stage/publish/...
                  asserting success.

In teardown every live plugin gets SIGTERM and must exit 0 (a sanitizer
build then reports its leaks), and a sanitizer report in any plugin or
daemon log fails the test.  Whatever a test starts is killed and whatever it mounts below its tmp dir
is lazily unmounted in teardown, even when the test fails; a per-test
watchdog (default 60 s, @pytest.mark.timeout(N)) SIGKILLs the plugins and
aborts the FUSE connections of a test that hangs.
"""

import os
import signal
import sys

import pytest

# tests/lib: the helpers this suite shares with tests/integration
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))

from csitest import (DEFAULT_TEST_TIMEOUT, Env, Kubelet, mounts_under, pb,  # noqa: E402
                     strata_csi_binary, stratafs_binary)
from strata_common import Watchdog  # noqa: E402

_current = {}


def _sigterm(signum, frame):
    # a CI timeout's SIGTERM becomes KeyboardInterrupt: fixtures still clean up
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _sigterm)
    config.addinivalue_line(
        "markers", "timeout(seconds): watchdog limit for this test "
        "(kills its plugins and aborts its FUSE connections when exceeded)")
    config.addinivalue_line(
        "markers", "valgrind: runs strata-csi under valgrind (slow); "
        "deselect with -k 'not valgrind'")


def pytest_sessionstart(session):
    # generate the messages once, up front: a broken proto fails loudly
    try:
        pb()
    except BaseException as e:  # pytest.fail raises outcomes, not Exception
        sys.stderr.write(f"cannot generate CSI messages: {e}\n")


@pytest.fixture
def env(request, tmp_path):
    e = Env(tmp_path)
    _current["env"] = e
    dog = Watchdog(request.node, DEFAULT_TEST_TIMEOUT,
                   "killing its plugins and daemons", e.kill_everything)
    failures = []
    try:
        yield e
    finally:
        dog.cancel()
        try:
            if not dog.fired:
                failures += e.stop_plugins()
        finally:
            # even when interrupted: nothing may outlive the test
            problems = e.cleanup()
            _current.pop("env", None)
        failures += e.sanitizer_reports()
    dog.check()
    if problems:
        sys.stderr.write(f"\nteardown of {request.node.nodeid}: "
                         + "; ".join(problems) + "\n")
    if failures:
        pytest.fail("teardown: " + "\n".join(failures), pytrace=False)


@pytest.fixture
def strata(env):
    """A ready plugin on <tmp>/root with the layers base and extra."""
    strata_csi_binary()
    stratafs_binary()
    return env.plugin(root=env.layered_root("root"))


@pytest.fixture
def csi(strata):
    return strata.csi


@pytest.fixture
def kubelet(env, strata):
    return Kubelet(env, strata)


def pytest_sessionfinish(session, exitstatus):
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None) if factory else None
    if basetemp is None:
        return
    left = mounts_under(str(basetemp))
    if left:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "LEFTOVER MOUNTS AFTER THE SESSION: " + ", ".join(
            f"{m['mountpoint']} ({m['fstype']})" for m in left)
        if tr is not None:
            tr.write_line(msg, red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
