# SPDX-License-Identifier: Apache-2.0
"""Inode numbers, st_dev and link counts."""

import os
import stat

import pytest

from stratatest import walk_fd

SPEC_L0 = {"d/a": "a", "d/sub0/x": "x", "only0": "0", "p0/f": "f", "same": "0"}
SPEC_L1 = {"d/b": "b", "d/sub1/y": "y", "only1": "1", "p1/g": "g", "same": "1",
           "d/a": "hidden"}
# Kernel surprise: an upper dir that merges a lower dir but was made outside
# overlayfs (so its parent lacks trusted.overlay.impure) gets the *upper*
# inode number as d_ino in readdir while st_ino is the lower one.  So the
# prebuilt upper here holds no merged directory; tests that want one create
# it through the mount.
SPEC_UP = {"onlyup": "u", "pu/h": "h"}


def inode_map(root):
    """{relpath: (st_ino, st_dev)} for every entry below root (not root)."""
    return {rel: (st.st_ino, st.st_dev) for rel, _, _, st in walk_fd(root) if rel != "."}


def assert_same_over_remount(after, before):
    """A remount keeps every inode number. Device numbers are the kernel's
    to hand out again (a mount's own, and overlayfs's per-layer ones), and
    on a busy machine a mount made meanwhile, by another test, may take an
    old one: they may change, but only as a renumbering, so that entries
    that shared a device before share one after, and no others."""
    assert sorted(after) == sorted(before)
    assert {k: v[0] for k, v in after.items()} == \
        {k: v[0] for k, v in before.items()}
    pairs = {(before[k][1], after[k][1]) for k in before}
    assert len({o for o, _ in pairs}) == len(pairs) == len({n for _, n in pairs}), \
        f"devices not renumbered one to one: {sorted(pairs)}"


def check_unique_and_same_dev(u):
    root_dev = os.stat(u.mnt).st_dev
    m = inode_map(u.mnt)
    assert len(m) > 10
    devs = {rel: dev for rel, (ino, dev) in m.items() if dev != root_dev}
    assert devs == {}, f"entries with a st_dev other than the mount's {root_dev}: {devs}"
    seen = {}
    for rel, (ino, _) in m.items():
        assert ino not in seen, f"st_ino {ino} shared by {seen[ino]} and {rel}"
        seen[ino] = rel
    return m


def check_d_ino(root):
    for rel, dfd, name, st in walk_fd(root):
        if not stat.S_ISDIR(st.st_mode):
            continue
        p = root if rel == "." else os.path.join(root, rel)
        with os.scandir(p) as it:
            for e in it:
                assert e.inode() == os.lstat(e.path).st_ino, \
                    f"d_ino of {e.path} != st_ino"


def test_st_ino_unique_and_st_dev_uniform_same_fs(union):
    u = union.make(lowers=[SPEC_L0, SPEC_L1], upper=SPEC_UP)
    check_unique_and_same_dev(u)


def _layers_on_tmpfs(union):
    # two lowers on two separate tmpfs instances: their inode numbers collide
    # (every tmpfs numbers its inodes from the same start), upper on ext4.
    t0 = union.mount_tmpfs("tmpfs0", "8m")
    t1 = union.mount_tmpfs("tmpfs1", "8m")
    return union.make(lowers=[SPEC_L0, SPEC_L1], upper=SPEC_UP,
                      layer_dirs=[os.path.join(t0, "l"), os.path.join(t1, "l")],
                      # kernel overlayfs needs xino to give one st_dev and
                      # unique st_ino over layers on different filesystems
                      kernel_opts=["xino=on"])


def test_st_ino_unique_and_st_dev_uniform_across_filesystems(union):
    u = _layers_on_tmpfs(union)
    # precondition: the raw inode numbers really collide between the layers
    raw0 = {st.st_ino for rel, _, _, st in walk_fd(u.lowers[0]) if rel != "."}
    raw1 = {st.st_ino for rel, _, _, st in walk_fd(u.lowers[1]) if rel != "."}
    assert raw0 & raw1, "test setup: expected colliding inode numbers"
    check_unique_and_same_dev(u)
    check_d_ino(u.mnt)


def test_d_ino_matches_st_ino(union):
    u = union.make(lowers=[SPEC_L0, SPEC_L1], upper=SPEC_UP)
    check_d_ino(u.mnt)
    os.mkdir(u.path("d", "newdir"))
    with open(u.path("d", "newfile"), "w"):
        pass
    os.chmod(u.path("d", "b"), 0o600)  # copy-up
    check_d_ino(u.mnt)


