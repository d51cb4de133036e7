# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes manifests (packaging/kubernetes), rendered as a cluster
would get them (`kubectl kustomize`), checked against the CSI facts that
decide the design and against the real strata-csi binary: every flag the
DaemonSet passes must be one `strata-csi --help` lists, with a well-formed
value, and the binary must parse the exact argument list.

Needs: kubectl >= 1.27 (its kustomize v5 renders components and
replacements; tested with 1.32), python3-yaml (apt), STRATA_CSI=<built
strata-csi>.
Each checker returns a list of problems; the negative tests feed them
broken manifests, so none of these checks can pass by checking nothing.
"""

import copy
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "packaging" / "kubernetes"
DRIVER = "strata.csi.dev"
KUBELET = "/var/lib/kubelet"

# kind -> the apiVersion it must have. A kind not here is a failure too:
# adding a kind means adding it here, on purpose.
API_VERSIONS = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "PersistentVolumeClaim": "v1",
    "Pod": "v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "CSIDriver": "storage.k8s.io/v1",
    "StorageClass": "storage.k8s.io/v1",
    "DaemonSet": "apps/v1",
}
BASE_KINDS = {
    "Namespace": 1, "ServiceAccount": 1, "ClusterRole": 2,
    "ClusterRoleBinding": 2, "Role": 1, "RoleBinding": 1, "CSIDriver": 1,
    "StorageClass": 1, "DaemonSet": 1,
}
EXAMPLE_KINDS = dict(BASE_KINDS, Namespace=2, PersistentVolumeClaim=3, Pod=4)
# components/single-node-resizer adds the resizer's ClusterRole and binding.
RESIZER_KINDS = dict(BASE_KINDS, ClusterRole=3, ClusterRoleBinding=3)

SNAPSHOT_GROUP = "snapshot.storage.k8s.io"
# What each sidecar needs, cluster-wide, when it is in the pod:
# (apiGroup, resource) -> verbs. The node-driver-registrar and the
# livenessprobe need nothing. The provisioner runs per node with capacity
# tracking and restores claims from VolumeSnapshots; the snapshotter's and
# the resizer's are their upstream deploy/ RBAC (no leases: no leader
# election; no group snapshots: the plugin has no GroupController).
CLUSTER_RULES = {
    "csi-provisioner": {
        ("", "persistentvolumes"): {"get", "list", "watch", "create", "delete"},
        ("", "persistentvolumeclaims"): {"get", "list", "watch", "update"},
        ("storage.k8s.io", "storageclasses"): {"get", "list", "watch"},
        ("", "events"): {"list", "watch", "create", "update", "patch"},
        ("storage.k8s.io", "csinodes"): {"get", "list", "watch"},
        ("", "nodes"): {"get", "list", "watch"},
        (SNAPSHOT_GROUP, "volumesnapshots"): {"get", "list"},
        (SNAPSHOT_GROUP, "volumesnapshotcontents"): {"get", "list"},
    },
    "csi-snapshotter": {
        ("", "events"): {"list", "watch", "create", "update", "patch"},
        (SNAPSHOT_GROUP, "volumesnapshotclasses"): {"get", "list", "watch"},
        (SNAPSHOT_GROUP, "volumesnapshotcontents"):
            {"create", "get", "list", "watch", "update", "patch"},
        (SNAPSHOT_GROUP, "volumesnapshotcontents/status"): {"update", "patch"},
    },
    "csi-resizer": {
        ("", "persistentvolumes"): {"get", "list", "watch", "patch"},
        ("", "persistentvolumeclaims"): {"get", "list", "watch"},
        ("", "persistentvolumeclaims/status"): {"patch"},
        ("", "pods"): {"get", "list", "watch"},
        ("", "events"): {"list", "watch", "create", "update", "patch"},
    },
}
NAMESPACE_RULES = {
    ("storage.k8s.io", "csistoragecapacities"):
        {"get", "list", "watch", "create", "update", "patch", "delete"},
    ("", "pods"): {"get"},
}
REGISTRY = "registry.k8s.io/sig-storage/"
# Sidecars: image -> major version of the CSI 1.12-era releases.
SIDECARS = {
    REGISTRY + "csi-node-driver-registrar": 2,
    REGISTRY + "livenessprobe": 2,
    REGISTRY + "csi-provisioner": 5,
    REGISTRY + "csi-snapshotter": 8,
    REGISTRY + "csi-resizer": 1,
}
# The sidecars the base's DaemonSet runs: all of them but the resizer,
# which has no per-node mode (components/single-node-resizer adds it).
BASE_SIDECARS = set(SIDECARS) - {REGISTRY + "csi-resizer"}
RESIZER_SIDECARS = BASE_SIDECARS | {REGISTRY + "csi-resizer"}
STRATA_IMAGE = "ghcr.io/strata-csi/strata"
# Values the downward API would give, to expand $(VAR) as kubelet does.
FIELD_SAMPLES = {
    "spec.nodeName": "node-1",
    "metadata.name": "strata-node-x7k2p",
    "metadata.namespace": "strata-system",
}
LAYER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# ---------------------------------------------------------------- rendering

def render(kubectl, directory):
    """kubectl kustomize DIR, parsed: a list of documents."""
    out = subprocess.run([kubectl, "kustomize", str(directory)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"kubectl kustomize {directory}:\n{out.stderr}"
    docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    assert docs, f"kubectl kustomize {directory} rendered nothing"
    return docs


@pytest.fixture(scope="session")
def kubectl(require_tool):
    return require_tool("kubectl", hint=(
        "install kubectl >= 1.27 (kustomize v5: components, replacements); "
        "Debian's kubernetes-client 1.20 is too old"))


@pytest.fixture(scope="module")
def base(kubectl):
    return render(kubectl, K8S)


@pytest.fixture(scope="module")
def examples(kubectl):
    return render(kubectl, K8S / "examples")


@pytest.fixture(scope="module")
def resizer(kubectl, tmp_path_factory):
    """The driver with components/single-node-resizer, as its header says
    to use it: an overlay naming the tree and the component."""
    root = tmp_path_factory.mktemp("single-node-resizer")
    rel = os.path.relpath(K8S, root)
    (root / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [rel],
        "components": [f"{rel}/components/single-node-resizer"]}))
    return render(kubectl, root)


@pytest.fixture(scope="session")
def plugin_help(require_program):
    binary = require_program("STRATA_CSI")
    out = subprocess.run([binary, "--help"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, f"{binary} --help: {out.returncode} {out.stderr}"
    return binary, out.stdout


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def container(ds, name):
    found = [c for c in ds["spec"]["template"]["spec"]["containers"]
             if c["name"] == name]
    assert len(found) == 1, f"DaemonSet has no single container {name}"
    return found[0]


def volumes(ds):
    return {v["name"]: v for v in ds["spec"]["template"]["spec"].get("volumes", [])}


def mounts(c):
    return {m["name"]: m for m in c.get("volumeMounts", [])}


# ---------------------------------------------------------------- checkers

def check_kinds(docs, expected):
    """Kinds and apiVersions against the tables; names unique per kind."""
    problems, counts, seen = [], {}, set()
    for d in docs:
        kind, api = d.get("kind"), d.get("apiVersion")
        if kind not in API_VERSIONS:
            problems.append(f"unexpected kind {kind} ({api})")
        elif api != API_VERSIONS[kind]:
            problems.append(f"{kind} {d['metadata']['name']}: apiVersion "
                            f"{api}, want {API_VERSIONS[kind]}")
        counts[kind] = counts.get(kind, 0) + 1
        key = (kind, d["metadata"].get("namespace"), d["metadata"]["name"])
        if key in seen:
            problems.append(f"duplicate {key}")
        seen.add(key)
    if counts != expected:
        problems.append(f"kinds {counts}, want {expected}")
    return problems


def parse_help(text):
    """Options of `strata-csi --help`: name -> takes a value. An option line
    is indented (by at most 4 spaces: deeper lines continue the text
    before) and starts with a dash; an upper-case word after the name
    (EP, NODE, N) is its value."""
    spec = {}
    for line in text.splitlines():
        m = re.match(r"^ {1,4}(-{1,2}[A-Za-z][\w-]*)(?:[ =]([A-Z][A-Z_]*))?(?:\s|$)",
                     line)
        if m:
            spec[m.group(1)] = m.group(2) is not None
    return spec


def container_env(c):
    """name -> (value kubelet would give, fieldPath or None)."""
    env = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if ref is not None:
            env[e["name"]] = (FIELD_SAMPLES.get(ref, f"<{ref}>"), ref)
        else:
            env[e["name"]] = (expand(e.get("value", ""), env)[0], None)
    return env


def expand(s, env):
    """$(VAR) as kubelet expands it in args: defined variables only, $$
    escapes. Returns the string and the undefined names left in it."""
    undefined = []

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        if m.group(1) in env:
            return env[m.group(1)][0]
        undefined.append(m.group(1))
        return m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s), undefined


def split_flags(argv, spec):
    """[(option, value or None, index)] and problems, parsed the way the
    binary's getopt_long does, but without its unambiguous-prefix matching:
    a manifest spells options in full."""
    out, problems, i = [], [], 0
    while i < len(argv):
        a, value = argv[i], None
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            if not eq:
                value = None
        elif a.startswith("-") and len(a) > 1:
            name, value = a[:2], (a[2:] or None)
        else:
            problems.append(f"stray argument {a!r}")
            i += 1
            continue
        if name not in spec:
            problems.append(f"{name}: not an option in strata-csi --help")
        elif spec[name] and value is None:
            if i + 1 >= len(argv):
                problems.append(f"{name}: missing its value")
            else:
                i += 1
                value = argv[i]
        elif not spec[name] and value is not None:
            problems.append(f"{name}: takes no value, got {value!r}")
        out.append((name, value, i))
        i += 1
    return out, problems


def plugin_argv(c):
    """The strata-csi container's argv after the image's ENTRYPOINT, raw."""
    command = c.get("command")
    if command not in (None, ["strata-csi"]):
        return None
    return list(c.get("args", []))


def check_plugin_args(docs, spec):
    """Every option the DaemonSet passes to strata-csi: known to the
    binary, with a value of the right form and coherent with the pod."""
    problems = []
    ds = one(docs, "DaemonSet")
    driver = one(docs, "CSIDriver")["metadata"]["name"]
    c = container(ds, "strata-csi")
    raw = plugin_argv(c)
    if raw is None:
        return [f"strata-csi container overrides the entrypoint: {c['command']}"]
    env = container_env(c)
    argv = []
    for a in raw:
        s, undefined = expand(a, env)
        problems += [f"{a}: $({u}) is not defined in the container's env"
                     for u in undefined]
        argv.append(s)
    flags, p = split_flags(argv, spec)
    problems += p
    vols, mnts = volumes(ds), mounts(c)
    mount_paths = {m["mountPath"]: m["name"] for m in mnts.values()}

    def mounted_dir(path):
        return path in mount_paths

    def host_path_of(path):
        """Where `path` inside the container is on the host: below the
        deepest hostPath volume mounted over it, or None."""
        best = None
        for mp in mount_paths:
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                if best is None or len(mp) > len(best):
                    best = mp
        hp = vols.get(mount_paths.get(best), {}).get("hostPath", {}).get("path")
        if best is None or hp is None:
            return None
        return hp + path[len(best):]

    seen = set()
    for name, value, i in flags:
        if name in seen and name != "--allowed-path-prefix":
            problems.append(f"{name} given twice")
        seen.add(name)
        rawarg = raw[i] if i < len(raw) else ""
        if name in ("--help", "--version"):
            problems.append(f"{name} would make the plugin exit")
        elif name == "--endpoint":
            m = re.fullmatch(r"unix://(/[^\s]+\.sock)", value or "")
            if not m:
                problems.append(f"--endpoint {value!r}: want unix:///abs/path.sock")
                continue
            path = m.group(1)
            if len(path.encode()) > 107:
                problems.append(f"--endpoint: socket path over 107 bytes")
            if not mounted_dir(os.path.dirname(path)):
                problems.append(f"--endpoint: {os.path.dirname(path)} is not "
                                "a mounted volume (the sidecars cannot reach it)")
        elif name == "--nodeid":
            m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", rawarg.partition("=")[2]
                             if "=" in rawarg else rawarg)
            if not m or env.get(m.group(1), (None, None))[1] != "spec.nodeName":
                problems.append(f"--nodeid {rawarg!r}: must come from the "
                                "downward API (an env var with fieldRef spec.nodeName)")
        elif name == "--root":
            if not (value or "").startswith("/") or not mounted_dir(value):
                problems.append(f"--root {value!r}: not a mounted volume")
            elif vols.get(mount_paths[value], {}).get("hostPath") is None:
                problems.append(f"--root {value!r}: not on a hostPath "
                                "(volumes would not outlive the pod)")
        elif name == "--driver-name":
            if value != driver:
                problems.append(f"--driver-name {value!r}: the CSIDriver is {driver!r}")
        elif name == "--mode":
            modes = (value or "").split(",")
            if not value or not set(modes) <= {"node", "controller"} or \
                    len(modes) != len(set(modes)):
                problems.append(f"--mode {value!r}: a list of node, controller")
        elif name == "--max-volumes":
            if not re.fullmatch(r"\d+", value or ""):
                problems.append(f"--max-volumes {value!r}: a count")
        elif name == "--stratafs":
            if not (value or "").startswith("/"):
                problems.append(f"--stratafs {value!r}: an absolute path")
        elif name == "-v":
            if not re.fullmatch(r"[0-5]", value or ""):
                problems.append(f"-v {value!r}: a level 0-5 (write -v2 or -v 2)")
        elif name == "--log-format":
            if value not in ("text", "json"):
                problems.append(f"--log-format {value!r}: text or json")
        elif name == "--allowed-path-prefix":
            # kubelet's directory, mounted at the same path, where the
            # staging and target paths are: nothing else is mounted on
            m = mnts.get(mount_paths.get(value or ""), {})
            if m.get("mountPropagation") != "Bidirectional":
                problems.append(f"--allowed-path-prefix {value!r}: not kubelet's "
                                "directory (a Bidirectional mount)")
        elif name == "--daemon-mount-namespace":
            # the host's init: pid 1 is the pod's own without hostPID
            if value != "/proc/1/ns/mnt":
                problems.append(f"--daemon-mount-namespace {value!r}: want "
                                "/proc/1/ns/mnt, the host's")
            elif not ds["spec"]["template"]["spec"].get("hostPID"):
                problems.append("--daemon-mount-namespace without hostPID: "
                                "/proc/1 is the pod's own init")
        elif name == "--daemon-cgroup":
            parent = os.path.dirname(value or "")
            if not (value or "").startswith("/") or \
                    os.path.basename(value) in ("", ".", "..") or \
                    host_path_of(parent) != "/sys/fs/cgroup":
                problems.append(f"--daemon-cgroup {value!r}: want DIR/NAME, "
                                "DIR a mount of the host's /sys/fs/cgroup")
        elif name == "--daemon-binary-dir":
            # daemons in the host's namespace run it by this very path
            if not (value or "").startswith("/") or host_path_of(value) != value:
                problems.append(f"--daemon-binary-dir {value!r}: not at the "
                                "same path on the host")
        elif name == "--fuse-uring":
            # on writes the host's /sys, read-only in a container that is
            # not privileged: the plugin would start and set nothing
            if value not in ("off", "on", "leave"):
                problems.append(f"--fuse-uring {value!r}: off, on or leave")
            elif value == "on" and \
                    c.get("securityContext", {}).get("privileged") is not True:
                problems.append("--fuse-uring=on in an unprivileged container: "
                                "its /sys is read-only, so fuse.enable_uring "
                                "cannot be set from it (set it on the host)")
        elif name in spec:
            problems.append(f"{name}: the binary takes it, but this test has "
                            "no rule for its value yet: add one")
    for needed in ("--daemon-mount-namespace", "--daemon-cgroup",
                   "--daemon-binary-dir"):
        if needed not in seen:
            problems.append(f"{needed} missing: the daemons would die with "
                            "the plugin's container")
    if "--daemon-mount-namespace" in seen:
        # daemons in the host's namespace open the store by its path, and
        # inline volumes' mounts below it must reach the host
        root = next((v for n, v, _ in flags if n == "--root"), "/var/lib/strata")
        if host_path_of(root) != root:
            problems.append(f"--root {root!r}: not at the same path on the "
                            "host, where the daemons open it")
        eph = root + "/ephemeral"
        em = mnts.get(mount_paths.get(eph), {})
        if host_path_of(eph) != eph or em.get("mountPropagation") != "Bidirectional":
            problems.append(f"{eph}: inline volumes are staged there; mount "
                            "it at the same path, Bidirectional")
    if "--allowed-path-prefix" not in seen:
        problems.append("--allowed-path-prefix missing: staging and target "
                        "paths must be confined to kubelet's directory")
    if "--nodeid" not in seen:
        problems.append("--nodeid missing (required)")
    if "--endpoint" not in seen and "CSI_ENDPOINT" not in env:
        problems.append("--endpoint missing (required)")
    return problems, argv


def check_daemonset(docs, want_sidecars=BASE_SIDECARS):
    """The node pod: privileges, propagation, devices, store, priority,
    tolerations, resources, probes, the sockets the sidecars share, and
    exactly the sidecars `want_sidecars` names (images)."""
    problems = []
    ds = one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    vols = volumes(ds)
    plugin = container(ds, "strata-csi")
    pm = mounts(plugin)

    if pod.get("priorityClassName") != "system-node-critical":
        problems.append("priorityClassName is not system-node-critical")
    if not any(t.get("operator") == "Exists" and not t.get("key")
               for t in pod.get("tolerations", [])):
        problems.append("no toleration of every taint (operator Exists, no key)")
    if pod.get("hostNetwork"):
        problems.append("hostNetwork: the probe ports would clash with the node's")
    labels = ds["spec"]["template"]["metadata"].get("labels", {})
    sel = ds["spec"]["selector"].get("matchLabels", {})
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        problems.append("selector does not match the pod template's labels")

    if plugin.get("securityContext", {}).get("privileged") is not True:
        problems.append("strata-csi is not privileged")
    for c in pod["containers"]:
        for m in c.get("volumeMounts", []):
            if m.get("mountPropagation") == "Bidirectional" and \
                    c.get("securityContext", {}).get("privileged") is not True:
                problems.append(f"{c['name']}: Bidirectional needs privileged")
        res = c.get("resources", {})
        if not {"cpu", "memory"} <= set(res.get("requests", {})) or \
                "memory" not in res.get("limits", {}):
            problems.append(f"{c['name']}: needs cpu+memory requests and a memory limit")
        image = c.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            problems.append(f"{c['name']}: image {image!r} is not pinned")

    # kubelet's directory: same path inside, Bidirectional, on the host's.
    kd = [n for n, v in vols.items()
          if v.get("hostPath", {}).get("path") == KUBELET]
    if len(kd) != 1:
        problems.append(f"no single hostPath volume of {KUBELET}")
    else:
        m = pm.get(kd[0])
        if not m or m["mountPath"] != KUBELET or \
                m.get("mountPropagation") != "Bidirectional":
            problems.append(f"strata-csi must mount {KUBELET} at the same path "
                            "with mountPropagation Bidirectional")
    # /dev/fuse
    fuse = [n for n, v in vols.items()
            if v.get("hostPath", {}).get("path") == "/dev/fuse"]
    if len(fuse) != 1 or vols[fuse[0]]["hostPath"].get("type") != "CharDevice" \
            or pm.get(fuse[0], {}).get("mountPath") != "/dev/fuse":
        problems.append("strata-csi must mount the host's /dev/fuse (CharDevice)")
    # The store on the host.
    store = [n for n, v in vols.items()
             if v.get("hostPath", {}).get("path") == "/var/lib/strata"]
    if len(store) != 1 or store[0] not in pm:
        problems.append("strata-csi must mount the hostPath /var/lib/strata")
    elif f"--root={pm[store[0]]['mountPath']}" not in plugin.get("args", []):
        problems.append("--root is not where the store's hostPath is mounted")

    # One socket for all: strata-csi's endpoint, the sidecars' --csi-address,
    # and the path kubelet is told about.
    sock_host = f"{KUBELET}/plugins/{DRIVER}/csi.sock"
    sd = [n for n, v in vols.items()
          if v.get("hostPath", {}).get("path") == os.path.dirname(sock_host)]
    if len(sd) != 1:
        problems.append(f"no hostPath volume of {os.path.dirname(sock_host)}")
        return problems
    sock_vol = sd[0]

    def socket_of(c, path):
        m = mounts(c).get(sock_vol)
        if not m or os.path.dirname(path) != m["mountPath"].rstrip("/"):
            problems.append(f"{c['name']}: {path} is not in the socket volume")
        elif os.path.basename(path) != os.path.basename(sock_host):
            problems.append(f"{c['name']}: socket {path}, want "
                            f"{os.path.basename(sock_host)}")

    penv = container_env(plugin)
    endpoint = [expand(a, penv)[0] for a in plugin.get("args", [])
                if a.startswith("--endpoint=")]
    if len(endpoint) != 1 or not endpoint[0].startswith("--endpoint=unix://"):
        problems.append("strata-csi: no single --endpoint=unix://...")
    else:
        socket_of(plugin, endpoint[0][len("--endpoint=unix://"):])

    def flag(c, name):
        env = container_env(c)
        vals = [expand(a, env)[0].partition("=")[2] for a in c.get("args", [])
                if a.partition("=")[0] == name]
        return vals[0] if len(vals) == 1 else None

    sidecars = {}
    for c in pod["containers"]:
        image = c.get("image", "").rsplit(":", 1)[0]
        if image in SIDECARS:
            sidecars[image.rsplit("/", 1)[1]] = c
            addr = flag(c, "--csi-address")
            if addr is None:
                problems.append(f"{c['name']}: no --csi-address")
            else:
                socket_of(c, addr.removeprefix("unix://"))
    want = {i.rsplit("/", 1)[1] for i in want_sidecars}
    if set(sidecars) != want:
        problems.append(f"sidecars {sorted(sidecars)}, want {sorted(want)}")
        return problems

    reg = sidecars["csi-node-driver-registrar"]
    if flag(reg, "--kubelet-registration-path") != sock_host:
        problems.append(f"registrar: --kubelet-registration-path is "
                        f"{flag(reg, '--kubelet-registration-path')!r}, want {sock_host}")
    rd = [n for n, v in vols.items()
          if v.get("hostPath", {}).get("path") == f"{KUBELET}/plugins_registry"]
    if len(rd) != 1 or mounts(reg).get(rd[0], {}).get("mountPath") != "/registration":
        problems.append("registrar must mount plugins_registry at /registration")

    # kubelet probes strata-csi on the port the livenessprobe sidecar serves.
    lp = sidecars["livenessprobe"]
    port = int(flag(lp, "--health-port") or 9808)
    probe = plugin.get("livenessProbe", {}).get("httpGet")
    if not probe:
        problems.append("strata-csi has no livenessProbe httpGet")
    else:
        p = probe.get("port")
        if isinstance(p, str):
            p = {q.get("name"): q["containerPort"]
                 for q in plugin.get("ports", [])}.get(p)
        if p != port or probe.get("path") != "/healthz":
            problems.append(f"strata-csi livenessProbe {probe} does not reach "
                            f"the livenessprobe sidecar on :{port}/healthz")

    prov = sidecars["csi-provisioner"]
    if flag(prov, "--node-deployment") != "true":
        problems.append("provisioner: --node-deployment=true missing")
    if flag(prov, "--enable-capacity") not in ("true", ""):
        problems.append("provisioner: --enable-capacity missing")
    if "--enable-capacity" not in [a.partition("=")[0] for a in prov.get("args", [])]:
        problems.append("provisioner: --enable-capacity missing")
    level = flag(prov, "--capacity-ownerref-level")
    if level not in ("0", "1", "2"):
        problems.append(f"provisioner: --capacity-ownerref-level {level!r}")
    if any("Topology=false" in a for a in prov.get("args", [])):
        problems.append("provisioner: topology turned off")
    if flag(prov, "--leader-election") == "true":
        problems.append("provisioner: leader election in per-node mode")
    penv = container_env(prov)
    for var, ref in (("NODE_NAME", "spec.nodeName"),
                     ("NAMESPACE", "metadata.namespace"),
                     ("POD_NAME", "metadata.name")):
        if penv.get(var, (None, None))[1] != ref:
            problems.append(f"provisioner: env {var} must come from {ref}")

    # The snapshotter per node: it takes the contents labelled with
    # $NODE_NAME, and exits without it or with leader election.
    snap = sidecars["csi-snapshotter"]
    if flag(snap, "--node-deployment") not in ("true", ""):
        problems.append("snapshotter: --node-deployment=true missing")
    if flag(snap, "--leader-election") in ("true", ""):
        problems.append("snapshotter: --leader-election with --node-deployment "
                        "(the sidecar refuses both)")
    if container_env(snap).get("NODE_NAME", (None, None))[1] != "spec.nodeName":
        problems.append("snapshotter: env NODE_NAME must come from spec.nodeName")

    # The resizer, where a component adds it: no release knows
    # --node-deployment (it would exit on the unknown flag).
    rsz = sidecars.get("csi-resizer")
    if rsz is not None:
        if any(a.partition("=")[0] == "--node-deployment" for a in rsz.get("args", [])):
            problems.append("resizer: --node-deployment is not a flag of any "
                            "external-resizer release")
        if flag(rsz, "--leader-election") in ("true", ""):
            problems.append("resizer: leader election on, but no Role grants leases")
    return problems


def check_images(docs, version):
    problems = []
    ds = one(docs, "DaemonSet")
    for c in ds["spec"]["template"]["spec"]["containers"]:
        name, _, tag = c["image"].rpartition(":")
        if name == STRATA_IMAGE:
            if tag != version:
                problems.append(f"{c['image']}: want tag {version} (configure.ac)")
        elif name in SIDECARS:
            m = re.fullmatch(r"v(\d+)\.\d+\.\d+", tag)
            if not m or int(m.group(1)) != SIDECARS[name]:
                problems.append(f"{c['image']}: want a v{SIDECARS[name]}.x.y release")
        else:
            problems.append(f"unexpected image {c['image']}")
    return problems


def check_csidriver(docs):
    spec = one(docs, "CSIDriver")["spec"]
    want = {
        "attachRequired": False,
        "podInfoOnMount": True,
        "fsGroupPolicy": "None",
        "storageCapacity": True,
    }
    problems = [f"CSIDriver {k}: {spec.get(k)!r}, want {v!r}"
                for k, v in want.items() if spec.get(k) != v]
    if sorted(spec.get("volumeLifecycleModes", [])) != ["Ephemeral", "Persistent"]:
        problems.append(f"volumeLifecycleModes {spec.get('volumeLifecycleModes')}")
    return problems


def check_storageclass(docs, expansion=False):
    """EXPANSION: whether the class must allow expansion (true only with
    components/single-node-resizer, which runs the resizer)."""
    problems = []
    driver = one(docs, "CSIDriver")["metadata"]["name"]
    for sc in (d for d in docs if d["kind"] == "StorageClass"):
        n = sc["metadata"]["name"]
        if sc.get("provisioner") != driver:
            problems.append(f"StorageClass {n}: provisioner {sc.get('provisioner')}")
        if sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            problems.append(f"StorageClass {n}: not WaitForFirstConsumer")
        if sc.get("reclaimPolicy") != "Delete":
            problems.append(f"StorageClass {n}: reclaimPolicy {sc.get('reclaimPolicy')}")
        # The plugin expands volumes online (EXPAND_VOLUME on both
        # services), but only a resizer calls it: without one, false makes
        # the API server refuse a larger request instead of taking it.
        if sc.get("allowVolumeExpansion") is not expansion:
            problems.append(f"StorageClass {n}: allowVolumeExpansion must be "
                            f"{str(expansion).lower()}")
        params = sc.get("parameters", {})
        for k in params:
            if k != "layers" and not k.startswith("csi.storage.k8s.io/"):
                problems.append(f"StorageClass {n}: the plugin refuses parameter {k}")
        layers = str(params.get("layers", "")).split(",")
        if "layers" not in params or not all(
                LAYER_NAME.match(x) and x not in (".", "..") for x in layers):
            problems.append(f"StorageClass {n}: layers {params.get('layers')!r}")
    return problems


def check_rbac(docs):
    problems = []
    ds = one(docs, "DaemonSet")
    ns = ds["metadata"].get("namespace")
    sa = ds["spec"]["template"]["spec"].get("serviceAccountName")
    if not any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == sa
               and d["metadata"].get("namespace") == ns for d in docs):
        problems.append(f"ServiceAccount {ns}/{sa} is not rendered")
    if not any(d["kind"] == "Namespace" and d["metadata"]["name"] == ns
               for d in docs):
        problems.append(f"Namespace {ns} is not rendered")

    def granted(role_kind, binding_kind, namespace):
        rules = {}
        for b in (d for d in docs if d["kind"] == binding_kind
                  and d["metadata"].get("namespace") == namespace):
            if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa
                       and s.get("namespace") == ns for s in b.get("subjects", [])):
                continue
            ref = b["roleRef"]
            if ref.get("kind") != role_kind:
                continue
            for r in (d for d in docs if d["kind"] == role_kind
                      and d["metadata"]["name"] == ref["name"]
                      and d["metadata"].get("namespace") == namespace):
                for rule in r.get("rules", []):
                    for g in rule.get("apiGroups", []):
                        for res in rule.get("resources", []):
                            rules.setdefault((g, res), set()).update(rule.get("verbs", []))
        return rules

    # Each sidecar in the pod needs its rules; they all share the pod's
    # ServiceAccount, so what the roles bound to it grant together counts.
    present = {c.get("name") for c in ds["spec"]["template"]["spec"]["containers"]}
    wants = [(f"ClusterRole ({name})", "ClusterRole", "ClusterRoleBinding", None, rules)
             for name, rules in CLUSTER_RULES.items() if name in present]
    wants.append(("Role", "Role", "RoleBinding", ns, NAMESPACE_RULES))
    for (what, kind, bkind, namespace, want) in wants:
        have = granted(kind, bkind, namespace)
        for key, verbs in want.items():
            missing = verbs - have.get(key, set())
            if missing:
                problems.append(f"{what}: {key[0] or 'core'}/{key[1]} lacks {sorted(missing)}")
    prov = container(ds, "csi-provisioner")
    if "--capacity-ownerref-level=2" in prov.get("args", []) and \
            "get" not in granted("Role", "RoleBinding", ns).get(("apps", "replicasets"), set()):
        problems.append("ownerref level 2 walks a ReplicaSet: Role lacks apps/replicasets get")
    return problems


def check_examples(docs):
    problems = []
    classes = {d["metadata"]["name"] for d in docs if d["kind"] == "StorageClass"}
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    claims = {}
    for d in docs:
        if d["kind"] in ("PersistentVolumeClaim", "Pod"):
            if d["metadata"].get("namespace") not in namespaces:
                problems.append(f"{d['kind']} {d['metadata']['name']}: namespace "
                                f"{d['metadata'].get('namespace')} is not rendered")
        if d["kind"] == "PersistentVolumeClaim":
            sc = d["spec"].get("storageClassName")
            if sc not in classes:
                problems.append(f"PVC {d['metadata']['name']}: no StorageClass {sc}")
            if not set(d["spec"].get("accessModes", [])) <= {"ReadWriteOnce",
                                                              "ReadWriteOncePod"}:
                problems.append(f"PVC {d['metadata']['name']}: the plugin refuses "
                                f"{d['spec'].get('accessModes')} (volumes are node-local)")
            claims[(d["metadata"].get("namespace"), d["metadata"]["name"])] = sc
    used = {}
    for pod in (d for d in docs if d["kind"] == "Pod"):
        for v in pod["spec"].get("volumes", []):
            if "csi" in v:
                # an inline volume: the plugin's attributes, nothing else
                csi = v["csi"]
                attrs = csi.get("volumeAttributes", {})
                if csi.get("driver") != DRIVER:
                    problems.append(f"Pod {pod['metadata']['name']}: inline volume "
                                    f"of driver {csi.get('driver')}")
                if set(attrs) - {"layers"} or not all(
                        LAYER_NAME.match(x) for x in attrs.get("layers", "").split(",")):
                    problems.append(f"Pod {pod['metadata']['name']}: inline volume "
                                    f"attributes {attrs} (the plugin takes: layers)")
            if "persistentVolumeClaim" in v:
                key = (pod["metadata"].get("namespace"),
                       v["persistentVolumeClaim"]["claimName"])
                if key not in claims:
                    problems.append(f"Pod {pod['metadata']['name']}: no PVC {key}")
                used.setdefault(key, []).append(pod["metadata"]["name"])
    for key, pods in used.items():
        if len(pods) > 1:
            problems.append(f"PVC {key} is used by {pods}: an example "
                            "should give each pod its own claim")
    unused = set(claims) - set(used)
    if unused:
        problems.append(f"PVCs no pod uses: {sorted(unused)}")
    by_class = {}
    for key in used:
        by_class.setdefault(claims[key], []).append(key)
    if not any(len(v) >= 2 for v in by_class.values()):
        problems.append("no two pods with their own claims of one StorageClass "
                        "(shared base, private writes)")
    return problems


def yaml_blocks(text, page):
    """[(page:line of the opening fence, text)] of the ```yaml blocks of a
    markdown page, indented ones (in a list item) included."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^(\s*)```yaml\s*$", lines[i])
        i += 1
        if not m:
            continue
        start, body = i, []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(m.group(1)):])
            i += 1
        out.append((f"{page}:{start}", "\n".join(body)))
        i += 1
    return out


