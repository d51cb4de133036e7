# SPDX-License-Identifier: Apache-2.0
"""stratactl's bash completion (packaging/bash-completion/stratactl): it
offers what the binary takes, read from its help, so the two cannot
drift; and `make install` (so the Debian package) puts it where
bash-completion loads it."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "packaging/bash-completion/stratactl"


@pytest.fixture(scope="module")
def complete(require_program, require_tool):
    """complete("stratactl", "stage", "--st") -> the words offered for the
    last one, as bash would compute them on TAB."""
    ctl = require_program("STRATACTL")
    bash = require_tool("bash", "bash")

    def run(*words):
        prog = f"""
source {SCRIPT}
COMP_WORDS=({' '.join(repr(w) for w in words)})
COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))
COMPREPLY=()
_stratactl
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
        env = {"PATH": f"{ctl.parent}:/usr/bin:/bin"}
        r = subprocess.run([bash, "-c", prog], capture_output=True, text=True,
                           env=env, timeout=30)
        assert r.returncode == 0, r.stderr
        return [w for w in r.stdout.split("\n") if w]
    return run


def help_commands(ctl):
    out = subprocess.run([str(ctl), "--help"], capture_output=True,
                         text=True).stdout
    section = out.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    return [re.split(r"\s{2,}", l.strip())[0] for l in section.splitlines()]


def test_every_command_is_offered(complete, require_program):
    names = {c.split()[0] for c in help_commands(require_program("STRATACTL"))}
    assert "volume" in names and "probe" in names
    assert set(complete("stratactl", "")) == names | {"help"}


def test_volume_subcommands(complete):
    assert complete("stratactl", "volume", "") == ["list", "inspect"]
    assert complete("stratactl", "vol") == ["volume"]


def test_layer_subcommands(complete, tmp_path):
    assert complete("stratactl", "layer", "") == ["import", "list", "rm"]
    assert complete("stratactl", "lay") == ["layer"]
    archive = tmp_path / "app-v1.tar.gz"
    archive.write_bytes(b"")
    assert complete("stratactl", "layer", "import", "app",
                    str(tmp_path / "app-")) == [str(archive)]


def test_snapshot_subcommands(complete, require_program):
    assert complete("stratactl", "snapshot", "") == ["create", "list", "rm"]
    assert complete("stratactl", "snap") == ["snapshot"]
    assert "--max-entries" in complete("stratactl", "snapshot", "list", "--")
    assert "--from-snapshot" in complete("stratactl", "create-volume", "v", "--")
    # no plugin answers on this endpoint: nothing to offer, no error
    assert complete("stratactl", "--endpoint", "/nonexistent.sock", "snapshot",
                    "rm", "") == []
    assert complete("stratactl", "--endpoint", "/nonexistent.sock",
                    "create-volume", "v", "--from-snapshot", "") == []


def test_a_commands_own_options(complete, require_program):
    ctl = require_program("STRATACTL")
    out = subprocess.run([str(ctl), "stage", "--help"], capture_output=True,
                         text=True).stdout
    own = set(re.findall(r"^  (--[a-z-]+)", out, re.M))
    offered = set(complete("stratactl", "stage", "--"))
    assert own <= offered and "--staging-path" in offered
    assert "--wait" in complete("stratactl", "probe", "--")
    assert "--wait" not in offered


def test_access_modes(complete):
    assert complete("stratactl", "stage", "x", "--access-mode",
                    "SINGLE_NODE_R") == ["SINGLE_NODE_READER_ONLY"]


def test_make_install_puts_it_where_bash_completion_looks(tmp_path, require_tool,
                                                         require_program):
    """Installed from the build tree of $STRATACTL as the Debian package's
    dh_auto_install does (make install into a DESTDIR); test_debian.py
    finds it in the package."""
    require_tool("make", "make")
    build = require_program("STRATACTL").parent
    if not (build / "Makefile").exists():
        pytest.fail(f"no Makefile beside $STRATACTL in {build}")
    r = subprocess.run(["make", "-C", str(build), "-s", "install-dist_bashcompletionDATA",
                        f"DESTDIR={tmp_path}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    found = list(tmp_path.rglob("bash-completion/completions/stratactl"))
    assert len(found) == 1 and found[0].read_text() == SCRIPT.read_text()
