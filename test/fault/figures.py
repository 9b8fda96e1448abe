#!/usr/bin/python3
"""figures.py: the figures of one or more runs (their results.json), as the
markdown tables docs/reliability.md shows.

    test/fault/figures.py /tmp/felix-fault/results.json [more.json ...]
"""

import collections
import json
import sys


def main(paths):
    results = []
    for p in paths:
        with open(p) as f:
            results.extend(json.load(f))
    by_store = collections.Counter(r["store"] for r in results)
    failed = [r for r in results if r["violations"]]
    totals = collections.Counter()
    faults = collections.Counter()
    longest = {}
    unavailable = collections.Counter()
    for r in results:
        totals.update(r.get("figures", {}))
        faults.update(r.get("faults", []))
        for kind, secs in r.get("unavailability", {}).items():
            longest[kind] = max(longest.get(kind, 0.0), secs)
        for key in r.get("unavailable", []):
            unavailable[r["store"]] += 1

    print("| | schedules | failed | shards unavailable at the end |")
    print("| --- | --- | --- | --- |")
    for store in sorted(by_store):
        print("| %s store | %d | %d | %d |" % (store, by_store[store],
                                            sum(1 for r in failed if r["store"] == store),
                                            unavailable[store]))
    builds = collections.OrderedDict()
    for r in results:
        b = builds.setdefault(r.get("build", "?"), [0, 0])
        b[0] += 1
        b[1] += 1 if r["violations"] else 0
    print()
    print("| felix.so (sha256, first 12) | schedules | failed |")
    print("| --- | --- | --- |")
    for b, (n, nf) in builds.items():
        print("| `%s` | %d | %d |" % (b, n, nf))
    print()
    print("| records | count |")
    print("| --- | --- |")
    for k, label in (("publishes", "publishes attempted"),
                     ("acknowledged", "acknowledged"),
                     ("publish_fail", "refused (nothing acknowledged)"),
                     ("publish_unknown", "no answer in time (outcome unknown)"),
                     ("lost", "acknowledged and lost"),
                     ("lost_in_leader_window", "acknowledged on a leader stream, lost to a failover (allowed)"),
                     ("acknowledged_unavailable", "acknowledged, kept on a shard nobody serves at the end"),
                     ("deposed_acks", "acknowledged by a deposed leader"),
                     ("unplaced_with_full_copy", "shards unplaced at the end with a copy holding every acknowledged record (after a restart or a replaced copy)"),
                     ("reads", "reads checked")):
        print("| %s | %d |" % (label, totals.get(k, 0)))
    print()
    print("| fault | injected | longest time a shard went without an acknowledged publish |")
    print("| --- | --- | --- |")
    for kind in sorted(faults):
        print("| %s | %d | %.2f s |" % (kind, faults[kind], longest.get(kind, 0.0)))
    if failed:
        print()
        for r in failed:
            print("- seed %d (%s): %s" % (r["seed"], r["store"], r["violations"][0][:200]))


if __name__ == "__main__":
    main(sys.argv[1:])
