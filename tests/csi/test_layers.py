# SPDX-License-Identifier: Apache-2.0
"""Layers as objects: `stratactl layer import|list|rm` against a real
plugin (strata.v1.Admin ImportLayer, ListLayers, DeleteLayer), with real
archives written here, and volumes staged over what was imported."""

import errno
import io
import json
import os
import pty
import re
import select
import signal
import stat
import subprocess
import tarfile
import time

import pytest

from csitest import poll, stratactl_binary
from test_stratactl import ctl, ok, parse

MTIME = 1700000000


def entry(name, kind=tarfile.REGTYPE, data=b"", mode=0o644, uid=0, gid=0,
          linkname="", pax=None, devmajor=0, devminor=0):
    """One tar member: its TarInfo and its data."""
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.uid, ti.gid = uid, gid
    ti.mtime = MTIME
    ti.linkname = linkname
    ti.devmajor, ti.devminor = devmajor, devminor
    if pax:
        ti.pax_headers = dict(pax)
    if isinstance(data, str):
        data = data.encode()
    ti.size = len(data) if kind == tarfile.REGTYPE else 0
    return ti, data


def write_tar(path, entries, compression=""):
    """A tar at `path`: "" plain, "gz", or "zst" (through the zstd command)."""
    plain = path + ".plain" if compression == "zst" else path
    mode = "w:gz" if compression == "gz" else "w"
    with tarfile.open(plain, mode, format=tarfile.PAX_FORMAT) as t:
        for ti, data in entries:
            t.addfile(ti, io.BytesIO(data) if ti.size else None)
    if compression == "zst":
        subprocess.run(["zstd", "-q", "-f", "--rm", plain, "-o", path], check=True)
    return path


def read_file(path):
    with open(path) as f:
        return f.read()


def layer_import(p, name, path, **kw):
    return ctl(p, "layer", "import", name, path, **kw)


def failed(r, code):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert f"stratactl: {code}: " in r.stderr, r.stderr
    return r.stderr


def leftovers(p):
    """Whatever layers/ holds besides the fixture's own layers."""
    return sorted(set(os.listdir(p.path("layers"))) - {"base", "extra"})


SAMPLE = [
    entry("etc/", tarfile.DIRTYPE, mode=0o755),
    entry("etc/hello.txt", data="hello\n", mode=0o640, uid=1234, gid=4321),
    entry("bin/", tarfile.DIRTYPE, mode=0o755),
    entry("bin/tool", data="#!/bin/sh\n", mode=0o755),
    entry("bin/link", tarfile.SYMTYPE, linkname="tool"),
]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_import_formats(env, strata, compression):
    path = write_tar(os.path.join(env.base, f"sample.tar{'.' + compression if compression else ''}"),
                     SAMPLE, compression)
    r = ok(layer_import(strata, "sample", path))
    assert r.stdout.startswith("imported layer sample: 5 entries"), r.stdout
    d = strata.path("layers", "sample")
    assert read_file(os.path.join(d, "etc/hello.txt")) == "hello\n"
    st = os.lstat(os.path.join(d, "etc/hello.txt"))
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime)) == \
        (0o640, 1234, 4321, MTIME)
    assert stat.S_IMODE(os.stat(os.path.join(d, "bin/tool")).st_mode) == 0o755
    assert os.readlink(os.path.join(d, "bin/link")) == "tool"
    # the daemons enter it; nothing hidden is left
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert leftovers(strata) == ["sample"]


def test_import_relative_path_and_json(env, strata):
    write_tar(os.path.join(env.base, "rel.tar"), SAMPLE)
    # the plugin reads the path: stratactl makes it absolute from its cwd
    r = subprocess.run([stratactl_binary(), "--endpoint", strata.endpoint,
                        "--json", "layer", "import", "rel", "rel.tar"],
                       cwd=env.base, capture_output=True, text=True, timeout=60)
    j = parse(r)
    assert j["layer"]["name"] == "rel"
    assert int(j["layer"]["entries"]) == 5
    assert int(j["layer"]["size_bytes"]) > 0


