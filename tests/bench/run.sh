#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Strata benchmark suite: stratafs against kernel overlayfs, fuse-overlayfs
# and a plain directory, on the same backing filesystem. See README.md.
#
#   tests/bench/run.sh [--quick] [--out DIR] [--rounds N] [--dir BACKING_DIR]
#                      [--runtime S] [--targets a,b] [--workloads a,b]
#                      [--stratafs BIN] [--rebuild] [--keep]
#
# A benchmark, never an assertion: a workload that fails on a target is
# recorded as failed and the run goes on; the exit status is 0 once the
# report is written, non-zero only when setup fails (or on Ctrl-C).
#
# Not `set -e`: failures inside workloads are expected and handled.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
PY=/usr/bin/python3 # the system one: stdlib only, never a pyenv build

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
	exit "${1:-0}"
}

# ---------------------------------------------------------------- options
QUICK=0 OUT="" ROUNDS="" BACKING=/var/tmp/strata-bench RUNTIME=""
ONLY_TARGETS="" ONLY_WORKLOADS="" STRATAFS="" REBUILD=0 KEEP=0
URING_PARAM=/sys/module/fuse/parameters/enable_uring URING_WAS=""
while [ $# -gt 0 ]; do
	case $1 in
	--quick) QUICK=1 ;;
	--out) OUT=$2; shift ;;
	--rounds) ROUNDS=$2; shift ;;
	--dir) BACKING=$2; shift ;;
	--runtime) RUNTIME=$2; shift ;;
	--targets) ONLY_TARGETS=$2; shift ;;
	--workloads) ONLY_WORKLOADS=$2; shift ;;
	--stratafs) STRATAFS=$2; shift ;;
	--rebuild) REBUILD=1 ;;
	--keep) KEEP=1 ;;
	-h | --help) usage 0 ;;
	*) echo "run.sh: unknown option $1" >&2; usage 2 >&2 ;;
	esac
	shift
done

# Sizes. Full mode is what the README's numbers come from; quick mode is
# for development only and says so in its output.
if [ "$QUICK" = 1 ]; then
	MODE=quick
	SEQ_SIZE=128m RAND_SIZE=128m COPYUP_SIZE=128m
	NFILES=2000 TREE_ENTRIES=10000
	: "${ROUNDS:=1}" "${RUNTIME:=500ms}" # fio time units
	COLD_CAP=10   # seconds: cap on a one-pass (cold) sequential fio job
	CMD_TIMEOUT=120
else
	MODE=full
	SEQ_SIZE=2g RAND_SIZE=1g COPYUP_SIZE=1g
	NFILES=20000 TREE_ENTRIES=130000
	: "${ROUNDS:=3}" "${RUNTIME:=2}" # keeps the full run under 50 min
	COLD_CAP=30
	CMD_TIMEOUT=900
fi
TREE_MAXBYTES=4096 # bytes kept of each /usr file in the tree
TREE_EVERY=10      # every 10th tree file is also in the top lower layer

if [ -z "$OUT" ]; then
	OUT=$HERE/results/$(date +%Y%m%d-%H%M%S)
	[ "$QUICK" = 1 ] && OUT=$OUT-quick
fi
RAW=$OUT/raw
RESULTS=$RAW/results.jsonl
LOG=$OUT/run.log
# Everything big lives in one run directory on the backing filesystem,
# removed at exit unless --keep.
RUN=$BACKING/run
L1=$RUN/lower/L1 # top lower layer: about a tenth of the tree
L2=$RUN/lower/L2 # bottom lower layer: big files and the whole tree
TARBALL=$RUN/tree.tar
METAOPS=$RUN/bin/metaops

log() { echo "[$(date +%T)] $*" | tee -a "$LOG" >&2; }
die() {
	log "SETUP FAILED: $*"
	exit 2
}

# ------------------------------------------------------ cleanup (always)
# Every mount we make is under $RUN, every daemon we start is in DAEMONS.
declare -A MNT PID RROOT WROOT OPTS
DAEMONS=()
OWNED=0    # set once we hold the backing dir's lock: cleanup may touch $RUN
CHILD=""   # the timed command being waited for (see run_cmd)
REPORTED=0
FINISHED=0

unmount_all() {
	local m
	# Deepest first, so nothing is busy underneath.
	for m in $(awk -v r="$RUN/" 'index($5, r) == 1 { print $5 }' \
		/proc/self/mountinfo | sort -r); do
		fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null ||
			umount -l "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null
	done
}

