# SPDX-License-Identifier: Apache-2.0
"""Layers that are old uppers (issue 12): redirects, opaque markers and
whiteouts are honoured in every layer, as kernel overlayfs does.

The stacks are made by the kernel itself: rename on a kernel overlay mount
(redirect_dir=on), freeze its upper as a lower layer, again, and then
compare what stratafs and the kernel show of the same stack, what each
does with it, and what each reads of the other's new upper."""

import errno
import os
import shutil

import pytest

from stratatest import (assert_same, build_tree, errno_of, read_bytes,
                        snapshot_tree)


def tree(m):
    return snapshot_tree(m, nlink=False)


def freeze(make_union, lowers, ops, name):
    """Runs ops(mountpoint) on a kernel overlay over `lowers` (dirs, top
    first) and returns its upper, now a layer of its own."""
    k = make_union("kernel")
    u = k.make(lowers=[{} for _ in lowers], layer_dirs=lowers,
               upper_dir=k.new_dir(name), work_dir=k.new_dir(name + ".work"))
    ops(u.mnt)
    u.unmount()
    shutil.rmtree(u.work)
    return u.upper


def both(make_union, layers, ops=None):
    """The stack mounted by the kernel and by stratafs, each with its own
    upper; ops(mnt) run on both; returns the two unions after checking
    that they show the same."""
    us = []
    for kind in ("kernel", "stratafs"):
        f = make_union(kind)
        us.append(f.make(lowers=[{} for _ in layers], layer_dirs=layers))
    k, s = us
    assert_same(tree(k.mnt), tree(s.mnt), ("kernel", "stratafs"),
                "the stack reads differently")
    if ops:
        for u in us:
            ops(u.mnt)
        assert_same(tree(k.mnt), tree(s.mnt), ("kernel", "stratafs"),
                    "the stack differs after the same operations")
    return k, s


def swap_uppers(k, s):
    """Each implementation mounts the other's upper over the same lowers:
    both must show what the writer showed."""
    want_k, want_s = tree(k.mnt), tree(s.mnt)
    k.unmount()
    s.unmount()
    k.upper, s.upper = s.upper, k.upper
    for u in (k, s):
        shutil.rmtree(u.work)
        os.makedirs(u.work)
    k.mount()
    s.mount()
    assert_same(want_s, tree(k.mnt), ("stratafs wrote", "kernel read"),
                "the kernel reads stratafs's upper differently")
    assert_same(want_k, tree(s.mnt), ("kernel wrote", "stratafs read"),
                "stratafs reads the kernel's upper differently")


BASE = {"d1/f1": "one", "d1/keep": "k", "d2/f2": "two", "d2/sub/s": "s",
        "p/q/deep": "deep", "x": ("dir",), "gone/g": "g", "o/hidden": "h"}


def test_renamed_dirs_in_a_frozen_upper(make_union):
    """The issue's case: d1 renamed in place, d2 moved into another dir."""
    def gen1(m):
        os.rename(os.path.join(m, "d1"), os.path.join(m, "e1"))
        os.rename(os.path.join(m, "d2"), os.path.join(m, "x", "e2"))
        with open(os.path.join(m, "e1", "top"), "w") as f:
            f.write("top")
        os.unlink(os.path.join(m, "gone", "g"))
        os.rmdir(os.path.join(m, "gone"))
        os.rename(os.path.join(m, "o"), os.path.join(m, "o2"))
        os.mkdir(os.path.join(m, "o"))              # opaque, in the old upper

    k0 = make_union("kernel")
    base = k0.new_dir("base")
    build_tree(base, BASE)
    u1 = freeze(make_union, [base], gen1, "gen1")
    layers = [k0.new_dir("extra"), u1, base]
    build_tree(layers[0], {"e1/extra": "x"})

    def ops(m):
        with open(os.path.join(m, "e1", "f1"), "a") as f:
            f.write("+")
        os.rename(os.path.join(m, "x", "e2"), os.path.join(m, "e3"))

    k, s = both(make_union, layers)
    assert sorted(os.listdir(s.path("e1"))) == ["extra", "f1", "keep", "top"]
    assert read_bytes(s.path("x", "e2", "f2")) == b"two"
    assert os.listdir(s.path("o")) == []
    assert not os.path.exists(s.path("gone"))
    for u in (k, s):
        ops(u.mnt)
        assert read_bytes(u.path("e1", "f1")) == b"one+"
        assert read_bytes(u.path("e3", "sub", "s")) == b"s"
    assert_same(tree(k.mnt), tree(s.mnt), ("kernel", "stratafs"))
    swap_uppers(k, s)


