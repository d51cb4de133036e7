# SPDX-License-Identifier: Apache-2.0
"""strata-csi --metrics-address: Prometheus text scraped during a real
lifecycle, with the counters checked to move as the calls and the I/O
happen."""

import os
import re
import signal
import socket
import urllib.error
import urllib.request

import pytest

from csitest import Kubelet, poll, read_file, write_file


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def scrape(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z_]+)(\{[^}]*\})? (\S+)", line)
        assert m, f"not exposition format: {line!r}"
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return text, samples


def value(samples, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = name + ("{" + want + "}" if want else "")
    return samples.get(key, 0.0)


@pytest.fixture
def metered(env):
    addr = f"127.0.0.1:{free_port()}"
    p = env.plugin(root=env.layered_root(), extra=["--metrics-address", addr])
    return p, addr


def test_metrics_follow_a_lifecycle(env, metered):
    p, addr = metered
    k = Kubelet(env, p)
    text0, s0 = scrape(addr)
    assert re.search(r'^strata_csi_build_info\{version="\d[^"]*",'
                     r'driver="strata.csi.dev"\} 1$', text0, re.M)
    assert value(s0, "strata_csi_volumes_staged") == 0
    assert value(s0, "strata_store_free_bytes") > 0
    st = os.statvfs(p.root)
    assert value(s0, "strata_store_capacity_bytes") == st.f_blocks * st.f_frsize

    vid = k.create("m1")
    staging = k.stage(vid)
    target = k.publish(vid, staging)
    write_file(os.path.join(target, "new.bin"), b"w" * (3 << 20))
    assert read_file(os.path.join(target, "lower.txt"))
    assert p.csi.call("NodeGetVolumeStats", volume_id="sv-" + "0" * 32,
                      volume_path=target).code == "NOT_FOUND"

    text, s1 = scrape(addr)
    assert value(s1, "strata_csi_rpc_total", method="CreateVolume", code="OK") == 1
    assert value(s1, "strata_csi_rpc_total", method="NodeStageVolume", code="OK") == 1
    assert value(s1, "strata_csi_rpc_total", method="NodePublishVolume", code="OK") == 1
    assert value(s1, "strata_csi_rpc_total", method="NodeGetVolumeStats",
                 code="NOT_FOUND") == 1
    assert value(s1, "strata_csi_rpc_duration_seconds_count",
                 method="NodeStageVolume", code="OK") == 1
    assert value(s1, "strata_csi_rpc_duration_seconds_bucket",
                 method="NodeStageVolume", code="OK", le="+Inf") == 1
    assert value(s1, "strata_csi_rpc_duration_seconds_sum",
                 method="NodeStageVolume", code="OK") > 0
    assert value(s1, "strata_csi_volumes_staged") == 1
    assert value(s1, "strata_csi_volumes_published") == 1
    assert value(s1, "strata_csi_daemon_starts_total") == 1
    assert value(s1, "strata_volume_written_bytes_total", volume=vid) >= 3 << 20
    assert value(s1, "strata_volume_read_bytes_total", volume=vid) > 0
    assert value(s1, "strata_volume_fuse_ops_total", volume=vid, op="create") == 1
    assert value(s1, "strata_volume_fuse_ops_total", volume=vid, op="write") >= 3
    assert value(s1, "strata_volume_fuse_ops_total", volume=vid, op="lookup") >= 1
    # histogram buckets are cumulative
    buckets = [float(m.group(2)) for m in re.finditer(
        r'strata_csi_rpc_duration_seconds_bucket\{method="CreateVolume",code="OK",'
        r'le="([^"]+)"\} (\S+)', text)]
    assert buckets == sorted(buckets) and buckets[-1] == 1

    # the daemon dies and the plugin heals the volume: exits and restarts move
    os.kill(p.daemon_pid(vid), signal.SIGKILL)
    poll(lambda: value(scrape(addr)[1], "strata_csi_daemon_restarts_total") == 1,
         20, what="the heal to be counted")
    s2 = scrape(addr)[1]
    assert value(s2, "strata_csi_daemon_exits_total") >= 1
    assert value(s2, "strata_csi_daemon_starts_total") == 2

    k.unpublish(vid, target)
    k.unstage(vid, staging)
    s3 = scrape(addr)[1]
    assert value(s3, "strata_csi_volumes_staged") == 0
    assert value(s3, "strata_csi_volumes_published") == 0
    assert value(s3, "strata_volume_written_bytes_total", volume=vid) == 0
    k.delete(vid)


def test_metrics_http_errors(metered):
    _, addr = metered
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{addr}/nothing", timeout=5)
    assert e.value.code == 404
    req = urllib.request.Request(f"http://{addr}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 405


@pytest.mark.parametrize("addr", ["nonsense", "127.0.0.1:", "999.1.1.1:80"])
def test_metrics_bad_address_refused(env, addr):
    p = env.plugin(root=env.layered_root(), extra=["--metrics-address", addr],
                   start=False)
    p.start(wait=None)
    assert p.proc.wait(timeout=10) == 1
    assert "metrics" in p.log()
