#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite: unit programs, the integration suite over real
# mounts (kernel overlayfs as the oracle, stratafs as built), the CSI
# plugin suite over a real socket, the packaging checks, every example
# of README.md and docs/ run as written, and the same again on an
# AddressSanitizer+UBSan build, the race suite on a ThreadSanitizer
# build, two copies at once, then its integration suite (part of it over
# FUSE over io_uring as well), and the libFuzzer targets (fuzz/) for
# FUZZ_SECONDS (60) each, two at a time. Ends with one line
# "N passed, N failed".
#
#   scripts/test.sh               everything
#   scripts/test.sh --quick       skip the sanitizer pass; the fuzz
#                                 targets only replay their seeds
#   PYTEST_ARGS="-k rename" scripts/test.sh   pass options to pytest
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

quick=0
[ "${1:-}" = "--quick" ] && quick=1

if [ "$(id -u)" -ne 0 ]; then
	echo "test.sh: the suite mounts file systems: run it as root" >&2
	exit 2
fi
scripts/deps.sh || exit 2
modprobe fuse 2>/dev/null || true
modprobe overlay 2>/dev/null || true

results=$(mktemp -d /tmp/strata-results.XXXXXX)
trap 'rm -rf "$results"' EXIT
passed=0
failed=0

# Adds the counts of one JUnit XML report to the totals.
count_junit() {
	local out
	out=$(/usr/bin/python3 - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception:
    print("0 1"); sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
t = f = 0
for s in suites:
    t += int(s.get("tests", 0)) - int(s.get("skipped", 0))
    f += int(s.get("failures", 0)) + int(s.get("errors", 0))
print(t - f, f)
PY
)
	passed=$((passed + ${out% *}))
	failed=$((failed + ${out#* }))
}

# Runs the unit programs of one build directory.
run_unit() {
	local dir=$1 log
	log="$results/unit-$(basename "$dir").log"
	if make -C "$dir" -s -j"$(nproc)" check >"$log" 2>&1; then :; fi
	local p f
	p=$(grep -c '^PASS:' "$log")
	f=$(grep -cE '^(FAIL|ERROR|XPASS):' "$log")
	passed=$((passed + p))
	failed=$((failed + f))
	grep -E '^(PASS|FAIL|ERROR|SKIP|XPASS):' "$log" | sed "s|^|[$(basename "$dir")] |"
	if [ "$f" -ne 0 ] || [ "$p" -eq 0 ]; then
		for t in "$dir"/tests/unit/*.log; do
			echo "--- $t"; cat "$t"
		done
		[ "$p" -eq 0 ] && failed=$((failed + 1))
	fi
}

# Runs the integration suite against one stratafs binary.
run_integration() {
	local name=$1 bin=$2
	shift 2
	echo "== integration ($name${STRATAFS_OPTS:+, $STRATAFS_OPTS})"
	(cd tests/integration &&
		STRATAFS="$bin" /usr/bin/python3 -m pytest -q \
			--junitxml="$results/$name.xml" ${PYTEST_ARGS:-} "$@")
	count_junit "$results/$name.xml"
}

# Runs two copies of the race suite at once against one stratafs binary:
# on 2 cores that is what makes timing-dependent bugs show.
run_race_pair() {
	local name=$1 bin=$2 i
	echo "== races, two copies at once ($name)"
	for i in 1 2; do
		(cd tests/integration &&
			STRATAFS="$bin" /usr/bin/python3 -m pytest -q \
				--basetemp="$results/$name-$i" \
				--junitxml="$results/$name-$i.xml" \
				test_races.py test_concurrency.py \
				>"$results/$name-$i.log" 2>&1) &
	done
	wait
	for i in 1 2; do
		if grep -qE "[0-9]+ (failed|error)" "$results/$name-$i.log"; then
			cat "$results/$name-$i.log"
		else
			tail -n 1 "$results/$name-$i.log"
		fi
		count_junit "$results/$name-$i.xml"
	done
}

# Runs one pytest suite of tests/ (SUITE) against one build directory's
# three programs, its report named NAME.
run_programs() {
	local suite=$1 name=$2 dir=$3
	shift 3
	(cd "tests/$suite" &&
		STRATA_CSI="$dir/strata-csi" STRATACTL="$dir/stratactl" \
		STRATAFS="$dir/stratafs" /usr/bin/python3 -m pytest -q \
			--junitxml="$results/$name.xml" ${PYTEST_ARGS:-} "$@")
	count_junit "$results/$name.xml"
}

# The CSI plugin suite over a real socket.
run_csi() {
	local name=$1 dir=$2
	shift 2
	echo "== csi ($name)"
	run_programs csi "$name" "$dir" "$@"
}

# Every example of README.md and docs/ as written, on a scratch root
# (tests/docs/README.md).
run_docs() {
	echo "== docs (every example, as written)"
	run_programs docs docs "$1"
}

# The packaging suite: manifests, image build script, the .deb, man
# pages, units.
run_packaging() {
	echo "== packaging"
	run_programs packaging packaging "$1"
}

# The fuzz targets, in their clang build: each fuzzed for FUZZ_SECONDS,
# or with --quick each seed replayed once. A crash, a leak, a broken
# property, a hang or running out of memory fails the target, and the
# finding is printed (fuzz/README.md says how to replay it).
run_fuzz() {
	local goal=fuzz-run log=$results/fuzz.log p f
	[ "$quick" -eq 1 ] && goal=fuzz-check
	echo "== fuzz ($goal)"
	make -C build-fuzz -s --no-print-directory "$goal" \
		FUZZ_SECONDS="${FUZZ_SECONDS:-60}" >"$log" 2>&1
	grep -v '^make: \*\*\*' "$log"
	p=$(grep -c '^PASS:' "$log")
	f=$(grep -c '^FAIL:' "$log")
	passed=$((passed + p))
	failed=$((failed + f))
	[ "$p" -eq 0 ] && [ "$f" -eq 0 ] && failed=$((failed + 1))
}

# FUSE over io_uring's module parameter: set for a stage, then put back
uring_param=/sys/module/fuse/parameters/enable_uring

# run_integration over FUSE over io_uring, where the kernel has it: one
# process, since a supervised daemon is served through /dev/fuse
# (fuse/uring.c); test_worker.py needs the supervisor, and test_uring.py
# picks its own options.
run_over_uring() {
	local name=$1 bin=$2 was
	shift 2
	[ -e "$uring_param" ] || return 0
	was=$(cat "$uring_param")
	echo 1 >"$uring_param"
	STRATAFS_OPTS=transport=uring,nosupervisor run_integration "$name" \
		"$bin" -m stratafs --ignore=test_worker.py \
		--ignore=test_uring.py "$@"
	echo "$was" >"$uring_param"
}

echo "== build"
if ! scripts/build.sh build; then
	echo "0 passed, 1 failed"
	exit 1
fi
run_unit build
run_integration integration "$top/build/stratafs"
# The data paths again under the other I/O engine (the default is uring),
# through the daemon: passthrough, the default, would skip the engine.
STRATAFS_OPTS=io=sync,nopassthrough run_integration integration-sync \
	"$top/build/stratafs" -m stratafs -k "not valgrind and not memory"
# And with the daemon doing upper files' I/O as well (-o nopassthrough,
# as the CSI plugin mounts most volumes).
STRATAFS_OPTS=nopassthrough run_integration integration-nopassthrough \
	"$top/build/stratafs" -m stratafs -k "not valgrind and not memory"
# And over FUSE over io_uring.
run_over_uring integration-uring "$top/build/stratafs" \
	-k "not valgrind and not memory"
run_csi csi "$top/build"
run_packaging "$top/build"
run_docs "$top/build"

echo "== build (libFuzzer targets, clang)"
if scripts/build.sh build-fuzz --enable-fuzz; then
	run_fuzz
else
	failed=$((failed + 1))
fi

if [ "$quick" -eq 0 ]; then
	echo "== build (AddressSanitizer + UBSan)"
	if scripts/build.sh build-asan --enable-sanitizers; then
		export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
		export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
		run_unit build-asan
		# The kernel's results do not change with our build, and valgrind
		# cannot run an ASan binary: stratafs tests only, valgrind aside.
		run_integration asan "$top/build-asan/stratafs" -m stratafs -k "not valgrind"
		run_csi csi-asan "$top/build-asan" -k "not valgrind"
		run_race_pair races-asan "$top/build-asan/stratafs"
	else
		failed=$((failed + 1))
	fi
	echo "== build (ThreadSanitizer)"
	if scripts/build.sh build-tsan --enable-tsan; then
		# The kernel orders every FUSE request after the replies it
		# depends on; io_sync=2 tells TSan that I/O orders threads.
		export TSAN_OPTIONS="halt_on_error=0 io_sync=2"
		run_race_pair races-tsan "$top/build-tsan/stratafs"
		run_integration tsan "$top/build-tsan/stratafs" -m stratafs \
			-k "not valgrind and not memory"
		# The rings' threads and their hand-over of replies, and what
		# runs beside them (a freeze's checks raced an OPEN there)
		run_over_uring tsan-uring "$top/build-tsan/stratafs" \
			-k "not valgrind and not memory" test_freeze.py \
			test_races.py test_concurrency.py test_io_engine.py \
			test_passthrough.py test_direct_io.py test_unmount.py
		run_integration tsan-uring-own "$top/build-tsan/stratafs" \
			test_uring.py
	else
		failed=$((failed + 1))
	fi
fi

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
