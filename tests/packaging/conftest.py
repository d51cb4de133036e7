# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the packaging tests: where the tree is, and the
tools and programs a test needs, which fail the test (never skip it) when
they are missing, so a run without them cannot pass by saying nothing."""

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root():
    """The top of the source tree."""
    return REPO


@pytest.fixture(scope="session")
def require_tool():
    """require_tool("make", "make") -> absolute path of a program on PATH
    (or /usr/bin, /usr/sbin, /sbin), failing the test when it is not there.
    The message names the Debian package when one is given, or says
    where to get the tool (hint=)."""
    def find(name, package=None, hint=None):
        path = shutil.which(name) or shutil.which(
            name, path="/usr/bin:/usr/sbin:/bin:/sbin")
        if not path:
            where = hint or (f"apt-get install {package}" if package else "")
            pytest.fail(f"{name} not found" + (f": {where}" if where else ""))
        return path
    return find


@pytest.fixture(scope="session")
def require_program():
    """require_program("STRATA_CSI") -> the executable the environment
    variable names. Unset or not executable fails the test: these tests
    exist to compare the packaging with real programs."""
    def get(var):
        value = os.environ.get(var)
        if not value:
            pytest.fail(f"set {var} to the program to check "
                        f"(e.g. {var}=build/{var.lower().replace('_', '-')})")
        path = Path(value).resolve()
        if not path.is_file() or not os.access(path, os.X_OK):
            pytest.fail(f"{var}={value}: not an executable file")
        return path
    return get

