#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The demo, through the CSI plugin as a cluster would drive it: builds
# Strata, starts strata-csi on a local socket with a demo store, places a
# small layer, and with stratactl creates, stages and publishes a volume
# into a local directory; then shows the merged view, a copy-up and a
# whiteout, and tears everything down.
#
#   scripts/demo.sh          run the demo and clean up
#   scripts/demo.sh --keep   leave the plugin and the volume running
#   scripts/demo.sh --stop   tear down what --keep left
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-run}
case "$mode" in
run | --keep | --stop) ;;
*)
	echo "usage: $0 [--keep | --stop]" >&2
	exit 2
	;;
esac
if [ "$(id -u)" -ne 0 ]; then
	echo "demo.sh: mounting needs root (sudo $0)" >&2
	exit 2
fi

demo=/tmp/strata-demo
root=$demo/store
# a directory of its own: the plugin never mounts in, at or above its
# socket's directory, so the socket cannot sit beside the demo's paths
sock=$demo/run/csi.sock
staging=$demo/staging
target=$demo/pod/volume
bin=$top/build

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }
ctl() { "$bin/stratactl" --endpoint "unix://$sock" "$@"; }

# Undoes whatever a previous run left, in the kubelet's order.
teardown() {
	local vid
	vid=$(cat "$demo/volume-id" 2>/dev/null || true)
	if [ -n "$vid" ] && [ -S "$sock" ]; then
		ctl unpublish "$vid" --target "$target" >/dev/null 2>&1 || true
		ctl unstage "$vid" --staging-path "$staging" >/dev/null 2>&1 || true
		ctl delete-volume "$vid" >/dev/null 2>&1 || true
	fi
	if [ -f "$demo/plugin.pid" ]; then
		kill -TERM "$(cat "$demo/plugin.pid")" 2>/dev/null || true
		for _ in $(seq 50); do
			kill -0 "$(cat "$demo/plugin.pid")" 2>/dev/null || break
			sleep 0.1
		done
	fi
	for m in "$target" "$staging" "$demo/kernel"; do
		mountpoint -q "$m" 2>/dev/null && umount -l "$m"
	done
	rm -rf "$demo"
}

if [ "$mode" = --stop ]; then
	teardown
	echo "demo stopped, $demo removed"
	exit 0
fi

"$top/scripts/deps.sh"
"$top/scripts/build.sh" build >/dev/null
teardown
mkdir -p "$root/layers/base/etc" "$root/layers/base/data" "$demo/pod" \
	"$demo/run"
[ "$mode" = --keep ] || trap teardown EXIT

step "a small read-only layer in the store: $root/layers/base"
echo "greeting=hello from the base layer" >"$root/layers/base/etc/app.conf"
echo "obsolete" >"$root/layers/base/data/old.txt"
seq 1 5 >"$root/layers/base/data/numbers.txt"
show find "$root/layers/base" -type f

step "start the plugin: strata-csi --endpoint unix://$sock --nodeid demo-node --root $root"
"$bin/strata-csi" --endpoint "unix://$sock" --nodeid demo-node --root "$root" \
	--stratafs "$bin/stratafs" </dev/null >"$demo/plugin.log" 2>&1 &
echo $! >"$demo/plugin.pid"
for _ in $(seq 100); do
	ctl probe >/dev/null 2>&1 && break
	sleep 0.1
done
show ctl info
show ctl probe

step "create a volume over the layer (CreateVolume)"
vid=$(ctl --json create-volume demo --layers base --capacity 64Mi |
	/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["volume"]["volume_id"])')
echo "$vid" >"$demo/volume-id"
show ctl list-volumes

step "stage it (NodeStageVolume starts a stratafs daemon) and publish it into a pod directory"
show ctl stage "$vid" --staging-path "$staging"
show ctl publish "$vid" --staging-path "$staging" --target "$target"
show findmnt -no SOURCE,FSTYPE,TARGET "$staging"
show ls -lR "$target"

step "copy-up: writing a base file copies it into the volume's upper layer first"
show sh -c "echo 'greeting=changed in the volume' > $target/etc/app.conf"
show cat "$target/etc/app.conf"
show cat "$root/layers/base/etc/app.conf"
show cat "$root/volumes/$vid/upper/etc/app.conf"

step "whiteout: deleting a base file leaves a 0/0 character device in upper"
show rm "$target/data/old.txt"
show ls "$target/data"
show ls -l "$root/volumes/$vid/upper/data"
show ctl stats "$vid" --path "$target"

if [ "$mode" = --keep ]; then
	step "left running: the volume is at $target"
	echo "plugin log: $demo/plugin.log; the socket: $sock"
	echo "stop it all with: sudo $0 --stop"
	exit 0
fi

step "tear down: unpublish, unstage, and the upper read by the kernel's overlayfs"
show ctl unpublish "$vid" --target "$target"
show ctl unstage "$vid" --staging-path "$staging"
mkdir -p "$demo/kernel" "$demo/kwork"
if mount -t overlay overlay -o "lowerdir=$root/layers/base,upperdir=$root/volumes/$vid/upper,workdir=$demo/kwork" "$demo/kernel" 2>/dev/null; then
	show cat "$demo/kernel/etc/app.conf"
	show ls "$demo/kernel/data"
	umount "$demo/kernel"
else
	echo "(kernel overlayfs is not available here)"
fi
show ctl delete-volume "$vid"
rm -f "$demo/volume-id"
step "done: stopping the plugin and removing $demo"
