# SPDX-License-Identifier: Apache-2.0
"""Each code block of README.md, docs/*.md and the man pages' EXAMPLES, run
as written on a scratch root, its output compared with what the page shows
(docblocks.py says how), so that the docs cannot drift from the programs."""

import os
import shutil
from pathlib import Path

import pytest

import docblocks
from docblocks import PAGES, DocError, blocks, run_page, shape_matches

PROGRAMS = ("STRATAFS", "STRATA_CSI", "STRATACTL")


def _collect():
    params = []
    for page in PAGES:
        try:
            for n, b in enumerate(blocks(page)):
                marks = ()
                if b.kind == "skip":
                    marks = pytest.mark.skip(reason=f"doctest: skip {b.arg}")
                params.append(pytest.param(page, n, id=b.id, marks=marks))
        except DocError as e:
            # a broken marker fails its own test instead of the collection
            params.append(pytest.param(page, -1, id=f"{page}:marker"))
            _ERRORS[page] = str(e)
    return params


_ERRORS = {}
_RUNS = {}


@pytest.fixture(scope="session")
def programs():
    found = []
    for var in PROGRAMS:
        value = os.environ.get(var)
        if not value:
            pytest.fail(f"set {var} to the program the docs describe "
                        f"(e.g. {var}=build/{var.lower().replace('_', '-')})")
        path = Path(value).resolve()
        if not path.is_file() or not os.access(path, os.X_OK):
            pytest.fail(f"{var}={value}: not an executable file")
        found.append(path)
    if os.geteuid() != 0:
        pytest.fail("the examples mount file systems: run as root")
    for tool in ("unshare", "jq", "fusermount3"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found (scripts/deps.sh installs it)")
    return found


@pytest.fixture(scope="session")
def page_results(programs, tmp_path_factory):
    """Runs a page (all its blocks, in order) once, the first time a test
    of one of its blocks asks."""
    def get(page):
        if page not in _RUNS:
            results = tmp_path_factory.mktemp(page.replace("/", "_"))
            _RUNS[page] = run_page(page, results, programs)
        return _RUNS[page]
    return get


@pytest.mark.parametrize("page,n", _collect())
def test_example(page, n, page_results):
    if n < 0:
        pytest.fail(_ERRORS[page])
    page_blocks, results = page_results(page)
    b, r = page_blocks[n], results[n]
    if b.kind == "text":
        return
    if b.kind == "session":
        for (cmd, expected), got in zip(b.commands, r["outputs"]):
            ok, why = shape_matches(expected, got.rstrip("\n").split("\n")
                                    if got else [])
            assert ok, (f"{b.id}: `{cmd}` printed what the page does not "
                        f"show ({why}):\n{got}")
        return
    assert not r["failed"], (f"{b.id}: failed as written: "
                             f"{r['failed'].strip()}\noutput:\n{r['output']}")


def test_markers_are_few_and_reasoned():
    """Every skipped block names its reason; the skips stay a short list
    of things CI cannot have (a cluster, systemd, a container engine, the
    network, a rebuild of the tree)."""
    reasons = [b.arg for p in PAGES for b in blocks(p) if b.kind == "skip"]
    allowed = ("kubectl", "systemd", "docker", "network", "builds", "suite")
    for r in reasons:
        assert r.split(":")[0].split()[0] in allowed, (
            f"skip reason '{r}' is not one of {allowed}")


def test_shape_rules():
    """The comparison itself: ids and numbers may differ, words may not."""
    ok, _ = shape_matches(["volume sv-5f0c... capacity 1073741824"],
                          ["volume sv-" + "ab" * 16 + " capacity 5"])
    assert ok
    ok, why = shape_matches(["deleted sv-5f0c..."],
                            ["volume sv-" + "ab" * 16 + ": no such volume"])
    assert not ok and "line 1" in why
    ok, why = shape_matches(["ready"], ["ready", "extra"])
    assert not ok and "1 lines shown, 2 printed" in why
    assert shape_matches(["a ... z"], ["a b c z"])[0]
