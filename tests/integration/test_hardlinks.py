# SPDX-License-Identifier: Apache-2.0
"""Hard links of lower files stay hard links through copy-up (stratafs only).

Kernel overlayfs with index=off breaks lower hard links on copy-up (the
copied-up name gets a new inode), so these tests only run on stratafs.
"""

import os
import stat

from stratatest import read_bytes

LOWER = {"a": "shared", "d/b": ("hardlink", "a"), "d/other": "o"}


def same_inode(u, *names):
    sts = [os.stat(u.path(n)) for n in names]
    assert len({s.st_ino for s in sts}) == 1, [(n, s.st_ino) for n, s in zip(names, sts)]
    return sts[0]


def test_lower_hardlinks_share_inode(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    st = same_inode(u, "a", "d/b")
    assert st.st_nlink == 2
    assert os.stat(u.path("d", "other")).st_ino != st.st_ino


def test_write_after_copy_up_is_seen_through_other_name(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    ino = same_inode(u, "a", "d/b").st_ino
    with open(u.path("a"), "a") as f:
        f.write("+written via a")
    assert read_bytes(u.path("d", "b")) == b"shared+written via a"
    st = same_inode(u, "a", "d/b")
    assert st.st_ino == ino and st.st_nlink == 2
    with open(u.path("d", "b"), "a") as f:
        f.write("+via b")
    assert read_bytes(u.path("a")) == b"shared+written via a+via b"
    assert read_bytes(u.lpath(0, "a")) == b"shared"
    u.remount()
    assert read_bytes(u.path("a")) == b"shared+written via a+via b"
    assert read_bytes(u.path("d", "b")) == b"shared+written via a+via b"
    st = same_inode(u, "a", "d/b")
    assert st.st_ino == ino and st.st_nlink == 2


def test_open_fd_on_other_name_sees_write(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    rfd = os.open(u.path("d", "b"), os.O_RDONLY)
    try:
        with open(u.path("a"), "r+") as f:
            f.write("SHARED")
        assert os.pread(rfd, 100, 0) == b"SHARED"
    finally:
        os.close(rfd)


def test_metadata_change_through_one_name(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    os.chmod(u.path("d", "b"), 0o600)
    os.chown(u.path("d", "b"), 123, 456)
    os.setxattr(u.path("d", "b"), "user.x", b"1")
    st = same_inode(u, "a", "d/b")
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (123, 456)
    assert os.getxattr(u.path("a"), "user.x") == b"1"
    u.remount()
    st = same_inode(u, "a", "d/b")
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (123, 456)
    assert os.getxattr(u.path("a"), "user.x") == b"1"


def test_unlink_one_name_keeps_other(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    ino = os.stat(u.path("a")).st_ino
    os.unlink(u.path("a"))
    st = os.stat(u.path("d", "b"))
    assert st.st_nlink == 1 and st.st_ino == ino
    assert read_bytes(u.path("d", "b")) == b"shared"
    u.remount()
    st = os.stat(u.path("d", "b"))
    assert st.st_nlink == 1 and st.st_ino == ino
    assert sorted(os.listdir(u.mnt)) == ["d"]


def test_link_and_rename_of_lower_hardlinked_file(stratafs_only):
    u = stratafs_only.make(lowers=[LOWER])
    os.link(u.path("a"), u.path("c"))
    st = same_inode(u, "a", "d/b", "c")
    assert st.st_nlink == 3
    os.rename(u.path("d", "b"), u.path("moved"))
    with open(u.path("moved"), "a") as f:
        f.write("!")
    for n in ("a", "c", "moved"):
        assert read_bytes(u.path(n)) == b"shared!"
    st = same_inode(u, "a", "c", "moved")
    assert st.st_nlink == 3
    u.remount()
    st = same_inode(u, "a", "c", "moved")
    assert st.st_nlink == 3
    for n in ("a", "c", "moved"):
        assert read_bytes(u.path(n)) == b"shared!"


def test_hardlinks_in_deeper_layer(stratafs_only):
    u = stratafs_only.make(lowers=[{"top": "t"},
                                   {"x/p": "deep", "y/q": ("hardlink", "x/p")}])
    with open(u.path("y", "q"), "a") as f:
        f.write("+")
    assert read_bytes(u.path("x", "p")) == b"deep+"
    same_inode(u, "x/p", "y/q")
    u.remount()
    assert read_bytes(u.path("x", "p")) == b"deep+"
    same_inode(u, "x/p", "y/q")
