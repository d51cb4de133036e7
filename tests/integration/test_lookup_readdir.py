# SPDX-License-Identifier: Apache-2.0
"""Lookup precedence and merged readdir."""

import errno
import os
import stat

from stratatest import errno_of, read_bytes

WH = ("whiteout",)
D = ("dir",)


def listing(path):
    return sorted(os.listdir(path))


def scan_types(path):
    out = {}
    with os.scandir(path) as it:
        for e in it:
            t = "dir" if e.is_dir(follow_symlinks=False) else \
                "symlink" if e.is_symlink() else \
                "file" if e.is_file(follow_symlinks=False) else "other"
            out[e.name] = t
    return out


def test_topmost_layer_wins(union):
    u = union.make(
        lowers=[{"a": "l0", "b": "l0"}, {"a": "l1", "b": "l1", "c": "l1"},
                {"a": "l2", "c": "l2", "d": "l2"}],
        upper={"a": "upper"})
    assert read_bytes(u.path("a")) == b"upper"
    assert read_bytes(u.path("b")) == b"l0"
    assert read_bytes(u.path("c")) == b"l1"
    assert read_bytes(u.path("d")) == b"l2"
    assert os.stat(u.path("a")).st_size == 5
    assert listing(u.mnt) == ["a", "b", "c", "d"]


def test_file_hides_lower_dir(union):
    u = union.make(lowers=[{"x": "file in l0"}, {"x/inner": "deep"}])
    st = os.lstat(u.path("x"))
    assert stat.S_ISREG(st.st_mode)
    assert read_bytes(u.path("x")) == b"file in l0"
    assert errno_of(os.listdir, u.path("x")) == errno.ENOTDIR
    assert errno_of(os.stat, u.path("x", "inner")) == errno.ENOTDIR


def test_dir_hides_lower_file(union):
    u = union.make(lowers=[{"x/inner": "i"}, {"x": "lower file"}])
    assert stat.S_ISDIR(os.lstat(u.path("x")).st_mode)
    assert listing(u.path("x")) == ["inner"]


def test_lower_file_between_dirs_stops_merge(union):
    # upper dir x, middle layer has a *file* x, deepest has dir x: the file
    # ends the merge, so nothing of the deepest x shows.
    u = union.make(lowers=[{"x": "middle file"}, {"x/deep": "d"}],
                   upper={"x/u": "u"})
    assert listing(u.path("x")) == ["u"]
    assert errno_of(os.stat, u.path("x", "deep")) == errno.ENOENT


def test_readdir_is_union_without_duplicates(union):
    u = union.make(
        lowers=[{"d/b": "0", "d/c": "0", "d/sub/x": "0", "d/gone": WH},
                {"d/c": "1", "d/e": "1", "d/gone": "1", "d/sub/y": "1",
                 "d/lnk": ("symlink", "c")}],
        upper={"d/a": "u", "d/b": "u", "d/e": WH})
    assert listing(u.path("d")) == ["a", "b", "c", "lnk", "sub"]
    assert scan_types(u.path("d")) == {"a": "file", "b": "file", "c": "file",
                                       "lnk": "symlink", "sub": "dir"}
    assert listing(u.path("d", "sub")) == ["x", "y"]
    assert errno_of(os.lstat, u.path("d", "gone")) == errno.ENOENT
    assert errno_of(os.lstat, u.path("d", "e")) == errno.ENOENT
    # readdir twice (cached or not) gives the same answer
    assert listing(u.path("d")) == ["a", "b", "c", "lnk", "sub"]


def test_readdir_large_merged_dir(union):
    # big enough to need many getdents calls; overlapping names, whiteouts
    l0 = {f"big/n{i:05d}": "" for i in range(0, 1000)}
    l1 = {f"big/n{i:05d}": "" for i in range(500, 1500)}
    up = {f"big/n{i:05d}": "" for i in range(1000, 2000)}
    for i in range(1200, 1300):
        up[f"big/n{i:05d}"] = WH
    for i in range(100, 150):   # whiteouts over l0-only names
        up[f"big/n{i:05d}"] = WH
    u = union.make(lowers=[l0, l1], upper=up)
    expected = sorted(f"n{i:05d}" for i in range(2000)
                      if not (1200 <= i < 1300 or 100 <= i < 150))
    names = os.listdir(u.path("big"))
    assert len(names) == len(set(names)), "duplicate names in readdir"
    assert sorted(names) == expected


