# SPDX-License-Identifier: Apache-2.0
"""The Debian package built from packaging/debian.

The build copies the source tree (tracked and new files, not what
.gitignore names) to a scratch directory with packaging/debian as
debian/, and runs `dpkg-buildpackage -us -uc -b` there with
DEB_BUILD_OPTIONS="nocheck parallel=2" (about 20 s on 2 cores here).
The .deb is then read with dpkg-deb and unpacked into a scratch root with
`dpkg-deb -x`: it is never installed on this machine.

Needs dpkg-dev and debhelper (and the build's libraries, scripts/deps.sh).
The build test is marked slow; the checks of packaging/debian against
scripts/deps.sh and configure.ac are not.

Run: /usr/bin/python3 -m pytest tests/packaging/test_debian.py
"""
import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEBIAN = ROOT / "packaging" / "debian"
PROGRAMS = ["stratafs", "strata-csi", "stratactl"]
MAN_PAGES = ["usr/share/man/man8/stratafs.8.gz", "usr/share/man/man8/strata-csi.8.gz",
             "usr/share/man/man1/stratactl.1.gz"]
UNITS = ["lib/systemd/system/strata-csi.service", "lib/systemd/system/stratafs@.service"]


def upstream_version():
    m = re.search(r"^AC_INIT\(\[strata\], \[([^]]+)\]", (ROOT / "configure.ac").read_text(), re.M)
    return m.group(1)


def package_version():
    first = (DEBIAN / "changelog").read_text().splitlines()[0]
    m = re.match(r"strata \(([^)]+)\) ", first)
    return m.group(1)


def build_depends():
    control = (DEBIAN / "control").read_text()
    m = re.search(r"^Build-Depends:\n((?: .*\n)+)", control, re.M)
    return {re.split(r"[\s(,]", item.strip())[0]
            for item in m.group(1).split(",") if item.strip()}


def deps_sh_packages():
    text = (ROOT / "scripts" / "deps.sh").read_text()
    m = re.search(r"^PKGS=\(\n(.*?)^\)", text, re.M | re.S)
    return set(m.group(1).split())


# --- packaging/debian against the rest of the tree (fast) ---------------

def test_version_matches_configure():
    assert package_version().rsplit("-", 1)[0] == upstream_version()


def test_build_depends_match_deps_sh():
    """The libraries and generators the build needs, as scripts/deps.sh
    lists them, are the package's Build-Depends, both ways."""
    deps = deps_sh_packages()
    # dpkg-dev builds .deb files; build-essential brings it to every
    # package build, so it is no Build-Depends of ours
    build = {p for p in deps if (p.endswith("-dev") and p != "dpkg-dev") or
             p in ("protobuf-c-compiler", "pkg-config")}
    assert "libfuse3-dev" in build and "protobuf-c-compiler" in build
    bd = build_depends()
    assert build - bd == set(), "in scripts/deps.sh, not in Build-Depends"
    assert bd - build - {"debhelper-compat"} == set(), \
        "in Build-Depends, not in scripts/deps.sh"


