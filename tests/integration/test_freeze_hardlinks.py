# SPDX-License-Identifier: Apache-2.0
"""A live freeze of a volume with copied-up lower hard links (fuse/linkup.c):
every name the view shows through the workdir's index is linked into the
upper first, so the frozen layer holds the file with all its names and
the new data, and the index entries go with it. The oracle is the kernel's
overlayfs (index=on) over the frozen stack."""

import errno
import os
import stat
import threading

import pytest

from stratatest import read_bytes
from test_freeze import (assert_stack_agrees, drained_freeze, freeze,
                         freeze_killed, holds_handles, mount, supervised,
                         unchanged, view)
from test_index import view as names_view

# one lower file, six names: three the view shows once the lower dir mv
# is renamed to mv2 (its name then comes through the redirect), one
# removed through the mount, and two the top lower layer hides from the
# start (an opaque dir, a whiteout), which the union's count still has
TOP = {"opq": ("opaque_dir",), "hidden": ("whiteout",)}
BOTTOM = {
    "h/first": "lower data\n",
    "deep/er/second": ("hardlink", "h/first"),
    "gone/third": ("hardlink", "h/first"),
    "opq/fourth": ("hardlink", "h/first"),
    "hidden": ("hardlink", "h/first"),
    "mv/fifth": ("hardlink", "h/first"),
    "mv/other": "other\n",
    "solo": "solo\n",
}
SHOWN = ["h/first", "deep/er/second", "mv2/fifth"]
NAMES = SHOWN + ["gone/third", "opq/fourth", "hidden", "mv/fifth"]


def index_files(u):
    """The workdir's index entries that refer to files (not whiteouts)."""
    d = os.path.join(u.work, "index")
    return [n for n in os.listdir(d)
            if not stat.S_ISCHR(os.lstat(os.path.join(d, n)).st_mode)]


def assert_linked(u, layer, data):
    """Through the mount, every shown name is one file with DATA and as
    many links as names (the kernel forgot the count it was told); in the
    frozen LAYER, the same names are hard links of one inode with DATA,
    the others absent or whited out, and the index refers to none of it
    any more."""
    seen = {n: os.stat(u.path(n)) for n in SHOWN}
    assert len({st.st_ino for st in seen.values()}) == 1
    assert {st.st_nlink for st in seen.values()} == {len(SHOWN)}
    for n in SHOWN:
        assert read_bytes(u.path(n)) == data
    for n in ("gone/third", "opq/fourth", "hidden", "mv/fifth"):
        assert not os.path.lexists(u.path(n))
    real = {n: os.lstat(os.path.join(layer, n)) for n in SHOWN}
    assert len({(st.st_dev, st.st_ino) for st in real.values()}) == 1
    assert {st.st_nlink for st in real.values()} == {len(SHOWN)}
    assert read_bytes(os.path.join(layer, SHOWN[0])) == data
    for n in ("opq/fourth", "hidden", "mv/fifth"):
        assert not os.path.lexists(os.path.join(layer, n))
    assert index_files(u) == []


def prepared(stratafs_only, tmp_path, **kw):
    """The volume with the file written through one name, its copy in
    the index only, the other names still reaching it through the lower
    file's."""
    u = mount(stratafs_only, tmp_path, lowers=(TOP, BOTTOM), **kw)
    os.rename(u.path("mv"), u.path("mv2"))
    os.unlink(u.path("gone/third"))
    with open(u.path("h/first"), "a") as f:
        f.write("written before\n")
        # synced: the kernel may keep the attributes then (inode.c)
        os.fsync(f.fileno())
    assert index_files(u) != []
    # the union's count has the names hidden from the start, as the
    # kernel's has: by the lower file's count
    assert os.stat(u.path("deep/er/second")).st_nlink == 5
    assert not os.path.lexists(u.upath("deep"))
    assert not os.path.lexists(u.upath("mv2/fifth"))
    return u


