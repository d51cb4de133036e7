# SPDX-License-Identifier: Apache-2.0
"""Lower hard links in the kernel's index format (issue 12): the origin
xattr holds the lower file's handle, the copy lives in WORKDIR/index
under that handle in hex, and the kernel (index=on) and stratafs read
each other's uppers identically through every name, both ways. With
index=off, stratafs reads the kernel's upper as the kernel does. Uppers
of the older WORKDIR/strata-index layout are converted at mount."""

import os
import shutil
import struct

from stratatest import build_tree, read_bytes, snapshot_upper

LOWER = {"a": "shared", "d/b": ("hardlink", "a"), "d/c": ("hardlink", "a"),
         "d/other": "o", "solo": "s"}
NAMES = ["a", "d/b", "d/c"]


def view(m, names):
    """Per name: content and link count, and which names share an inode."""
    out, inos = {}, {}
    for n in names:
        p = os.path.join(m, n)
        if not os.path.lexists(p):
            out[n] = None
            continue
        st = os.stat(p)
        out[n] = (read_bytes(p), st.st_nlink)
        inos.setdefault(st.st_ino, []).append(n)
    return out, sorted(sorted(v) for v in inos.values())


def index_entries(work):
    d = os.path.join(work, "index")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def nlink_of(path):
    """The union's count an index entry stores, decoded."""
    v = os.getxattr(path, "trusted.overlay.nlink").decode()
    assert v[0] == "U", v
    return os.stat(path).st_nlink + int(v[1:])


def make(make_union, kind, lower, upper, work, index):
    f = make_union(kind)
    opts = {"kernel_opts": ["index=on" if index else "index=off"]}
    return f.make(lowers=[{}], layer_dirs=[lower], upper_dir=upper,
                  work_dir=work, **(opts if kind == "kernel" else {}))


def layers(make_union, name="x"):
    base = make_union("kernel").new_dir(name)
    lower = os.path.join(base, "lower")
    build_tree(lower, LOWER)
    return lower, os.path.join(base, "upper"), os.path.join(base, "work")


def test_index_entry_as_the_kernel_makes_it(make_union):
    lower, _, _ = layers(make_union)
    us = {}
    for kind in ("kernel", "stratafs"):
        base = make_union(kind).new_dir("own")
        u = make(make_union, kind, lower, os.path.join(base, "upper"),
                 os.path.join(base, "work"), True)
        with open(u.path("a"), "a") as f:
            f.write("+")
        us[kind] = u
    k, s = us["kernel"], us["stratafs"]
    assert index_entries(k.work) == index_entries(s.work) != []
    name = index_entries(s.work)[0]
    ke, se = (os.path.join(u.work, "index", name) for u in (k, s))
    assert (os.getxattr(se, "trusted.overlay.origin") ==
            os.getxattr(ke, "trusted.overlay.origin") == bytes.fromhex(name))
    assert nlink_of(se) == nlink_of(ke) == 3
    assert read_bytes(se) == read_bytes(ke) == b"shared+"
    for u in (k, s):
        assert view(u.mnt, NAMES) == view(k.mnt, NAMES)
    # a file with one name is copied up with an origin too, never indexed
    with open(s.path("solo"), "a") as f:
        f.write("+")
    assert (os.getxattr(s.upath("solo"), "trusted.overlay.origin")[:2] ==
            b"\x00\xfb")
    assert index_entries(s.work) == [name]


def first(m):
    """What the writer does: through one name, then new names and fewer."""
    with open(os.path.join(m, "a"), "a") as f:
        f.write("+a")
    os.link(os.path.join(m, "d", "b"), os.path.join(m, "e"))
    os.unlink(os.path.join(m, "d", "c"))


def second(m):
    with open(os.path.join(m, "d", "b"), "a") as f:
        f.write("+b")
    os.rename(os.path.join(m, "e"), os.path.join(m, "d", "f"))
    os.unlink(os.path.join(m, "a"))


ALL = NAMES + ["e", "d/f"]


