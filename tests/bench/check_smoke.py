#!/usr/bin/env python3
"""Checks the output of the benchmark's smoke run (`.ci/run`):

    BENCH_SMOKE=1 cargo bench --locked --profile dev --bench realcluster > out
    python3 tests/bench/check_smoke.py out

`tests/bench/realcluster.rs` prints one JSON object per line: per
(scenario, binary, driver) a result `{"scenario", "binary", "driver", ...}`
with `binary` "ours" or "upstream" (the Go csi-provisioner), per (scenario,
driver) one or more `{"ratio": scenario, "driver", "metric", "ours",
"upstream", "ours_better_by"}` lines (one per metric), and `{"skipped": why}` alone when it ran nothing.

The scenarios are taken from the output, not from a list: every
(scenario, driver) pair that appears must have a result of both binaries
(none of them `"completed": false`) and a ratio with numbers. The smoke run
takes the drivers in turn, one per scenario, so a scenario need not appear
with every driver; but when the output names more than one driver, each of
them must have run at least two scenarios, so a driver that stopped working
cannot drop out unseen. An
output without any scenario, or with a `skipped` line, fails. Exit code 0
when all holds, 1 (after saying what is missing) when not, 2 on bad usage.
"""

import json
import math
import sys

BINARIES = ("ours", "upstream")
# Scenarios the bench runs for our binary alone, by design, without a ratio
# (outside smoke mode: `idle` again with every loop of ours on; the orphan
# audit, which the Go image does not have).
OURS_ONLY = {"idle-all-loops", "orphan-audit"}


def number(value):
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def check(lines):
    """The problems of a smoke run's output lines, and a summary."""
    problems = []
    results = {}  # (scenario, driver) -> {binary: [result, ...]}
    ratios = {}  # (scenario, driver) -> ratio object
    drivers = set()
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"line {n}: not JSON ({e}): {line[:200]}")
            continue
        if not isinstance(obj, dict):
            continue
        if "skipped" in obj:
            problems.append(f"line {n}: the benchmark skipped: {obj['skipped']}")
        elif "ratio" in obj:
            key = (str(obj["ratio"]), str(obj.get("driver")))
            drivers.add(key[1])
            metric = str(obj.get("metric"))
            by_metric = ratios.setdefault(key, {})
            if metric in by_metric:
                problems.append(
                    f"line {n}: a second ratio of {metric} for {key[0]} / {key[1]}"
                )
            by_metric[metric] = obj
        elif "scenario" in obj:
            key = (str(obj["scenario"]), str(obj.get("driver")))
            drivers.add(key[1])
            binary = obj.get("binary")
            if binary not in BINARIES:
                problems.append(
                    f"line {n}: {key[0]} / {key[1]}: unknown binary {binary!r}"
                )
                continue
            results.setdefault(key, {}).setdefault(binary, []).append(obj)
            if obj.get("completed") is False:
                problems.append(
                    f"line {n}: {key[0]} / {key[1]} / {binary}: did not complete"
                )

    pairs = sorted(set(results) | set(ratios))
    if not pairs:
        problems.append("no scenario in the output: the benchmark ran nothing")
    if len(drivers) > 1:
        for driver in sorted(drivers):
            ran = {s for s, d in pairs if d == driver}
            if len(ran) < 2:
                problems.append(
                    f"driver {driver}: ran {len(ran)} scenario(s) ({', '.join(sorted(ran))}); "
                    "each driver named must run at least two"
                )
    summary = []
    for scenario, driver in pairs:
        key = (scenario, driver)
        what = f"{scenario} / {driver}"
        by_binary = results.get(key, {})
        if scenario in OURS_ONLY:
            if "ours" not in by_binary:
                problems.append(f"{what}: no result of ours")
            else:
                summary.append(f"{what}: ours only (the Go image has no such run)")
            continue
        for binary in BINARIES:
            if binary not in by_binary:
                problems.append(f"{what}: no result of {binary}")
        by_metric = ratios.get(key)
        if not by_metric:
            problems.append(f"{what}: no ratio line")
            continue
        for ratio in by_metric.values():
            bad = [
                f
                for f in ("ours", "upstream", "ours_better_by")
                if not number(ratio.get(f))
            ]
            if bad:
                problems.append(
                    f"{what}: ratio without a number for {', '.join(bad)}: {ratio}"
                )
                continue
            summary.append(
                f"{what}: {ratio.get('metric')} ours {ratio['ours']} upstream "
                f"{ratio['upstream']} (ours better by {ratio['ours_better_by']})"
            )
    return problems, summary


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} BENCH_OUTPUT (- for stdin)", file=sys.stderr)
        return 2
    if argv[1] == "-":
        lines = sys.stdin.read().splitlines()
    else:
        with open(argv[1], encoding="utf-8") as f:
            lines = f.read().splitlines()
    problems, summary = check(lines)
    for line in summary:
        print(f"bench smoke: {line}")
    if problems:
        print(f"bench smoke: FAILED ({argv[1]}):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(f"bench smoke: OK ({len(summary)} scenario/driver pairs, both binaries each but ours-only runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
