# SPDX-License-Identifier: Apache-2.0
"""unlink / rmdir: whiteouts, opaque directories, ENOTEMPTY."""

import errno
import os
import stat

import pytest

from stratatest import (errno_of, is_whiteout, read_bytes, snapshot_tree,
                        snapshot_upper, upper_whiteouts)

WH = ("whiteout",)


def test_unlink_lower_file_leaves_whiteout(union):
    u = union.make(lowers=[{"d/f": "lower", "d/g": "g"}, {"d/f": "deeper"}])
    lower_before = [snapshot_tree(l, ctime=True, mtime=True) for l in u.lowers]
    os.unlink(u.path("d", "f"))
    assert errno_of(os.lstat, u.path("d", "f")) == errno.ENOENT
    assert sorted(os.listdir(u.path("d"))) == ["g"]
    st = os.lstat(u.upath("d", "f"))
    assert is_whiteout(st), f"expected char 0/0 whiteout, got mode {oct(st.st_mode)}"
    assert upper_whiteouts(u.upper) == ["d/f"]
    assert [snapshot_tree(l, ctime=True, mtime=True) for l in u.lowers] == lower_before
    u.remount()
    assert errno_of(os.lstat, u.path("d", "f")) == errno.ENOENT
    assert sorted(os.listdir(u.path("d"))) == ["g"]


def test_unlink_file_in_upper_and_lower_leaves_whiteout(union):
    u = union.make(lowers=[{"f": "lower"}], upper={"f": "upper"})
    os.unlink(u.path("f"))
    assert errno_of(os.lstat, u.path("f")) == errno.ENOENT
    assert upper_whiteouts(u.upper) == ["f"]


def test_unlink_upper_only_file_leaves_no_whiteout(union):
    u = union.make(lowers=[{"d/x": "x"}], upper={"pre": "p"})
    with open(u.path("d", "new"), "w") as f:
        f.write("n")
    with open(u.path("top"), "w") as f:
        f.write("t")
    os.unlink(u.path("d", "new"))
    os.unlink(u.path("top"))
    os.unlink(u.path("pre"))
    up = snapshot_upper(u.upper)
    assert "d/new" not in up and "top" not in up and "pre" not in up, up
    assert upper_whiteouts(u.upper) == []
    assert sorted(os.listdir(u.mnt)) == ["d"]


@pytest.mark.parametrize("how", ["create", "mkdir", "symlink", "rename", "link", "mknod"])
def test_recreating_unlinked_name_replaces_whiteout(union, how):
    u = union.make(lowers=[{"d/f": "lower", "d/other": "o"}])
    os.unlink(u.path("d", "f"))
    assert is_whiteout(os.lstat(u.upath("d", "f")))
    target = u.path("d", "f")
    if how == "create":
        with open(target, "w") as fh:
            fh.write("new")
    elif how == "mkdir":
        os.mkdir(target)
    elif how == "symlink":
        os.symlink("other", target)
    elif how == "rename":
        with open(u.path("d", "tmp"), "w") as fh:
            fh.write("new")
        os.rename(u.path("d", "tmp"), target)
    elif how == "link":
        with open(u.path("d", "tmp"), "w") as fh:
            fh.write("new")
        os.link(u.path("d", "tmp"), target)
    elif how == "mknod":
        os.mkfifo(target)
    st = os.lstat(u.upath("d", "f"))
    assert not is_whiteout(st)
    assert upper_whiteouts(u.upper) == []
    expect = sorted(["f", "other"] + (["tmp"] if how == "link" else []))
    assert sorted(os.listdir(u.path("d"))) == expect
    if how in ("create", "rename", "link"):
        assert read_bytes(target) == b"new"
    elif how == "mkdir":
        assert os.listdir(target) == []
    elif how == "symlink":
        assert os.readlink(target) == "other"
        assert read_bytes(target) == b"o"
    elif how == "mknod":
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
    u.remount()
    assert sorted(os.listdir(u.path("d"))) == expect


def test_unlink_then_recreate_then_unlink_again(union):
    u = union.make(lowers=[{"f": "lower"}])
    os.unlink(u.path("f"))
    with open(u.path("f"), "w") as fh:
        fh.write("again")
    os.unlink(u.path("f"))
    # the lower file must stay hidden: a whiteout again
    assert errno_of(os.lstat, u.path("f")) == errno.ENOENT
    assert upper_whiteouts(u.upper) == ["f"]
    u.remount()
    assert os.listdir(u.mnt) == []


def test_unlink_errors(union):
    u = union.make(lowers=[{"d/f": "x"}])
    assert errno_of(os.unlink, u.path("d")) == errno.EISDIR
    assert errno_of(os.rmdir, u.path("d", "f")) == errno.ENOTDIR
    assert errno_of(os.unlink, u.path("nope")) == errno.ENOENT
    assert errno_of(os.rmdir, u.path("nope")) == errno.ENOENT
    assert errno_of(os.unlink, u.path("d", "f", "x")) == errno.ENOTDIR
    assert upper_whiteouts(u.upper) == []


