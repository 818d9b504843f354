#!/usr/bin/env bash
# conformance.sh BIN_DIR — conformance both ways with the upstream tools.
#
#   (a) the upstream Go csi-sanity (BIN_DIR/csi-sanity, kubernetes-csi/csi-test),
#       whole suite, against our csi-hostpath driver: requires "0 Failed";
#   (b) our csi-sanity against the upstream Go hostpath driver
#       (BIN_DIR/hostpathplugin, kubernetes-csi/csi-driver-host-path): every
#       failure must be a known deviation of that driver listed in
#       csi-sanity/upstream-hostpath-deviations.txt, and every listed
#       deviation must still fail (so the list stays true).
#
# BIN_DIR holds the upstream binaries (../shared/k8s/install.sh BIN_DIR puts
# them there). When it lacks them, the script prints one line saying so and
# exits 0.
#
# It builds nothing. Our binaries are taken from the environment:
#   CSI_HOSTPATH  path of csi-hostpath (default: <repo>/target/debug/csi-hostpath)
#   CSI_SANITY    path of csi-sanity   (default: <repo>/target/debug/csi-sanity)
# e.g. `cargo build --locked -p csi-hostpath -p csi-sanity` first.
#
# Exit code 0 when both directions conform, 1 when not, 2 for bad usage or
# missing binaries of ours. Temporary directories, driver processes and any
# mount left below them are cleaned up on every exit path.
set -euo pipefail

