#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs the libFuzzer targets of a --enable-fuzz build. `make fuzz-check`
# and `make fuzz-run` call it from the build directory with the targets
# they built:
#
#   fuzz.sh --replay CORPUS TARGET...      every seed once (seconds)
#   fuzz.sh --seconds N CORPUS TARGET...   fuzz each for N seconds,
#                                          FUZZ_JOBS (2) at a time
#
# CORPUS/NAME/ holds the seeds of fuzz/NAME; runs never write there.
# Prints one line per target, "PASS: NAME ..." or "FAIL: NAME ...", and
# for a failure the finding: the sanitizer's or the broken property's
# report, and the input in hex, also kept in fuzz-findings/ to replay.
# Exits 0 when every target passed.
set -uo pipefail

usage() {
	echo "usage: $0 --replay|--seconds N CORPUS TARGET..." >&2
	exit 2
}

mode=${1:-}
case "$mode" in
--replay) shift ;;
--seconds) secs=${2:-}; shift 2 || usage ;;
*) usage ;;
esac
[ $# -ge 2 ] || usage
corpus=$1
shift
jobs=${FUZZ_JOBS:-2}
# an input the targets take milliseconds over: minutes is a hang
input_timeout=${FUZZ_TIMEOUT:-120}

work=$(mktemp -d /tmp/strata-fuzz-run.XXXXXX)
# the stratafs targets build layers per input: on a tmpfs when there is one
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
	scratch=$(mktemp -d /dev/shm/strata-fuzz.XXXXXX)
else
	scratch=$(mktemp -d "$work/scratch.XXXXXX")
fi
trap 'rm -rf "$work" "$scratch"' EXIT
export TMPDIR=$scratch
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1

# Starts one target in the background; its log and status go to $work.
start() {
	local bin=$1 name
	name=$(basename "$bin")
	if [ "$mode" = --replay ]; then
		(
			"$bin" -timeout="$input_timeout" \
				-artifact_prefix="$work/$name-" \
				"$corpus/$name"/* >"$work/$name.log" 2>&1
			echo $? >"$work/$name.rc"
		) &
	else
		mkdir -p "$work/$name.corpus"
		(
			# a target stuck outside any input ends too
			timeout --kill-after=30 $((secs + 600)) \
				"$bin" -max_total_time="$secs" \
				-timeout="$input_timeout" -print_final_stats=1 \
				-artifact_prefix="$work/$name-" \
				"$work/$name.corpus" "$corpus/$name" \
				>"$work/$name.log" 2>&1
			echo $? >"$work/$name.rc"
		) &
	fi
}

# The finding: the report from its first line, and each input kept.
show_finding() {
	local name=$1 log=$work/$1.log from f
	# a replay names the seed it was running
	grep '^Running: ' "$log" | tail -n 1
	from=$(grep -nE '^==[0-9]+==|property broken|ERROR: libFuzzer|^SUMMARY' \
		"$log" | head -n 1 | cut -d: -f1)
	if [ -n "$from" ]; then
		tail -n +"$from" "$log" | head -n 80
	else
		tail -n 40 "$log"
	fi
	for f in "$work/$name"-*; do
		[ -f "$f" ] || continue
		mkdir -p fuzz-findings
		cp "$f" fuzz-findings/
		echo "input ($(stat -c %s "$f") bytes), kept as fuzz-findings/${f##*/}:"
		od -An -c "$f" | head -n 16
	done
}

# A number from libFuzzer's last status line ("DONE cov: 142 ft: 522 ...").
done_field() {
	grep -E '^#[0-9]+[[:space:]]+DONE' "$work/$1.log" | tail -n 1 |
		sed -E "s/.* $2: ([0-9]+).*/\1/"
}

# One line for a target that passed: what it ran, and what it reached.
summary() {
	local name=$1 seeds execs
	seeds=$(find "$corpus/$name" -type f | wc -l)
	if [ "$mode" = --replay ]; then
		echo "PASS: $name: $seeds seeds replayed"
		return
	fi
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$name.log")
	echo "PASS: $name: $execs execs in $secs s, cov $(done_field "$name" cov)," \
		"ft $(done_field "$name" ft), corpus $(done_field "$name" corp)" \
		"(from $seeds seeds)"
}

running=0
for bin in "$@"; do
	[ -d "$corpus/$(basename "$bin")" ] || continue
	if [ "$running" -ge "$jobs" ]; then
		wait -n
		running=$((running - 1))
	fi
	start "$bin"
	running=$((running + 1))
done
wait

failed=0
for bin in "$@"; do
	name=$(basename "$bin")
	if [ ! -d "$corpus/$name" ]; then
		echo "FAIL: $name: no seed corpus in $corpus/$name"
		failed=1
		continue
	fi
	rc=$(cat "$work/$name.rc" 2>/dev/null || echo "?")
	if [ "$rc" = 0 ]; then
		summary "$name"
	else
		echo "FAIL: $name (exit status $rc)"
		show_finding "$name"
		failed=1
	fi
done
exit "$failed"