def test_maintainer_script_sources():
    rules = (DEBIAN / "rules").read_text()
    assert "--with-systemdsystemunitdir=/lib/systemd/system" in rules
    for line in re.findall(r"^\tdh_installsystemd .*$", rules, re.M):
        assert "--no-enable" in line and "--no-start" in line, line
    r = subprocess.run(["sh", "-n", str(DEBIAN / "strata.prerm")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# --- the package --------------------------------------------------------

def source_files():
    """The tree as a checkout has it: tracked files and new ones, not
    build output (.gitignore)."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                        "--exclude-standard"], capture_output=True)
    if r.returncode == 0:
        return [f for f in r.stdout.decode().split("\0") if f]
    pytest.fail("git ls-files failed: the build copies the files git knows")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    for tool, pkg in (("dpkg-buildpackage", "dpkg-dev"), ("dh", "debhelper")):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found: install the Debian package {pkg}")
    status = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", "strata"],
                            capture_output=True, text=True).stdout
    scratch = tmp_path_factory.mktemp("deb")
    src = scratch / "strata"
    for f in source_files():
        if not os.path.lexists(ROOT / f):
            continue                # deleted in the working tree
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f, follow_symlinks=False)
    shutil.rmtree(src / "debian", ignore_errors=True)
    shutil.copytree(DEBIAN, src / "debian", symlinks=True)
    env = {**os.environ, "DEB_BUILD_OPTIONS": "nocheck parallel=2", "LC_ALL": "C.UTF-8"}
    log = scratch / "build.log"
    with open(log, "w") as out:
        r = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, env=env,
                           stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert r.returncode == 0, log.read_text()[-4000:]
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                          text=True).stdout.strip()
    deb = scratch / f"strata_{package_version()}_{arch}.deb"
    assert deb.exists(), sorted(p.name for p in scratch.iterdir())
    root = scratch / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    yield deb, root
    # the package was read and unpacked, never installed
    assert subprocess.run(["dpkg-query", "-W", "-f", "${Status}", "strata"],
                          capture_output=True, text=True).stdout == status


def listing(deb):
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[5].removeprefix("./"): line.split()[0] for line in out.splitlines()}


@pytest.mark.slow
def test_contents(package):
    deb, _ = package
    files = listing(deb)
    for prog in PROGRAMS:
        assert files.get(f"usr/bin/{prog}", "").startswith("-rwxr-xr-x"), prog
    for path in MAN_PAGES + UNITS + ["etc/default/strata-csi",
                                     "usr/share/doc/strata/examples/stratafs-example.conf",
                                     "usr/share/bash-completion/completions/stratactl",
                                     "usr/share/doc/strata/copyright"]:
        assert path in files, f"{path} is not in the package"
    assert "etc/strata/" in files


@pytest.mark.slow
def test_control(package):
    deb, _ = package
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True,
                          check=True).stdout
    assert f"Version: {package_version()}" in info
    depends = re.search(r"^Depends: (.*)$", info, re.M).group(1)
    for lib in ("fuse3", "libfuse3-3", "libgrpc", "libprotobuf-c1"):
        assert lib in depends, f"Depends lacks {lib}: {depends}"
    conffiles = subprocess.run(["dpkg-deb", "-I", str(deb), "conffiles"],
                               capture_output=True, text=True).stdout.split()
    assert conffiles == ["/etc/default/strata-csi"]


@pytest.mark.slow
def test_services_are_not_enabled_or_started(package, tmp_path):
    """postinst: no enable, no start; an upgrade restarts strata-csi only
    if it runs; the stratafs@ template is never touched."""
    deb, _ = package
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path)], check=True)
    scripts = {p.name: p.read_text() for p in tmp_path.iterdir()
               if p.name in ("preinst", "postinst", "prerm", "postrm")}
    all_text = "\n".join(scripts.values())
    assert "stratafs@" not in all_text
    post = scripts["postinst"]
    assert "deb-systemd-invoke try-restart 'strata-csi.service'" in post
    assert not re.search(r"deb-systemd-invoke (start|restart) ", all_text)
    # "enable" only where the admin had enabled it before (was-enabled)
    assert post.count("deb-systemd-helper enable") == 1
    assert re.search(r"was-enabled 'strata-csi.service'; then\s+#.*\n\s+deb-systemd-helper enable",
                     post)
    assert "stop" not in scripts.get("preinst", "")     # never stopped before unpacking
    assert re.search(r'"\$1" = remove .*\n\s+deb-systemd-invoke stop strata-csi.service',
                     scripts["prerm"])
    for name in scripts:
        r = subprocess.run(["sh", "-n", str(tmp_path / name)], capture_output=True, text=True)
        assert r.returncode == 0, f"{name}: {r.stderr}"


@pytest.mark.slow
def test_programs_run_from_the_package(package):
    _, root = package
    version = upstream_version()
    for prog in PROGRAMS:
        r = subprocess.run([str(root / "usr/bin" / prog), "--version"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        # stratafs also prints libfuse's versions, in an order that
        # depends on buffering: look for its own line
        assert f"{prog} {version}" in r.stdout.splitlines(), r.stdout
        r = subprocess.run([str(root / "usr/bin" / prog), "--help"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and "--version" in r.stdout, r.stderr


@pytest.mark.slow
def test_man_pages_from_the_package(package, tmp_path):
    _, root = package
    for page in MAN_PAGES:
        text = gzip.decompress((root / page).read_bytes()).decode()
        th = re.search(r"^\.TH .*$", text, re.M).group(0)
        assert f'"strata {upstream_version()}"' in th, f"version not filled in: {th}"
        assert "@VERSION@" not in text
        plain = tmp_path / Path(page).stem
        plain.write_text(text)
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(plain)],
                           capture_output=True, text=True)
        assert r.returncode == 0 and r.stderr == "", f"{page}: {r.stderr}"


@pytest.mark.slow
def test_units_from_the_package(package):
    _, root = package
    for unit in UNITS:
        text = (root / unit).read_text()
        assert "@bindir@" not in text
        for prog in re.findall(r"(/usr/bin/[\w-]+)", text):
            assert (root / prog.lstrip("/")).exists(), f"{unit}: {prog} not in the package"
    assert "ExecStart=/usr/bin/strata-csi " in (root / UNITS[0]).read_text()
    assert "exec /usr/bin/stratafs -f " in (root / UNITS[1]).read_text()
    default = (root / "etc/default/strata-csi").read_text()
    assert default == (ROOT / "packaging/systemd/strata-csi.default").read_text()
