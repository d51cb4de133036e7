# SPDX-License-Identifier: Apache-2.0
"""rename / renameat2 across layers, directory redirects."""

import errno
import os

import pytest

from stratatest import (assert_survives_remount, RENAME_EXCHANGE, RENAME_NOREPLACE, assert_same,
                        errno_of, read_bytes, renameat2, snapshot_tree,
                        snapshot_upper, upper_whiteouts)

WH = ("whiteout",)


def names(path):
    return sorted(os.listdir(path))


def test_rename_lower_file(union):
    u = union.make(lowers=[{"a": "A", "d/x": "x"}])
    os.rename(u.path("a"), u.path("d", "b"))
    assert errno_of(os.lstat, u.path("a")) == errno.ENOENT
    assert read_bytes(u.path("d", "b")) == b"A"
    assert upper_whiteouts(u.upper) == ["a"]
    assert read_bytes(u.lpath(0, "a")) == b"A"
    u.remount()
    assert names(u.mnt) == ["d"]
    assert names(u.path("d")) == ["b", "x"]


def test_rename_upper_file_leaves_no_whiteout(union):
    u = union.make(lowers=[{"keep": "k"}])
    with open(u.path("new"), "w") as f:
        f.write("n")
    os.rename(u.path("new"), u.path("moved"))
    assert upper_whiteouts(u.upper) == []
    assert names(u.mnt) == ["keep", "moved"]


def test_rename_over_lower_file(union):
    u = union.make(lowers=[{"src": "S", "dst": "D"}, {"dst": "deeper"}])
    os.rename(u.path("src"), u.path("dst"))
    assert read_bytes(u.path("dst")) == b"S"
    assert names(u.mnt) == ["dst"]
    up = snapshot_upper(u.upper)
    assert up["src"] == ("whiteout",)
    assert up["dst"][0] == "file"
    u.remount()
    assert read_bytes(u.path("dst")) == b"S"
    assert names(u.mnt) == ["dst"]


def test_rename_onto_whiteout(union):
    u = union.make(lowers=[{"f": "old lower"}], upper={"g": WH})
    with open(u.path("new"), "w") as fh:
        fh.write("new")
    os.unlink(u.path("f"))
    os.rename(u.path("new"), u.path("f"))
    assert read_bytes(u.path("f")) == b"new"
    assert names(u.mnt) == ["f"]
    assert "f" not in upper_whiteouts(u.upper)
    assert "new" not in snapshot_upper(u.upper)
    u.remount()
    assert names(u.mnt) == ["f"]
    assert read_bytes(u.path("f")) == b"new"


def test_rename_lower_file_onto_whiteout_of_other_lower(union):
    u = union.make(lowers=[{"a": "A", "b": "B"}])
    os.unlink(u.path("b"))
    os.rename(u.path("a"), u.path("b"))
    assert names(u.mnt) == ["b"]
    assert read_bytes(u.path("b")) == b"A"
    assert upper_whiteouts(u.upper) == ["a"]


def test_rename_noreplace_existing_is_eexist(union):
    u = union.make(lowers=[{"a": "A", "b": "B"}], upper={"c": "C"})
    for src, dst in (("a", "b"), ("c", "a"), ("a", "c")):
        assert errno_of(renameat2, u.path(src), u.path(dst), RENAME_NOREPLACE) == errno.EEXIST
    assert read_bytes(u.path("a")) == b"A"
    assert read_bytes(u.path("b")) == b"B"
    assert read_bytes(u.path("c")) == b"C"


def test_rename_noreplace_onto_whiteout_succeeds(union):
    u = union.make(lowers=[{"a": "A", "b": "B"}])
    os.unlink(u.path("b"))
    renameat2(u.path("a"), u.path("b"), RENAME_NOREPLACE)
    assert names(u.mnt) == ["b"]
    assert read_bytes(u.path("b")) == b"A"
    renameat2(u.path("b"), u.path("fresh"), RENAME_NOREPLACE)
    assert names(u.mnt) == ["fresh"]


@pytest.mark.parametrize("where", ["both_lower", "lower_upper", "upper_lower", "two_lowers"])
def test_rename_exchange_files(union, where):
    lowers = [{}, {}]
    upper = {}
    if where == "both_lower":
        lowers[0] = {"a": "A", "b": "B"}
    elif where == "lower_upper":
        lowers[0] = {"a": "A"}
        upper = {"b": "B"}
    elif where == "upper_lower":
        upper = {"a": "A"}
        lowers[0] = {"b": "B"}
    else:
        lowers = [{"a": "A"}, {"b": "B"}]
    u = union.make(lowers=lowers, upper=upper)
    renameat2(u.path("a"), u.path("b"), RENAME_EXCHANGE)
    assert read_bytes(u.path("a")) == b"B"
    assert read_bytes(u.path("b")) == b"A"
    assert upper_whiteouts(u.upper) == []
    u.remount()
    assert read_bytes(u.path("a")) == b"B"
    assert read_bytes(u.path("b")) == b"A"
    assert names(u.mnt) == ["a", "b"]