usage() {
  echo "usage: CSI_HOSTPATH=... CSI_SANITY=... $0 BIN_DIR" >&2
  exit 2
}
[ $# -eq 1 ] || usage
bin_dir=$1
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
deviations_file="$here/upstream-hostpath-deviations.txt"
our_hostpath=${CSI_HOSTPATH:-$repo/target/debug/csi-hostpath}
our_sanity=${CSI_SANITY:-$repo/target/debug/csi-sanity}
upstream_sanity=$bin_dir/csi-sanity
upstream_hostpath=$bin_dir/hostpathplugin

for b in "$upstream_sanity" "$upstream_hostpath"; do
  if [ ! -x "$b" ]; then
    echo "conformance: skipped: $b is missing (run ../shared/k8s/install.sh $bin_dir to get the upstream csi-sanity and hostpathplugin)"
    exit 0
  fi
done
for b in "$our_hostpath" "$our_sanity"; do
  if [ ! -x "$b" ]; then
    echo "conformance: $b is missing; build it first (cargo build --locked -p csi-hostpath -p csi-sanity) or set CSI_HOSTPATH/CSI_SANITY" >&2
    exit 2
  fi
done
[ -f "$deviations_file" ] || { echo "conformance: $deviations_file is missing" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/csi-conformance.XXXXXX")
driver_pid=""
tool_pid=""

# Mount points at or below $work (the drivers must leave none behind).
mounts_below_work() {
  awk -v dir="$work" '$5 == dir || index($5, dir "/") == 1 { print $5 }' /proc/self/mountinfo
}

stop_driver() {
  if [ -n "$driver_pid" ]; then
    kill "$driver_pid" 2>/dev/null || true
    wait "$driver_pid" 2>/dev/null || true
    driver_pid=""
  fi
}

cleanup() {
  if [ -n "$tool_pid" ]; then
    kill "$tool_pid" 2>/dev/null || true
    wait "$tool_pid" 2>/dev/null || true
  fi
  stop_driver
  # Deepest first; lazily, so a busy mount does not keep the directory.
  mounts_below_work | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_driver LOG SOCKET COMMAND... — starts a driver in the background and
# waits up to 10 s for its socket.
start_driver() {
  local log=$1 socket=$2
  shift 2
  NO_COLOR=1 "$@" >"$log" 2>&1 &
  driver_pid=$!
  for _ in $(seq 100); do
    [ -S "$socket" ] && return 0
    if ! kill -0 "$driver_pid" 2>/dev/null; then
      echo "conformance: $1 exited at start:" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "conformance: $1 did not create $socket within 10 s:" >&2
  tail -n 20 "$log" >&2
  return 1
}

# run_tool LOG COMMAND... — runs a test suite with a time limit, in the
# background so that a signal to this script is handled at once (bash runs
# traps only between foreground commands); sets $status.
run_tool() {
  local log=$1
  shift
  timeout 900 "$@" >"$log" 2>&1 &
  tool_pid=$!
  status=0
  wait "$tool_pid" || status=$?
  tool_pid=""
}

# no_mounts_left WHAT — fails when a mount is left below $work.
no_mounts_left() {
  local left
  left=$(mounts_below_work)
  if [ -n "$left" ]; then
    echo "conformance: $1 left mounts behind:" >&2
    echo "$left" >&2
    return 1
  fi
}

failed=0

# --- (a) upstream csi-sanity against csi-hostpath ---------------------------
echo "==> upstream csi-sanity ($upstream_sanity) against csi-hostpath ($our_hostpath)"
start_driver "$work/csi-hostpath.log" "$work/hp.sock" \
  "$our_hostpath" --endpoint "unix://$work/hp.sock" --nodeid conformance-node \
  --statedir "$work/hp-state"
run_tool "$work/upstream-sanity.log" "$upstream_sanity" \
  -csi.endpoint "unix://$work/hp.sock" \
  -csi.testvolumesize=10485760 \
  -csi.mountdir "$work/hp-mount" \
  -csi.stagingdir "$work/hp-staging" \
  -csi.junitfile "$work/upstream-sanity.xml" \
  -ginkgo.no-color
stop_driver
summary=$(grep -E '^(SUCCESS|FAIL)! -- [0-9]+ Passed \| [0-9]+ Failed' "$work/upstream-sanity.log" | tail -n 1 || true)
seed=$(grep -oE 'Random Seed: [0-9]+' "$work/upstream-sanity.log" | head -n 1 || true)
if [ -z "$summary" ]; then
  echo "upstream csi-sanity printed no summary (exit code $status); last lines:"
  tail -n 40 "$work/upstream-sanity.log"
  failed=1
else
  counts=${summary#* -- }
  echo "upstream csi-sanity: $counts ($seed)"
  if [ "$status" -ne 0 ] || ! grep -q '| 0 Failed |' <<<"$summary"; then
    echo "upstream csi-sanity failed against csi-hostpath (exit code $status); failed specs:"
    grep -E '^\s*\[FAIL\]' "$work/upstream-sanity.log" || true
    echo "(rerun the same order with -ginkgo.seed=${seed#Random Seed: }; last lines of the driver log:)"
    tail -n 20 "$work/csi-hostpath.log"
    failed=1
  fi
fi
no_mounts_left "csi-hostpath under upstream csi-sanity" || failed=1
leaked=$(find "$work/hp-state/volumes" "$work/hp-state/snapshots" -maxdepth 1 -name '*.json' 2>/dev/null | wc -l)
if [ "$leaked" -ne 0 ]; then
  echo "conformance: $leaked volume or snapshot records left in csi-hostpath's state after upstream csi-sanity" >&2
  failed=1
fi

# --- (b) our csi-sanity against the upstream hostpath driver ----------------
echo "==> csi-sanity ($our_sanity) against upstream hostpathplugin ($upstream_hostpath)"
start_driver "$work/hostpathplugin.log" "$work/up.sock" \
  "$upstream_hostpath" -endpoint "unix://$work/up.sock" -nodeid conformance-node \
  -statedir "$work/up-state"
run_tool "$work/our-sanity.log" "$our_sanity" \
  --csi-address "$work/up.sock" \
  --test-volume-size 10Mi \
  --mount-dir "$work/up-mount" \
  --staging-dir "$work/up-staging" \
  --junit "$work/our-sanity.xml"
stop_driver
if [ "$status" -gt 1 ]; then
  echo "csi-sanity could not run against hostpathplugin (exit code $status):"
  tail -n 40 "$work/our-sanity.log"
  failed=1
else
  summary=$(tail -n 1 "$work/our-sanity.log")
  # Check names contain no colon; the reason follows the first ": ".
  sed -n 's/^FAIL \([^:]*\): .*/\1/p' "$work/our-sanity.log" | sort -u >"$work/failed.txt"
  grep -vE '^[[:space:]]*(#|$)' "$deviations_file" | sed 's/[[:space:]]*$//' | sort -u >"$work/known.txt"
  unexpected=$(comm -23 "$work/failed.txt" "$work/known.txt")
  fixed=$(comm -13 "$work/failed.txt" "$work/known.txt")
  known=$(comm -12 "$work/failed.txt" "$work/known.txt" | wc -l)
  echo "csi-sanity against hostpathplugin: $summary ($known known deviations of the upstream driver)"
  if [ -n "$unexpected" ]; then
    echo "failures that are not known deviations of the upstream driver:"
    grep -F -f <(printf '%s\n' "$unexpected" | sed 's/^/FAIL /') "$work/our-sanity.log" || true
    failed=1
  fi
  if [ -n "$fixed" ]; then
    echo "listed in $(basename "$deviations_file") but no longer failing (remove them from the list):"
    while read -r name; do
      line=$(grep -F "$name" "$work/our-sanity.log" | head -n 1 || true)
      echo "  ${line:-not run: $name}"
    done <<<"$fixed"
    failed=1
  fi
fi
no_mounts_left "hostpathplugin under csi-sanity" || failed=1

if [ "$failed" -ne 0 ]; then
  echo "conformance: FAILED"
  exit 1
fi
echo "conformance: OK"