def test_rename_chains_across_generations(make_union):
    """a is renamed on three mounts in a row, each over the frozen uppers
    of the ones before; a subdirectory is moved out through a redirected
    parent, so its redirect points through another redirect."""
    def gen1(m):
        os.rename(os.path.join(m, "p"), os.path.join(m, "r"))        # relative

    def gen2(m):
        os.rename(os.path.join(m, "r"), os.path.join(m, "x", "r2"))  # absolute
        os.rename(os.path.join(m, "d2", "sub"), os.path.join(m, "sub2"))

    def gen3(m):
        os.rename(os.path.join(m, "x", "r2", "q"), os.path.join(m, "q3"))
        os.rename(os.path.join(m, "x", "r2"), os.path.join(m, "r3"))
        os.rename(os.path.join(m, "sub2"), os.path.join(m, "d1", "sub3"))

    k0 = make_union("kernel")
    base = k0.new_dir("base")
    build_tree(base, BASE)
    u1 = freeze(make_union, [base], gen1, "gen1")
    u2 = freeze(make_union, [u1, base], gen2, "gen2")
    u3 = freeze(make_union, [u2, u1, base], gen3, "gen3")

    def ops(m):
        os.rename(os.path.join(m, "q3"), os.path.join(m, "d1", "q4"))
        with open(os.path.join(m, "d1", "q4", "deep"), "a") as f:
            f.write("+")
        os.mkdir(os.path.join(m, "r3", "new"))

    k, s = both(make_union, [u3, u2, u1, base], ops)
    assert read_bytes(s.path("d1", "q4", "deep")) == b"deep+"
    assert read_bytes(s.path("d1", "sub3", "s")) == b"s"
    swap_uppers(k, s)


def test_hand_made_redirects_in_a_lower(make_union):
    """Redirects as another tool may leave them: relative and absolute,
    through a redirected parent, and stopping at an opaque directory."""
    k0 = make_union("kernel")
    top, mid, bottom = (k0.new_dir("top"), k0.new_dir("mid"),
                        k0.new_dir("bottom"))
    build_tree(bottom, {"a/b/f": "f", "a/c": "c", "o/y/z": "z", "w/v": "v"})
    build_tree(mid, {"m": ("dir",), "n": ("dir",), "o": ("opaque_dir",),
                     "o/y": ("dir",), "k": ("dir",), "t/u": ("dir",)})
    build_tree(top, {"t/u": ("dir",)})
    for layer, rel, target in ((mid, "m", "/a"), (mid, "n", "a"),
                               (mid, "k", "/o/y"), (mid, "t/u", "/m/b"),
                               (top, "t/u", "/m/b")):
        os.setxattr(os.path.join(layer, rel), "trusted.overlay.redirect",
                    target.encode())
    k, s = both(make_union, [top, mid, bottom])
    assert sorted(os.listdir(s.path("m"))) == ["b", "c"]
    assert sorted(os.listdir(s.path("n"))) == ["b", "c"]
    # walked in mid, where m redirects on to /a/b for the layer below
    assert os.listdir(s.path("t", "u")) == ["f"]
    assert os.listdir(s.path("o", "y")) == []        # opaque o in mid
    assert os.listdir(s.path("k")) == ["z"]          # absolute: from the roots
    swap_uppers(k, s)


@pytest.mark.parametrize("value, err", [(b"/../etc", errno.EACCES),
                                        (b"..", errno.EACCES),
                                        (b"/a/./b", errno.EACCES),
                                        (b"a/b", errno.EINVAL),
                                        (b"/a//b", errno.EINVAL),
                                        (b"/", errno.EINVAL)])
def test_hostile_redirect_in_a_lower_is_refused(union, value, err):
    u = union.make(lowers=[{"h": ("dir",), "ok": "fine"},
                           {"a/b/secret": "s", "a/./b": ("dir",)}],
                   mount=False)
    os.setxattr(u.lpath(0, "h"), "trusted.overlay.redirect", value)
    u.mount()
    assert errno_of(os.listdir, u.path("h")) == err
    assert read_bytes(u.path("ok")) == b"fine"