def test_rename_exchange_with_missing_name_is_enoent(union):
    u = union.make(lowers=[{"a": "A", "b": "B"}])
    os.unlink(u.path("b"))
    assert errno_of(renameat2, u.path("a"), u.path("b"), RENAME_EXCHANGE) == errno.ENOENT
    assert errno_of(renameat2, u.path("a"), u.path("zz"), RENAME_EXCHANGE) == errno.ENOENT
    assert read_bytes(u.path("a")) == b"A"


def test_rename_exchange_lower_dirs(union):
    u = union.make(lowers=[{"a/f": "1", "a/s/x": "x", "b/g": "2"}])
    renameat2(u.path("a"), u.path("b"), RENAME_EXCHANGE)
    assert names(u.path("a")) == ["g"]
    assert names(u.path("b")) == ["f", "s"]
    assert_survives_remount(u)
    up = snapshot_upper(u.upper)
    assert up["a"][2] == "/b" and up["b"][2] == "/a", up


def test_rename_errors(union):
    u = union.make(lowers=[{"d/x": "x", "e/y": "y", "empty": ("dir",), "f": "f"}])
    assert errno_of(os.rename, u.path("f"), u.path("d")) == errno.EISDIR
    assert errno_of(os.rename, u.path("d"), u.path("f")) == errno.ENOTDIR
    assert errno_of(os.rename, u.path("d"), u.path("e")) == errno.ENOTEMPTY
    assert errno_of(os.rename, u.path("d"), u.path("d", "sub")) == errno.EINVAL
    assert errno_of(os.rename, u.path("nope"), u.path("x")) == errno.ENOENT
    assert errno_of(os.rename, u.path("f"), u.path("nodir", "f")) == errno.ENOENT
    # a failed rename changes nothing visible
    assert names(u.mnt) == ["d", "e", "empty", "f"]
    assert upper_whiteouts(u.upper) == []


def test_rename_to_same_name_is_noop(union):
    u = union.make(lowers=[{"f": "f", "d/x": "x"}])
    os.rename(u.path("f"), u.path("f"))
    os.rename(u.path("d"), u.path("d"))
    assert names(u.mnt) == ["d", "f"]
    assert upper_whiteouts(u.upper) == []


def test_rename_dir_with_lower_content(union):
    u = union.make(lowers=[{"src/a": "A", "src/sub/b": "B", "other": "o"},
                           {"src/deep": "D"}])
    os.rename(u.path("src"), u.path("dst"))   # must not fail with EXDEV
    assert names(u.mnt) == ["dst", "other"]
    assert names(u.path("dst")) == ["a", "deep", "sub"]
    assert read_bytes(u.path("dst", "sub", "b")) == b"B"
    assert read_bytes(u.path("dst", "deep")) == b"D"
    up = snapshot_upper(u.upper)
    assert up["src"] == ("whiteout",)
    assert up["dst"][0] == "dir"
    assert up["dst"][2] == "/src", f"expected a redirect to /src, upper: {up}"
    # the raw xattr exists (kernel stores "src" or "/src")
    raw = os.getxattr(u.upath("dst"), u.redirect_xattr)
    assert raw in (b"src", b"/src")
    # private xattrs never show through the mount
    assert [x for x in os.listxattr(u.path("dst")) if ".overlay." in x] == []
    assert_survives_remount(u)


def test_rename_dir_into_other_dir_stores_absolute_redirect(union):
    u = union.make(lowers=[{"a/b/f": "F", "c/keep": "k"}])
    os.rename(u.path("a", "b"), u.path("c", "moved"))
    assert names(u.path("c", "moved")) == ["f"]
    assert names(u.path("a")) == []
    up = snapshot_upper(u.upper)
    assert up["c/moved"][2] == "/a/b"
    assert os.getxattr(u.upath("c", "moved"), u.redirect_xattr) == b"/a/b"
    assert_survives_remount(u)


def test_rename_chain_of_lower_dirs(union):
    u = union.make(lowers=[{"p/q/f": "F", "p/g": "G"}])
    os.rename(u.path("p", "q"), u.path("p", "r"))
    os.rename(u.path("p"), u.path("s"))
    os.rename(u.path("s", "r"), u.path("t"))
    assert names(u.mnt) == ["s", "t"]
    assert names(u.path("s")) == ["g"]
    assert names(u.path("t")) == ["f"]
    assert read_bytes(u.path("t", "f")) == b"F"
    up = snapshot_upper(u.upper)
    assert up["t"][2] == "/p/q" and up["s"][2] == "/p", up
    assert_survives_remount(u)