def quantity(q):
    """A storage quantity in bytes (the binary and decimal suffixes)."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q))
    if not m:
        return None
    mult = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12}.get(m.group(2), 1)
    return int(m.group(1)) * mult


def check_doc_yaml(blocks, base, examples):
    """The objects the docs show, against the manifests: the StorageClass
    is the base's, a VolumeSnapshotClass names the driver, snapshots and
    claims name classes, claims and snapshots that exist (in the docs or
    the examples, same namespace), a claim made from another asks for at
    least its size, and a kustomization's components exist."""
    problems = []
    driver = one(base, "CSIDriver")["metadata"]["name"]
    sc = copy.deepcopy(one(base, "StorageClass"))
    sc["metadata"].pop("labels", None)
    objs = []
    for where, text in blocks:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{where}: not YAML: {e}")
            continue
        for d in docs:
            if "components" in d or "resources" in d:
                for c in d.get("components", []):
                    tail = c.partition("packaging/kubernetes/")[2]
                    if not tail or not (K8S / tail / "kustomization.yaml").is_file():
                        problems.append(f"{where}: component {c} does not exist")
            elif "kind" in d:
                objs.append((where, d))

    def ns(d):
        return d["metadata"].get("namespace", "default")
    claims = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d
              for d in examples if d["kind"] == "PersistentVolumeClaim"}
    claims.update({(ns(d), d["metadata"]["name"]): d for _, d in objs
                   if d["kind"] == "PersistentVolumeClaim"})
    snaps = {(ns(d), d["metadata"]["name"]): d for _, d in objs
             if d["kind"] == "VolumeSnapshot"}
    snap_classes = {d["metadata"]["name"] for _, d in objs
                    if d["kind"] == "VolumeSnapshotClass"}
    classes = {d["metadata"]["name"] for d in base if d["kind"] == "StorageClass"}

    def size(claim):
        return quantity(claim["spec"].get("resources", {}).get("requests", {})
                        .get("storage", ""))

    for where, d in objs:
        kind, name = d["kind"], d["metadata"].get("name")
        if kind == "StorageClass":
            if d != sc:
                problems.append(f"{where}: StorageClass {name} is not the base's: {d}")
        elif kind == "VolumeSnapshotClass":
            if d.get("apiVersion") != "snapshot.storage.k8s.io/v1" or \
                    d.get("driver") != driver or \
                    d.get("deletionPolicy") not in ("Delete", "Retain"):
                problems.append(f"{where}: VolumeSnapshotClass {name}: want "
                                f"snapshot.storage.k8s.io/v1, driver {driver}, "
                                "deletionPolicy Delete or Retain")
        elif kind == "VolumeSnapshot":
            spec = d.get("spec", {})
            src = (ns(d), spec.get("source", {}).get("persistentVolumeClaimName"))
            if d.get("apiVersion") != "snapshot.storage.k8s.io/v1":
                problems.append(f"{where}: VolumeSnapshot {name}: apiVersion")
            if spec.get("volumeSnapshotClassName") not in snap_classes:
                problems.append(f"{where}: VolumeSnapshot {name}: no "
                                f"VolumeSnapshotClass {spec.get('volumeSnapshotClassName')}")
            if src not in claims:
                problems.append(f"{where}: VolumeSnapshot {name}: no claim {src}")
        elif kind == "PersistentVolumeClaim":
            spec = d.get("spec", {})
            if spec.get("storageClassName") not in classes:
                problems.append(f"{where}: PVC {name}: no StorageClass "
                                f"{spec.get('storageClassName')}")
            if not set(spec.get("accessModes", [])) <= {"ReadWriteOnce",
                                                        "ReadWriteOncePod"}:
                problems.append(f"{where}: PVC {name}: access modes "
                                f"{spec.get('accessModes')} (volumes are node-local)")
            ds = spec.get("dataSource")
            if ds is None:
                continue
            key = (ns(d), ds.get("name"))
            if ds.get("kind") == "VolumeSnapshot" and \
                    ds.get("apiGroup") == "snapshot.storage.k8s.io":
                snap = snaps.get(key)
                source = snap and claims.get(
                    (key[0], snap["spec"]["source"].get("persistentVolumeClaimName")))
            elif ds.get("kind") == "PersistentVolumeClaim" and not ds.get("apiGroup"):
                source = claims.get(key)
                # external-provisioner refuses a clone of another class
                if source and source["spec"].get("storageClassName") != \
                        spec.get("storageClassName"):
                    problems.append(f"{where}: PVC {name}: a clone must be of "
                                    "its source's StorageClass")
            else:
                problems.append(f"{where}: PVC {name}: dataSource {ds}: want a "
                                "VolumeSnapshot (apiGroup snapshot.storage.k8s.io) "
                                "or a PersistentVolumeClaim (no apiGroup)")
                continue
            if not source:
                problems.append(f"{where}: PVC {name}: dataSource {ds} does not "
                                "exist in the docs or the examples")
            elif size(d) is None or size(source) is None:
                problems.append(f"{where}: PVC {name}: a storage request this "
                                "check cannot read (it and its source's)")
            elif size(d) < size(source):
                problems.append(f"{where}: PVC {name}: asks for less than its "
                                "source (CreateVolume: OUT_OF_RANGE)")
    return problems


