#!/usr/bin/env bash
# conformance.sh BIN_DIR — conformance both ways with the upstream tools.
#
#   (a) the upstream Go csi-sanity (BIN_DIR/csi-sanity, kubernetes-csi/csi-test),
#       whole suite, against our csi-hostpath driver: requires "0 Failed",
#       every spec of csi-sanity/upstream-sanity-expected-pass.txt passed, and
#       at most UPSTREAM_SANITY_MAX_SKIPPED skipped;
#   (b) our csi-sanity against the upstream Go hostpath driver
#       (BIN_DIR/hostpathplugin, kubernetes-csi/csi-driver-host-path): every
#       failure must be a known deviation of that driver listed in
#       csi-sanity/upstream-hostpath-deviations.txt, every listed deviation
#       must still fail (so the list stays true), every check of
#       csi-sanity/upstream-hostpath-expected-pass.txt passed, and at most
#       OUR_SANITY_MAX_SKIPPED skipped.
#
#   (c) both against democratic-csi, a third-party driver (DCSI_DIR, from
#       ../shared/drivers/democratic-csi/install.sh): each fails exactly the
#       driver's deviations in csi-sanity/democratic-deviations.txt, and both
#       give the same verdict on every check both ran, except those listed
#       with their cause in csi-sanity/democratic-differences.txt
#       (csi-sanity/compare_runs.py). Without DCSI_DIR it is skipped, with
#       a line saying so, unless CI is set.
#
# BIN_DIR holds the upstream binaries (../shared/k8s/install.sh BIN_DIR puts
# them there). When they are missing, the script fails (exit 2) naming them
# if CI is `true` (or `1`) or BIN_DIR exists; only without CI and without
# BIN_DIR (a newcomer without ../shared/k8s) it prints one line saying what
# is skipped and exits 0.
#
# It builds nothing. Our binaries are taken from the environment:
#   CSI_HOSTPATH  path of csi-hostpath (default: <repo>/target/debug/csi-hostpath)
#   CSI_SANITY    path of csi-sanity   (default: <repo>/target/debug/csi-sanity)
# e.g. `cargo build --locked -p csi-hostpath -p csi-sanity` first.
#
# Exit code 0 when both directions conform, 1 when not, 2 for bad usage or
# missing binaries (ours; the upstream ones as said above). Temporary directories, driver processes and any
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
upstream_sanity_pass_file="$here/upstream-sanity-expected-pass.txt"
our_sanity_pass_file="$here/upstream-hostpath-expected-pass.txt"
# The pinned counts of the last runs (the lists above pin what passes):
#   upstream csi-sanity vs csi-hostpath: 66 Passed | 0 Failed | 1 Pending | 29 Skipped
#   our csi-sanity vs hostpathplugin:   77 passed, 3 failed, 9 skipped
UPSTREAM_SANITY_MAX_SKIPPED=29
OUR_SANITY_MAX_SKIPPED=9
our_hostpath=${CSI_HOSTPATH:-$repo/target/debug/csi-hostpath}
our_sanity=${CSI_SANITY:-$repo/target/debug/csi-sanity}
upstream_sanity=$bin_dir/csi-sanity
upstream_hostpath=$bin_dir/hostpathplugin

# A missing upstream binary is a skip only for a user without them and
# without CI; in CI, or when BIN_DIR exists but is incomplete, it fails.
missing_upstream=()
for b in "$upstream_sanity" "$upstream_hostpath"; do
  [ -x "$b" ] || missing_upstream+=("$b")
