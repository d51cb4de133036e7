# SPDX-License-Identifier: Apache-2.0
"""The code blocks of README.md, docs/*.md and the man pages' EXAMPLES, and
how each is checked.

Every fenced block is one of:

* ``script``  -- a ```` ```sh ```` block: run as written, in order with the
  page's other blocks, in one shell (so `export` and `&` carry over); it
  passes when no command in it fails (bash's ERR trap: set -e's rules).
* ``session`` -- a block whose lines start with ``$ ``: each command runs
  as written, and what it prints (stdout and stderr, as a terminal shows
  them) must have the shape of the lines shown under it (see ``shape``).
* ``fstab``   -- a block marked ``<!-- doctest: fstab MOUNTPOINT -->``:
  the line goes into a scratch fstab, and ``mount --fstab`` must mount
  MOUNTPOINT from it, as `mount MOUNTPOINT` would (it stays mounted).
* ``text``    -- anything else (a synopsis, a layout, YAML, an fstab line
  not marked): nothing to run.
* ``skip``    -- a block marked ``<!-- doctest: skip REASON -->`` right
  above its fence: it cannot run here (kubectl needs a cluster, systemctl
  a systemd), and REASON says so. A marker without a reason, or on a
  block that would not run anyway, is an error: the list of what is not
  run stays short and honest.

A man page's examples are its ``.EX``/``.EE`` blocks under ``.SH EXAMPLES``,
read as ```` ```sh ```` blocks once roff's escapes are undone; a roff
comment ``.\\" doctest: skip REASON`` (or ``fstab MOUNTPOINT``) right above
``.EX`` marks one as above.

A page's blocks run inside a private mount namespace with fresh tmpfs on
the directories the docs use (/srv, /run, /var/lib, /mnt, and
/usr/local/bin holding the programs as `make install` puts them), so they
run exactly as written, paths and all, and leave nothing behind.
"""

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(
    str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")) + sorted(
    str(p.relative_to(REPO)) for p in (REPO / "man").glob("*.in"))

# The directories a page may write to: each a fresh tmpfs for the page.
SCRATCH = ["/srv", "/run", "/var/lib", "/mnt", "/usr/local/bin"]
PAGE_TIMEOUT = 180

MARKER = re.compile(r"^<!--\s*doctest:\s*(\w+)\s*(.*?)\s*-->\s*$")
ROFF_MARKER = re.compile(r'^\.\\"\s*doctest:\s*(\w+)\s*(.*?)\s*$')
# roff's escapes as the man pages use them, and what they print
ROFF_ESCAPES = [("\\-", "-"), ("\\e", "\\"), ("\\(aq", "'"),
                ("\\(dq", '"'), ("\\&", "")]
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


@dataclass
class Block:
    page: str
    line: int           # of the opening fence, 1-based
    lang: str
    text: str
    kind: str
    arg: str = ""       # the skip reason, or the fstab mountpoint
    commands: list = field(default_factory=list)  # session: (cmd, [expected])

    @property
    def id(self):
        return f"{self.page}:{self.line}"


class DocError(Exception):
    """A block the rules above cannot place: a marker without a reason."""


def parse_session(text):
    """[(command, [expected lines])] of a session block; `\\` continues."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if out:
                out[-1][1].append(line)
            elif line.strip():
                raise DocError(f"output before the first '$ ' command: {line!r}")
            i += 1
            continue
        cmd = line[2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd += "\n" + lines[i]
        out.append((cmd, []))
        i += 1
    for _, expected in out:
        while expected and not expected[-1].strip():
            expected.pop()
    return out


def _roff_markdown(src):
    """A man page's EXAMPLES as the markdown the rules above read: each
    .EX/.EE block a ```sh fence, its marker comment an HTML one; one line
    for each of the page's, so that a block's id names its real line."""
    out, section, inside = [], "", False
    for line in src:
        if line.startswith(".SH "):
            section = line[4:].strip()
        m = ROFF_MARKER.match(line)
        if section != "EXAMPLES":
            line = ""
        elif line.strip() in (".EX", ".EE"):
            inside = line.strip() == ".EX"
            line = "```sh" if inside else "```"
        elif inside:
            for esc, plain in ROFF_ESCAPES:
                line = line.replace(esc, plain)
        elif m:
            line = f"<!-- doctest: {m.group(1)} {m.group(2)} -->"
        else:
            # prose between examples: keeps a marker off a later block
            line = ""
        out.append(line)
    return out


def blocks(page):
    """Every fenced block of a page, classified."""
    src = (REPO / page).read_text().split("\n")
    if page.startswith("man/"):
        src = _roff_markdown(src)
    found = []
    i = 0
    while i < len(src):
        m = FENCE.match(src[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(src) and src[j].strip() != "```":
            j += 1
        body = "\n".join(l[len(indent):] if l.startswith(indent) else l
                         for l in src[i + 1:j])
        marker = MARKER.match(src[i - 1].strip()) if i else None
        b = Block(page, i + 1, lang, body, "text")
        is_session = any(l.startswith("$ ") for l in body.split("\n"))
        if marker:
            b.kind, b.arg = marker.group(1), marker.group(2)
            if b.kind == "skip" and not b.arg:
                raise DocError(f"{b.id}: 'doctest: skip' needs a reason")
            if b.kind == "skip" and not (lang == "sh" or is_session):
                raise DocError(f"{b.id}: 'doctest: skip' on a block that "
                               "is not run anyway")
            if b.kind == "fstab" and not b.arg.startswith("/"):
                raise DocError(f"{b.id}: 'doctest: fstab' needs the mountpoint")
            if b.kind not in ("skip", "fstab"):
                raise DocError(f"{b.id}: unknown marker 'doctest: {b.kind}'")
        elif is_session:
            b.kind = "session"
            b.commands = parse_session(body)
        elif lang == "sh":
            b.kind = "script"
        found.append(b)
        i = j + 1
    return found