@pytest.mark.parametrize("fs", ["same_fs", "tmpfs_lowers"])
def test_st_ino_stable_over_copy_up_and_remount(union, fs):
    if fs == "same_fs":
        u = union.make(lowers=[SPEC_L0, SPEC_L1], upper=SPEC_UP)
    else:
        u = _layers_on_tmpfs(union)
    before = inode_map(u.mnt)
    # copy-up files from both lowers and a directory from each
    for p in ("d/a", "d/b", "only0", "only1", "p0/f", "p1/g", "d/sub1/y"):
        with open(u.path(p), "a") as fh:
            fh.write("+")
    os.chmod(u.path("d", "sub0"), 0o700)
    after = inode_map(u.mnt)
    assert after == before
    check_d_ino(u.mnt)
    u.remount()
    assert_same_over_remount(inode_map(u.mnt), before)
    check_d_ino(u.mnt)


def test_st_ino_of_new_files_stable_over_remount(union):
    u = union.make(lowers=[SPEC_L0])
    os.mkdir(u.path("nd"))
    with open(u.path("nd", "nf"), "w") as fh:
        fh.write("x")
    os.symlink("nf", u.path("nd", "nl"))
    before = inode_map(u.mnt)
    u.remount()
    assert_same_over_remount(inode_map(u.mnt), before)


def test_st_ino_follows_rename(union):
    u = union.make(lowers=[SPEC_L0], upper=SPEC_UP)
    ino_f = os.stat(u.path("only0")).st_ino
    ino_d = os.stat(u.path("p0")).st_ino
    ino_u = os.stat(u.path("onlyup")).st_ino
    os.rename(u.path("only0"), u.path("renamed0"))
    os.rename(u.path("p0"), u.path("renamedp"))
    os.rename(u.path("onlyup"), u.path("pu", "moved"))
    assert os.stat(u.path("renamed0")).st_ino == ino_f
    assert os.stat(u.path("renamedp")).st_ino == ino_d
    assert os.stat(u.path("pu", "moved")).st_ino == ino_u
    u.remount()
    assert os.stat(u.path("renamed0")).st_ino == ino_f
    assert os.stat(u.path("renamedp")).st_ino == ino_d
    assert os.stat(u.path("pu", "moved")).st_ino == ino_u


def _expected_dir_nlink(kind, merged, subdirs):
    # kernel overlayfs reports nlink 1 for merged directories (it does not
    # count the union); stratafs reports 2 + visible subdirectories.
    if kind == "kernel" and merged:
        return 1
    return 2 + subdirs


def test_nlink_of_directories(union):
    u = union.make(lowers=[{"m/s0/x": "", "m/s1/x": "", "m/f": "", "m/gone/x": "",
                            "lo/a/x": "", "lo/b/x": "", "lo/f": ""},
                           {"m/s1/y": "", "m/s2/y": "", "m/s3": "file-not-dir"}],
                   upper={"m/s4/z": "", "m/gone": ("whiteout",),
                          "up/a/x": "", "up/f": ""})
    k = union.kind
    # m: visible subdirs s0 s1 s2 s4 (s3 is a file, gone is whited out)
    assert os.stat(u.path("m")).st_nlink == _expected_dir_nlink(k, True, 4)
    assert os.stat(u.path("lo")).st_nlink == _expected_dir_nlink(k, False, 2)
    assert os.stat(u.path("up")).st_nlink == _expected_dir_nlink(k, False, 1)
    assert os.stat(u.path("lo", "a")).st_nlink == 2
    os.mkdir(u.path("m", "s5"))
    assert os.stat(u.path("m")).st_nlink == _expected_dir_nlink(k, True, 5)
    os.rmdir(u.path("m", "s4", "..", "s5"))
    os.unlink(u.path("m", "s4", "z"))
    os.rmdir(u.path("m", "s4"))
    assert os.stat(u.path("m")).st_nlink == _expected_dir_nlink(k, True, 3)
    u.remount()
    assert os.stat(u.path("m")).st_nlink == _expected_dir_nlink(k, True, 3)


def test_nlink_of_files(union):
    u = union.make(lowers=[{"lf": "l", "d/x": ""}], upper={"uf": "u"})
    assert os.stat(u.path("lf")).st_nlink == 1
    assert os.stat(u.path("uf")).st_nlink == 1
    os.link(u.path("uf"), u.path("uf2"))
    assert os.stat(u.path("uf")).st_nlink == 2
    assert os.stat(u.path("uf2")).st_nlink == 2
    assert os.stat(u.path("uf")).st_ino == os.stat(u.path("uf2")).st_ino
    os.link(u.path("lf"), u.path("d", "lf2"))
    assert os.stat(u.path("lf")).st_nlink == 2
    assert os.stat(u.path("d", "lf2")).st_nlink == 2
    assert os.stat(u.path("lf")).st_ino == os.stat(u.path("d", "lf2")).st_ino
    with open(u.path("d", "lf2"), "a") as fh:
        fh.write("+")
    with open(u.path("lf")) as fh:
        assert fh.read() == "l+"
    os.unlink(u.path("uf2"))
    assert os.stat(u.path("uf")).st_nlink == 1
    os.unlink(u.path("lf"))
    assert os.stat(u.path("d", "lf2")).st_nlink == 1
    u.remount()
    assert os.stat(u.path("uf")).st_nlink == 1
    assert os.stat(u.path("d", "lf2")).st_nlink == 1