done
if [ ${#missing_upstream[@]} -gt 0 ]; then
  no_skip=""
  case "${CI:-}" in
    [Tt][Rr][Uu][Ee] | 1) no_skip="CI=$CI" ;;
  esac
  if [ -z "$no_skip" ] && [ -d "$bin_dir" ]; then
    no_skip="$bin_dir exists"
  fi
  if [ -n "$no_skip" ]; then
    echo "conformance: FAILED: missing or not executable: ${missing_upstream[*]}; $no_skip, so this fails instead of skipping (run ../shared/k8s/install.sh $bin_dir to get the upstream csi-sanity and hostpathplugin)" >&2
    exit 2
  fi
  echo "conformance: skipped: ${missing_upstream[*]} missing (run ../shared/k8s/install.sh $bin_dir to get the upstream csi-sanity and hostpathplugin)"
  exit 0
fi
for b in "$our_hostpath" "$our_sanity"; do
  if [ ! -x "$b" ]; then
    echo "conformance: $b is missing; build it first (cargo build --locked -p csi-hostpath -p csi-sanity) or set CSI_HOSTPATH/CSI_SANITY" >&2
    exit 2
  fi
done
for f in "$deviations_file" "$upstream_sanity_pass_file" "$our_sanity_pass_file"; do
  [ -f "$f" ] || { echo "conformance: $f is missing" >&2; exit 2; }
done

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

# names FILE — the names of a list file, without comments and blank lines,
# sorted.
names() {
  grep -vE '^[[:space:]]*(#|$)' "$1" | sed 's/[[:space:]]*$//' | LC_ALL=C sort -u
}

# expect_pass WHAT LIST PASSED — fails, printing them, when a name of the list
# file LIST is not among the names in the file PASSED; notes passing names
# the list lacks.
expect_pass() {
  local what=$1 list=$2 passed=$3 missing extra
  names "$list" >"$work/expected.txt"
  LC_ALL=C sort -u "$passed" >"$work/passed-sorted.txt"
  missing=$(LC_ALL=C comm -23 "$work/expected.txt" "$work/passed-sorted.txt")
  extra=$(LC_ALL=C comm -13 "$work/expected.txt" "$work/passed-sorted.txt")
  echo "$what: $(wc -l <"$work/passed-sorted.txt") passed, $(wc -l <"$work/expected.txt") pinned in $(basename "$list")"
  if [ -n "$extra" ]; then
    echo "$what: passing but not pinned in $(basename "$list") (add them):"
    sed 's/^/  /' <<<"$extra"
  fi
  if [ -n "$missing" ]; then
    echo "$what: pinned in $(basename "$list") but did not pass:"
    sed 's/^/  /' <<<"$missing"
    return 1
  fi
}

# expect_counts WHAT PASSED SKIPPED LIST MAX_SKIPPED — fails when fewer
# passed than LIST pins or more were skipped than MAX_SKIPPED.
expect_counts() {
  local what=$1 passed=$2 skipped=$3 pinned
  pinned=$(names "$4" | wc -l)
  if [ "$passed" -lt "$pinned" ]; then
    echo "$what: $passed passed, fewer than the $pinned pinned in $(basename "$4")"
    return 1
  fi
  if [ "$skipped" -gt "$5" ]; then
    echo "$what: $skipped skipped, more than the $5 pinned in $(basename "$0")"
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
  # The specs that passed, from the JUnit report (one <testcase> per spec).
  if [ -f "$work/upstream-sanity.xml" ]; then
    grep -oE '<testcase [^>]*>' "$work/upstream-sanity.xml" | grep -F 'status="passed"' |
      sed -E 's/.* name="([^"]*)".*/\1/; s/^\[It\] //; s/&quot;/"/g; s/&#39;/'"'"'/g; s/&lt;/</g; s/&gt;/>/g; s/&amp;/\&/g' \
      >"$work/upstream-passed.txt" || true
  else
    echo "upstream csi-sanity wrote no JUnit report ($work/upstream-sanity.xml)"
    : >"$work/upstream-passed.txt"
  fi
  expect_pass "upstream csi-sanity" "$upstream_sanity_pass_file" "$work/upstream-passed.txt" || failed=1
  passed_n=$(sed -nE 's/.* ([0-9]+) Passed .*/\1/p' <<<"$summary")
  skipped_n=$(sed -nE 's/.* ([0-9]+) Skipped.*/\1/p' <<<"$summary")
  expect_counts "upstream csi-sanity" "${passed_n:-0}" "${skipped_n:-0}" \
    "$upstream_sanity_pass_file" "$UPSTREAM_SANITY_MAX_SKIPPED" || failed=1
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
  sed -n 's/^PASS //p' "$work/our-sanity.log" >"$work/our-passed.txt"
  expect_pass "csi-sanity against hostpathplugin" "$our_sanity_pass_file" "$work/our-passed.txt" || failed=1
  if [[ $summary =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed,\ ([0-9]+)\ skipped$ ]]; then
    expect_counts "csi-sanity against hostpathplugin" "${BASH_REMATCH[1]}" "${BASH_REMATCH[3]}" \
      "$our_sanity_pass_file" "$OUR_SANITY_MAX_SKIPPED" || failed=1
  else
    echo "csi-sanity against hostpathplugin: no summary line (\"N passed, N failed, N skipped\"), last line: $summary"
    failed=1
  fi
fi
no_mounts_left "hostpathplugin under csi-sanity" || failed=1

# --- (c) both suites against democratic-csi ---------------------------------
# A second, third-party driver (../shared/drivers/democratic-csi, installed at
# $DCSI_DIR). Upstream csi-sanity runs without the one spec that leaves a bind
# mount behind on this driver (see democratic-differences.txt); then
# compare_runs.py checks that each suite fails exactly the driver's known
# deviations and that both give the same verdict on every check both ran.
dcsi_start=$repo/../shared/drivers/democratic-csi/start.sh
dcsi_skip="already mounted at a different target path"
if [ -z "${DCSI_DIR:-}" ] || [ ! -f "$dcsi_start" ]; then
  case "${CI:-}" in
    [Tt][Rr][Uu][Ee] | 1)
      echo "conformance: FAILED: democratic-csi not available (DCSI_DIR=${DCSI_DIR:-unset}, $dcsi_start); CI=$CI, so this fails instead of skipping (run ../shared/drivers/democratic-csi/install.sh DIR and export DCSI_DIR=DIR)" >&2
      failed=1
      ;;
    *)
      echo "conformance (c): skipped: democratic-csi not available (set DCSI_DIR to a ../shared/drivers/democratic-csi/install.sh folder)"
      ;;
  esac
