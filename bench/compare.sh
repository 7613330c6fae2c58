#!/usr/bin/env bash
# Runs the whole weft comparison on this machine and writes a report:
#   1. a "weft up" cluster (3 data servers, replicas 1), a FUSE loopback
#      ("weft loopback", kernel passthrough off) of a directory on the same
#      disk, and that disk directly, side by side with weft bench --compare;
#   2. the same with replicas 3.
# Everything it starts is stopped and unmounted at the end (also on error or
# Ctrl-C).
#
# Usage: bench/compare.sh [--tmpfs] [REPORT_DIR]
#   --tmpfs      put every backing directory on a tmpfs (isolates the
#                software's own cost from the disk's noise; needs root)
#   REPORT_DIR   default bench-report (replicas1/ and replicas3/ below it)
# Environment:
#   WEFT         the weft binary (default ./bin/weft)
#   BENCH_ARGS   flags of both runs (default: 64MiB per process, 1 and 4
#                processes, 1000 files per process, medians of 3 for replicas 1;
#                about 12 minutes in all here)
#   BENCH_ARGS3  flags of the replicas 3 run (default: BENCH_ARGS, 1 repetition)
#   BENCH_WORK   where the temporary directories go (default /var/tmp)
set -euo pipefail

tmpfs=0
if [[ "${1:-}" == "--tmpfs" ]]; then
	tmpfs=1
	shift
fi
report=$(realpath -m "${1:-bench-report}")
weft=$(realpath "${WEFT:-./bin/weft}")
args=${BENCH_ARGS:---size 64MiB --procs 1,4 --files 1000 --repeat 3}
args3=${BENCH_ARGS3:-${BENCH_ARGS:---size 64MiB --procs 1,4 --files 1000} --repeat 1}

work=$(mktemp -d "${BENCH_WORK:-/var/tmp}/weft-bench.XXXXXX")
pids=()

cleanup() {
	set +e
	local pid
	for pid in "${pids[@]}"; do
		kill -INT "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	pids=()
	# Anything still mounted below the work directory (a daemon that died).
	awk -v w="$work" '$2 == w || index($2, w "/") == 1 { print $2 }' /proc/mounts | sort -r | while read -r mp; do
		umount -l "$mp" 2>/dev/null || fusermount3 -u -z "$mp" 2>/dev/null || true
	done
	if [[ $tmpfs == 1 ]]; then
		umount "$work" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ $tmpfs == 1 ]]; then
	mount -t tmpfs -o size=12g weft-bench "$work"
fi

# wait_mount DIR: wait until DIR is a mount point (60 s at most).
wait_mount() {
	local i
	for i in $(seq 600); do
		if grep -q " $1 " /proc/mounts; then
			return 0
		fi
		sleep 0.1
	done
	echo "bench: $1 was not mounted within 60 s; see the logs in $work" >&2
	return 1
}

# start_weft R: a weft up cluster with replicas R, mounted at $work/weft-rR.
start_weft() {
	local r=$1
	mkdir -p "$work/weft-r$r"
	"$weft" up --dir "$work/cluster-r$r" --mount "$work/weft-r$r" --data-servers 3 --replicas "$r" \
		>"$work/up-r$r.log" 2>&1 &
	pids+=($!)
	wait_mount "$work/weft-r$r"
}

# stop_all: stop every daemon started so far.
stop_all() {
	local pid
	for pid in "${pids[@]}"; do
		kill -INT "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	pids=()
}

mkdir -p "$work/loop-src" "$work/loop-mnt" "$work/local" "$report"
echo "bench: working in $work (tmpfs: $tmpfs); report in $report"

for r in 1 3; do
	start_weft "$r"
	"$weft" loopback "$work/loop-src" "$work/loop-mnt" >"$work/loopback.log" 2>&1 &
	pids+=($!)
	wait_mount "$work/loop-mnt"
	a=$args
	if [[ $r == 3 ]]; then
		a=$args3
	fi
	echo "bench: replicas $r: weft bench --compare $work/weft-r$r $work/loop-mnt $work/local $a"
	# shellcheck disable=SC2086 # the flags are meant to be split
	"$weft" bench --compare --cpu-match "$work/" --report "$report/replicas$r" $a \
		"$work/weft-r$r" "$work/loop-mnt" "$work/local" | tee "$report/replicas$r.txt"
	stop_all
done
echo "bench: reports in $report/replicas1 and $report/replicas3"
