#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds into build/ (or the directory given), with extra configure
# arguments after it: scripts/build.sh build-asan --enable-sanitizers
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-build}
shift || true
cd "$top"
[ -x configure ] || autoreconf -fi >/dev/null
mkdir -p "$dir"
cd "$dir"
if [ ! -f Makefile ] || [ "$top/configure" -nt Makefile ]; then
	"$top/configure" -q "$@"
fi
make -s -j"$(nproc)"