def test_rmdir_merged_dir_holding_only_whiteouts(union):
    u = union.make(lowers=[{"d/a": "a", "d/sub/x": "x", "keep": "k"},
                           {"d/b": "b"}],
                   upper={"d/c": "c"})
    for p in ("d/a", "d/b", "d/c", "d/sub/x"):
        os.unlink(u.path(p))
    os.rmdir(u.path("d", "sub"))
    assert os.listdir(u.path("d")) == []
    os.rmdir(u.path("d"))
    assert errno_of(os.lstat, u.path("d")) == errno.ENOENT
    assert os.listdir(u.mnt) == ["keep"]
    assert is_whiteout(os.lstat(u.upath("d")))
    assert upper_whiteouts(u.upper) == ["d"]
    u.remount()
    assert os.listdir(u.mnt) == ["keep"]


def test_rmdir_merged_dir_with_preexisting_upper_whiteouts(union):
    u = union.make(lowers=[{"d/a": "a"}, {"d/b": "b"}],
                   upper={"d/a": WH, "d/b": WH})
    assert os.listdir(u.path("d")) == []
    os.rmdir(u.path("d"))
    assert os.listdir(u.mnt) == []
    assert upper_whiteouts(u.upper) == ["d"]


@pytest.mark.parametrize("visible", ["upper", "lower0", "lower1", "subdir"])
def test_rmdir_merged_dir_with_visible_entry_is_enotempty(union, visible):
    u = union.make(lowers=[{"d/a": "a"}, {"d/b": "b"}], upper={"d/c": "c"})
    keep = {"upper": "d/c", "lower0": "d/a", "lower1": "d/b", "subdir": None}[visible]
    for p in ("d/a", "d/b", "d/c"):
        if p != keep:
            os.unlink(u.path(p))
    if visible == "subdir":
        os.mkdir(u.path("d", "sub"))
    assert errno_of(os.rmdir, u.path("d")) == errno.ENOTEMPTY
    expect = ["sub"] if visible == "subdir" else [keep.split("/")[1]]
    assert sorted(os.listdir(u.path("d"))) == expect
    assert "d" not in upper_whiteouts(u.upper)


def test_rmdir_then_mkdir_gives_empty_opaque_dir(union):
    u = union.make(lowers=[{"d/a": "a", "d/sub/x": "x"}, {"d/b": "b", "d/sub/y": "y"}])
    for p in ("d/a", "d/b", "d/sub/x", "d/sub/y"):
        os.unlink(u.path(p))
    os.rmdir(u.path("d", "sub"))
    os.rmdir(u.path("d"))
    os.mkdir(u.path("d"))
    assert os.listdir(u.path("d")) == []
    up = snapshot_upper(u.upper)
    assert up["d"][0] == "dir" and up["d"][1] is True, up
    # no stray markers: nothing left below d, no whiteouts anywhere
    assert [p for p in up if p.startswith("d/")] == []
    assert upper_whiteouts(u.upper) == []
    assert os.getxattr(u.upath("d"), u.opaque_xattr) == b"y"
    # private xattrs never show in the merged view
    assert [x for x in os.listxattr(u.path("d")) if ".overlay." in x] == []
    u.remount()
    assert os.listdir(u.path("d")) == []
    with open(u.path("d", "a"), "w") as fh:
        fh.write("fresh")
    assert os.listdir(u.path("d")) == ["a"]
    assert read_bytes(u.path("d", "a")) == b"fresh"


def test_rmdir_upper_only_dir_leaves_no_whiteout(union):
    u = union.make(lowers=[{"x": "x"}])
    os.makedirs(u.path("n", "m"))
    os.rmdir(u.path("n", "m"))
    os.rmdir(u.path("n"))
    assert sorted(os.listdir(u.upper)) == []
    assert upper_whiteouts(u.upper) == []


def test_rmdir_lower_empty_dir(union):
    u = union.make(lowers=[{"e": ("dir",), "f": "f"}])
    os.rmdir(u.path("e"))
    assert os.listdir(u.mnt) == ["f"]
    assert upper_whiteouts(u.upper) == ["e"]
    os.mkdir(u.path("e"))
    assert os.listdir(u.path("e")) == []
    assert upper_whiteouts(u.upper) == []


def test_unlink_deep_lower_file_copies_up_parents(union):
    u = union.make(lowers=[{"a/b/c/f": "x", "a/b/c/g": "y"}])
    os.unlink(u.path("a", "b", "c", "f"))
    up = snapshot_upper(u.upper)
    assert [p for p in up if up[p][0] == "dir"] == ["a", "a/b", "a/b/c"]
    assert upper_whiteouts(u.upper) == ["a/b/c/f"]
    assert os.listdir(u.path("a", "b", "c")) == ["g"]