def test_whiteout_in_middle_layer_hides_deeper(union):
    u = union.make(lowers=[{"top": "t"},
                           {"f": WH, "d": WH, "keep": "m"},
                           {"f": "deep", "d/x": "deep", "keep": "deep", "other": "o"}])
    assert listing(u.mnt) == ["keep", "other", "top"]
    assert errno_of(os.stat, u.path("f")) == errno.ENOENT
    assert errno_of(os.stat, u.path("d")) == errno.ENOENT
    assert read_bytes(u.path("keep")) == b"m"
    # a name hidden by a lower whiteout can be created again
    with open(u.path("f"), "w") as fh:
        fh.write("new")
    os.mkdir(u.path("d"))
    assert listing(u.path("d")) == []
    assert read_bytes(u.path("f")) == b"new"


def test_whiteout_in_top_lower_is_overridden_by_upper(union):
    u = union.make(lowers=[{"f": WH}, {"f": "deep"}], upper={"f": "up"})
    assert read_bytes(u.path("f")) == b"up"


def test_opaque_lower_dir_stops_merging(union):
    u = union.make(lowers=[{"d": ("opaque_dir",), "d/a": "a"},
                           {"d/b": "b", "d/sub/c": "c", "other": "o"}])
    assert listing(u.path("d")) == ["a"]
    assert errno_of(os.stat, u.path("d", "b")) == errno.ENOENT
    assert listing(u.mnt) == ["d", "other"]
    # the marker xattr is private
    assert not [x for x in os.listxattr(u.path("d")) if "overlay" in x]


def test_opaque_upper_dir_stops_merging(union):
    u = union.make(lowers=[{"d/low": "l", "d/sub/x": "x"}],
                   upper={"d": ("opaque_dir",), "d/up": "u"})
    assert listing(u.path("d")) == ["up"]


def test_opaque_dir_nested(union):
    # an opaque dir below a merged dir: the parent keeps merging
    u = union.make(lowers=[{"x/y": ("opaque_dir",), "x/y/n": "new"},
                           {"x/y/old": "old", "x/keep": "k"}])
    assert listing(u.path("x")) == ["keep", "y"]
    assert listing(u.path("x", "y")) == ["n"]


def test_recreated_nested_dir_is_opaque(union):
    u = union.make(lowers=[{"a/b/old": "1", "a/keep": "k"},
                           {"a/b/older": "2", "a/b/c/x": "3"}])
    os.unlink(u.path("a", "b", "old"))
    os.unlink(u.path("a", "b", "older"))
    os.unlink(u.path("a", "b", "c", "x"))
    os.rmdir(u.path("a", "b", "c"))
    os.rmdir(u.path("a", "b"))
    os.mkdir(u.path("a", "b"))
    assert listing(u.path("a", "b")) == []
    assert listing(u.path("a")) == ["b", "keep"]
    assert os.getxattr(u.upath("a", "b"), u.opaque_xattr) == b"y"
    u.remount()
    assert listing(u.path("a", "b")) == []
    assert listing(u.path("a")) == ["b", "keep"]


def test_three_and_more_lower_layers(union):
    lowers = []
    for i in range(5):
        spec = {f"only{i}": f"layer{i}", "shared/name": f"layer{i}",
                f"shared/from{i}": str(i)}
        if i >= 2:
            spec["deepdir/x"] = f"layer{i}"
        lowers.append(spec)
    u = union.make(lowers=lowers)
    for i in range(5):
        assert read_bytes(u.path(f"only{i}")) == f"layer{i}".encode()
    assert read_bytes(u.path("shared", "name")) == b"layer0"
    assert listing(u.path("shared")) == sorted(["name"] + [f"from{i}" for i in range(5)])
    assert read_bytes(u.path("deepdir", "x")) == b"layer2"


def test_lookup_of_missing_name(union):
    u = union.make(lowers=[{"d/a": "a"}])
    assert errno_of(os.stat, u.path("nope")) == errno.ENOENT
    assert errno_of(os.stat, u.path("d", "nope")) == errno.ENOENT
    assert errno_of(os.stat, u.path("d", "a", "x")) == errno.ENOTDIR


# ---- AUFS/OCI whiteouts: kernel overlayfs ignores these (stratafs only)