def test_whiteouts_hide_lower_entries(env, strata, kubelet):
    """.wh.NAME and .wh..wh..opq become overlayfs' own markers, and a
    volume with the layer over `base` shows the lower entries hidden."""
    path = write_tar(os.path.join(env.base, "wh.tar"), [
        entry(".wh.lower.txt"),
        entry("dir/", tarfile.DIRTYPE, mode=0o755),
        entry("dir/.wh..wh..opq"),
        entry("dir/new.txt", data="new\n"),
        entry("deep/sub/.wh.gone"),
    ])
    ok(layer_import(strata, "wh", path))
    d = strata.path("layers", "wh")
    st = os.lstat(os.path.join(d, "lower.txt"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert os.getxattr(os.path.join(d, "dir"), "trusted.overlay.opaque") == b"y"
    assert stat.S_ISCHR(os.lstat(os.path.join(d, "deep/sub/gone")).st_mode)
    assert not [n for n in os.listdir(d) if n.startswith(".wh.")]
    assert os.listdir(os.path.join(d, "dir")) == ["new.txt"]

    vid = kubelet.create("over-base", layers="wh,base")
    target = kubelet.publish(vid, kubelet.stage(vid))
    names = sorted(os.listdir(target))
    assert "lower.txt" not in names and "big.bin" in names, names
    assert os.listdir(os.path.join(target, "dir")) == ["new.txt"]
    assert read_file(os.path.join(target, "dir/new.txt")) == "new\n"
    # base itself is untouched
    assert os.listdir(strata.path("layers", "base", "dir")) == ["inner.txt"]


def test_links_xattrs_acls_devices(env, strata):
    path = write_tar(os.path.join(env.base, "meta.tar"), [
        entry("data.txt", data="shared\n", pax={
            "SCHILY.xattr.user.color": "blue",
            "SCHILY.xattr.trusted.origin": "tar",
            "SCHILY.acl.access": "user::rw-,user:1234:r--,group::r--,mask::r--,other::r--",
        }),
        entry("alias.txt", tarfile.LNKTYPE, linkname="data.txt"),
        entry("dev/", tarfile.DIRTYPE, mode=0o755),
        entry("dev/null", tarfile.CHRTYPE, mode=0o666, devmajor=1, devminor=3),
        entry("dev/fifo", tarfile.FIFOTYPE, mode=0o600),
    ])
    ok(layer_import(strata, "meta", path))
    d = strata.path("layers", "meta")
    a, b = os.lstat(os.path.join(d, "data.txt")), os.lstat(os.path.join(d, "alias.txt"))
    assert a.st_ino == b.st_ino and a.st_nlink == 2
    assert os.getxattr(os.path.join(d, "data.txt"), "user.color") == b"blue"
    assert os.getxattr(os.path.join(d, "data.txt"), "trusted.origin") == b"tar"
    acl = subprocess.run(["getfacl", "-cn", os.path.join(d, "data.txt")],
                         capture_output=True, text=True, check=True).stdout
    assert "user:1234:r--" in acl, acl
    dev = os.lstat(os.path.join(d, "dev/null"))
    assert stat.S_ISCHR(dev.st_mode) and os.major(dev.st_rdev) == 1 and \
        os.minor(dev.st_rdev) == 3
    assert stat.S_ISFIFO(os.lstat(os.path.join(d, "dev/fifo")).st_mode)


def hostile_cases(outside):
    """(name, entries, the entry the error must name) per hostile tar;
    each aims at `outside`, a directory beside the store."""
    return {
        "dotdot": ([entry("ok.txt", data="fine\n"),
                    entry("../../../outside/escape.txt", data="pwned\n")],
                   "../../../outside/escape.txt"),
        "inner-dotdot": ([entry("a/../../outside/escape.txt", data="pwned\n")],
                         "a/../../outside/escape.txt"),
        "absolute": ([entry(outside + "/abs.txt", data="pwned\n")],
                     outside + "/abs.txt"),
        "symlink": ([entry("link", tarfile.SYMTYPE, linkname=outside),
                     entry("link/through.txt", data="pwned\n")],
                    "link/through.txt"),
        "symlink-whiteout": ([entry("link", tarfile.SYMTYPE, linkname=outside),
                              entry("link/.wh.victim")],
                             "link/.wh.victim"),
        "hardlink-absolute": ([entry("hl", tarfile.LNKTYPE,
                                     linkname=outside + "/victim")],
                              "hl"),
        "hardlink-symlink": ([entry("link", tarfile.SYMTYPE, linkname=outside),
                              entry("hl", tarfile.LNKTYPE, linkname="link/victim")],
                             "hl"),
        "hardlink-dotdot": ([entry("hl", tarfile.LNKTYPE,
                                   linkname="../../../outside/victim")],
                            "hl"),
        "overlay-xattr": ([entry("f", data="x", pax={
            "SCHILY.xattr.trusted.overlay.redirect": "/etc"})], "f"),
    }


@pytest.mark.parametrize("case", sorted(hostile_cases("/x")))
def test_hostile_tar_refused(env, strata, case):
    outside = os.path.join(env.base, "outside")
    os.makedirs(outside)
    with open(os.path.join(outside, "victim"), "w") as f:
        f.write("victim\n")
    before = sorted(os.listdir(outside))
    entries, named = hostile_cases(outside)[case]
    path = write_tar(os.path.join(env.base, f"{case}.tar"), entries)
    err = failed(layer_import(strata, "evil", path), "INVALID_ARGUMENT")
    assert f"entry '{named}'" in err and "nothing was imported" in err, err
    assert sorted(os.listdir(outside)) == before
    assert os.stat(os.path.join(outside, "victim")).st_nlink == 1
    assert read_file(os.path.join(outside, "victim")) == "victim\n"
    assert not os.path.exists(os.path.join(env.base, "escape.txt"))
    assert leftovers(strata) == []
    # the store still imports
    ok(layer_import(strata, "evil", write_tar(os.path.join(env.base, "good.tar"), SAMPLE)))


def test_import_bad_input(env, strata):
    good = write_tar(os.path.join(env.base, "good.tar"), SAMPLE)
    for name in ("../up", ".hidden", "a/b", "_under", "x" * 129):
        err = failed(layer_import(strata, name, good), "INVALID_ARGUMENT")
        assert f"layer name '{name[:128]}' is malformed" in err, err
    missing = os.path.join(env.base, "missing.tar")
    err = failed(layer_import(strata, "m", missing), "NOT_FOUND")
    assert missing in err, err
    err = failed(layer_import(strata, "d", env.base), "INVALID_ARGUMENT")
    assert "not a regular file" in err, err

    notar = os.path.join(env.base, "notes.txt")
    with open(notar, "w") as f:
        f.write("not an archive\n" * 100)
    err = failed(layer_import(strata, "n", notar), "INVALID_ARGUMENT")
    assert "is not a tar archive" in err, err

    big = write_tar(os.path.join(env.base, "big.tar.gz"),
                    [entry("blob", data=os.urandom(256 * 1024))], "gz")
    cut = os.path.join(env.base, "cut.tar.gz")
    with open(big, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:100 * 1024])
    err = failed(layer_import(strata, "cut", cut), "INVALID_ARGUMENT")
    assert "damaged or truncated" in err and "'blob'" in err, err
    assert leftovers(strata) == []

    ok(layer_import(strata, "once", good))
    err = failed(layer_import(strata, "once", good), "ALREADY_EXISTS")
    assert "layer once already exists" in err, err
    err = failed(layer_import(strata, "base", good), "ALREADY_EXISTS")
    assert leftovers(strata) == ["once"]


def test_list_and_rm(env, strata, kubelet):
    ok(layer_import(strata, "app", write_tar(os.path.join(env.base, "a.tar"), SAMPLE)))
    vid = kubelet.create("uses-app", layers="app,base")

    r = ok(ctl(strata, "layer", "list"))
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["LAYER", "SIZE", "ENTRIES", "VOLUMES"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert sorted(rows) == ["app", "base", "extra"]
    assert rows["app"][2] == "5" and rows["app"][3] == vid
    assert rows["base"][3] == vid and rows["extra"][3] == "-"
    j = parse(ctl(strata, "layer", "list", as_json=True))
    by = {x["name"]: x for x in j["layers"]}
    assert by["app"]["volumes"] == [vid] and int(by["app"]["entries"]) == 5
    assert "volumes" not in by["extra"] or by["extra"]["volumes"] == []

    err = failed(ctl(strata, "layer", "rm", "app"), "FAILED_PRECONDITION")
    assert f"layer app is used by 1 volume ({vid})" in err, err
    assert os.path.isdir(strata.path("layers", "app"))

    kubelet.delete(vid)
    r = ok(ctl(strata, "layer", "rm", "app"))
    assert r.stdout == "removed layer app\n"
    assert leftovers(strata) == []
    err = failed(ctl(strata, "layer", "rm", "app"), "NOT_FOUND")
    assert "layer app: no such layer" in err
    failed(ctl(strata, "layer", "rm", "../base"), "INVALID_ARGUMENT")
    assert os.path.isdir(strata.path("layers", "base"))


def test_crash_mid_import_leaves_no_layer(env, strata):
    """A plugin killed between the extraction and the rename: no layer of
    that name, and the hidden directory is gone after the restart."""
    path = write_tar(os.path.join(env.base, "s.tar"), SAMPLE)
    root = strata.root
    assert strata.stop() == 0
    p = env.plugin(root=root, environ={"STRATA_CSI_KILL_AT": "layer-import-extracted"})
    r = layer_import(p, "crash", path)
    assert r.returncode == 1
    p.proc.wait(10)
    assert not os.path.exists(os.path.join(root, "layers", "crash"))
    assert [n for n in os.listdir(os.path.join(root, "layers"))
            if n.startswith(".import-crash-")]
    p.environ.pop("STRATA_CSI_KILL_AT")
    p.start()
    assert sorted(os.listdir(os.path.join(root, "layers"))) == ["base", "extra"]
    ok(layer_import(p, "crash", path))
    assert json.dumps(parse(ctl(p, "layer", "list", as_json=True))).count('"crash"') == 1


def import_request(name, path):
    """ImportLayerRequest's wire bytes: stratactl always sends an
    absolute path, so the plugin's own checks are reached this way."""
    out = b""
    for tag, s in ((0x0a, name), (0x12, path)):
        b = s.encode()
        if b:
            out += bytes([tag, len(b)]) + b
    return out


def test_import_path_checks_over_the_wire(env, strata):
    call = "/strata.v1.Admin/ImportLayer"
    r = strata.csi.call_path(call, b"")
    assert r.code == "INVALID_ARGUMENT" and "layer name '' is malformed" in r.details, r
    r = strata.csi.call_path(call, import_request("app", ""))
    assert r.code == "INVALID_ARGUMENT" and "path is required" in r.details, r
    r = strata.csi.call_path(call, import_request("app", "app.tar"))
    assert r.code == "INVALID_ARGUMENT" and \
        "path 'app.tar' is not absolute" in r.details, r
    r = strata.csi.call_path("/strata.v1.Admin/DeleteLayer", b"")
    assert r.code == "INVALID_ARGUMENT" and "layer name '' is malformed" in r.details, r
    # a Controller-only plugin serves no node calls, these among them
    c = env.plugin(root=env.layered_root("croot"), mode="controller",
                   sock=os.path.join(env.base, "c.sock"))
    r = c.csi.call_path(call, import_request("app", "/x.tar"))
    assert r.code == "UNIMPLEMENTED", r
    assert leftovers(strata) == []


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
def test_plugin_killed_mid_extraction(env, strata):
    """The extracting child dies with the plugin: it neither goes on
    writing into the hidden directory, nor keeps the store's lock from
    the next plugin (which sweeps what it left), nor holds the caller's
    connection open (it inherited the plugin's sockets)."""
    blob = os.path.join(env.base, "blob")
    with open(blob, "wb") as f:
        # zeros: a few KiB compressed, and about 3 s to extract, which a
        # child that outlived the plugin would go on doing
        f.truncate(3 << 30)
    path = os.path.join(env.base, "big.tar.zst")
    subprocess.run(["tar", "--zstd", "-C", env.base, "-cf", path, "blob"], check=True)
    os.unlink(blob)
    imp = subprocess.Popen([stratactl_binary(), "--endpoint", strata.endpoint,
                            "layer", "import", "big", path],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    layers = strata.path("layers")

    def extracting():
        tmp = [n for n in os.listdir(layers) if n.startswith(".import-big-")]
        return tmp and os.path.exists(os.path.join(layers, tmp[0], "blob"))
    poll(extracting, timeout=30, what="the extraction to start")
    kids = children(strata.proc.pid)
    assert kids, "no extracting child"
    strata.proc.send_signal(9)  # the plugin alone, not its process group
    strata.proc.wait(10)
    poll(lambda: not any(running(k) for k in kids), timeout=0.5,
         what="the child to die with the plugin")
    # the child held the call's connection too: stratactl hears at once
    assert imp.wait(5) == 1
    strata.start()
    assert sorted(os.listdir(layers)) == ["base", "extra"]


def zeros_archive(env, name, size):
    """A tar.zst of one file of `size` zero bytes: a few KiB, seconds
    to extract."""
    blob = os.path.join(env.base, "blob")
    with open(blob, "wb") as f:
        f.truncate(size)
    path = os.path.join(env.base, name)
    subprocess.run(["tar", "--zstd", "-C", env.base, "-cf", path, "blob"], check=True)
    os.unlink(blob)
    return path


@pytest.mark.timeout(120)
def test_import_blocks_no_other_layer_call(env, strata, kubelet):
    """No lock is held while an archive extracts: another import of the
    same name finishes first and wins (the slow one then answers
    ALREADY_EXISTS), a removal and a CreateVolume go through at once."""
    big = zeros_archive(env, "big.tar.zst", 3 << 30)
    slow = subprocess.Popen([stratactl_binary(), "--endpoint", strata.endpoint,
                             "layer", "import", "app", big],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    layers = strata.path("layers")
    poll(lambda: [n for n in os.listdir(layers) if n.startswith(".import-app-")],
         timeout=30, what="the slow import to start")
    t0 = time.monotonic()
    ok(layer_import(strata, "app", write_tar(os.path.join(env.base, "s.tar"), SAMPLE)))
    ok(ctl(strata, "layer", "rm", "extra"))
    kubelet.create("while-importing", layers="app,base")
    assert time.monotonic() - t0 < 1.5, "a layer call waited for an extraction"
    assert slow.poll() is None, "the slow import ended before the others ran"
    out, err = slow.communicate(timeout=60)
    assert slow.returncode == 1 and "ALREADY_EXISTS: layer app already exists" in err, err
    assert sorted(os.listdir(layers)) == ["app", "base"]
    assert read_file(os.path.join(layers, "app", "etc/hello.txt")) == "hello\n"


def import_read(strata):
    """How much of the archive the import of "big" has read so far."""
    j = parse(ctl(strata, "layer", "list", as_json=True))
    return sum(int(i.get("done_bytes", 0)) for i in j["importing"] if i["name"] == "big")


@pytest.mark.timeout(180)
def test_import_progress(env, strata):
    """While an archive extracts, ListLayers lists the import with how much
    of the archive the plugin has read, and `layer import` on a terminal
    shows it in its progress line."""
    blob = os.path.join(env.base, "blob")
    with open(blob, "wb") as f:
        f.truncate(512 << 20)
    # plain tar: its bytes are read as they extract, not all at once
    path = os.path.join(env.base, "big.tar")
    subprocess.run(["tar", "-C", env.base, "-cf", path, "blob"], check=True)
    os.unlink(blob)
    size = os.path.getsize(path)
    master, slave = pty.openpty()
    imp = subprocess.Popen([stratactl_binary(), "--endpoint", strata.endpoint,
                            "layer", "import", "big", path],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=slave)
    os.close(slave)
    layers = strata.path("layers")
    stopped = []
    try:
        # stopped only once it has read something: stopped before its
        # first read, it would rightly show nothing read
        poll(lambda: [n for n in os.listdir(layers) if n.startswith(".import-big-")]
             and children(strata.proc.pid) and import_read(strata) > 0,
             timeout=30, what="the extraction to read")
        stopped = children(strata.proc.pid)
        for k in stopped:
            os.kill(k, signal.SIGSTOP)
        j = parse(ctl(strata, "layer", "list", as_json=True))
        assert [i["name"] for i in j["importing"]] == ["big"]
        im = j["importing"][0]
        assert int(im["total_bytes"]) == size
        assert 0 < int(im["done_bytes"]) <= size
        assert "big" not in [l["name"] for l in j["layers"]]
        rows = ok(ctl(strata, "layer", "list")).stdout.splitlines()
        assert re.fullmatch(r"big +importing: \S+ of 512\.\dMi read", rows[-1]), rows
        # the line refreshes once a second: two and a half seconds show it
        out = b""
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    out += os.read(master, 4096)
                except OSError as e:
                    # EIO: stratactl has closed the terminal; what it
                    # wrote before is all there is to check
                    if e.errno != errno.EIO:
                        raise
                    break
        text = out.decode(errors="replace")
        assert re.search(r"layer import big: extracting in the plugin, "
                         r"\S+ of 512\.\dMi read \(\d+%\) \(\d+s\)", text), text
    finally:
        for k in stopped:
            os.kill(k, signal.SIGCONT)
    assert imp.wait(120) == 0
    os.close(master)
    j = parse(ctl(strata, "layer", "list", as_json=True))
    assert j["importing"] == [] and "big" in [l["name"] for l in j["layers"]]