def test_hard_links_are_linked_up_and_frozen(stratafs_only, tmp_path):
    u = prepared(stratafs_only, tmp_path)
    f1, f2 = tmp_path / "f1", tmp_path / "f2"
    status, text = freeze(u, f1)
    assert status == 0, text
    data = b"lower data\nwritten before\n"
    assert_linked(u, f1, data)
    st = os.lstat(os.path.join(f1, "gone/third"))
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
    assert read_bytes(u.path("mv2/other")) == b"other\n"

    # the frozen file is a lower one now: a write copies it up again,
    # into the index, and the next freeze links its names up again
    with open(u.path("mv2/fifth"), "a") as f:
        f.write("written after\n")
    assert index_files(u) != []
    status, text = freeze(u, f2)
    assert status == 0, text
    data += b"written after\n"
    assert_linked(u, f2, data)
    assert read_bytes(os.path.join(f1, SHOWN[0])) == data[:-14]

    assert_stack_agrees(stratafs_only, u, [f2, f1], "hl",
                        lambda m: (view(m), names_view(m, NAMES)),
                        ["index=on"])


@pytest.mark.skipif(not supervised(),
                    reason="without a supervisor a dead daemon's mount is gone")
def test_a_freeze_its_worker_died_in_drops_the_index(stratafs_only,
                                                     tmp_path):
    """The worker killed once the new upper was made, before the index
    entries went: the next one finishes the freeze, and they go then."""
    u = prepared(stratafs_only, tmp_path,
                 env={"STRATAFS_CRASH_AFTER": "freeze.made"})
    freeze_killed(u, tmp_path / "frozen")
    assert_linked(u, tmp_path / "frozen", b"lower data\nwritten before\n")


@holds_handles
def test_hard_links_copied_up_during_freezes(stratafs_only, tmp_path):
    """Copies into the index while freezes go on: whatever a freeze finds
    in the index, before its gate closes or after, has all its names in
    the layer, and no write is lost."""
    count = 200
    lower = {}
    for i in range(count):
        lower[f"a/f{i}"] = f"{i}\n"
        lower[f"b/f{i}"] = ("hardlink", f"a/f{i}")
    u = mount(stratafs_only, tmp_path, lowers=(lower,),
              extra_opts=["nopassthrough"])
    errors = []

    def writer():
        try:
            for i in range(count):
                with open(u.path(f"{'ab'[i % 2]}/f{i}"), "a") as f:
                    f.write("w\n")
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    frozen = []
    try:
        while len(frozen) < 8 and (t.is_alive() or len(frozen) < 2):
            frozen.insert(0, tmp_path / f"f{len(frozen)}")
            status, text = drained_freeze(u, frozen[0])
            assert status == 0, text
    finally:
        t.join()
    assert not errors
    # what was copied up after the last: the kernel mounts its own workdir
    frozen.insert(0, tmp_path / "last")
    status, text = freeze(u, frozen[0])
    assert status == 0, text
    names = [f"{d}/f{i}" for i in range(count) for d in "ab"]
    for i in range(count):
        for d in "ab":
            assert read_bytes(u.path(f"{d}/f{i}")) == f"{i}\nw\n".encode()
    assert_stack_agrees(stratafs_only, u, frozen, "load",
                        lambda m: (view(m), names_view(m, names)),
                        ["index=on"])


def test_unresolvable_index_entry_refused(stratafs_only, tmp_path):
    u = prepared(stratafs_only, tmp_path)
    upper_ino = os.stat(u.upper).st_ino
    index = os.path.join(u.work, "index")
    origin = os.getxattr(os.path.join(index, index_files(u)[0]),
                         "trusted.overlay.origin")
    # the same layers' uuid, a handle no file has: a lower file gone
    junk = os.path.join(index, "junk")
    with open(junk, "w"):
        pass
    os.setxattr(junk, "trusted.overlay.origin",
                origin[:-1] + bytes([origin[-1] ^ 0xff]))
    status, text = freeze(u, tmp_path / "f")
    assert status == -errno.ESTALE, text
    assert f"{index}/junk names a lower file that no lower layer holds" \
        in text and "remove that entry" in text
    unchanged(u, upper_ino, tmp_path / "f")
    os.unlink(junk)
    status, text = freeze(u, tmp_path / "f")
    assert status == 0, text
    assert_linked(u, tmp_path / "f", b"lower data\nwritten before\n")