# An ext4 without a journal keeps recently deleted inodes out of reuse
# for minutes, and every create then scans its whole inode group
# (fs/ext4/ialloc.c, recently_deleted): creates right after another
# target's unlinks ran 4x slower on a plain directory, and the create
# results were bimodal. Such a host gets a journaled ext4 image, loop
# mounted on $RUN, that every target shares.
IMAGE=$BACKING/run.img
unjournaled() {
	local dev
	[ "$(findmnt -n -o FSTYPE -T "$BACKING")" = ext4 ] || return 1
	dev=$(basename "$(findmnt -n -o SOURCE -T "$BACKING")")
	[ "$(cat "/sys/fs/ext4/$dev/journal_task" 2>/dev/null)" = "<none>" ]
}
drop_image() {
	mountpoint -q "$RUN" && { umount "$RUN" 2>/dev/null || umount -l "$RUN"; }
	rm -f "$IMAGE"
}

kill_daemons() {
	local p i
	for p in "${DAEMONS[@]}"; do
		# Only if that pid is still the daemon we started (not reused).
		if [ -r "/proc/$p/cmdline" ] &&
			tr '\0' '\n' <"/proc/$p/cmdline" | grep -qF "$RUN/"; then
			kill "$p" 2>/dev/null
			for i in 1 2 3 4 5 6 7 8 9 10; do
				[ -d "/proc/$p" ] || break
				sleep 0.2
			done
			[ -d "/proc/$p" ] && kill -9 "$p" 2>/dev/null
		fi
	done
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	[ "$OWNED" = 1 ] || exit "$rc"
	unmount_all
	kill_daemons
	unmount_all
	[ -n "$URING_WAS" ] && echo "$URING_WAS" >"$URING_PARAM"
	# A partial report is still worth having after Ctrl-C or a failure.
	if [ "$REPORTED" = 0 ] && [ -s "$RESULTS" ]; then
		echo "finished=$FINISHED" >>"$RAW/meta.env"
		"$PY" "$HERE/lib/report.py" report "$OUT" >/dev/null 2>&1 &&
			log "partial report: $OUT/results.md"
	fi
	if [ "$KEEP" = 1 ]; then
		log "kept $RUN (--keep)"
	elif [ -d "$RUN" ]; then
		# Never leave the backing dir full. Only once nothing is mounted:
		# rm -rf across a live mount would delete through it.
		if awk -v r="$RUN/" 'index($5, r) == 1 { f = 1 } END { exit !f }' \
			/proc/self/mountinfo; then
			log "WARNING: mounts remain under $RUN; not deleting it"
		else
			rm -rf "$RUN" 2>/dev/null
			drop_image
			rm -rf "$RUN"
		fi
	fi
	exit "$rc"
}
# Ctrl-C: commands run through run_cmd are in a process group of their own
# (timeout makes one), so the terminal's SIGINT does not reach them; stop
# that group, then exit, which runs cleanup.
on_signal() {
	log "interrupted"
	[ -n "$CHILD" ] && kill -TERM -- "-$CHILD" "$CHILD" 2>/dev/null
	exit 130
}
trap cleanup EXIT
trap on_signal INT TERM

# ------------------------------------------------------------- utilities
in_list() { # in_list WORD "a,b,c" (an empty list holds everything)
	[ -z "$2" ] && return 0
	case ",$2," in *",$1,"*) return 0 ;; esac
	return 1
}

# run_cmd CMD...: runs CMD under a timeout, so a hung daemon cannot stall
# the suite, in the background with `wait`, so that Ctrl-C is handled at
# once (bash defers traps while a foreground command runs).
run_cmd() {
	local rc
	timeout -k 10 "$CMD_TIMEOUT" "$@" &
	CHILD=$!
	wait "$CHILD"
	rc=$?
	CHILD=""
	return $rc
}

drop_caches() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
}

# record WORKLOAD TARGET ROUND VALUE [extra JSON fields]: one result line.
record() {
	printf '{"workload":"%s","target":"%s","round":%s,"value":%s%s}\n' \
		"$1" "$2" "$3" "$4" "${5:+,$5}" >>"$RESULTS"
	log "  $1 $2 r$3: $4"
}