def test_mkdir_where_renamed_dir_was_is_empty(union):
    u = union.make(lowers=[{"d/f": "F"}])
    os.rename(u.path("d"), u.path("e"))
    os.mkdir(u.path("d"))
    assert names(u.path("d")) == []
    assert names(u.path("e")) == ["f"]
    u.remount()
    assert names(u.path("d")) == []
    assert names(u.path("e")) == ["f"]


def test_rename_dir_back_and_forth(union):
    u = union.make(lowers=[{"d/f": "F", "d/s/g": "G"}])
    os.rename(u.path("d"), u.path("e"))
    os.rename(u.path("e"), u.path("d"))
    assert names(u.path("d")) == ["f", "s"]
    u.remount()
    assert names(u.mnt) == ["d"]
    assert names(u.path("d")) == ["f", "s"]
    assert read_bytes(u.path("d", "s", "g")) == b"G"


def test_rename_dir_over_empty_merged_dir(union):
    u = union.make(lowers=[{"src/a": "A", "dst/old": "O"}, {"dst/older": "OO"}])
    os.unlink(u.path("dst", "old"))
    os.unlink(u.path("dst", "older"))
    assert names(u.path("dst")) == []
    os.rename(u.path("src"), u.path("dst"))
    assert names(u.mnt) == ["dst"]
    assert names(u.path("dst")) == ["a"]
    assert_survives_remount(u)
    assert names(u.path("dst")) == ["a"]


def test_rename_upper_dir_over_empty_lower_dir(union):
    u = union.make(lowers=[{"dst": ("dir",), "x": "x"}])
    os.makedirs(u.path("src", "in"))
    os.rename(u.path("src"), u.path("dst"))
    assert names(u.path("dst")) == ["in"]
    assert names(u.mnt) == ["dst", "x"]
    u.remount()
    assert names(u.path("dst")) == ["in"]
    assert names(u.mnt) == ["dst", "x"]


def test_rename_file_inside_renamed_dir(union):
    u = union.make(lowers=[{"d/f": "F", "d/g": "G"}])
    os.rename(u.path("d"), u.path("e"))
    os.rename(u.path("e", "f"), u.path("e", "h"))
    os.unlink(u.path("e", "g"))
    assert names(u.path("e")) == ["h"]
    u.remount()
    assert names(u.path("e")) == ["h"]
    assert read_bytes(u.path("e", "h")) == b"F"


def test_rename_symlink_and_fifo(union):
    u = union.make(lowers=[{"l": ("symlink", "target"), "p": ("fifo",)}])
    os.rename(u.path("l"), u.path("l2"))
    os.rename(u.path("p"), u.path("p2"))
    assert os.readlink(u.path("l2")) == "target"
    import stat as _st
    assert _st.S_ISFIFO(os.lstat(u.path("p2")).st_mode)
    assert upper_whiteouts(u.upper) == ["l", "p"]


@pytest.mark.parametrize("how", ["rename", "exchange"])
def test_redirect_honours_opaque_dir_on_its_lower_path(union, how):
    # d is opaque in the top lower, so d/y/hidden (deepest layer) never
    # shows; once d/y is renamed away its redirect "/d/y" must be looked up
    # the same way, stopping at the opaque d (found by the differential
    # test, seed 358 with STRATA_OPS=250)
    u = union.make(lowers=[{"d": ("opaque_dir",), "d/y/a": "a", "f": "file"},
                           {"d/y/hidden": "must stay hidden", "d/y/a": "deep a"}])
    assert names(u.path("d", "y")) == ["a"]
    check = move_out_of_d(u, how)
    assert names(check) == ["a"]
    assert read_bytes(os.path.join(check, "a")) == b"a"
    snap = snapshot_tree(u.mnt)
    u.remount()
    assert names(check) == ["a"]
    assert_same(snap, snapshot_tree(u.mnt), ("before remount", "after remount"))


def move_out_of_d(u, how):
    """Moves d/y away by rename, or by exchange with f; returns where it is."""
    if how == "rename":
        os.rename(u.path("d", "y"), u.path("moved"))
        return u.path("moved")
    renameat2(u.path("f"), u.path("d", "y"), RENAME_EXCHANGE)
    return u.path("f")


@pytest.mark.parametrize("how", ["rename", "exchange"])
def test_redirect_honours_whiteout_on_its_lower_path(union, how):
    u = union.make(lowers=[{"d/y/a": "a", "d/y/gone": ("whiteout",), "f": "file"},
                           {"d/y/gone": "must stay hidden"}])
    check = move_out_of_d(u, how)
    assert names(check) == ["a"]
    u.remount()
    assert names(check) == ["a"]