def interop(make_union, writer, reader, index=True):
    lower, upper, work = layers(make_union)
    a = make(make_union, writer, lower, upper, work, index)
    first(a.mnt)
    want = view(a.mnt, ALL)
    a.unmount()
    b = make(make_union, reader, lower, upper, work, index)
    assert view(b.mnt, ALL) == want, f"{reader} reads {writer}'s upper differently"
    second(b.mnt)
    want = view(b.mnt, ALL)
    b.unmount()
    a.mount()
    assert view(a.mnt, ALL) == want, f"{writer} reads {reader}'s upper differently"
    return want


def test_kernel_index_upper_read_by_stratafs(make_union):
    want = interop(make_union, "kernel", "stratafs")
    assert want[0]["d/b"] == (b"shared+a+b", 2)


def test_stratafs_upper_read_by_kernel_index(make_union):
    want = interop(make_union, "stratafs", "kernel")
    assert want[0]["d/f"] == (b"shared+a+b", 2)


def test_kernel_index_off_upper_read_as_the_kernel_reads_it(make_union):
    """index=off breaks the link on copy-up: the other names keep the
    lower data. stratafs shows that upper as the kernel itself does."""
    lower, upper, work = layers(make_union)
    k = make(make_union, "kernel", lower, upper, work, False)
    with open(k.path("a"), "a") as f:
        f.write("+a")
    k.remount()
    want = view(k.mnt, NAMES)
    assert want[0]["d/b"] == (b"shared", 3) and want[0]["a"] == (b"shared+a", 1)
    k.unmount()
    s = make(make_union, "stratafs", lower, upper, work, False)
    assert view(s.mnt, NAMES) == want


def test_upper_does_not_depend_on_lookup_order(make_union):
    lower, _, _ = layers(make_union)
    uppers = []
    for order in (["d/b", "d/c", "a"], ["a", "d/c", "d/b"]):
        base = make_union("stratafs").new_dir("o" + order[0].replace("/", ""))
        u = make(make_union, "stratafs", lower, os.path.join(base, "upper"),
                 os.path.join(base, "work"), True)
        for n in order:
            os.stat(u.path(n))
        with open(u.path("a"), "a") as f:
            f.write("+")
        uppers.append((snapshot_upper(u.upper), index_entries(u.work)))
    assert uppers[0] == uppers[1]


def test_strata_index_layout_is_converted(make_union):
    """An upper as stratafs wrote it before: the copy in
    WORKDIR/strata-index/<inode number, hex>, our count of names in view
    (8 bytes) in strata.nlink, a name linked to it in the upper."""
    lower, upper, work = layers(make_union)
    ino = os.stat(os.path.join(lower, "a")).st_ino
    old = os.path.join(work, "strata-index")
    os.makedirs(old)
    os.makedirs(os.path.join(upper, "d"))
    entry = os.path.join(old, "%016x" % ino)
    shutil.copy2(os.path.join(lower, "a"), entry)
    with open(entry, "a") as f:
        f.write("+old")
    os.setxattr(entry, "trusted.overlay.strata.ino", struct.pack("<Q", ino))
    os.setxattr(entry, "trusted.overlay.strata.nlink", struct.pack("<Q", 3))
    os.link(entry, os.path.join(upper, "d", "b"))
    for d in (upper, os.path.join(upper, "d")):
        os.setxattr(d, "trusted.overlay.impure", b"y")
    s = make(make_union, "stratafs", lower, upper, work, True)
    want = view(s.mnt, NAMES)
    assert want == ({"a": (b"shared+old", 3), "d/b": (b"shared+old", 3),
                     "d/c": (b"shared+old", 3)}, [sorted(NAMES)])
    assert not os.path.exists(old)
    [name] = index_entries(work)
    assert os.getxattr(os.path.join(work, "index", name),
                       "trusted.overlay.origin") == bytes.fromhex(name)
    s.unmount()
    k = make(make_union, "kernel", lower, upper, work, True)
    assert view(k.mnt, NAMES) == want
