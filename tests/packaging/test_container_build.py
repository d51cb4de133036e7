# SPDX-License-Identifier: Apache-2.0
"""The container image, without a container engine: the build script the
Containerfile's build stage runs is run here into a scratch DESTDIR, the
installed programs must run, and the runtime stage's package list must
be exactly what their ELF dependencies need (each library mapped to its
Debian package with dpkg -S), so the Containerfile cannot drift from the
binaries.

Needs: the build dependencies (scripts/deps.sh), binutils (objdump),
dpkg. Runs the build (about half a minute), then checks in seconds.
"""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTAINER = REPO / "packaging" / "container"
CONTAINERFILE = CONTAINER / "Containerfile"
PROGRAMS = ("strata-csi", "stratafs", "stratactl")
# Listed runtime packages that are not libraries, and what they are for
# (each must ship that file, and the Containerfile says why).
TOOLS = {"fuse3": "/bin/fusermount3", "util-linux": "/bin/findmnt"}
# Always in a Debian image: never listed, never counted as missing.
IMPLICIT = {"libc6"}


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True,
                          text=True, check=False, **kw)


# ------------------------------------------------------- the Containerfile

def instructions(text):
    """[(INSTRUCTION, arguments)] with continuations joined, comments out."""
    out, cur = [], ""
    for line in text.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def stages(text):
    """[[(INSTRUCTION, args)]] per FROM."""
    result = []
    for ins in instructions(text):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def apt_packages(stage):
    """The packages a stage's RUN lines apt-get install."""
    pkgs = []
    for word, args in stage:
        if word != "RUN":
            continue
        for part in re.split(r"&&|;|\|\|", args):
            tokens = shlex.split(part)
            if "apt-get" in tokens and "install" in tokens:
                after = tokens[tokens.index("install") + 1:]
                pkgs += [t for t in after if not t.startswith("-") and "=" not in t]
    return pkgs


@pytest.fixture(scope="module")
def containerfile():
    return CONTAINERFILE.read_text()


@pytest.fixture(scope="module")
def runtime_packages(containerfile):
    pkgs = apt_packages(stages(containerfile)[-1])
    assert pkgs, "the runtime stage installs no packages?"
    assert len(pkgs) == len(set(pkgs)), f"listed twice: {pkgs}"
    return set(pkgs)


def test_containerfile_shape(containerfile):
    s = stages(containerfile)
    assert len(s) == 2, "want a build stage and a runtime stage"
    args = dict(a.partition("=")[::2] for w, a in instructions(containerfile)
                if w == "ARG" and "=" in a)
    for stage in s:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), image)
        assert re.search(r"debian:bookworm", image), f"FROM {image}: want bookworm"
    build, runtime = s
    assert build[0][1].split()[-2:] == ["AS", "build"]
    runs = [a for w, a in build if w == "RUN"]
    assert any(a.startswith("packaging/container/build.sh /out") for a in runs), runs
    assert ("ENTRYPOINT", '["strata-csi"]') in runtime
    copies = [a for w, a in runtime if w == "COPY"]
    assert copies == ["--from=build /out/usr/bin/ /usr/bin/"], copies
    # The build tools stay in the build stage.
    assert not any(w == "RUN" and "build.sh" in a for w, a in runtime)


def test_build_script_is_the_readmes(containerfile):
    text = (CONTAINER / "build.sh").read_text()
    assert os.access(CONTAINER / "build.sh", os.X_OK)
    for step in ('"$top/scripts/deps.sh"', '"$top/scripts/build.sh"',
                 "install-strip DESTDIR="):
        assert step in text, f"build.sh does not run {step}"


def test_apt_parser():
    st = stages("FROM x AS build\nFROM y\nRUN apt-get update \\\n"
                " && DEBIAN_FRONTEND=noninteractive apt-get install -y \\\n"
                "   --no-install-recommends a b \\\n   c && rm -rf /v\n")
    assert apt_packages(st[-1]) == ["a", "b", "c"]
    assert apt_packages(st[0]) == []


# ----------------------------------------------------- the build, for real

@pytest.fixture(scope="module")
def destdir(tmp_path_factory, require_tool):
    require_tool("make", "make")
    dest = tmp_path_factory.mktemp("destdir")
    build = tmp_path_factory.mktemp("build")
    out = run([CONTAINER / "build.sh", dest, build], timeout=900)
    assert out.returncode == 0, f"build.sh failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return dest


def configure_version():
    m = re.search(r"AC_INIT\(\[[^]]*\],\s*\[([^]]+)\]",
                  (REPO / "configure.ac").read_text())
    return m.group(1)


def test_programs_run(destdir):
    version = configure_version()
    for p in PROGRAMS:
        path = destdir / "usr" / "bin" / p
        assert path.is_file() and os.access(path, os.X_OK), f"{path} not installed"
        out = run([path, "--version"], timeout=10)
        assert out.returncode == 0, f"{p} --version: {out.returncode} {out.stderr}"
        assert f"{p} {version}" in out.stdout + out.stderr, out


# --------------------------------------------- libraries -> Debian packages

def needed(path, require_tool):
    """Direct DT_NEEDED sonames of an ELF file."""
    out = run([require_tool("objdump", "binutils"), "-p", path])
    assert out.returncode == 0, out.stderr
    return re.findall(r"^\s+NEEDED\s+(\S+)$", out.stdout, re.M)


