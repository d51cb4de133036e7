# SPDX-License-Identifier: Apache-2.0
"""The man pages render cleanly and document every option the programs take.

Each page is built from one source, man/<page>.in, by make (the version
filled in). These tests fill the version in the same way, render each
page with groff and man, and hold it against the program's --help (and,
for stratactl, every command's --help): an option, -o option or command
the program lists and its page does not name fails the test, so pages
and binaries cannot drift apart.

The programs come from $STRATAFS, $STRATA_CSI and $STRATACTL (absolute
paths to built binaries); the tests fail when one is unset.

Run: STRATAFS=... STRATA_CSI=... STRATACTL=... /usr/bin/python3 -m pytest tests/packaging/test_man.py
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANDIR = ROOT / "man"

# page -> (environment variable naming the program, sections the page must have)
PAGES = {
    "stratafs.8": ("STRATAFS", ["FILES"]),
    "strata-csi.8": ("STRATA_CSI", ["FILES", "ENVIRONMENT"]),
    "stratactl.1": ("STRATACTL", ["COMMANDS", "ENVIRONMENT"]),
}
SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS",
            "EXAMPLES", "SEE ALSO"]


def program(var):
    path = os.environ.get(var)
    if not path:
        pytest.fail(f"${var} is not set: point it at the built program "
                    f"(e.g. {var}=build/{var.lower().replace('_', '-')})")
    if not os.access(path, os.X_OK):
        pytest.fail(f"${var}={path} is not an executable")
    return path


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{argv}: exit {r.returncode}: {r.stderr}"
    return r.stdout


def version(prog):
    """From the line "stratafs 0.1.0": stratafs also prints libfuse's
    versions, before or after its own depending on buffering."""
    name = os.path.basename(prog)
    out = run([prog, "--version"])
    m = re.search(rf"^{re.escape(name)} (\S+)$", out, re.M)
    assert m, f"{prog} --version: no line '{name} VERSION' in {out!r}"
    return m.group(1)


def build_page(page, tmp_path):
    """What make does: the source with @VERSION@ filled in."""
    prog = program(PAGES[page][0])
    src = (MANDIR / f"{page}.in").read_text()
    out = tmp_path / page
    out.write_text(src.replace("@VERSION@", version(prog)))
    return out


def page_text(source):
    """The words of a man(7) source as a reader sees them: escapes and
    font changes dropped. Checked on the source, not the rendering, so
    that hyphenation at a line's end cannot split an option."""
    lines = [l for l in source.splitlines() if not l.startswith('.\\"')]
    text = "\n".join(lines)
    for esc, plain in (("\\-", "-"), ("\\(aq", "'"), ("\\e", "\\"),
                       ("\\c", ""), ("\\&", ""), ("\\%", "")):
        text = text.replace(esc, plain)
    return re.sub(r"\\f(\[[A-Z]*\]|[BIRP])", "", text)


LONG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SHORT = re.compile(r"(?<![\w-])-[A-Za-z](?![\w-])")
MOUNT_OPT = re.compile(r"^\s*-o ([a-z_]+)", re.M)
COMMANDS = re.compile(r"^Commands:\n((?:  \S.*\n)+)", re.M)


def help_items(help_text):
    """Everything a --help text offers: long and short options, -o
    options (as 'name'), and commands listed under 'Commands:'."""
    items = set(LONG.findall(help_text)) | set(SHORT.findall(help_text))
    items |= {f"-o {name}" for name in MOUNT_OPT.findall(help_text)}
    m = COMMANDS.search(help_text)
    if m:
        items |= {f"command {line.split()[0]}" for line in m.group(1).splitlines()}
    return items


def missing(help_text, page):
    """The items of help_text that the page (its text) never names."""
    def named(item):
        word = item.split(" ", 1)[1] if " " in item else item
        return re.search(r"(?<![\w-])" + re.escape(word) + r"(?![\w-])", page)
    return sorted(i for i in help_items(help_text) if not named(i))


def full_help(page):
    prog = program(PAGES[page][0])
    text = run([prog, "--help"])
    if page == "stratactl.1":
        for item in sorted(help_items(text)):
            if item.startswith("command "):
                text += run([prog, item.split()[1], "--help"])
    return text


@pytest.mark.parametrize("page", sorted(PAGES))
def test_renders_without_warnings(page, tmp_path):
    built = build_page(page, tmp_path)
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(built)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    if shutil.which("man"):
        r = subprocess.run(["man", "--warnings", "-l", str(built)],
                           capture_output=True, text=True,
                           env={**os.environ, "MANWIDTH": "80", "MANPAGER": "cat",
                                "PAGER": "cat"})
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "SYNOPSIS" in r.stdout
        name, section = page.rsplit(".", 1)
        assert f"{name.upper()}({section})" in r.stdout
        assert version(program(PAGES[page][0])) in r.stdout


@pytest.mark.parametrize("page", sorted(PAGES))
def test_has_sections(page):
    source = (MANDIR / f"{page}.in").read_text()
    heads = re.findall(r'^\.SH "?([A-Z ]+?)"?$', source, re.M)
    for section in SECTIONS + PAGES[page][1]:
        assert section in heads, f"{page}: no {section} section"
    assert re.search(r"^\.TH \S+ " + page.rsplit(".", 1)[1] + " .*@VERSION@", source,
                     re.M), f"{page}: .TH must carry the section and @VERSION@"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_option_is_documented(page):
    help_text = full_help(page)
    items = help_items(help_text)
    # the checker found the options at all (a changed --help layout
    # must not make this test pass vacuously)
    assert "--help" in items and "--version" in items
    if page == "stratafs.8":
        assert {"-o lowerdir", "-o upperdir", "-o workdir", "-f"} <= items
    if page == "stratactl.1":
        assert {"command stage", "--staging-path", "--layers"} <= items
    source = (MANDIR / f"{page}.in").read_text()
    gaps = missing(help_text, page_text(source))
    assert not gaps, f"{page} does not document: {', '.join(gaps)}"


def test_checker_catches_a_missing_option():
    """The checker itself: an option, -o option or command the help
    lists and the page lacks is reported."""
    page = page_text(r""".TH X 8
.SH OPTIONS
.TP
.BI \-\-root " dir"
.TP
.B \-\-max\-volumes\-per\-node
.TP
.BI "\-o lowerdir=" dir
.TP
.B \-f
.SH COMMANDS
.B stage
""")
    help_text = """usage: x [options]
  --root DIR
  --max-volumes N
  -f
  -v N
    -o lowerdir=L1:L2   layers
    -o io=uring|sync    engine
Commands:
  stage    mount it
  unstage  unmount it
"""
    # --max-volumes is named only as part of a longer option, which does
    # not count; -v, io= and unstage are not named at all
    assert missing(help_text, page) == ["--max-volumes", "-o io", "-v",
                                        "command unstage"]


def test_checker_catches_an_option_removed_from_a_real_page():
    help_text = full_help("strata-csi.8")
    source = (MANDIR / "strata-csi.8.in").read_text()
    assert missing(help_text, page_text(source)) == []
    cut = "\n".join(l for l in source.splitlines() if "max\\-volumes" not in l)
    assert missing(help_text, page_text(cut)) == ["--max-volumes"]
