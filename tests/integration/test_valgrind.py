# SPDX-License-Identifier: Apache-2.0
"""stratafs under valgrind: a workload over every kind of operation, then
an unmount; the daemon must exit 0 with no memory errors and no definite
leaks (stratafs only; the sanitizer pass runs without it, as valgrind
cannot run an ASan build)."""

import os
import shutil
import subprocess

import pytest

from stratatest import (STRATAFS_FSTYPE, build_tree, is_mounted,
                        is_sanitizer_build, lazy_umount, stratafs_binary,
                        wait_for_mount)

VALGRIND = ["valgrind", "--error-exitcode=99", "--leak-check=full",
            "--show-leak-kinds=definite", "--errors-for-leak-kinds=definite",
            "--child-silent-after-fork=yes"]


def workload(m):
    for i in range(20):
        with open(os.path.join(m, f"new{i}"), "w") as f:
            f.write("x" * (i * 100))
    with open(os.path.join(m, "big"), "ab") as f:      # copy-up of 1 MiB
        f.write(b"tail")
    os.rename(os.path.join(m, "dir"), os.path.join(m, "moved"))  # redirect
    os.unlink(os.path.join(m, "moved", "f"))                       # whiteout
    os.rmdir(os.path.join(m, "empty"))
    os.mkdir(os.path.join(m, "empty"))                             # opaque
    os.link(os.path.join(m, "h1"), os.path.join(m, "h3"))          # index
    os.setxattr(os.path.join(m, "new1"), "user.k", b"v")
    os.listxattr(os.path.join(m, "new1"))
    os.symlink("new1", os.path.join(m, "sl"))
    os.truncate(os.path.join(m, "new2"), 0)
    os.chmod(os.path.join(m, "new3"), 0o600)
    # ACLs: inherited (one default ACL bigger than the first read takes),
    # set, read back
    entries = ",".join(f"u:{3000 + i}:rwx" for i in range(70))
    for d, acl in (("acl", "u:3001:rwx"), ("bigacl", entries)):
        os.mkdir(os.path.join(m, d))
        subprocess.run(["setfacl", "-d", "-m", acl, os.path.join(m, d)],
                       check=True)
        with open(os.path.join(m, d, "f"), "w"):
            pass
        os.mkdir(os.path.join(m, d, "sub"))
    subprocess.run(["setfacl", "-m", "u:3001:r", os.path.join(m, "new4")],
                   check=True)
    subprocess.run(["getfacl", "-R", m], check=True, stdout=subprocess.DEVNULL)
    for root, dirs, files in os.walk(m):
        for n in files:
            os.lstat(os.path.join(root, n))
    with open(os.path.join(m, "big"), "rb") as f:
        assert f.read()[-4:] == b"tail"


# passthrough: the backing ids and the replies built by hand (passthrough.c)
@pytest.mark.parametrize("opts", ["", ",nopassthrough"],
                         ids=["default", "nopassthrough"])
def test_daemon_is_valgrind_clean(tmp_path, opts):
    binary = stratafs_binary()
    if is_sanitizer_build(binary):
        pytest.fail("valgrind cannot run a sanitizer build: deselect this "
                    "test in the sanitizer pass (-k 'not valgrind')")
    assert shutil.which("valgrind"), "valgrind is not installed (scripts/deps.sh)"
    lower, upper, work, mnt = (str(tmp_path / n) for n in ("l", "u", "w", "m"))
    build_tree(lower, {"big": b"b" * (1 << 20), "dir": ("dir",), "dir/f": "f",
                       "empty": ("dir",), "h1": "linked"})
    os.link(os.path.join(lower, "h1"), os.path.join(lower, "h2"))
    build_tree(upper, {})
    os.makedirs(work)
    os.makedirs(mnt)
    log = str(tmp_path / "valgrind.log")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            # one process: valgrind follows no clone(2) that shares the
            # descriptor table (supervisor.c); the worker's code is the same
            VALGRIND + [binary, "-f", "-o",
                        f"lowerdir={lower},upperdir={upper},workdir={work}"
                        f",nosupervisor{opts}", mnt],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err,
            start_new_session=True)
    try:
        wait_for_mount(mnt, STRATAFS_FSTYPE, proc, log, timeout=60)
        workload(mnt)
        subprocess.run(["fusermount3", "-u", mnt], check=True)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            lazy_umount(mnt)
    with open(log) as f:
        text = f.read()
    assert rc == 0, f"stratafs under valgrind exited {rc}:\n{text[-6000:]}"
    assert "definitely lost: 0 bytes" in text or "no leaks are possible" in text, text[-6000:]