# fail WORKLOAD TARGET ROUND MESSAGE: a failure is a result too.
fail() {
	local msg=${4//\\/\\\\}
	msg=${msg//\"/\\\"}
	msg=$(printf '%s' "$msg" | tr '\n\t' '  ' | cut -c1-300)
	printf '{"workload":"%s","target":"%s","round":%s,"error":"%s"}\n' \
		"$1" "$2" "$3" "$msg" >>"$RESULTS"
	log "  $1 $2 r$3: FAILED: $msg"
}

# timed WORKLOAD TARGET ROUND CMD...: wall time of a shell command line
# (run by bash -c so it can hold a pipe), under a timeout so a hung
# daemon cannot stall the suite.
timed() {
	local wl=$1 t=$2 r=$3 t0 t1 err
	shift 3
	err=$RAW/err.$$
	t0=$EPOCHREALTIME
	if run_cmd bash -c "$*" >/dev/null 2>"$err"; then
		t1=$EPOCHREALTIME
		record "$wl" "$t" "$r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
	else
		fail "$wl" "$t" "$r" "exit $?: $(head -c 300 "$err")"
	fi
	rm -f "$err"
}

# metaop WORKLOAD TARGET ROUND ARGS...: a metaops timing.
metaop() {
	local wl=$1 t=$2 r=$3 out=$RAW/out.$$ err=$RAW/err.$$
	shift 3
	if run_cmd "$METAOPS" "$@" >"$out" 2>"$err"; then
		record "$wl" "$t" "$r" "$(cat "$out")"
	else
		fail "$wl" "$t" "$r" "exit $?: $(head -c 300 "$err")"
	fi
	rm -f "$out" "$err"
}

# fio_run WORKLOAD TARGET ROUND JOB [VAR=value...]: runs jobs/JOB.fio with
# those environment variables; keeps the JSON; records MiB/s for 1 MiB
# block jobs and ops/s (IOPS) for 4 KiB ones.
fio_run() {
	local wl=$1 t=$2 r=$3 job=$4 json vals
	shift 4
	json=$RAW/fio/$wl.$t.r$r.json
	if run_cmd env "$@" fio --output-format=json \
		--output="$json" "$HERE/jobs/$job.fio" 2>"$json.err" &&
		vals=$("$PY" "$HERE/lib/report.py" fio "$json"); then
		rm -f "$json.err"
		set -- $vals # "MiB/s IOPS"
		case $job in
		seq*) record "$wl" "$t" "$r" "$1" "\"fio\":\"fio/${json##*/}\"" ;;
		*) record "$wl" "$t" "$r" "$2" "\"fio\":\"fio/${json##*/}\"" ;;
		esac
	else
		fail "$wl" "$t" "$r" "fio: $(head -c 300 "$json.err" 2>/dev/null)"
	fi
}

# Reads a whole file through a target so a "warm" run finds it cached
# (at the level that target caches: FUSE has a page cache of its own).
prewarm() { run_cmd cat "$1" >/dev/null 2>&1; }

# ------------------------------------------------------------- targets
# A target is a directory tree to run workloads in:
#   RROOT[t]  where the lower content is read (seq.bin, rand.bin, tree/)
#   WROOT[t]  where new files are written
# For the union targets both are the mountpoint. For native, reads go to
# the bottom lower layer itself (it holds the whole merged content) and
# writes to a plain directory beside it: the physical limit.

# find_daemon MOUNTPOINT: pid of the FUSE daemon serving it: the process
# that was started. stratafs's worker is a clone of its supervisor with
# the same command line; the one whose parent is not a daemon of the
# same mount is the supervisor (killing it stops the worker too).
find_daemon() {
	local p c pids=() ppid
	for p in /proc/[0-9]*; do
		c=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || continue
		case ${c%%$'\n'*} in
		*stratafs | fuse-overlayfs | */fuse-overlayfs) ;;
		*) continue ;;
		esac
		grep -qxF "$1" <<<"$c" && pids+=("${p#/proc/}")
	done
	for p in "${pids[@]}"; do
		ppid=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
		[[ " ${pids[*]} " == *" $ppid "* ]] || { echo "$p"; return 0; }
	done
	return 1
}

# daemon_rss PID: the memory of the daemon PID and its children (stratafs:
# the supervisor and its worker) in MiB, as the sum of their Pss: pages
# they share (the worker's state in the shared-memory arena is mapped by
# both, pages the clone left shared) count once, and shared libraries by
# their share. Prints it, then each process's VmRSS (the daemon's first,
# comma separated).
daemon_rss() {
	local p pids=("$1") each=""
	for p in /proc/[0-9]*; do
		[ "$(awk '/^PPid:/ { print $2 }' "$p/status" 2>/dev/null)" = "$1" ] &&
			pids+=("${p#/proc/}")
	done
	for p in "${pids[@]}"; do
		each+="${each:+,}$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' \
			"/proc/$p/status" 2>/dev/null)"
	done
	(for p in "${pids[@]}"; do cat "/proc/$p/smaps_rollup"; done) 2>/dev/null |
		awk -v each="$each" '/^Pss:/ { s += $2; n++ }
			END { if (n) printf "%.1f %s\n", s / 1024, each }'
}

mounted() { awk -v m="$1" '$5 == m { f = 1 } END { exit !f }' /proc/self/mountinfo; }