def resolved(path):
    """soname -> path for every library ldd resolves (transitively)."""
    out = run(["ldd", path])
    assert out.returncode == 0, out.stderr
    libs = {}
    for line in out.stdout.splitlines():
        if "not found" in line:
            pytest.fail(f"{path}: {line.strip()}")
        m = re.match(r"^\s*(\S+) => (/\S+)", line) or \
            re.match(r"^\s*((/\S+))\s+\(", line)
        if m:
            libs[os.path.basename(m.group(1))] = m.group(2)
    return libs


def owner(path):
    """The Debian package that ships a file (usrmerge: /lib and /usr/lib)."""
    cands = [path, os.path.realpath(path)]
    for p in list(cands):
        if p.startswith("/usr/"):
            cands.append(p[4:])
        else:
            cands.append("/usr" + p)
    for p in cands:
        out = run(["dpkg", "-S", p])
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                pkg, _, f = line.partition(": ")
                if f == p:
                    return pkg.split(":")[0]
    pytest.fail(f"no Debian package ships {path}")


def installed_packages():
    """name -> (dependency alternatives, provides, priority) of installed
    packages, from dpkg's database."""
    out = run(["dpkg-query", "-W", "-f",
               "${Package}\t${Pre-Depends}, ${Depends}\t${Provides}\t"
               "${Priority}\t${db:Status-Abbrev}\n"])
    pkgs = {}
    for line in out.stdout.splitlines():
        name, deps, provides, prio, status = line.split("\t")
        if not status.startswith("ii"):
            continue
        alts = []
        for d in deps.split(","):
            choice = [re.sub(r"[ (:].*", "", a.strip()) for a in d.split("|")]
            choice = [c for c in choice if c]
            if choice:
                alts.append(choice)
        prov = [re.sub(r"[ (:].*", "", p.strip()) for p in provides.split(",") if p.strip()]
        pkgs[name] = (alts, prov, prio)
    return pkgs


def closure(roots, pkgs):
    """roots and everything apt would pull in for them (installed view)."""
    providers = {}
    for name, (_, prov, _) in pkgs.items():
        for p in prov:
            providers.setdefault(p, []).append(name)
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen or p not in pkgs:
            continue
        seen.add(p)
        for choice in pkgs[p][0]:
            for c in choice:
                real = [c] if c in pkgs else providers.get(c, [])
                if real:
                    todo.append(real[0])
                    break
    return seen


def check_runtime(direct, transitive, listed, pkgs):
    """direct: package -> sonames the programs link to; transitive: package
    -> sonames ldd resolves; listed: the runtime stage's packages. Returns
    the problems."""
    problems = []
    required = set(direct) - IMPLICIT
    libs_listed = {p for p in listed if p not in TOOLS}
    for p in sorted(required - libs_listed):
        problems.append(f"missing from the runtime stage: {p} ({', '.join(sorted(set(direct[p])))})")
    for p in sorted(libs_listed - required):
        problems.append(f"listed but no program links to it: {p}")
    for p in sorted(set(listed) & set(TOOLS)):
        out = run(["dpkg", "-L", p])
        if TOOLS[p] not in out.stdout.split() and \
                "/usr" + TOOLS[p] not in out.stdout.split():
            problems.append(f"{p} does not ship {TOOLS[p]}")
    base = {n for n, (_, _, prio) in pkgs.items() if prio == "required"}
    have = closure(set(listed) | base | IMPLICIT, pkgs)
    for p in sorted(set(transitive) - have):
        problems.append(f"{p} ({', '.join(sorted(set(transitive[p])))}) is neither listed, "
                        "in a minimal Debian image, nor pulled in by a listed package")
    return problems


@pytest.fixture(scope="module")
def dependencies(destdir, require_tool):
    direct, transitive = {}, {}
    for p in PROGRAMS:
        path = destdir / "usr" / "bin" / p
        libs = resolved(path)
        for soname in needed(path, require_tool):
            assert soname in libs, f"{p}: ldd does not resolve {soname}"
            direct.setdefault(owner(libs[soname]), []).append(soname)
        for soname, lib in libs.items():
            transitive.setdefault(owner(lib), []).append(soname)
    return direct, transitive


def test_runtime_packages_are_exactly_the_needed_ones(dependencies, runtime_packages):
    direct, transitive = dependencies
    # The mapping must have found the libraries we know are there.
    assert {"libgrpc29", "libfuse3-3", "libprotobuf-c1"} <= set(direct), direct
    assert check_runtime(direct, transitive, runtime_packages,
                         installed_packages()) == []


def test_runtime_checker_reports(dependencies, runtime_packages):
    direct, transitive = dependencies
    pkgs = installed_packages()
    problems = check_runtime(direct, transitive, runtime_packages - {"libgrpc29"}, pkgs)
    assert any("missing from the runtime stage: libgrpc29" in p for p in problems)
    problems = check_runtime(direct, transitive, runtime_packages | {"libssl3"}, pkgs)
    assert any("listed but no program links to it: libssl3" in p for p in problems)
    problems = check_runtime(direct, dict(transitive, **{"libfoo-nope": ["libfoo.so.1"]}),
                             runtime_packages, pkgs)
    assert any("libfoo-nope" in p for p in problems)
    problems = check_runtime(direct, transitive, runtime_packages | {"fuse3"},
                             pkgs)
    assert not any("fuse3" in p for p in problems)
