"""The FUSE settings stratafs negotiates, checked by the requests the
kernel then sends (stratafs only; docs/fuse-settings.md). The daemon runs
with libfuse's debug log, which names every request it gets."""

import os

from stratatest import read_bytes


def requests(u, opcode):
    return u.stderr().count(f"opcode: {opcode} (")


def test_writes_are_one_request_each(stratafs_only):
    """HANDLE_KILLPRIV_V2, which fuse/handshake.c adds to libfuse 3.14's
    INIT reply: once a file has shown no privileges to drop, a write is
    just a WRITE, not a GETXATTR of security.capability first."""
    u = stratafs_only.make(lowers=[{"f": "x" * 100}], extra_opts=["debug"])
    fd = os.open(u.path("f"), os.O_WRONLY)
    try:
        for i in range(100):
            os.pwrite(fd, b"y", i)
    finally:
        os.close(fd)
    assert read_bytes(u.path("f")) == b"y" * 100
    # with -o passthrough (STRATAFS_OPTS) the kernel writes upper files itself
    passthrough = "passthrough" in u.options().split(",")
    assert requests(u, "WRITE") == (0 if passthrough else 100)
    assert requests(u, "GETXATTR") <= 1


def test_chown_is_one_request(stratafs_only):
    """Without HANDLE_KILLPRIV_V2 the kernel refreshes the mode with a
    GETATTR before each chown, to drop setuid itself."""
    u = stratafs_only.make(lowers=[{"f": "x"}], extra_opts=["debug"])
    os.stat(u.path("f"))
    before = requests(u, "GETATTR"), requests(u, "SETATTR")
    for i in range(20):
        os.chown(u.path("f"), 1000 + i % 2, 1000)
    assert os.stat(u.path("f")).st_uid == 1001
    assert requests(u, "SETATTR") - before[1] == 20
    assert requests(u, "GETATTR") - before[0] == 0


def passthrough_union(factory, **kw):
    u = factory.make(extra_opts=["passthrough", "debug"], **kw)
    assert "passthrough: the kernel reads and writes upper files itself" in u.stderr()
    return u


def test_passthrough_data_skips_the_daemon(stratafs_only):
    u = passthrough_union(stratafs_only, lowers=[{"x": ""}])
    data = os.urandom(1 << 20)
    with open(u.path("new"), "wb") as f:          # CREATE reply
        for i in range(0, len(data), 4096):
            f.write(data[i:i + 4096])
    with open(u.path("new"), "r+b") as f:         # OPEN reply
        f.seek(100)
        f.write(b"patched")
    data = data[:100] + b"patched" + data[107:]
    assert os.stat(u.path("new")).st_size == len(data)
    assert read_bytes(u.path("new")) == data
    assert read_bytes(u.upath("new")) == data
    assert (requests(u, "WRITE"), requests(u, "READ")) == (0, 0)
    u.remount()
    assert read_bytes(u.path("new")) == data


def test_passthrough_leaves_lower_and_privileged_files_to_the_daemon(stratafs_only):
    u = passthrough_union(stratafs_only, lowers=[{"low": "lower data"}],
                          upper={"suid": ("file", "s", {"mode": 0o4777})},
                          allow_other=True)
    assert read_bytes(u.path("low")) == b"lower data"
    assert requests(u, "READ") > 0
    # through the daemon, so the write drops setuid as the kernel would
    from test_locks_sync import write_as
    assert write_as(65534, 65534, u.mnt, "suid") == 0
    assert requests(u, "WRITE") > 0
    assert os.stat(u.path("suid")).st_mode & 0o7777 == 0o777


def test_passthrough_and_cached_handles_of_one_file_agree(stratafs_only):
    """The kernel fails an open that disagrees with the file's other open
    handles; and pages cached before passthrough writes must not be
    served afterwards."""
    u = passthrough_union(stratafs_only, lowers=[{"f": "old" * 1000}])
    reader = open(u.path("f"), "rb")              # lower: through the daemon
    try:
        assert reader.read() == b"old" * 1000
        with open(u.path("f"), "r+b") as w:       # copy-up, while reader is open
            w.write(b"NEW")
        reader.seek(0)
        assert reader.read(6) == b"NEWold"         # follows the copy-up
    finally:
        reader.close()
    st = os.stat(u.path("f"))
    with open(u.path("f"), "r+b") as w:           # alone now: passthrough
        w.write(b"PT!")
    # the old times hide the change from the kernel's own check (mtime)
    os.utime(u.path("f"), ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(u.path("f"), 0o4755)                  # privileged: cached again
    with open(u.path("f"), "rb") as r:
        assert r.read(6) == b"PT!old"
    assert read_bytes(u.upath("f"))[:6] == b"PT!old"