# do_mount TARGET UPPER WORK MNT: mounts one union target over the shared
# lower layers and returns when a lookup in the bottom layer answers
# (the FUSE daemons return once mounted, but checking costs nothing: a
# shell test, no process). Kept lean because wl_mount times it.
# The daemons must not inherit fd 9 (the run lock) or our stdout.
do_mount() {
	local t=$1 upper=$2 work=$3 mnt=$4 i
	local o="lowerdir=$L1:$L2,upperdir=$upper,workdir=$work"
	case $t in
	kernel) timeout 60 mount -t overlay overlay -o "$o" "$mnt" ;;
	fuse-overlayfs) timeout 60 fuse-overlayfs -o "$o" "$mnt" ;;
	stratafs*) timeout 60 "$STRATAFS" -o "$o${OPTS[$t]}" "$mnt" ;;
	esac 9>&- >/dev/null 2>>"$LOG" || return 1
	for ((i = 0; i < 1000; i++)); do
		[ -e "$mnt/seq.bin" ] && return 0
		sleep 0.01
	done
	return 1
}

# track_daemon TARGET MNT: remembers the FUSE daemon's pid (for RSS and
# for the cleanup); sets LAST_PID, empty for the kernel.
track_daemon() {
	LAST_PID=""
	[ "$1" = kernel ] && return 0
	LAST_PID=$(find_daemon "$2") || return 1
	DAEMONS+=("$LAST_PID")
}

