# SPDX-License-Identifier: Apache-2.0
"""A staged volume's stratafs worker replaced through the plugin
(strata.v1.Admin/ReplaceWorker, `stratactl replace-worker`): the
supervisor keeps the mount, the pods notice nothing, and with
--daemon-binary-dir the new worker runs the plugin's newest copy of
stratafs: a daemon upgrade under running pods (issue 11, item 1)."""

import json
import os
import shutil

from csitest import (Kubelet, answers, poll, read_file, stratafs_binary,
                     write_file)
from test_stratactl import ctl, ok


def worker_of(sup):
    """The supervisor's worker: its child named stratafs-worker."""
    with open(f"/proc/{sup}/task/{sup}/children") as f:
        kids = [int(x) for x in f.read().split()]
    out = []
    for k in kids:
        try:
            with open(f"/proc/{k}/comm") as f:
                if f.read().strip() == "stratafs-worker":
                    out.append(k)
        except OSError:
            pass
    assert len(out) == 1, f"supervisor {sup} has workers {out}"
    return out[0]


def published(env, p, name="v"):
    k = Kubelet(env, p)
    vid = k.create(name)
    st = k.stage(vid, env.staging(name))
    tgt = k.publish(vid, st, env.target(name))
    return k, vid, st, tgt


def replace(p, vid):
    """stratactl replace-worker, as JSON."""
    r = ok(ctl(p, "replace-worker", vid, as_json=True))
    return json.loads(r.stdout)


def test_replace_worker_keeps_the_mount(env):
    p = env.plugin(root=env.layered_root())
    k, vid, st, tgt = published(env, p)
    sup = p.daemon_pid(vid)
    old = worker_of(sup)
    held = os.open(os.path.join(tgt, "held"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(held, b"before ")
        os.fsync(held)
        r = ok(ctl(p, "replace-worker", vid))
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines()[1:])
        assert r.stdout.splitlines()[0] == f"replaced the worker of {vid}"
        assert int(lines["supervisor_pid"]) == sup
        assert int(lines["old_worker_pid"]) == old
        new = int(lines["new_worker_pid"])
        assert new != old and worker_of(sup) == new
        assert lines["binary"] == os.path.realpath(stratafs_binary())
        # the open descriptor, the mount and the record: all as before
        os.write(held, b"after\n")
        os.fsync(held)
        assert read_file(os.path.join(tgt, "held")) == b"before after\n"
        assert answers(tgt) and answers(st)
        assert p.daemon_pid(vid) == sup
        # and again, as JSON: each call a new worker
        j = replace(p, vid)
        assert j["supervisor_pid"] == sup and j["old_worker_pid"] == new
        assert j["new_worker_pid"] == worker_of(sup) != new
    finally:
        os.close(held)
    assert "replaced by" in p.log()
    k.unpublish(vid, tgt)
    k.unstage(vid, st)
    k.delete(vid)


def test_replace_worker_refusals(env):
    p = env.plugin(root=env.layered_root())
    k = Kubelet(env, p)
    unstaged = k.create("unstaged")
    cases = [
        ("sv-" + "0" * 32, "NOT_FOUND", "no such volume"),
        ("../etc", "NOT_FOUND", "no such volume"),
        (unstaged, "FAILED_PRECONDITION", "not staged on this node"),
    ]
    for vid, code, words in cases:
        r = ctl(p, "replace-worker", vid)
        assert r.returncode != 0, r
        assert code in r.stderr and words in r.stderr, r.stderr
    r = p.csi.call_path("/strata.v1.Admin/ReplaceWorker", b"")
    assert r.code == "INVALID_ARGUMENT" and "volume_id is required" in r.details, r
    # a Controller-only plugin serves no Node calls, nor this one
    c = env.plugin(root=env.layered_root("croot"), mode="controller",
                   sock=os.path.join(env.base, "c.sock"))
    r = ctl(c, "replace-worker", unstaged)
    assert "UNIMPLEMENTED" in r.stderr, r.stderr


def bundles(bindir):
    return sorted(d for d in os.listdir(bindir) if d.startswith("stratafs-"))


def test_upgrade_under_running_pods(env):
    """A new plugin with a new stratafs: its copy becomes current, and a
    replaced worker runs it, its loader and libraries, not the old
    copy's; the copy no daemon runs any more is removed."""
    root = env.layered_root()
    bindir = os.path.join(env.base, "hostbin")
    p = env.plugin(root=root, extra=["--daemon-binary-dir", bindir])
    k, vid, st, tgt = published(env, p)
    first = bundles(bindir)
    assert len(first) == 1
    assert os.readlink(os.path.join(bindir, "current")) == first[0]
    sup = p.daemon_pid(vid)
    held = os.open(os.path.join(tgt, "held"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(held, b"old binary\n")
        os.fsync(held)

        # the upgrade: another stratafs (any byte differs: another copy)
        newer = os.path.join(env.base, "stratafs-newer")
        shutil.copy2(stratafs_binary(), newer)
        with open(newer, "ab") as f:
            f.write(b"\0upgrade\0")
        p.stratafs = newer
        p.restart()
        both = bundles(bindir)
        assert len(both) == 2, "the copy a daemon runs was removed"
        second = (set(both) - set(first)).pop()
        assert os.readlink(os.path.join(bindir, "current")) == second
        assert p.daemon_pid(vid) == sup, "the restart replaced the daemon"

        j = replace(p, vid)
        want = os.path.join(bindir, second, "stratafs")
        assert j["binary"] == want
        assert os.readlink(f"/proc/{sup}/exe") == want
        assert os.readlink(f"/proc/{j['new_worker_pid']}/exe") == want
        with open(f"/proc/{sup}/maps") as f:
            old_files = {line.split(None, 5)[5].strip() for line in f
                         if os.path.join(bindir, first[0]) in line}
        assert old_files == set(), f"the new binary maps {old_files}"

        os.write(held, b"new binary\n")
        os.fsync(held)
        assert read_file(os.path.join(tgt, "held")) == b"old binary\nnew binary\n"
        write_file(os.path.join(tgt, "fresh"), "through the new worker\n")
        assert answers(st)
    finally:
        os.close(held)

    # no daemon runs the first copy now: the next start removes it
    p.restart()
    poll(lambda: bundles(bindir) == [second], 5, what="the old copy to go")
    assert os.readlink(os.path.join(bindir, "current")) == second
    k = Kubelet(env, p)
    k.unpublish(vid, tgt)
    k.unstage(vid, st)
    k.delete(vid)
