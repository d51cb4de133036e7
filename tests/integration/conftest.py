# SPDX-License-Identifier: Apache-2.0
"""Fixtures and hooks for the stratafs integration suite.

Every behavioural test runs against two implementations of the same union
filesystem:

* ``kernel``   -- Linux kernel overlayfs (the oracle), mounted with
                  ``redirect_dir=on,index=off``;
* ``stratafs`` -- the FUSE daemon named by the ``STRATAFS`` environment
                  variable (``-f`` foreground mode, one process per mount).

The ``union`` fixture is a *factory* parametrized over both kinds::

    def test_x(union):
        u = union.make(lowers=[{"a": "top"}, {"a": "bottom", "d": ("dir",)}],
                       upper={"b": "up"})
        assert open(u.path("a")).read() == "top"
        u.remount()

``stratafs_only`` is the same factory restricted to stratafs (behaviour that
kernel overlayfs lacks), ``kernel_only`` the one restricted to the kernel, and
``make_union(kind)`` lets a test use both implementations side by side.
Layer specs are dicts ``relative path -> entry``; see stratatest.build_tree.
"""

import os
import signal
import sys

import pytest

# tests/lib: the helpers this suite shares with tests/csi
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "lib"))

from stratatest import (DEFAULT_TEST_TIMEOUT, UnionFactory, _live_procs,  # noqa: E402
                        _live_unions, fuse_abort, lazy_umount, mounts_under,
                        stratafs_binary)
from strata_common import Watchdog  # noqa: E402


def _factory(request, tmp_path, kind):
    if kind == "stratafs":
        stratafs_binary()
    f = UnionFactory(kind, tmp_path)
    request.addfinalizer(f.cleanup)
    return f


@pytest.fixture(params=["kernel", "stratafs"])
def union(request, tmp_path):
    """Factory for unions of the parametrized kind (see module doc)."""
    return _factory(request, tmp_path, request.param)


@pytest.fixture(params=["stratafs"])
def stratafs_only(request, tmp_path):
    """Like `union`, but only stratafs (behaviour kernel overlayfs lacks)."""
    return _factory(request, tmp_path, request.param)


@pytest.fixture(params=["kernel"])
def kernel_only(request, tmp_path):
    return _factory(request, tmp_path, request.param)


@pytest.fixture
def make_union(request, tmp_path):
    """make_union(kind) -> factory; for tests that use both kinds."""
    made = {}

    def get(kind):
        if kind not in made:
            f = UnionFactory(kind, os.path.join(str(tmp_path), kind))
            if kind == "stratafs":
                stratafs_binary()
            request.addfinalizer(f.cleanup)
            made[kind] = f
        return made[kind]
    return get


@pytest.fixture
def stratafs_bin():
    return stratafs_binary()


# --------------------------------------------------------------------------
# markers, watchdog, leftover checks

def _sigterm(signum, frame):
    # turn SIGTERM (e.g. from a CI timeout) into a KeyboardInterrupt so that
    # fixtures still unmount and the leftover check still runs
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    signal.signal(signal.SIGTERM, _sigterm)
    config.addinivalue_line(
        "markers", "stratafs: the test needs the stratafs binary ($STRATAFS)")
    config.addinivalue_line(
        "markers", "timeout(seconds): watchdog limit for this test "
        "(aborts stratafs FUSE connections when exceeded)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        # a test runs without the binary only if it is a kernel variant;
        # everything else (stratafs variants, stratafs-only tests, tests
        # that use both or call stratafs_binary() themselves) needs it
        kernel_variant = params.get("union") == "kernel" or "kernel_only" in names
        if not kernel_variant and not item.get_closest_marker("stratafs"):
            item.add_marker(pytest.mark.stratafs)


@pytest.fixture(autouse=True)
def _watchdog(request):
    def abort_all():
        for u in list(_live_unions):
            if u.kind == "stratafs":
                fuse_abort(u.mnt)
    dog = Watchdog(request.node, DEFAULT_TEST_TIMEOUT,
                   "aborting stratafs FUSE connections", abort_all)
    yield
    dog.cancel()
    dog.check()


def pytest_sessionfinish(session, exitstatus):
    problems = []
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None) if factory else None
    if basetemp is not None:
        for m in mounts_under(str(basetemp)):
            problems.append(f"leftover mount: {m['mountpoint']} ({m['fstype']})")
            lazy_umount(m["mountpoint"])
    for p in list(_live_procs):
        if p.poll() is None:
            problems.append(f"leftover stratafs process pid {p.pid}: {p.args}")
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
    if problems:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "LEFTOVER MOUNTS/PROCESSES AFTER THE SESSION:\n  " + "\n  ".join(problems)
        if tr is not None:
            tr.write_line("")
            tr.write_line("!" * 70, red=True, bold=True)
            tr.write_line(msg, red=True, bold=True)
            tr.write_line("!" * 70, red=True, bold=True)
        else:
            sys.stderr.write(msg + "\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
