#!/usr/bin/env python3
"""compare_runs.py UPSTREAM_JUNIT OUR_LOG DEVIATIONS DIFFERENCES

Upstream csi-sanity and ours, run against one third-party driver, must agree:
- each suite fails exactly the checks DEVIATIONS lists (the driver's known
  breaches of the spec; every listed one must still fail, so the list stays
  true);
- on every check both suites ran, the verdicts (pass, fail, skip) are the
  same, so where upstream skips ours skips too; a check whose verdicts differ
  for a stated cause is listed in DIFFERENCES as `name | cause`.

Check names are compared without upstream's `[It] ` prefix and bracketed tags
(`[Controller Server]`, `[BeforeEach]`), the form ours prints them in.
Prints the comparison; exit 0 when it holds, 1 when not, 2 for bad input.
"""

import re
import sys
import xml.etree.ElementTree as ET

VERDICT = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP", "pending": "PENDING"}


def norm(name):
    name = re.sub(r"^\[It\] ", "", name)
    name = re.sub(r"\[[A-Za-z ]+\] ?", "", name)
    return re.sub(r"\s+", " ", name).strip()


def listed(path):
    with open(path, encoding="utf-8") as f:
        return [l.strip() for l in f if l.strip() and not l.lstrip().startswith("#")]


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    upstream_junit, our_log, deviations_file, differences_file = argv[1:]
    upstream = {}
    for case in ET.parse(upstream_junit).iter("testcase"):
        skipped = case.find("skipped")
        reason = skipped.get("message", "") if skipped is not None else ""
        upstream[norm(case.get("name", ""))] = (VERDICT.get(case.get("status"), "?"), reason)
    ours = {}
    with open(our_log, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^(PASS|FAIL|SKIP) (.*?)(?:: (.*))?$", line.rstrip("\n"))
            if m:
                ours[norm(m.group(2))] = (m.group(1), m.group(3) or "")
    if not upstream or not ours:
        print(f"compare: no results read ({len(upstream)} upstream, {len(ours)} ours)")
        return 2
    deviations = {norm(n) for n in listed(deviations_file)}
    differences = {}
    for line in listed(differences_file):
        name, _, cause = line.partition("|")
        differences[norm(name)] = cause.strip()
    ok = True
    for who, results in (("upstream csi-sanity", upstream), ("our csi-sanity", ours)):
        failed = {n for n, (v, _) in results.items() if v == "FAIL"}
        ran = set(results)
        unexpected = sorted(failed - deviations)
        still = sorted(n for n in deviations - failed if n in ran and n not in differences)
        for n in unexpected:
            print(f"{who}: FAIL not among the driver's known deviations: {n}: {results[n][1]}")
        for n in still:
            print(f"{who}: listed as a deviation but {results[n][0]}: {n}")
        ok = ok and not unexpected and not still
    common = sorted(set(upstream) & set(ours))
    agree = 0
    for n in common:
        up, our = upstream[n][0], ours[n][0]
        if up == our:
            agree += 1
            if n in differences:
                print(f"listed as a difference but both say {up} (remove it): {n}")
                ok = False
        elif n in differences:
            print(f"known difference: upstream {up}, ours {our}: {n} ({differences[n]})")
        else:
            print(f"verdicts differ: upstream {up} ({upstream[n][1]}), ours {our} ({ours[n][1]}): {n}")
            ok = False
    counts = {}
    for who, results in (("upstream", upstream), ("ours", ours)):
        c = {}
        for v, _ in results.values():
            c[v] = c.get(v, 0) + 1
        counts[who] = ", ".join(f"{k} {c[k]}" for k in sorted(c))
    print(
        f"compare: {len(common)} checks run by both, {agree} with the same verdict; "
        f"upstream: {counts['upstream']}; ours: {counts['ours']}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
