# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by test_snapshot.py, test_clone.py and the snapshot
crash tests: volumes with data written through their daemon, snapshots
taken through the real plugin, and what the store holds."""

import os
import re

from csitest import cap, pb, read_file, write_file

SNAPSHOT_ID_RE = re.compile(r"^ss-[0-9a-f]{32}$")


def fill(k, vid, files, remove=()):
    """Stages VID, writes FILES ({name: text}) and removes REMOVE through
    its daemon (synced), and unstages it again."""
    st = k.stage(vid, k.env.staging(vid + "-w"))
    for name, text in files.items():
        path = os.path.join(st, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_file(path, text)
    for name in remove:
        os.unlink(os.path.join(st, name))
    k.unstage(vid, st)


def contents(k, vid, names):
    """{name: text or None} of VID's merged view, read through a daemon."""
    st = k.stage(vid, k.env.staging(vid + "-r"))
    out = {}
    for name in names:
        try:
            out[name] = read_file(os.path.join(st, name)).decode()
        except FileNotFoundError:
            out[name] = None
    k.unstage(vid, st)
    return out


def snap(csi, name, vid):
    r = csi.CreateSnapshot(name=name, source_volume_id=vid)
    assert r.code == "OK", r
    s = r.reply.snapshot
    assert SNAPSHOT_ID_RE.match(s.snapshot_id), s
    return s.snapshot_id


def clone(csi, name, snapshot=None, volume=None, **kw):
    src = pb().VolumeContentSource()
    if snapshot is not None:
        src.snapshot.snapshot_id = snapshot
    if volume is not None:
        src.volume.volume_id = volume
    kw.setdefault("volume_capabilities", [cap()])
    return csi.CreateVolume(name=name, volume_content_source=src, **kw)


def snapshot_dirs(p):
    """snapshots/'s entries, hidden leftovers included."""
    try:
        return sorted(os.listdir(p.path("snapshots")))
    except FileNotFoundError:
        return []


def chain(p, vid):
    return p.volume_record(vid)["layers"]
