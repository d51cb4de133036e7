#!/bin/bash
# Installs the Debian bookworm packages that building, the demo and the
# tests need. Only missing packages are installed; nothing runs when all
# are there, so repeated runs are cheap.
set -euo pipefail

PKGS=(
	build-essential autoconf automake libtool pkg-config
	libfuse3-dev fuse3 liburing-dev libmount-dev
	libprotobuf-c-dev protobuf-c-compiler libgrpc-dev protobuf-compiler libprotobuf-dev
	libjson-c-dev libmicrohttpd-dev
	python3 python3-pytest python3-grpcio python3-protobuf
	attr acl util-linux kmod fuse-overlayfs fio valgrind
)

missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	SUDO=""
	[ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