DOC_PAGES = ["docs/kubernetes.md", "docs/csi.md"]


def doc_blocks():
    return [b for page in DOC_PAGES
            for b in yaml_blocks((REPO / page).read_text(), page)]


def configure_version():
    m = re.search(r"AC_INIT\(\[[^]]*\],\s*\[([^]]+)\]",
                  (REPO / "configure.ac").read_text())
    assert m, "no version in configure.ac's AC_INIT"
    return m.group(1)


# ------------------------------------------------------------------- tests

def test_base_kinds_and_api_versions(base):
    assert check_kinds(base, BASE_KINDS) == []


def test_examples_kinds_and_api_versions(examples):
    assert check_kinds(examples, EXAMPLE_KINDS) == []


def test_examples_include_the_base_unchanged(base, examples):
    def key(d):
        return (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
    got = {key(d): d for d in examples}
    for d in base:
        assert got.get(key(d)) == d, f"examples change {key(d)}"


def test_csidriver(base):
    assert check_csidriver(base) == []


def test_daemonset(base):
    assert check_daemonset(base) == []


def test_images_pinned(base):
    assert check_images(base, configure_version()) == []


def test_rbac(base):
    assert check_rbac(base) == []


def test_storageclass(base):
    assert check_storageclass(base) == []


def test_docs_yaml(base, examples):
    """The StorageClass, VolumeSnapshotClass, snapshot and claims the docs
    show work with the manifests as rendered."""
    blocks = doc_blocks()
    kinds = {d.get("kind") for _, t in blocks for d in yaml.safe_load_all(t) if d}
    # the checker must see what the docs promise, or it checks nothing
    assert {"StorageClass", "VolumeSnapshotClass", "VolumeSnapshot",
            "PersistentVolumeClaim"} <= kinds, kinds
    assert check_doc_yaml(blocks, base, examples) == []


def test_examples(examples):
    assert check_examples(examples) == []


def test_plugin_flags_are_the_binarys(base, plugin_help):
    _, text = plugin_help
    spec = parse_help(text)
    # The parser must see the options the docs promise, or it checks nothing.
    assert {"--endpoint", "--nodeid", "--root", "--mode", "-v"} <= set(spec), spec
    assert spec["--endpoint"] and not spec["--help"]
    problems, _ = check_plugin_args(base, spec)
    assert problems == []


def test_plugin_parses_the_manifest_args(base, plugin_help):
    """The binary itself parses the rendered argv: getopt_long and the
    per-option checks (--mode, --max-volumes, --log-format) run before the
    trailing --help makes it print usage and exit 0."""
    binary, text = plugin_help
    _, argv = check_plugin_args(base, parse_help(text))
    out = subprocess.run([binary, *argv, "--help"], capture_output=True,
                         text=True, check=False, timeout=10)
    assert out.returncode == 0 and out.stdout.startswith("usage:"), \
        f"strata-csi {' '.join(argv)} --help: {out.returncode}\n{out.stderr}"


def render_kubelet_dir(kubectl, tmp_path, root, *components):
    """The driver with components/kubelet-dir moving kubelet's directory to
    ROOT (its local strata-kubelet-dir ConfigMap), then the other
    COMPONENTS (names under components/), rendered from an overlay in
    TMP_PATH."""
    rel = os.path.relpath(K8S, tmp_path)
    (tmp_path / "kubelet-dir.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "strata-kubelet-dir", "annotations":
                     {"config.kubernetes.io/local-config": "true"}},
        "data": {"path": root}}))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [rel, "kubelet-dir.yaml"],
        "components": [f"{rel}/components/{c}"
                       for c in ("kubelet-dir",) + components]}))
    return render(kubectl, tmp_path)


