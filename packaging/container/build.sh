#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Builds Strata and installs it under DESTDIR with prefix /usr: what the
# Containerfile's build stage runs, and what tests/packaging runs to check
# it without a container engine. The same steps as the README:
# scripts/deps.sh, scripts/build.sh, then make install-strip.
#
#   packaging/container/build.sh DESTDIR [BUILDDIR]
#
# BUILDDIR defaults to build-container/ in the tree; one configured for
# another prefix is configured again.
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 DESTDIR [BUILDDIR]" >&2
	exit 2
fi
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
dest=$(abs "$1")
build=$(abs "${2:-$top/build-container}")

"$top/scripts/deps.sh"
if [ -f "$build/Makefile" ] && ! grep -qx 'prefix = /usr' "$build/Makefile"; then
	rm -f "$build/Makefile"
fi
"$top/scripts/build.sh" "$build" --prefix=/usr --sysconfdir=/etc --localstatedir=/var
make -C "$build" -s install-strip DESTDIR="$dest"
