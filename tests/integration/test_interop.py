# SPDX-License-Identifier: Apache-2.0
"""On-disk compatibility: an upper written by one implementation, mounted by
the other, shows the same merged tree."""

import os

import pytest

from stratatest import assert_same, snapshot_tree

LOWERS = [
    {"top/keep": "k0", "top/gone": "g0", "ren/a": "a0", "ren/sub/b": "b0",
     "deep/x/y/f": "f0", "re/old": "o0", "re/sub/s": "s0", "mv/inner/i": "i0",
     "xd/d1/q": "q0", "file0": ("file", "file0", {"mode": 0o640, "uid": 7, "gid": 8,
                                                    "xattrs": {"user.l": "v"}}),
     "link0": ("symlink", "file0"), "opq": ("opaque_dir",), "opq/visible": "v0",
     "hidden": ("whiteout",)},
    {"top/gone": "g1", "top/lower1": "l1", "ren/c": "c1", "re/old2": "o1",
     "mv/inner/j": "j1", "opq/invisible": "x1", "hidden": "h1", "file1": "file1",
     "xd/d1/r": "r1", "xd/d2/z": "z1"},
]


def script(m):
    """Operations covering the on-disk format: whiteouts, opaque dirs,
    redirects (same dir, other dir, chained), copy-ups of data and
    metadata, new entries."""
    p = lambda *a: os.path.join(m, *a)  # noqa: E731
    os.unlink(p("top", "gone"))                     # whiteout over two lowers
    os.rename(p("ren"), p("renamed"))               # redirect, same parent
    os.rename(p("mv", "inner"), p("top", "moved"))  # redirect, other parent
    os.rename(p("top", "moved"), p("top", "moved2"))  # chained redirect
    os.rename(p("renamed", "sub"), p("renamed", "sub2"))  # redirect in redirected dir
    for n in ("old", "sub/s", "old2"):
        os.unlink(p("re", n))
    os.rmdir(p("re", "sub"))
    os.rmdir(p("re"))
    os.mkdir(p("re"))                               # opaque dir
    with open(p("re", "new"), "w") as f:
        f.write("new in opaque")
    with open(p("deep", "x", "y", "f"), "a") as f:  # copy-up with parents
        f.write("+appended")
    os.chmod(p("file0"), 0o600)                     # metadata copy-up
    os.setxattr(p("file1"), "user.added", b"1")
    os.chown(p("link0"), 3, 4, follow_symlinks=False)
    os.makedirs(p("newdir", "nested"))
    with open(p("newdir", "nested", "n"), "w") as f:
        f.write("n")
    os.symlink("../file1", p("newdir", "sl"))
    os.link(p("newdir", "nested", "n"), p("newdir", "n2"))
    with open(p("hidden"), "w") as f:               # over a lower whiteout
        f.write("visible again")
    os.rename(p("xd", "d1"), p("xd", "d3"))
    os.rename(p("xd", "d2"), p("xd", "d1"))         # dir over whited-out name


def script2(m):
    """More operations on the second implementation, after the switch."""
    p = lambda *a: os.path.join(m, *a)  # noqa: E731
    os.unlink(p("renamed", "a"))
    os.rename(p("top", "moved2"), p("moved3"))
    with open(p("re", "new"), "a") as f:
        f.write("+2")
    os.mkdir(p("top", "d2"))
    os.unlink(p("top", "lower1"))


def tree(m):
    return snapshot_tree(m, mtime=True, nlink=False)


@pytest.mark.parametrize("first", ["stratafs", "kernel"],
                         ids=["stratafs_upper_read_by_overlay",
                              "overlay_upper_read_by_stratafs"])
@pytest.mark.stratafs
def test_upper_is_interchangeable(make_union, first):
    second = "kernel" if first == "stratafs" else "stratafs"
    fa = make_union(first)
    fb = make_union(second)
    a = fa.make(lowers=LOWERS)
    script(a.mnt)
    snap1 = tree(a.mnt)
    # sanity: the script did what it should on the first implementation
    assert "top/gone" not in snap1 and "renamed/sub2/b" in snap1
    assert "top/moved2/j" in snap1 and "re/new" in snap1 and "re/old" not in snap1
    assert "xd/d3/r" in snap1 and "xd/d1/z" in snap1 and "xd/d1/q" not in snap1
    a.unmount()
    # same layers, fresh workdir on the same file system
    wb = fb.new_dir("work_b")
    b = fb.make(lowers=[{} for _ in LOWERS], layer_dirs=a.lowers,
                upper_dir=a.upper, work_dir=wb)
    assert_same(snap1, tree(b.mnt), (first, second),
                f"upper written by {first} reads differently on {second}")
    script2(b.mnt)
    snap2 = tree(b.mnt)
    b.unmount()
    # and back again
    a.mount()
    assert_same(snap2, tree(a.mnt), (second, first),
                f"upper written by {second} reads differently on {first}")


def test_upper_survives_remount_same_implementation(union):
    u = union.make(lowers=LOWERS)
    script(u.mnt)
    s = tree(u.mnt)
    u.remount()
    assert_same(s, tree(u.mnt), ("before remount", "after remount"))
    script2(u.mnt)
    s = tree(u.mnt)
    u.remount()
    assert_same(s, tree(u.mnt), ("before remount", "after remount"))