def test_kubelet_dir_component(kubectl, tmp_path):
    """components/kubelet-dir moves every kubelet path, and nothing else."""
    root = "/var/lib/k0s/kubelet"
    docs = render_kubelet_dir(kubectl, tmp_path, root)
    assert check_kinds(docs, BASE_KINDS) == []   # the ConfigMap stays local
    text = yaml.safe_dump(one(docs, "DaemonSet"))
    assert KUBELET not in text
    moved = yaml.safe_load(text.replace(root, KUBELET))
    assert check_daemonset([moved if d["kind"] == "DaemonSet" else d
                            for d in docs]) == []


def without_container(docs, name):
    docs = copy.deepcopy(docs)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    pod["containers"] = [c for c in pod["containers"] if c["name"] != name]
    return docs


def test_single_node_resizer_component(base, resizer):
    """components/single-node-resizer adds the csi-resizer sidecar and its
    RBAC, and changes nothing else of the base."""
    assert check_kinds(resizer, RESIZER_KINDS) == []
    assert check_daemonset(resizer, RESIZER_SIDECARS) == []
    assert check_rbac(resizer) == []
    assert check_images(resizer, configure_version()) == []
    assert check_storageclass(resizer, expansion=True) == []
    c = container(one(resizer, "DaemonSet"), "csi-resizer")
    assert c["image"].startswith(REGISTRY + "csi-resizer:v1.")

    def key(d):
        return (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
    added = {key(d) for d in resizer} - {key(d) for d in base}
    assert added == {("ClusterRole", None, "strata-external-resizer"),
                     ("ClusterRoleBinding", None, "strata-external-resizer")}
    got = {key(d): d for d in without_container(resizer, "csi-resizer")}
    for d in base:
        if d["kind"] == "StorageClass":
            d = dict(d, allowVolumeExpansion=True)
        assert got.get(key(d)) == d, f"the component changes {key(d)}"


def test_components_combine(kubectl, tmp_path, resizer):
    """A one-node k0s: both components at once. The resizer reaches the
    plugin's socket wherever kubelet-dir moves it."""
    root = "/var/lib/k0s/kubelet"
    docs = render_kubelet_dir(kubectl, tmp_path, root, "single-node-resizer")
    assert check_kinds(docs, RESIZER_KINDS) == []
    text = yaml.safe_dump(one(docs, "DaemonSet"))
    assert KUBELET not in text
    moved = yaml.safe_load(text.replace(root, KUBELET))
    assert moved == one(resizer, "DaemonSet")
    assert check_daemonset([moved if d["kind"] == "DaemonSet" else d
                            for d in docs], RESIZER_SIDECARS) == []


def test_base_has_no_resizer(base):
    """Per node, a resizer would act on every node's claims."""
    names = [c["name"] for c in one(base, "DaemonSet")["spec"]["template"]["spec"]["containers"]]
    assert "csi-resizer" not in names
    assert check_daemonset(base, RESIZER_SIDECARS)   # and the checker sees it


# ------------------------------------------------ the checkers can fail

def with_plugin_args(docs, args):
    docs = copy.deepcopy(docs)
    container(one(docs, "DaemonSet"), "strata-csi")["args"] = args
    return docs


GOOD_ARGS = ["--endpoint=$(CSI_ENDPOINT)", "--nodeid=$(NODE_NAME)",
             "--root=/var/lib/strata"]


@pytest.mark.parametrize("args, expect", [
    (GOOD_ARGS + ["--bogus=1"], "--bogus: not an option"),
    (GOOD_ARGS + ["--mode=node,storage"], "--mode"),
    (GOOD_ARGS + ["-v=2"], "-v '=2'"),
    (GOOD_ARGS + ["--log-format=yaml"], "--log-format"),
    (GOOD_ARGS + ["--driver-name=other.csi.dev"], "--driver-name"),
    (GOOD_ARGS + ["--version"], "--version would make"),
    (GOOD_ARGS + ["--max-volumes=-1"], "--max-volumes"),
    (GOOD_ARGS + ["--root=/srv/strata"], "--root '/srv/strata': not a mounted"),
    (GOOD_ARGS + ["stray"], "stray argument"),
    (["--endpoint=tcp://0.0.0.0:1234"] + GOOD_ARGS[1:], "--endpoint 'tcp://"),
    (["--endpoint=unix:///run/elsewhere/csi.sock"] + GOOD_ARGS[1:],
     "/run/elsewhere is not a mounted volume"),
    (["--endpoint=$(NO_SUCH_VAR)"] + GOOD_ARGS[1:], "$(NO_SUCH_VAR) is not defined"),
    (GOOD_ARGS[:1] + ["--nodeid=node-1"] + GOOD_ARGS[2:], "downward API"),
    (GOOD_ARGS[:1] + GOOD_ARGS[2:], "--nodeid missing"),
    (GOOD_ARGS + ["--root=/var/lib/strata"], "given twice"),
    (GOOD_ARGS, "--daemon-cgroup missing"),
    (GOOD_ARGS + ["--daemon-mount-namespace=/proc/self/ns/mnt"],
     "want /proc/1/ns/mnt"),
    (GOOD_ARGS + ["--daemon-cgroup=/sys/fs/cgroup/strata"],
     "DIR a mount of the host's /sys/fs/cgroup"),
    (GOOD_ARGS + ["--daemon-cgroup=/host/sys/fs/cgroup"],
     "DIR a mount of the host's /sys/fs/cgroup"),
    (GOOD_ARGS + ["--daemon-binary-dir=/usr/lib/strata"],
     "not at the same path on the host"),
    (GOOD_ARGS + ["--fuse-uring=yes"], "--fuse-uring 'yes': off, on or leave"),
])
def test_flag_checker_reports(base, plugin_help, args, expect):
    assert check_plugin_args(base, parse_help(plugin_help[1]))[0] == []
    problems, _ = check_plugin_args(with_plugin_args(base, args),
                                    parse_help(plugin_help[1]))
    assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("args", [
    GOOD_ARGS + ["--bogus=1"],
    GOOD_ARGS + ["--mode=node,storage"],
    GOOD_ARGS + ["--log-format=yaml"],
    GOOD_ARGS + ["--fuse-uring=yes"],
])
def test_binary_dry_run_can_fail(base, plugin_help, args):
    binary, text = plugin_help
    _, argv = check_plugin_args(with_plugin_args(base, args), parse_help(text))
    out = subprocess.run([binary, *argv, "--help"], capture_output=True,
                         text=True, check=False, timeout=10)
    assert out.returncode == 2, out


@pytest.mark.parametrize("fn, expect", [
    (lambda d: d["spec"]["template"]["spec"].pop("hostPID"), "without hostPID"),
    (lambda d: [m.pop("mountPropagation") for m in plugin_of(d)["volumeMounts"]
                if m["name"] == "store-ephemeral"], "/var/lib/strata/ephemeral"),
    (lambda d: [v["hostPath"].update(path="/srv/strata") for v in
                d["spec"]["template"]["spec"]["volumes"] if v["name"] == "store"],
     "--root '/var/lib/strata': not at the same path on the host"),
])
def test_flag_checker_reports_the_pod(base, plugin_help, fn, expect):
    """The rules that tie the daemon flags to the pod around them."""
    problems, _ = check_plugin_args(mutate(base, "DaemonSet", fn),
                                    parse_help(plugin_help[1]))
    assert any(expect in p for p in problems), problems


def with_fuse_uring(mode, privileged):
    def fn(d):
        c = plugin_of(d)
        c["args"] = [a for a in c["args"] if not a.startswith("--fuse-uring")]
        c["args"].append(f"--fuse-uring={mode}")
        c["securityContext"]["privileged"] = privileged
    return fn


@pytest.mark.parametrize("mode, privileged, refused", [
    ("on", True, False),
    ("on", False, True),
    ("off", False, False),
    ("leave", False, False),
])
def test_fuse_uring_on_needs_a_writable_sys(base, plugin_help, mode,
                                            privileged, refused):
    """--fuse-uring=on writes the host's fuse.enable_uring through /sys,
    which only a privileged container has writable."""
    problems, _ = check_plugin_args(
        mutate(base, "DaemonSet", with_fuse_uring(mode, privileged)),
        parse_help(plugin_help[1]))
    assert any("--fuse-uring=on in an unprivileged container" in p
               for p in problems) == refused, problems


def test_help_parser_reads_options():
    spec = parse_help("usage: x --a A\n\n  --endpoint EP   where\n"
                      "  -v N            level\n  --help          this\n"
                      "                  --not-an-option continued\n")
    assert spec == {"--endpoint": True, "-v": True, "--help": False}


def mutate(docs, kind, fn):
    docs = copy.deepcopy(docs)
    for d in docs:
        if d["kind"] == kind:
            fn(d)
    return docs


def plugin_of(d):
    return container(d, "strata-csi")


@pytest.mark.parametrize("kind, fn, expect", [
    ("DaemonSet", lambda d: plugin_of(d)["securityContext"].update(privileged=False),
     "not privileged"),
    ("DaemonSet", lambda d: [m.pop("mountPropagation", None)
                             for m in plugin_of(d)["volumeMounts"]],
     "Bidirectional"),
    ("DaemonSet", lambda d: plugin_of(d)["volumeMounts"].__setitem__(
        slice(None), [m for m in plugin_of(d)["volumeMounts"]
                      if m["mountPath"] != "/dev/fuse"]), "/dev/fuse"),
    ("DaemonSet", lambda d: d["spec"]["template"]["spec"].pop("priorityClassName"),
     "system-node-critical"),
    ("DaemonSet", lambda d: d["spec"]["template"]["spec"].pop("tolerations"),
     "toleration"),
    ("DaemonSet", lambda d: plugin_of(d)["livenessProbe"]["httpGet"].update(port=9999),
     "livenessProbe"),
    ("DaemonSet", lambda d: container(d, "csi-provisioner")["args"].remove(
        "--node-deployment=true"), "--node-deployment"),
    ("DaemonSet", lambda d: container(d, "node-driver-registrar")["env"][0].update(
        value="/var/lib/kubelet/plugins/other/csi.sock"), "registration-path"),
    ("DaemonSet", lambda d: container(d, "liveness-probe")["args"].__setitem__(
        1, "--csi-address=/tmp/csi.sock"), "liveness-probe: /tmp/csi.sock"),
    ("DaemonSet", lambda d: plugin_of(d)["resources"].pop("limits"), "memory limit"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter")["args"].remove(
        "--node-deployment=true"), "snapshotter: --node-deployment=true missing"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter")["args"].append(
        "--leader-election"), "snapshotter: --leader-election"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter").pop("env"),
     "snapshotter: env NODE_NAME"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter")["env"][0].update(
        valueFrom={"fieldRef": {"fieldPath": "metadata.name"}}),
     "snapshotter: env NODE_NAME"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter").update(
        image=REGISTRY + "csi-snapshotter"), "csi-snapshotter: image"),
    ("DaemonSet", lambda d: container(d, "csi-snapshotter")["args"].__setitem__(
        1, "--csi-address=/run/csi/socket"), "csi-snapshotter: /run/csi/socket"),
])
def test_daemonset_checker_reports(base, kind, fn, expect):
    problems = check_daemonset(mutate(base, kind, fn))
    assert any(expect in p for p in problems), problems


