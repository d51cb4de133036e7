# SPDX-License-Identifier: Apache-2.0
"""The host's switch for FUSE over io_uring (csi/transport.c,
--fuse-uring off|on|leave), and a staged volume's transport and
passthrough as `stratactl volume inspect` shows them.

fuse.enable_uring is one switch for the whole machine, and other tests
of a CI run on this machine set it: these tests never touch it. Each
plugin runs in a mount namespace of its own (unshare -m, private
propagation) where a directory of the test's is bound over
/sys/module/fuse/parameters, holding a stand-in enable_uring the test
reads from outside. The plugin's code is the one that runs for real;
a marker file in the stand-in directory proves, before the plugin is
executed, that the bind is in place, so a failed mount never lets it
near the real switch."""

import json
import os
import subprocess

import pytest

from csitest import Kubelet, stratactl_binary

PARAMS = "/sys/module/fuse/parameters"
MARKER = "strata-test-stand-in"
HOWTO = ["'echo 1 > /sys/module/fuse/parameters/enable_uring'",
         "'options fuse enable_uring=1' in /etc/modprobe.d/",
         "'fuse.enable_uring=1' on the kernel command line"]


def stand_in(env, value, name="params"):
    """A directory to bind over PARAMS: enable_uring holds VALUE (None:
    no such file, a kernel without the feature)."""
    d = os.path.join(env.base, name)
    os.makedirs(d)
    open(os.path.join(d, MARKER), "w").close()
    if value is not None:
        with open(os.path.join(d, "enable_uring"), "w") as f:
            f.write(value)
    return d


def behind(d, readonly=False):
    """argv prefix: the plugin in a mount namespace of its own with D
    over PARAMS (read-only: as /sys is in an unprivileged container)."""
    ro = "-o ro " if readonly else ""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount --bind {ro}"$0" {PARAMS} && '
            f'test -e {PARAMS}/{MARKER} && exec "$@"', d]


def start(env, d, *args, readonly=False, **kw):
    p = env.plugin(root=env.layered_root(), prefix=behind(d, readonly),
                   extra=list(args), **kw)
    # the bind stayed in the plugin's namespace
    assert not os.path.exists(os.path.join(PARAMS, MARKER))
    return p


def switch(d):
    with open(os.path.join(d, "enable_uring")) as f:
        return f.read()


def said(p):
    """The one start-up line about the switch (none: None)."""
    lines = [l for l in p.log().splitlines() if "FUSE over io_uring" in l]
    assert len(lines) <= 1, lines
    return lines[0] if lines else None


# ---- the modes --------------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["--fuse-uring=off"]])
def test_off_is_the_default_and_writes_nothing(env, args):
    d = stand_in(env, "N\n")
    p = start(env, d, *args)
    assert said(p) == ("strata-csi: info: FUSE over io_uring: fuse.enable_uring "
                       "is off; left off (--fuse-uring=off)")
    assert switch(d) == "N\n"


def test_off_never_turns_it_off(env):
    """Another user of the host may need it: off is not 'set it to 0'."""
    d = stand_in(env, "Y\n")
    p = start(env, d, "--fuse-uring", "off")
    assert said(p) == ("strata-csi: info: FUSE over io_uring: fuse.enable_uring "
                       "is on; left on, as other FUSE daemons on this host may "
                       "use it (--fuse-uring=off)")
    assert switch(d) == "Y\n"


@pytest.mark.parametrize("value,word", [("N\n", "off"), ("Y\n", "on")])
def test_leave_only_reports(env, value, word):
    d = stand_in(env, value)
    p = start(env, d, "--fuse-uring=leave")
    assert said(p) == (f"strata-csi: info: FUSE over io_uring: fuse.enable_uring "
                       f"is {word}; left as it is (--fuse-uring=leave)")
    assert switch(d) == value


def test_on_turns_it_on(env):
    d = stand_in(env, "N\n")
    p = start(env, d, "--fuse-uring=on")
    assert switch(d).startswith("1")
    assert said(p) == ("strata-csi: info: FUSE over io_uring: fuse.enable_uring "
                       "was off; turned on (--fuse-uring=on): FUSE daemons that "
                       "ask for io_uring get it from their next mount")


def test_on_when_already_on_writes_nothing(env):
    d = stand_in(env, "Y\n")
    p = start(env, d, "--fuse-uring=on")
    assert said(p) == ("strata-csi: info: FUSE over io_uring: fuse.enable_uring "
                       "is on; nothing to do (--fuse-uring=on)")
    assert switch(d) == "Y\n"


