#!/bin/bash
# The demo: builds stratafs if needed, makes a small union volume (a
# lower layer it creates, an upper, a workdir) under /tmp/strata-demo,
# mounts it, and shows a copy-up and a whiteout happening.
#
#   scripts/demo.sh          run the demo, unmount and clean up
#   scripts/demo.sh --keep   leave the volume mounted (it says how to stop)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
keep=0
[ "${1:-}" = "--keep" ] && keep=1
if [ "$(id -u)" -ne 0 ]; then
	echo "demo.sh: mounting needs root (sudo $0)" >&2
	exit 2
fi
"$top/scripts/deps.sh"
"$top/scripts/build.sh" build
bin="$top/build/stratafs"

demo=/tmp/strata-demo
mnt=$demo/merged
if mountpoint -q "$mnt" 2>/dev/null; then
	fusermount3 -u "$mnt" || umount -l "$mnt"
fi
rm -rf "$demo"
mkdir -p "$demo"/{base,upper,work,merged}
cleanup() {
	if [ "$keep" -eq 0 ]; then
		mountpoint -q "$mnt" && fusermount3 -u "$mnt"
		rm -rf "$demo"
	fi
}
trap cleanup EXIT

# A small read-only base layer.
mkdir -p "$demo/base/etc" "$demo/base/data"
echo "greeting=hello from the base layer" >"$demo/base/etc/app.conf"
echo "obsolete" >"$demo/base/data/old.txt"
seq 1 5 >"$demo/base/data/numbers.txt"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@"; }

step "mount: stratafs -o lowerdir=base,upperdir=upper,workdir=work merged"
"$bin" -o "lowerdir=$demo/base,upperdir=$demo/upper,workdir=$demo/work" "$mnt"
show findmnt -no SOURCE,FSTYPE,TARGET "$mnt"
show ls -lR "$mnt"

step "copy-up: writing a base file copies it into upper first"
show sh -c "echo 'greeting=changed in the volume' > $mnt/etc/app.conf"
show cat "$mnt/etc/app.conf"
show cat "$demo/base/etc/app.conf"
show cat "$demo/upper/etc/app.conf"

step "whiteout: deleting a base file leaves a 0/0 character device in upper"
show rm "$mnt/data/old.txt"
show ls "$mnt/data"
show ls -l "$demo/upper/data"
show ls "$demo/base/data"

step "the same upper layer, read by the kernel's overlayfs"
fusermount3 -u "$mnt"
kmnt=$demo/kernel
mkdir -p "$kmnt" "$demo/kwork"
if mount -t overlay overlay -o "lowerdir=$demo/base,upperdir=$demo/upper,workdir=$demo/kwork" "$kmnt" 2>/dev/null; then
	show cat "$kmnt/etc/app.conf"
	show ls "$kmnt/data"
	umount "$kmnt"
else
	echo "(kernel overlayfs is not available here)"
fi
"$bin" -o "lowerdir=$demo/base,upperdir=$demo/upper,workdir=$demo/work" "$mnt"

if [ "$keep" -eq 1 ]; then
	step "left mounted at $mnt"
	echo "stop it with: fusermount3 -u $mnt && rm -rf $demo"
else
	step "unmounting and removing $demo"
fi