@pytest.mark.parametrize("fn, expect", [
    (lambda d: container(d, "csi-resizer")["args"].append("--node-deployment=true"),
     "resizer: --node-deployment is not a flag"),
    (lambda d: container(d, "csi-resizer")["args"].__setitem__(
        3, "--leader-election=true"), "resizer: leader election on"),
])
def test_daemonset_checker_reports_the_resizer(resizer, fn, expect):
    problems = check_daemonset(mutate(resizer, "DaemonSet", fn), RESIZER_SIDECARS)
    assert any(expect in p for p in problems), problems


def drop_rule(resource):
    def fn(d):
        d["rules"] = [r for r in d["rules"] if resource not in r["resources"]]
    return fn


def test_rbac_checker_reports_each_sidecar(base, resizer):
    """Each sidecar's rules are required while it is in the pod, and only
    then."""
    assert any("ClusterRole (csi-snapshotter): snapshot.storage.k8s.io/"
               "volumesnapshotcontents/status lacks" in p for p in check_rbac(
                   mutate(base, "ClusterRole", drop_rule("volumesnapshotcontents/status"))))
    assert any("ClusterRole (csi-provisioner): snapshot.storage.k8s.io/"
               "volumesnapshots lacks" in p for p in check_rbac(
                   mutate(base, "ClusterRole", drop_rule("volumesnapshots"))))
    # the component's role missing: the resizer cannot patch claims
    no_role = [d for d in resizer if not (d["kind"] == "ClusterRole" and
                                          d["metadata"]["name"] == "strata-external-resizer")]
    assert any("ClusterRole (csi-resizer): core/persistentvolumeclaims/status lacks"
               in p for p in check_rbac(no_role))
    # ... bound to another ServiceAccount: the same
    other = mutate(resizer, "ClusterRoleBinding", lambda d: d["metadata"]["name"] ==
                   "strata-external-resizer" and d["subjects"][0].update(name="nobody"))
    assert any("csi-resizer" in p for p in check_rbac(other))
    # and without the resizer container, its rules are not asked for
    assert check_rbac(without_container(no_role, "csi-resizer")) == []