def test_on_with_a_read_only_sys_starts_and_says_what_to_do(env):
    """An unprivileged container's /sys is read-only: the plugin serves
    all the same, and the log says how to set the switch on the host."""
    d = stand_in(env, "N\n")
    p = start(env, d, "--fuse-uring=on", readonly=True)
    line = said(p)
    assert line.startswith("strata-csi: warning: FUSE over io_uring: "
                           "fuse.enable_uring is off and cannot be turned on "
                           "from here (/sys/module/fuse/parameters/enable_uring: "
                           "Read-only file system: /sys is read-only, as in an "
                           "unprivileged container); set it on the host: "), line
    assert all(h in line for h in HOWTO), line
    assert switch(d) == "N\n"
    assert p.csi.Probe().reply.ready.value


@pytest.mark.parametrize("mode,level", [("on", "warning"), ("off", "info"),
                                        ("leave", "info")])
def test_a_kernel_without_the_switch_is_reported(env, mode, level):
    d = stand_in(env, None)
    p = start(env, d, f"--fuse-uring={mode}")
    assert said(p) == (
        f"strata-csi: {level}: FUSE over io_uring: "
        "/sys/module/fuse/parameters/enable_uring does not exist: this kernel "
        "has no FUSE over io_uring (Linux 6.14 and later, CONFIG_FUSE_IO_URING), "
        f"or its fuse module is not loaded yet; nothing done (--fuse-uring={mode})")
    assert sorted(os.listdir(d)) == [MARKER]


def test_a_value_of_neither_kind_is_reported(env):
    d = stand_in(env, "maybe\n")
    p = start(env, d, "--fuse-uring=on")
    assert said(p) == ("strata-csi: warning: FUSE over io_uring: "
                       "/sys/module/fuse/parameters/enable_uring: reads as "
                       "neither on nor off; nothing done (--fuse-uring=on)")
    assert switch(d) == "maybe\n"


@pytest.mark.parametrize("mode", ["on", "leave", "off"])
def test_a_controller_only_plugin_never_touches_it(env, mode):
    """It mounts nothing on its machine: not its switch."""
    d = stand_in(env, "N\n")
    p = start(env, d, f"--fuse-uring={mode}", mode="controller")
    assert switch(d) == "N\n"
    if mode == "off":
        assert said(p) is None
    else:
        assert said(p) == (f"strata-csi: info: FUSE over io_uring: "
                           f"--fuse-uring={mode} ignored: this plugin serves "
                           "only the Controller service, which mounts nothing "
                           "here")


def test_the_line_goes_in_the_json_log(env):
    d = stand_in(env, "N\n")
    p = start(env, d, "--fuse-uring=on", "--log-format=json")
    (rec,) = [json.loads(l) for l in p.log().splitlines()
              if "FUSE over io_uring" in l]
    assert rec["level"] == "info" and rec["message"].startswith(
        "FUSE over io_uring: fuse.enable_uring was off; turned on"), rec


# ---- a volume's transport ---------------------------------------------------

def inspect(p, vid, *json_flag):
    r = subprocess.run([stratactl_binary(), "--endpoint", p.endpoint,
                        *json_flag, "volume", "inspect", vid],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_inspect_shows_the_transport_and_passthrough(env, strata):
    """The plugin's daemons are supervised: /dev/fuse, whatever the
    switch says. Passthrough as the volume's class asked, as the daemon
    agreed it with the kernel."""
    k = Kubelet(env, strata)
    plain = k.create("plain")
    pt = k.create("pt", params={"passthrough": "true"})
    created = k.create("created")
    k.stage(plain)
    k.stage(pt)

    lines = inspect(strata, plain).splitlines()
    assert "transport /dev/fuse" in lines and "passthrough off" in lines, lines
    lines = inspect(strata, pt).splitlines()
    assert "transport /dev/fuse" in lines and "passthrough on" in lines, lines
    assert lines.index("transport /dev/fuse") == lines.index(
        f"daemon_pid {strata.daemon_pid(pt)}") + 2, lines   # after uptime
    j = json.loads(inspect(strata, pt, "--json"))["volume"]
    assert (j["transport"], j["passthrough"]) == ("dev", "on"), j

    # no daemon: nothing to say
    text = inspect(strata, created)
    assert "transport" not in text and "passthrough" not in text, text
    j = json.loads(inspect(strata, created, "--json"))["volume"]
    assert (j["transport"], j["passthrough"]) == ("", ""), j