# ---- output shapes --------------------------------------------------------

# volume (sv-) and snapshot (ss-) ids
_ID = re.compile(r"(s[sv])-[0-9a-f]{32}")
_ID_SHOWN = re.compile(r"(s[sv])-[0-9a-f]*\.\.\.")
_NUM = re.compile(r"\d+(\.\d+)?")


def _norm(line, shown):
    line = _ID.sub(r"\1-ID", line)
    if shown:
        line = _ID_SHOWN.sub(r"\1-ID", line)
    line = _NUM.sub("N", line)
    return " ".join(line.split())


def shape_matches(expected, actual):
    """Whether `actual` lines have the shape of `expected`: volume and
    snapshot ids (sv-5f0c..., ss-7e21... in the docs) and numbers may differ, runs of blanks
    are one, and `...` left in an expected line stands for anything.
    Returns (ok, why)."""
    act = [l for l in actual if l.strip() or expected]
    while act and not act[-1].strip():
        act.pop()
    if len(act) != len(expected):
        return False, (f"{len(expected)} lines shown, {len(act)} printed")
    for n, (e, a) in enumerate(zip(expected, act), 1):
        pat = re.escape(_norm(e, True)).replace(re.escape("..."), ".*")
        if not re.fullmatch(pat, _norm(a, False)):
            return False, f"line {n}: shown {e!r}, printed {a!r}"
    return True, ""


# ---- running a page -------------------------------------------------------

PRELUDE = r"""

R=%(results)s
for d in %(scratch)s; do
    mkdir -p "$d" 2>/dev/null
    mount -t tmpfs -o mode=0755 docs-scratch "$d" || exit 97
done
# the programs where `make install` puts them, and first on PATH
cp %(bins)s /usr/local/bin/ || exit 98
export PATH=/usr/local/bin:$PATH
cd "$R/cwd"
__rc=0
"""

# Everything a page started ends with it: its FUSE mounts (below the
# scratch directories: the namespace's copies of other mounts are left
# alone) are detached, so their daemons exit, and every process left in
# this namespace is killed.
EPILOGUE = r"""
trap - ERR
exec >/dev/null 2>&1
for t in $(jobs -p); do kill "$t"; done
sleep 0.5
awk '$3 ~ /^fuse/ {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    m=$(printf '%%b' "$m")
    for d in %(scratch)s; do
        case $m in "$d"/*) umount -l "$m" ;; esac
    done
done
me=$(readlink /proc/$$/ns/mnt)
for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$$" ] && continue
    [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$me" ] && kill -9 "${p#/proc/}"
done
exit 0
"""


def _script(page_blocks, results, bins):
    parts = [PRELUDE % {"results": shlex.quote(str(results)),
                        "scratch": " ".join(SCRATCH),
                        "bins": " ".join(shlex.quote(str(b)) for b in bins)}]
    for n, b in enumerate(page_blocks):
        tag = f'"$R/{n}'
        if b.kind == "script":
            parts.append(
                f"trap 'echo \"$BASH_COMMAND\" >> {tag}.failed\"' ERR\n"
                f"{{\n{b.text}\n}} > {tag}.out\" 2>&1 < /dev/null\n"
                "trap - ERR\n")
        elif b.kind == "session":
            for k, (cmd, _) in enumerate(b.commands):
                parts.append(
                    f"( exit $__rc ); {{\n{cmd}\n}} > {tag}.{k}.out\" 2>&1 "
                    f"< /dev/null; __rc=$?\n")
        elif b.kind == "fstab":
            mnt = shlex.quote(b.arg)
            parts.append(
                f"printf '%s\\n' {shlex.quote(b.text)} > {tag}.fstab\"\n"
                f"{{ mount --fstab {tag}.fstab\" {mnt} && "
                f"mountpoint {mnt}; }} > {tag}.out\" 2>&1 "
                f"|| echo \"mount --fstab: $?\" >> {tag}.failed\"\n")
    parts.append(EPILOGUE % {"scratch": " ".join(SCRATCH)})
    return "\n".join(parts)


def run_page(page, results, bins):
    """Runs the page's blocks; returns {block index: result dict}."""
    page_blocks = blocks(page)
    (results / "cwd").mkdir(parents=True, exist_ok=True)
    script = results / "page.sh"
    script.write_text(_script(page_blocks, results, bins))
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=PAGE_TIMEOUT)
    if proc.returncode in (97, 98):
        raise RuntimeError(f"{page}: setting up the scratch root failed:\n"
                           f"{proc.stdout}")
    out = {}
    for n, b in enumerate(page_blocks):
        def read(name):
            p = results / f"{n}{name}"
            return p.read_text(errors="replace") if p.exists() else None
        if b.kind == "session":
            out[n] = {"outputs": [read(f".{k}.out") or ""
                                  for k in range(len(b.commands))]}
        else:
            out[n] = {"output": read(".out") or "", "failed": read(".failed")}
    return page_blocks, out