else
  # stop_dcsi PIDFILE — stops a democratic-csi started by start.sh (not our
  # child: polled until gone, so its mounts are released before cleanup).
  stop_dcsi() {
    local pid
    pid=$(cat "$1" 2>/dev/null || true)
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || return 0
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  }
  dcsi_run() {
    local name=$1
    shift
    if ! DCSI_DIR=$DCSI_DIR LOG_LEVEL=warn bash "$dcsi_start" "$work/$name.sock" "$work/$name-data" >/dev/null; then
      echo "conformance: democratic-csi did not start for $name" >&2
      return 1
    fi
    dcsi_pidfile="$work/$name.sock.pid"
    run_tool "$work/$name.log" "$@"
    stop_dcsi "$dcsi_pidfile"
    dcsi_pidfile=""
  }
  trap '[ -n "${dcsi_pidfile:-}" ] && stop_dcsi "$dcsi_pidfile"; cleanup' EXIT
  echo "==> upstream csi-sanity ($upstream_sanity) and csi-sanity ($our_sanity) against democratic-csi ($DCSI_DIR)"
  dcsi_ok=1
  dcsi_run dcsi-upstream "$upstream_sanity" \
    -csi.endpoint "unix://$work/dcsi-upstream.sock" \
    -csi.testvolumesize=10485760 \
    -csi.mountdir "$work/dcsi-up-mount" \
    -csi.stagingdir "$work/dcsi-up-staging" \
    -csi.junitfile "$work/dcsi-upstream.xml" \
    -ginkgo.no-color \
    -ginkgo.skip="$dcsi_skip" || dcsi_ok=0
  no_mounts_left "democratic-csi under upstream csi-sanity" || failed=1
  dcsi_run dcsi-ours "$our_sanity" \
    --csi-address "$work/dcsi-ours.sock" \
    --test-volume-size 10Mi \
    --mount-dir "$work/dcsi-our-mount" \
    --staging-dir "$work/dcsi-our-staging" || dcsi_ok=0
  no_mounts_left "democratic-csi under csi-sanity" || failed=1
  if [ "$dcsi_ok" -ne 1 ] || [ ! -f "$work/dcsi-upstream.xml" ]; then
    echo "conformance: the runs against democratic-csi did not complete; last lines:"
    tail -n 20 "$work/dcsi-upstream.log" "$work/dcsi-ours.log" 2>/dev/null || true
    failed=1
  elif ! python3 "$here/compare_runs.py" "$work/dcsi-upstream.xml" "$work/dcsi-ours.log" \
    "$here/democratic-deviations.txt" "$here/democratic-differences.txt"; then
    echo "conformance: upstream csi-sanity and ours disagree about democratic-csi (above)"
    failed=1
  fi
fi

if [ "$failed" -ne 0 ]; then
  echo "conformance: FAILED"
  exit 1
fi
echo "conformance: OK"
