# SPDX-License-Identifier: Apache-2.0
"""strata-csi as the CSI bench scripts run it: started on a temporary
store, called with messages generated from csi/csi.proto, stopped.

    plugin = Plugin(args.bin, tmp, timeout=60)    # the store: TMP/root
    try:
        vid = plugin.create_volume("bench", parameters={"layers": "base"})
        plugin.stage(vid, staging)
        plugin.call("Node", "NodeGetVolumeStats", plugin.pb.NodeGetVolumeStatsRequest(...))
    finally:
        plugin.stop()
"""

import os
import signal
import subprocess
import sys

import grpc

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def load_pb(tmp):
    """The CSI messages, generated into TMP (the scripts need no stubs)."""
    subprocess.run(["protoc", f"--python_out={tmp}", f"-I{REPO}/csi",
                    f"{REPO}/csi/csi.proto"], check=True)
    sys.path.insert(0, tmp)
    import csi_pb2
    return csi_pb2


class Plugin:
    """strata-csi of the build directory BINDIR on the store TMP/root (made
    by the caller, with its layers), logging to TMP/plugin.log, ready to
    answer. Its socket is in TMP/sock: the plugin never mounts in or above
    its socket's directory, so stagings and targets may go anywhere else
    in TMP. Each call waits TIMEOUT seconds at most."""

    def __init__(self, bindir, tmp, timeout):
        self.pb = load_pb(tmp)
        self.timeout = timeout
        self.cap = self.pb.VolumeCapability(
            mount=self.pb.VolumeCapability.MountVolume(),
            access_mode=self.pb.VolumeCapability.AccessMode(mode=1))
        os.makedirs(os.path.join(tmp, "sock"))
        sock = os.path.join(tmp, "sock", "csi.sock")
        with open(os.path.join(tmp, "plugin.log"), "w") as log:
            self.proc = subprocess.Popen(
                [os.path.join(bindir, "strata-csi"), "--endpoint",
                 f"unix://{sock}", "--nodeid", "bench",
                 "--root", os.path.join(tmp, "root"), "-v", "0",
                 "--stratafs", os.path.join(bindir, "stratafs")],
                stdout=log, stderr=log)
        self.ch = grpc.insecure_channel(f"unix://{sock}")
        try:
            grpc.channel_ready_future(self.ch).result(timeout=15)
        except BaseException:
            self.stop()
            raise

    def call(self, service, method, req):
        """/csi.v1.SERVICE/METHOD with REQ: its reply, or grpc.RpcError."""
        f = self.ch.unary_unary(
            f"/csi.v1.{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=getattr(self.pb, method + "Response").FromString)
        return f(req, timeout=self.timeout)

    def create_volume(self, name, **fields):
        """CreateVolume of a mount volume NAME with FIELDS: its id."""
        return self.call("Controller", "CreateVolume", self.pb.CreateVolumeRequest(
            name=name, volume_capabilities=[self.cap], **fields)).volume.volume_id

    def stage(self, vid, staging):
        self.call("Node", "NodeStageVolume", self.pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging, volume_capability=self.cap))

    def unstage(self, vid, staging):
        self.call("Node", "NodeUnstageVolume", self.pb.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=staging))

    def stop(self):
        """SIGTERM, and its exit awaited."""
        self.ch.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