mount_target() {
	local t=$1 d=$RUN/t/$1
	do_mount "$t" "$d/upper" "$d/work" "$d/mnt" &&
		track_daemon "$t" "$d/mnt" || return 1
	PID[$t]=$LAST_PID
	# FUSE over io_uring pins a thread to each CPU; none means the daemon
	# fell back to /dev/fuse, and the target measures that instead
	if [ "$t" = stratafs-ring ] &&
		! grep -qx 'Cpus_allowed_list:[[:space:]]*0' \
			/proc/"$LAST_PID"/task/*/status 2>/dev/null; then
		log "WARNING: $t is not served over io_uring (see the daemon's log)"
	fi
}

# A union target is healthy if its daemon lives and its root can be
# listed (opendir always reaches the daemon; a stat may be answered from
# the kernel's attribute cache even when the daemon is gone). A dead FUSE
# daemon leaves "Transport endpoint is not connected"; remount the target
# (same upper) so the remaining workloads still run, and say so in the
# report.
ensure_target() { # ensure_target TARGET WORKLOAD ROUND
	local t=$1 m=${MNT[$1]:-} p=${PID[$1]:-}
	[ -z "$m" ] && return 0
	if mounted "$m" && { [ -z "$p" ] || [ -d "/proc/$p" ]; } &&
		timeout 10 ls -f "$m" >/dev/null 2>&1; then
		return 0
	fi
	log "  $t is not answering before $2 (round $3); remounting"
	printf '{"event":"remount","target":"%s","workload":"%s","round":%s}\n' \
		"$t" "$2" "$3" >>"$RESULTS"
	fusermount3 -uz "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
	# A hung daemon is killed, but only if that pid is still ours.
	[ -n "$p" ] && tr '\0' '\n' 2>/dev/null <"/proc/$p/cmdline" |
		grep -qxF "$m" && kill -9 "$p" 2>/dev/null
	PID[$t]=""
	mount_target "$t" || { log "  remount of $t failed"; return 1; }
}

# ------------------------------------------------------------ workloads
# Each workload function takes TARGET ROUND, measures one or more metrics
# and records them under names that lib/report.py knows (it holds the
# labels, units and better-direction of each).

wl_seqread() { # cold and warm, psync and io_uring
	local t=$1 r=$2 f=${RROOT[$1]}/seq.bin
	drop_caches
	fio_run seqread-cold-psync "$t" "$r" seqread FILE="$f" ENGINE=psync \
		IODEPTH=1 TIME_BASED=0 RUNTIME=$COLD_CAP
	drop_caches
	fio_run seqread-cold-uring "$t" "$r" seqread FILE="$f" ENGINE=io_uring \
		IODEPTH=32 TIME_BASED=0 RUNTIME=$COLD_CAP
	prewarm "$f"
	fio_run seqread-warm-psync "$t" "$r" seqread FILE="$f" ENGINE=psync \
		IODEPTH=1 TIME_BASED=1 RUNTIME=$RUNTIME
	fio_run seqread-warm-uring "$t" "$r" seqread FILE="$f" ENGINE=io_uring \
		IODEPTH=32 TIME_BASED=1 RUNTIME=$RUNTIME
}

wl_seqwrite() {
	local t=$1 r=$2 f=${WROOT[$1]}/seqwrite.bin
	sync
	fio_run seqwrite "$t" "$r" seqwrite FILE="$f" SIZE=$SEQ_SIZE
	rm -f "$f"
	sync
}

wl_randread() { # cold and warm: 1 job, 4 jobs (psync), io_uring at depth 32
	local t=$1 r=$2 f=${RROOT[$1]}/rand.bin temp tb
	for temp in cold warm; do
		tb=0
		[ $temp = warm ] && { tb=1; prewarm "$f"; }
		[ $temp = cold ] && drop_caches
		fio_run randread-$temp-1j "$t" "$r" randread FILE="$f" ENGINE=psync \
			IODEPTH=1 NUMJOBS=1 JOBSIZE=100% TIME_BASED=$tb RUNTIME=$RUNTIME
		[ $temp = cold ] && drop_caches
		fio_run randread-$temp-4j "$t" "$r" randread FILE="$f" ENGINE=psync \
			IODEPTH=1 NUMJOBS=4 JOBSIZE=25% TIME_BASED=$tb RUNTIME=$RUNTIME
		[ $temp = cold ] && drop_caches
		fio_run randread-$temp-uring32 "$t" "$r" randread FILE="$f" \
			ENGINE=io_uring IODEPTH=32 NUMJOBS=1 JOBSIZE=100% \
			TIME_BASED=$tb RUNTIME=$RUNTIME
	done
	# Cold jobs stop after RUNTIME seconds or one pass over their slice,
	# whichever comes first: a partial pass is still all cache misses.
}

wl_randwrite() {
	local t=$1 r=$2 f=${WROOT[$1]}/randwrite.bin
	sync
	fio_run randwrite-1j "$t" "$r" randwrite FILE="$f" NUMJOBS=1 \
		JOBSIZE=100% RUNTIME=$RUNTIME
	sync
	fio_run randwrite-4j "$t" "$r" randwrite FILE="$f" NUMJOBS=4 \
		JOBSIZE=25% RUNTIME=$RUNTIME
	sync
}

wl_direct() { # O_DIRECT 4K random reads (lower file) and writes (upper file)
	local t=$1 r=$2
	fio_run direct-randread-1j "$t" "$r" direct FILE="${RROOT[$t]}/rand.bin" \
		RW=randread ENGINE=psync IODEPTH=1 RUNTIME=$RUNTIME
	fio_run direct-randread-uring32 "$t" "$r" direct \
		FILE="${RROOT[$t]}/rand.bin" RW=randread ENGINE=io_uring \
		IODEPTH=32 RUNTIME=$RUNTIME
	fio_run direct-randwrite-1j "$t" "$r" direct \
		FILE="${WROOT[$t]}/randwrite.bin" RW=randwrite ENGINE=psync \
		IODEPTH=1 RUNTIME=$RUNTIME
}

# Copy-up: the first append to a lower file. Each round has its own lower
# file (copyup-rN.bin), so it is fresh on every target in every round. The
# lower file is read into the page cache first (it is shared by all
# targets, and whichever ran first would otherwise pay the disk read
# alone). Two times: the append as the application sees it (including
# any fsync the filesystem does itself: kernel overlayfs fsyncs copied-up
# data), and the append plus a sync(2), i.e. until the copy is on disk
# whatever the filesystem does. The copy is deleted afterwards (leaving a
# whiteout) to keep the backing filesystem from filling up.
wl_copyup() {
	local t=$1 r=$2 f
	if [ "$t" = native ]; then
		f=${WROOT[$t]}/copyup.bin # no copy-up: just the append
	else
		f=${WROOT[$t]}/copyup-r$r.bin
		prewarm "$L2/copyup-r$r.bin"
	fi
	sync
	local out=$RAW/out.$$ err=$RAW/err.$$
	if run_cmd "$METAOPS" append "$f" >"$out" 2>"$err"; then
		local app dur
		read -r app dur <"$out"
		record copyup "$t" "$r" "$app"
		record copyup-sync "$t" "$r" "$dur"
	else
		fail copyup "$t" "$r" "exit $?: $(head -c 300 "$err")"
	fi
	rm -f "$out" "$err"
	[ "$t" = native ] || rm -f "$f"
	sync
}

# Metadata: NFILES empty files in a new directory (in the upper layer).
wl_meta() {
	local t=$1 r=$2 d=${WROOT[$1]}/meta-r$2
	rm -rf "$d"
	mkdir "$d" || { fail meta-create "$t" "$r" "mkdir $d"; return; }
	sync
	metaop meta-create "$t" "$r" create "$d" "$NFILES"
	metaop meta-stat-warm "$t" "$r" stat "$d" "$NFILES"
	drop_caches
	metaop meta-stat-cold "$t" "$r" stat "$d" "$NFILES"
	drop_caches
	metaop meta-readdir-cold "$t" "$r" readdir "$d"
	metaop meta-readdir-warm "$t" "$r" readdir "$d"
	metaop meta-unlink "$t" "$r" unlink "$d" "$NFILES"
	rm -rf "$d"
}

# find and du -s over the tree, cold then warm; then the daemon's memory
# (daemon_rss).
wl_walk() {
	local t=$1 r=$2 d=${RROOT[$1]}/tree rss each
	drop_caches
	timed find-cold "$t" "$r" "find '$d' >/dev/null"
	timed find-warm "$t" "$r" "find '$d' >/dev/null"
	drop_caches
	timed du-cold "$t" "$r" "du -s '$d' >/dev/null"
	timed du-warm "$t" "$r" "du -s '$d' >/dev/null"
	if [ -n "${PID[$t]:-}" ]; then
		read -r rss each < <(daemon_rss "${PID[$t]}")
		if [ -n "$rss" ]; then
			record rss-after-walk "$t" "$r" "$rss" "\"vmrss_mib\":[$each]"
			log "  VmRSS of each process (MiB, the daemon's first): $each"
		else
			fail rss-after-walk "$t" "$r" "daemon ${PID[$t]} is gone"
		fi
	fi
}

# mem_after TARGET ROUND WORKLOAD: the daemon's memory (daemon_rss) once
# WORKLOAD is done, as mem-after-WORKLOAD in raw/results.jsonl and the
# log; not in the report. It tells which workload left what the
# rss-after-walk row measures.
mem_after() {
	local rss each
	[ -n "${PID[$1]:-}" ] || return 0
	read -r rss each < <(daemon_rss "${PID[$1]}")
	[ -n "$rss" ] || return 0
	printf '{"workload":"mem-after-%s","target":"%s","round":%s,"value":%s,"vmrss_mib":[%s]}\n' \
		"$3" "$1" "$2" "$rss" "$each" >>"$RESULTS"
	log "  memory after $3 on $1: $rss MiB (VmRSS of each process: $each)"
}

# tar: extract the tree's tarball into the merged view (as root, so with
# owners and modes, like an image layer being unpacked) including the
# sync that makes it durable; then tar the lower tree out through the
# target, cold. GNU tar skips reading file data when the archive is
# /dev/null, hence the pipe through cat. The extracted copy stays until
# the end (cleanup removes it from the upper directly, much faster than
# through the mount; metadata unlink is measured by wl_meta already).
wl_tar() {
	local t=$1 r=$2 x=${WROOT[$1]}/x-r$2
	mkdir "$x" || { fail tar-extract "$t" "$r" "mkdir $x"; return; }
	prewarm "$TARBALL"
	sync
	timed tar-extract "$t" "$r" "tar -xf '$TARBALL' -C '$x' && sync"
	drop_caches
	timed tar-out-cold "$t" "$r" "tar -cf - -C '${RROOT[$t]}' tree | cat >/dev/null"
}

# Mount time: a fresh upper/work over the same lower layers, from the
# mount command until a lookup in the bottom layer answers. (The mount
# lives in $RUN/mt so the cleanup trap finds it.)
wl_mount() {
	local t=$1 r=$2 d=$RUN/mt/$1-r$2 t0 t1
	[ "$t" = native ] && return # nothing to mount
	mkdir -p "$d/upper" "$d/work" "$d/mnt"
	sync
	t0=$EPOCHREALTIME
	if do_mount "$t" "$d/upper" "$d/work" "$d/mnt"; then
		t1=$EPOCHREALTIME
		record mount "$t" "$r" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
	else
		fail mount "$t" "$r" "mount failed"
	fi
	track_daemon "$t" "$d/mnt"
	fusermount3 -u "$d/mnt" 2>/dev/null || umount "$d/mnt" 2>/dev/null ||
		umount -l "$d/mnt" 2>/dev/null
	rm -rf "$d"
}

# The order of a round. Ordered so that each workload's leftovers (dirty
# pages, deleted files) are synced before the next one is timed.
WORKLOADS=(seqread seqwrite randread randwrite direct copyup meta walk tar mount)

# ---------------------------------------------------------------- setup
mkdir -p "$RAW/fio" || { echo "run.sh: cannot create $RAW" >&2; exit 2; }
: >"$LOG"
[ "$(id -u)" = 0 ] || die "must run as root (mounts, drop_caches)"
log "strata bench: $MODE mode, $ROUNDS round(s), output in $OUT"

# Only one run at a time on a backing directory: they would share $RUN.
mkdir -p "$BACKING" || die "cannot create $BACKING"
exec 9>"$BACKING/.lock"
flock -n 9 || die "another run holds $BACKING/.lock"
OWNED=1
# A run killed with SIGKILL leaves its run dir (and maybe mounts) behind.
unmount_all
rm -rf "$RUN" 2>/dev/null
drop_image
rm -rf "$RUN"
BACKING_NOTE=""
if unjournaled; then
	# room for the full run's layers and uppers, allocated as they are used
	size=$(( $(df -k --output=avail "$BACKING" | tail -1) * 9 / 10 ))
	mkdir -p "$RUN" && truncate -s "${size}K" "$IMAGE" &&
		mkfs.ext4 -q -F "$IMAGE" && mount -o loop "$IMAGE" "$RUN" ||
		die "cannot set up a journaled ext4 image at $IMAGE"
	BACKING_NOTE="; the host ext4 has no journal: a journaled ext4 image on it, loop-mounted, holds every target"
	log "backing: journaled ext4 image $IMAGE on $RUN (the host ext4 has no journal)"
fi

# Packages: only what is missing, so repeated runs do not touch apt.
need=()
for p in fio fuse-overlayfs gnuplot-nox fuse3 gcc; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq >>"$LOG" 2>&1
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends "${need[@]}" >>"$LOG" 2>&1 ||
		die "apt-get install ${need[*]}"
fi

if [ -z "$STRATAFS" ]; then
	STRATAFS=$TOP/build/stratafs
	if [ ! -x "$STRATAFS" ] || [ "$REBUILD" = 1 ]; then
		log "building stratafs"
		{ "$TOP/scripts/deps.sh" && "$TOP/scripts/build.sh" build; } \
			>>"$LOG" 2>&1 || die "build failed (see $LOG)"
	fi
fi
[ -x "$STRATAFS" ] || die "no stratafs at $STRATAFS"
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null
grep -qw overlay /proc/filesystems || die "kernel overlayfs not available"
[ -c /dev/fuse ] || die "/dev/fuse missing"

# Targets. stratafs is two targets when it has a choice of I/O engine.
TARGETS=(native kernel fuse-overlayfs)
if "$STRATAFS" --help 2>&1 | grep -q 'io='; then
	IO_NOTE="stratafs supports -o io=: both engines are separate targets"
	TARGETS+=(stratafs-uring stratafs-sync)
	OPTS[stratafs-uring]=",io=uring"
	OPTS[stratafs-sync]=",io=sync"
	# Where passthrough is the default, the engines' targets turn it off
	# (the engines would not see upper files' I/O), and it is a target
	# of its own; the transports' targets run with the default.
	if "$STRATAFS" --help 2>&1 | grep -q 'nopassthrough'; then
		OPTS[stratafs-uring]=",io=uring,nopassthrough"
		OPTS[stratafs-sync]=",io=sync,nopassthrough"
	fi
	# and the kernel doing upper files' I/O itself, where it offers to
	if "$STRATAFS" --help 2>&1 | grep -q 'passthrough'; then
		IO_NOTE="$IO_NOTE; -o passthrough is a third target"
		TARGETS+=(stratafs-passthrough)
		OPTS[stratafs-passthrough]=",passthrough"
	fi
	# and the two transports, each daemon in one process: supervised,
	# stratafs is served through /dev/fuse (fuse/uring.c)
	if "$STRATAFS" --help 2>&1 | grep -q 'transport='; then
		IO_NOTE="$IO_NOTE; -o transport=uring and =dev (with nosupervisor) are two more"
		TARGETS+=(stratafs-ring stratafs-dev)
		OPTS[stratafs-ring]=",transport=uring,nosupervisor"
		OPTS[stratafs-dev]=",transport=dev,nosupervisor"
	fi
else
	IO_NOTE="stratafs has no -o io= option (yet): one stratafs target, default engine"
	TARGETS+=(stratafs)
	OPTS[stratafs]=""
fi
if [ -n "$ONLY_TARGETS" ]; then
	sel=()
	for t in "${TARGETS[@]}"; do in_list "$t" "$ONLY_TARGETS" && sel+=("$t"); done
	TARGETS=("${sel[@]}")
	[ ${#TARGETS[@]} -gt 0 ] || die "no target left after --targets"
fi
log "$IO_NOTE"
log "targets: ${TARGETS[*]}"
# FUSE over io_uring needs the module parameter: on for the run, then
# back to what it was (cleanup)
if in_list stratafs-ring "$(IFS=,; echo "${TARGETS[*]}")" && [ -e "$URING_PARAM" ]; then
	URING_WAS=$(cat "$URING_PARAM")
	echo 1 >"$URING_PARAM"
fi

sh_version=$(cd "$TOP" && git describe --always --dirty 2>/dev/null || echo unknown)
{
	echo "mode=$MODE"
	echo "rounds=$ROUNDS"
	echo "runtime=$RUNTIME"
	echo "cold_cap=$COLD_CAP"
	echo "seq_size=$SEQ_SIZE"
	echo "rand_size=$RAND_SIZE"
	echo "copyup_size=$COPYUP_SIZE"
	echo "nfiles=$NFILES"
	echo "tree_entries=$TREE_ENTRIES"
	echo "targets=${TARGETS[*]}"
	echo "io_note=$IO_NOTE"
	echo "stratafs=$STRATAFS"
	echo "stratafs_version=$sh_version"
	echo "stratafs_built=$(date -r "$STRATAFS" '+%F %T')"
	echo "kernel=$(uname -r)"
	echo "fio=$(fio --version)"
	echo "fuse_overlayfs=$(dpkg-query -W -f='${Version}' fuse-overlayfs)"
	echo "cpus=$(nproc)"
	echo "mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
	echo "backing=$BACKING ($(findmnt -n -o FSTYPE -T "$BACKING")$BACKING_NOTE)"
	echo "started=$(date '+%F %T')"
	echo "started_epoch=$EPOCHREALTIME"
} >"$RAW/meta.env"

setup_t0=$EPOCHREALTIME
mkdir -p "$L1" "$L2" "$RUN/bin" "$RUN/mt" || die "mkdir $RUN"
cc -O2 -Wall -o "$METAOPS" "$HERE/lib/metaops.c" || die "cannot build metaops"

# Lower layer content, made once per run and shared by every union target
# (lower layers are never written, so sharing is safe, and one copy means
# every target reads the very same blocks). fio writes the big files: its
# buffers are not all zeroes, unlike dd from /dev/zero.
log "setup: lower layers (seq $SEQ_SIZE, rand $RAND_SIZE, $ROUNDS x copy-up $COPYUP_SIZE, tree of $TREE_ENTRIES)"
mkfile() { # mkfile PATH SIZE
	FILE=$1 SIZE=$2 fio --output=/dev/null "$HERE/jobs/seqwrite.fio" >>"$LOG" 2>&1
}
mkfile "$L2/seq.bin" "$SEQ_SIZE" || die "making seq.bin"
mkfile "$L2/rand.bin" "$RAND_SIZE" || die "making rand.bin"
for r in $(seq "$ROUNDS"); do
	mkfile "$L2/copyup-r$r.bin" "$COPYUP_SIZE" || die "making copyup-r$r.bin"
done
tree_stats=$("$PY" "$HERE/lib/maketree.py" /usr "$L2" "$L1" "$TREE_ENTRIES" \
	"$TREE_MAXBYTES" "$TREE_EVERY") || die "making the tree"
echo "tree=$tree_stats" >>"$RAW/meta.env"
log "setup: tree (entries files bytes): $tree_stats"
tar -cf "$TARBALL" -C "$L2" tree || die "making the tarball"

# Targets: mount the union ones; give each its own upper (and native its
# own directory); create the random-write file through the target, so it
# sits in the upper layer before anything is timed.
for t in "${TARGETS[@]}"; do
	d=$RUN/t/$t
	if [ "$t" = native ]; then
		mkdir -p "$d/dir" || die "mkdir $d/dir"
		RROOT[$t]=$L2
		WROOT[$t]=$d/dir
		cp "$L2/copyup-r1.bin" "$d/dir/copyup.bin" || die "native copyup.bin"
	else
		mkdir -p "$d/upper" "$d/work" "$d/mnt" || die "mkdir $d"
		mount_target "$t" || die "mounting $t"
		MNT[$t]=$d/mnt
		RROOT[$t]=$d/mnt
		WROOT[$t]=$d/mnt
	fi
	mkfile "${WROOT[$t]}/randwrite.bin" "$RAND_SIZE" || die "randwrite.bin on $t"
	log "setup: $t ready${PID[$t]:+ (daemon pid ${PID[$t]})}"
done
sync
echo "setup_seconds=$(awk -v a="$setup_t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')" >>"$RAW/meta.env"

# ----------------------------------------------------------------- runs
# Interleaved: each workload runs on every target before the next
# workload starts, and each round repeats the whole sequence, so slow
# drifts (page cache, disk, other load) hit all targets alike. The target
# order rotates by one each round so no target is always first.
n=${#TARGETS[@]}
for r in $(seq "$ROUNDS"); do
	order=()
	for i in $(seq 0 $((n - 1))); do order+=("${TARGETS[$(((i + r - 1) % n))]}"); done
	log "round $r/$ROUNDS: ${order[*]}"
	for wl in "${WORKLOADS[@]}"; do
		in_list "$wl" "$ONLY_WORKLOADS" || continue
		for t in "${order[@]}"; do
			ensure_target "$t" "$wl" "$r" || {
				fail "$wl" "$t" "$r" "target down"
				continue
			}
			log "r$r $wl on $t"
			"wl_$wl" "$t" "$r"
			mem_after "$t" "$r" "$wl"
		done
	done
done
FINISHED=1

# ---------------------------------------------------------------- report
echo "finished=1" >>"$RAW/meta.env"
echo "ended=$(date '+%F %T')" >>"$RAW/meta.env"
echo "total_seconds=$(awk -v a="$(sed -n 's/^started_epoch=//p' "$RAW/meta.env")" \
	-v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')" >>"$RAW/meta.env"
"$PY" "$HERE/lib/report.py" report "$OUT" || log "report failed"
REPORTED=1
log "results: $OUT/results.md, $OUT/results.png"
exit 0
