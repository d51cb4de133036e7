# SPDX-License-Identifier: Apache-2.0
"""The license: Apache-2.0, stated once in LICENSE, by an SPDX tag at the
top of every source file git tracks, and in the Debian copyright file."""

import os
import subprocess

import pytest

TOP = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
TAG = "SPDX-License-Identifier: Apache-2.0"
# What counts as source: code, build files, scripts, units, man pages,
# manifests. Documentation (*.md) and fuzz seeds (data) do not.
SOURCE_EXT = (".c", ".h", ".py", ".sh", ".proto", ".am", ".ac", ".in",
              ".yaml", ".ini", ".fio", ".inc", ".supp", ".prerm",
              ".default", ".conf")
SOURCE_NAMES = ("Containerfile", "rules", "run", "stratactl")


def tracked():
    r = subprocess.run(["git", "-C", TOP, "ls-files"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.fail(f"git ls-files in {TOP}: {r.stderr}")
    return r.stdout.split()


def is_source(path):
    if path.startswith("fuzz/corpus/") or path.endswith(".md"):
        return False
    return path.endswith(SOURCE_EXT) or os.path.basename(path) in SOURCE_NAMES


def untagged(paths):
    out = []
    for p in paths:
        with open(os.path.join(TOP, p), errors="replace") as f:
            head = [f.readline() for _ in range(3)]
        if not any(TAG in line for line in head):
            out.append(p)
    return out


def test_license_file_is_apache_2():
    with open(os.path.join(TOP, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_every_source_file_is_tagged():
    sources = [p for p in tracked() if is_source(p)]
    assert len(sources) > 150, "the source list lost most of the tree"
    assert untagged(sources) == []


def test_the_check_finds_an_untagged_file(tmp_path):
    (tmp_path / "bare.c").write_text("int x;\n")
    (tmp_path / "tagged.c").write_text(f"// {TAG}\nint x;\n")
    global TOP
    saved, TOP = TOP, str(tmp_path)
    try:
        assert untagged(["bare.c", "tagged.c"]) == ["bare.c"]
    finally:
        TOP = saved


def test_debian_copyright_names_the_license():
    with open(os.path.join(TOP, "packaging", "debian", "copyright")) as f:
        text = f.read()
    assert "unspecified" not in text
    stanzas = [s for s in text.split("\n\n") if s.startswith("Files:")]
    assert stanzas and all("License: Apache-2.0" in s for s in stanzas)
    assert "/usr/share/common-licenses/Apache-2.0" in text
