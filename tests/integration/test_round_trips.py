# SPDX-License-Identifier: Apache-2.0
"""How many FUSE requests the common operations cost, pinned: a change
that adds a round trip to one of them fails here (issue 14 item 3;
docs/fuse-settings.md, "Round trips", says why each one left is the
kernel's and cannot be answered away by the daemon). Counted from the
daemon's debug log by tests/lib/round_trips.py, which
tests/bench/round-trips.py prints as a table; FORGET gets no reply and is
not a round trip.

Root's operations on root's files, as in an image: the kernel decides
by the owner's mode bits. POSIX ACLs (FUSE_POSIX_ACL) would add a
GETXATTR of system.posix_acl_access where the kernel needs an inode's
ACL and has none cached: a permission check by someone who is not the
owner of a file with group bits (acl_permission_check), and ls -l's own
getxattr of it (below), which the kernel then answers from its cache
until the inode's attributes are fetched again. None of the operations
pinned here checks a permission as a non-owner.

Under STRATAFS_OPTS=nopassthrough (and io=sync) the data writes are the
daemon's: one WRITE more per write, and nothing else changes."""

import pytest

from round_trips import (ColdListing, ColdLsL, ColdStat, CreateClose, Pwrite,
                         TarEntry, Unlink, measure)

N = 50


def pinned(u, op, expected):
    c, _, ops = measure(u, op, N, reps=2)
    got = {k: v for k, v in c.items() if k not in op.fractional}
    want = {k: v * ops for k, v in expected.items() if v}
    assert got == want, (f"{op.name}: {N} operations cost {dict(c)}, "
                         f"expected {want}")
    return c


@pytest.fixture
def u(stratafs_only):
    return stratafs_only.make([{}], extra_opts=["debug"])


def test_create_close(u):
    """LOOKUP: fuse_atomic_open looks a name the dcache does not know up
    before it decides to create (an O_CREAT open of a name that exists
    opens it); nothing in the protocol lets a CREATE stand for both.
    GETATTR: the parent's. Every change in a directory makes the kernel
    drop its attributes (fuse_dir_changed), and with default_permissions
    fuse_permission fetches them again before the next check of that
    directory (the path walk's MAY_EXEC, the create's MAY_WRITE).
    RELEASE: the close; FLUSH is not sent (FOPEN_NOFLUSH)."""
    pinned(u, CreateClose(), {"LOOKUP": 1, "GETATTR": 1, "CREATE": 1,
                              "RELEASE": 1})


def test_unlink(u):
    """A name the kernel holds (created just before): no LOOKUP. GETATTR:
    the parent's, dropped by the previous unlink, before may_delete's
    check. The FORGET of the removed inode follows, without a reply."""
    pinned(u, Unlink(), {"GETATTR": 1, "UNLINK": 1})


def test_cold_stat(u):
    """After a remount: the LOOKUP's reply carries the attributes, valid
    for the attribute timeout, so stat(2) needs no GETATTR."""
    pinned(u, ColdStat(), {"LOOKUP": 1})


def test_pwrite_to_an_upper_file(u):
    """With passthrough the kernel writes the backing file itself. Through
    the daemon, one WRITE: no GETXATTR of security.capability (the file
    was found free of privileges at its first write, and HANDLE_KILLPRIV_V2
    leaves the rest to the daemon) and no GETATTR."""
    pinned(u, Pwrite(), {"WRITE": 0 if u.passthrough() else 1})


def test_tar_extract_per_entry(u):
    """GNU tar as root: openat(O_CREAT|O_EXCL) as create+close above, the
    data, then utimensat, fchown and fchmod: three SETATTRs, one a
    syscall. GETXATTR security.capability twice: at the new file's first
    write (file_remove_privs; then S_NOSEC spares the later ones) and at
    the fchown, where notify_change asks whether a capability must go
    (ATTR_KILL_PRIV) every time."""
    pinned(u, TarEntry(), {"LOOKUP": 1, "GETATTR": 1, "CREATE": 1,
                           "WRITE": 0 if u.passthrough() else 1,
                           "GETXATTR": 2, "SETATTR": 3, "RELEASE": 1})


def test_cold_listing(u):
    """A directory of 5 entries after a remount: its LOOKUP; a READDIRPLUS
    (the first read at offset 0 asks for attributes too, readdirplus
    being adaptive) that returns every entry; and a READDIR that finds the
    end, an empty reply, which also marks the kernel's cached listing
    complete. No OPENDIR or RELEASEDIR (NO_OPENDIR_SUPPORT), no GETATTR
    for glibc's fstat in opendir (the LOOKUP's attributes are valid)."""
    pinned(u, ColdListing(), {"LOOKUP": 1, "READDIRPLUS": 1, "READDIR": 1})


def test_cold_ls_l_per_entry(u):
    """READDIRPLUS carries each entry's attributes: ls's statx asks
    nothing. ls (coreutils 9.1) asks security.selinux and
    system.posix_acl_access of every entry, and the kernel passes both
    on: two GETXATTRs (with FUSE_POSIX_ACL the second is cached
    afterwards, but this listing is cold). Listing requests grow with
    the buffers the entries fill: at most one per page of entries (a
    name this short takes 160 bytes with its attributes), where the
    kernel of this machine reads 32 KiB at a time."""
    c = pinned(u, ColdLsL(), {"GETXATTR": 2})
    assert c["READDIRPLUS"] + c["READDIR"] <= N // (4096 // 160) + 1, c
