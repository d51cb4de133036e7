#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian bookworm packages that building, the demo and the
# tests need. Only missing packages are installed; nothing runs when all
# are there, so repeated runs are cheap.
set -euo pipefail

PKGS=(
	build-essential autoconf automake libtool pkg-config
	libfuse3-dev fuse3 liburing-dev
	libprotobuf-c-dev protobuf-c-compiler libgrpc-dev protobuf-compiler libprotobuf-dev
	libjson-c-dev libmicrohttpd-dev libarchive-dev
	python3 python3-pytest python3-grpcio python3-protobuf python3-yaml jq
	attr acl util-linux kmod fuse-overlayfs fio valgrind zstd btrfs-progs
	debhelper dpkg-dev groff-base man-db systemd
)
# The fuzz targets' own build (never the package's): clang, libFuzzer,
# and llvm-symbolizer for their reports.
FUZZ_PKGS=(clang libclang-rt-14-dev llvm)

missing=()
for p in "${PKGS[@]}" "${FUZZ_PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The manifest tests render with `kubectl kustomize`. Bookworm itself has
# no kubectl recent enough (kubernetes-client is 1.20); take the one a
# configured repository offers (Kubernetes' or Google Cloud's apt repo),
# and otherwise say where to get it: the manifest tests fail without it.
if ! command -v kubectl >/dev/null; then
	if apt-cache policy kubectl 2>/dev/null | grep -q 'Candidate: [0-9]'; then
		DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq kubectl >/dev/null
	else
		echo "deps: no kubectl: add the Kubernetes apt repository (pkgs.k8s.io) for the manifest tests" >&2
	fi
fi
