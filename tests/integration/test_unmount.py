# SPDX-License-Identifier: Apache-2.0
"""Unmount releases the layers (issue 12): once fusermount3 -u returns,
the filesystem under the layers can be unmounted at once, with either
I/O engine. A few cycles here; tests/bench/unmount-cycles.py runs 500 and
reports how long the daemon takes to let go."""

import pytest

from layer_cycles import run_cycle
from stratatest import stratafs_binary

CYCLES = 20


@pytest.mark.parametrize("engine", ["uring", "sync"])
def test_layers_unmount_right_after_the_union(tmp_path, engine):
    binary = stratafs_binary()
    busy = 0
    for i in range(CYCLES):
        c = run_cycle(binary, str(tmp_path / f"c{i}"), f"io={engine}")
        assert c.status == 0, c.stderr
        busy += c.ebusy
    assert busy == 0, f"{busy} of {CYCLES} unmounts of the layers were EBUSY"