def test_oci_whiteout_hides_lower_entries(stratafs_only):
    u = stratafs_only.make(lowers=[{"f": ("oci_whiteout",), "d/g": ("oci_whiteout",),
                                    "d/new": "n", "gone": ("oci_whiteout",)},
                                   {"f": "deep", "d/g": "deep", "d/h": "h",
                                    "gone/x": "x", "stay": "s"}])
    assert listing(u.mnt) == ["d", "stay"]
    assert listing(u.path("d")) == ["h", "new"]
    for p in ("f", "gone", ".wh.f", ".wh.gone", "d/g", "d/.wh.g"):
        assert errno_of(os.lstat, u.path(p)) == errno.ENOENT, p


def test_oci_whiteout_beside_its_name(stratafs_only):
    """A layer holding NAME and .wh.NAME: the marker hides the layers
    below, never its own (the OCI image spec); a directory there replaced
    the one below, which does not merge into it (found by fuzz/whiteout)."""
    names = [f"n{i}" for i in range(16)]          # no lucky readdir order
    top = dict({n: "top" for n in names}, **{"d/mine": "m"})
    u = stratafs_only.make(lowers=[top, {"d/old": "o", "n0": "below"}],
                           mount=False)
    for n in names + ["d"]:
        open(u.lpath(0, ".wh." + n), "wb").close()
    u.mount()
    assert listing(u.mnt) == sorted(["d"] + names)
    assert read_bytes(u.path("n0")) == b"top"
    assert listing(u.path("d")) == ["mine"]
    assert errno_of(os.lstat, u.path("d", "old")) == errno.ENOENT


def test_oci_opaque_marker(stratafs_only):
    u = stratafs_only.make(lowers=[{"o": ("oci_opaque",), "o/new": "n"},
                                   {"o/old": "o", "o/sub/x": "x", "p/q": "q"}])
    assert listing(u.path("o")) == ["new"]
    assert errno_of(os.lstat, u.path("o", ".wh..wh..opq")) == errno.ENOENT
    assert errno_of(os.lstat, u.path("o", "old")) == errno.ENOENT
    assert listing(u.mnt) == ["o", "p"]


def test_oci_whiteout_in_middle_layer_and_recreate(stratafs_only):
    u = stratafs_only.make(lowers=[{"t": "t"}, {"f": ("oci_whiteout",)}, {"f": "deep"}])
    assert listing(u.mnt) == ["t"]
    with open(u.path("f"), "w") as fh:
        fh.write("again")
    u.remount()
    assert listing(u.mnt) == ["f", "t"]
    assert read_bytes(u.path("f")) == b"again"
    # the upper uses the overlay whiteout format, never .wh. files
    assert not [n for n in os.listdir(u.upper) if n.startswith(".wh.")]


# ---- private xattrs

def test_private_xattrs_never_visible(union):
    u = union.make(lowers=[{"d/a": "a", "r/x": "x", "f": "f", "o/gone": "g"}])
    os.rename(u.path("r"), u.path("r2"))          # redirect
    os.unlink(u.path("o", "gone"))
    os.rmdir(u.path("o"))
    os.mkdir(u.path("o"))                         # opaque
    os.chmod(u.path("f"), 0o600)                  # copied-up file
    os.mkdir(u.path("d", "new"))                  # copied-up parent
    for root, dirs, files in os.walk(u.mnt):
        for n in [root] + [os.path.join(root, x) for x in dirs + files]:
            names = os.listxattr(n, follow_symlinks=False)
            assert not [x for x in names if ".overlay." in x], (n, names)
    for p, x in (("r2", "trusted.overlay.redirect"), ("o", "trusted.overlay.opaque"),
                 ("f", "trusted.overlay.origin")):
        assert errno_of(os.getxattr, u.path(p), x) == errno.ENODATA, (p, x)


def test_private_markers_cannot_be_forged_through_the_mount(union):
    # Kernel surprise (6.7+): setting trusted.overlay.* through the mount
    # succeeds, but is stored escaped as trusted.overlay.overlay.* and then
    # even shows in listxattr.  Whatever an implementation does (store it
    # escaped, or refuse), the marker must not take effect.
    u = union.make(lowers=[{"d/a": "a", "e/b": "b"}])
    for name in ("trusted.overlay.opaque", "trusted.overlay.redirect"):
        try:
            os.setxattr(u.path("d"), name, b"y" if name.endswith("opaque") else b"/e")
        except OSError:
            pass
    u.remount()
    assert listing(u.path("d")) == ["a"]
    assert listing(u.path("e")) == ["b"]