DOC_SNAPSHOT = """\
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: strata}
driver: strata.csi.dev
deletionPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: s1, namespace: strata-examples}
spec:
  volumeSnapshotClassName: strata
  source: {persistentVolumeClaimName: strata-demo}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: r1, namespace: strata-examples}
spec:
  storageClassName: strata
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
  dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: s1}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: c1, namespace: strata-examples}
spec:
  storageClassName: strata
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
  dataSource: {kind: PersistentVolumeClaim, name: strata-demo}
"""


@pytest.mark.parametrize("old, new, expect", [
    (None, None, None),
    ("driver: strata.csi.dev", "driver: other.csi.dev", "driver strata.csi.dev"),
    ("volumeSnapshotClassName: strata", "volumeSnapshotClassName: x",
     "no VolumeSnapshotClass x"),
    ("persistentVolumeClaimName: strata-demo", "persistentVolumeClaimName: nope",
     "no claim ('strata-examples', 'nope')"),
    ("apiGroup: snapshot.storage.k8s.io, kind", "kind", "dataSource"),
    ("name: s1}", "name: s2}", "does not exist"),
    ("storage: 1Gi", "storage: 512Mi", "asks for less than its source"),
    ("storage: 1Gi", "storage: 1.5Gi", "a storage request this check cannot read"),
    ("storageClassName: strata", "storageClassName: fast", "no StorageClass fast"),
    ("[ReadWriteOnce]", "[ReadWriteMany]", "node-local"),
    ("name: c1, namespace: strata-examples}\nspec:\n  storageClassName: strata",
     "name: c1, namespace: strata-examples}\nspec:\n  storageClassName: fast",
     "a clone must be of its source's StorageClass"),
    ("name: strata-demo}", "name: strata-demo-x}", "does not exist"),
    ("metadata: {name: s1,", "metadata: [", "not YAML"),
])
def test_doc_yaml_checker_reports(base, examples, old, new, expect):
    text = DOC_SNAPSHOT if old is None else DOC_SNAPSHOT.replace(old, new, 1)
    assert text != DOC_SNAPSHOT or old is None
    problems = check_doc_yaml([("t", text)], base, examples)
    if expect is None:
        assert problems == []
    else:
        assert any(expect in p for p in problems), problems