def test_redirect_past_path_max_leads_nowhere(union):
    """A redirect that, joined to the rest of a walk, names a path longer
    than PATH_MAX: the kernel walks it and finds nothing, and the
    directory stays, its own entries in view (found by fuzz/redirect)."""
    comp = "p" * 250
    u = union.make(lowers=[{"c/f": "own"}, {"a": ("dir",)}, {"a/b": "b"}],
                   mount=False)
    os.setxattr(u.lpath(0, "c"), "trusted.overlay.redirect",
                ("/a" + ("/" + comp) * 6).encode())
    os.setxattr(u.lpath(1, "a"), "trusted.overlay.redirect",
                (("/" + comp) * 11).encode())
    u.mount()
    assert os.listdir(u.path("c")) == ["f"]
    assert os.listdir(u.path("a")) == []


def test_redirect_to_an_ancestor_is_not_a_loop(union):
    """A lower dir redirected to its own parent shows the parent's lower
    content, one level, as the kernel does: nothing recurses."""
    u = union.make(lowers=[{"a/b": ("dir",)}, {"a/f": "f", "a/b/g": "g"}],
                   mount=False)
    os.setxattr(u.lpath(0, "a", "b"), "trusted.overlay.redirect", b"/a")
    u.mount()
    assert sorted(os.listdir(u.path("a", "b"))) == ["b", "f"]
    assert os.listdir(u.path("a", "b", "b")) == ["g"]


def test_xattr_whiteouts_in_a_lower(union):
    """The kernel's whiteouts for layers without device nodes: an empty
    file with the whiteout xattr, in a directory marked opaque "x"."""
    u = union.make(lowers=[{"d/gone": "", "d/new": "n"},
                           {"d/gone": "g", "d/keep": "k"}], mount=False)
    os.setxattr(u.lpath(0, "d"), "trusted.overlay.opaque", b"x")
    os.setxattr(u.lpath(0, "d", "gone"), "trusted.overlay.whiteout", b"")
    u.mount()
    assert sorted(os.listdir(u.path("d"))) == ["keep", "new"]
    assert errno_of(os.stat, u.path("d", "gone")) == errno.ENOENT
    with open(u.path("d", "gone"), "w") as f:      # over it, as a new file
        f.write("again")
    assert sorted(os.listdir(u.path("d"))) == ["gone", "keep", "new"]
    u.remount()
    assert read_bytes(u.path("d", "gone")) == b"again"


def test_xattr_whiteout_outside_an_x_directory(union):
    """Elsewhere, as the kernel has it: a lookup takes it for a whiteout,
    in the upper layer too, but a listing shows the name."""
    u = union.make(lowers=[{"d/f": ""}, {"d/f": "lower"}],
                   upper={"d/g": ""}, mount=False)
    os.setxattr(u.lpath(0, "d", "f"), "trusted.overlay.whiteout", b"")
    os.setxattr(u.upath("d", "g"), "trusted.overlay.whiteout", b"")
    u.mount()
    assert sorted(os.listdir(u.path("d"))) == ["f", "g"]
    assert errno_of(os.stat, u.path("d", "f")) == errno.ENOENT
    assert errno_of(os.stat, u.path("d", "g")) == errno.ENOENT
    with open(u.path("d", "g"), "w") as f:          # over it, as a new file
        f.write("new")
    assert read_bytes(u.path("d", "g")) == b"new"


def test_a_layer_seen_inside_another_is_refused(stratafs_only, tmp_path):
    """Lower layers may share a tree, but a layer's root reached by a
    lookup (here: the top layer, through the name it has in the one
    below; a redirect can lead there too) is ELOOP, as for the kernel's
    traps: the view never holds a layer inside itself."""
    base = str(tmp_path / "shared")
    build_tree(base, {"top/t": "t", "b": "b"})
    u = stratafs_only.make(lowers=[{}, {}],
                           layer_dirs=[os.path.join(base, "top"), base])
    assert sorted(os.listdir(u.mnt)) == ["b", "t", "top"]
    assert errno_of(os.listdir, u.path("top")) == errno.ELOOP
    assert read_bytes(u.path("t")) == b"t"