def test_doc_yaml_checker_reports_the_class_and_components(base, examples):
    sc = copy.deepcopy(one(base, "StorageClass"))
    sc["metadata"].pop("labels", None)
    assert check_doc_yaml([("t", yaml.safe_dump(sc))], base, examples) == []
    sc["allowVolumeExpansion"] = True
    assert any("not the base's" in p for p in check_doc_yaml(
        [("t", yaml.safe_dump(sc))], base, examples))
    good = "components:\n  - ../strata/packaging/kubernetes/components/single-node-resizer\n"
    assert check_doc_yaml([("t", good)], base, examples) == []
    assert any("does not exist" in p for p in check_doc_yaml(
        [("t", good.replace("single-node-resizer", "resizer"))], base, examples))


def test_yaml_blocks_reads_indented_blocks():
    text = "a\n```yaml\nx: 1\n```\n- item:\n\n  ```yaml\n  y: 2\n  ```\n```sh\nz\n```\n"
    assert yaml_blocks(text, "p") == [("p:2", "x: 1"), ("p:7", "y: 2")]


def test_other_checkers_report(base, examples):
    assert any("apiVersion storage.k8s.io/v1beta1" in p for p in check_kinds(
        mutate(base, "CSIDriver", lambda d: d.update(apiVersion="storage.k8s.io/v1beta1")),
        BASE_KINDS))
    assert check_kinds(base + [{"kind": "Secret", "apiVersion": "v1",
                                "metadata": {"name": "x"}}], BASE_KINDS)
    assert any("fsGroupPolicy" in p for p in check_csidriver(
        mutate(base, "CSIDriver", lambda d: d["spec"].update(fsGroupPolicy="File"))))
    assert any("WaitForFirstConsumer" in p for p in check_storageclass(
        mutate(base, "StorageClass", lambda d: d.update(volumeBindingMode="Immediate"))))
    assert any("parameter fsType" in p for p in check_storageclass(
        mutate(base, "StorageClass", lambda d: d["parameters"].update(fsType="ext4"))))
    assert any("layers" in p for p in check_storageclass(
        mutate(base, "StorageClass", lambda d: d["parameters"].update(layers="../etc"))))
    assert any("csistoragecapacities" in p for p in check_rbac(
        mutate(base, "Role", lambda d: d["rules"].pop(0))))
    assert any("ServiceAccount" in p for p in check_rbac(
        mutate(base, "DaemonSet", lambda d: d["spec"]["template"]["spec"].update(
            serviceAccountName="nobody"))))
    assert any("want tag 9.9.9" in p for p in check_images(base, "9.9.9"))
    assert any("v2.x.y" in p for p in check_images(mutate(
        base, "DaemonSet", lambda d: container(d, "liveness-probe").update(
            image="registry.k8s.io/sig-storage/livenessprobe:canary")), "0.1.0"))
    assert any("want a v8.x.y" in p for p in check_images(mutate(
        base, "DaemonSet", lambda d: container(d, "csi-snapshotter").update(
            image=REGISTRY + "csi-snapshotter:v6.3.3")), "0.1.0"))
    assert any("allowVolumeExpansion" in p for p in check_storageclass(
        mutate(base, "StorageClass", lambda d: d.update(allowVolumeExpansion=True))))
    assert any("allowVolumeExpansion" in p for p in check_storageclass(
        base, expansion=True))
    assert any("inline volume attributes" in p for p in check_examples(mutate(
        examples, "Pod", lambda d: d["spec"]["volumes"].append(
            {"name": "i", "csi": {"driver": DRIVER,
                                  "volumeAttributes": {"layers": "../etc"}}}))))
    assert any("no StorageClass" in p for p in check_examples(mutate(
        examples, "PersistentVolumeClaim",
        lambda d: d["spec"].update(storageClassName="nope"))))


def test_docs_name_the_rendered_images(resizer):
    """docs/kubernetes.md tells the versions installed, the component's
    resizer included: keep it honest."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    ds = one(resizer, "DaemonSet")
    for c in ds["spec"]["template"]["spec"]["containers"]:
        short = c["image"].rsplit("/", 1)[-1]
        assert short in text, f"docs/kubernetes.md does not name {short}"
        assert f"`{c['name']}`" in text, f"docs/kubernetes.md does not name {c['name']}"
