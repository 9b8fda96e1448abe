"""checker.py: what must hold of a recorded history, checked after the
faults are healed and every replica has caught up.

Input: the history (workload.py: publishes, reads, grants the watcher saw,
faults), the final state (for every shard: its leader, whether it serves,
the records every replica serves, the generation of each record batch of
every replica), and each stream's consistency.  A shard that does not
serve at the end is a failure, and is judged on its most complete copy.  Output: the violations, and the figures.

The properties:
  1. every acknowledged record is readable at the end, at the seq it was
     acknowledged at, with its payload (a leader stream may lose what its
     documented window allows: records its leader acknowledged before a
     failover to another node, docs/replication.md);
  2. each shard's seqs are contiguous, and every replica serves a prefix
     of the leader's records: the replicas agree below the mark;
  3. no seq holds two payloads: what any reader saw at a seq, at any time,
     on any node, is what the shard holds there at the end (a leader
     stream: unless it is a record lost as 1 allows, which a copy that has
     not learned of the failover, such as the old leader cut off, serves);
  4. nothing is acknowledged by a deposed leader: an acknowledged record
     whose batch was written at generation g, by a publish that began
     after the watcher had seen the control plane grant a generation above
     g, was acknowledged by a leader after its successor's grant.  (The
     watcher sees a grant after it happens, so this never accuses wrongly;
     a publish that began just before the grant is not judged by it, the
     lease rules keep that case, and 1 catches any loss.)
  5. no payload twice: a record published once is stored once;
  6. no shard unplaced by mistake: a shard nobody leads at the end (not
     one led whose copies are not level yet) while one of its copies
     stores every acknowledged record is a violation
     when no fault restarted or replaced any of its replicas (kill9, wipe,
     restore_old) -- nothing could then have made a copy doubtful, and
     felix must place it.  Otherwise it is counted
     (unplaced_with_full_copy): after a restart, felix cannot tell a copy
     that kept its log from one put back from a backup, and promotes by
     log only from copies known to have kept theirs (docs/control-plane.md,
     "Promotion by log").
Committed transactions (INSERT through any node) are held to 1: each of
their records is in the shard it named, at some seq.

A shard that no node serves at the end (unplaced: no copy the control
plane may promote) is reported as unavailable, and is a violation only as
6 says: felix chooses to wait rather than lead from a copy that may lack
acknowledged records.  Such a shard is judged on what its copies store on
disk.

Run alone: checker.py RUN_DIR re-checks the history.json and final.json a
run left there.
"""

import bisect
import collections
import json
import sys

# Faults after which a node's copies may have lost what they stored.
RESTARTING = ("kill9", "wipe", "restore_old")

def _grants_by_shard(history):
    g = collections.defaultdict(list)
    for ev in history:
        if ev["k"] == "grant":
            g[(ev["stream"], ev["shard"])].append((ev["t"], ev["gen"], ev["leader"]))
    for v in g.values():
        v.sort()
    return g


def _failover_after(grants, key, t, node=None):
    """A grant to a node other than `node` (any, when None) seen after t."""
    return any(gt > t and (node is None or leader != node) for gt, _, leader in grants.get(key, []))


def _gen_of(gens, seq):
    """The generation of the batch holding seq (gens: sorted [base, count, gen])."""
    i = bisect.bisect_right([b for b, _, _ in gens], seq) - 1
    if i >= 0 and gens[i][0] <= seq < gens[i][0] + gens[i][1]:
        return gens[i][2]
    return None


def check(history, final, consistency):
    v = []
    figures = collections.Counter()
    grants = _grants_by_shard(history)
    final_map = {}
    ref_gens = {}
    unavailable = []
    on_disk = {}
    stored_unplaced = {}

    # 2. contiguity and agreement of the replicas
    for skey, f in final.items():
        key = tuple(skey.split("/", 1))
        key = (key[0], int(key[1]))
        if not f.get("converged", True):
            # not served: judged on what its copies store (what they serve
            # stops at the mark they know), the most complete first
            unavailable.append("%s/%d" % key)
            stored = f.get("stored", {})
            ref = max(stored, key=lambda n: len(stored[n]), default=None)
            on_disk[key] = {(s, i) for rr in stored.values() for s, i in rr}
            if not f.get("led", False):
                stored_unplaced[key] = stored
            # the copies of a shard nobody leads need not agree yet
            f = dict(f, replicas={ref: stored[ref]} if ref else {})
        else:
            ref = f["leader"]
        recs = f["replicas"].get(ref)
        if recs is None:
            v.append("%s shard %d: no copy could be read at the end" % key)
            continue
        seqs = [s for s, _ in recs]
        if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            v.append("%s shard %d: seqs on the leader are not contiguous" % key)
        final_map[key] = dict(recs)
        ref_gens[key] = f["gens"].get(ref, [])
        ids = collections.Counter(i for _, i in recs)
        for i, n in ids.items():
            if n > 1:
                v.append("%s shard %d: record %s is stored %d times" % (key[0], key[1], i, n))
        for node, rr in f["replicas"].items():
            if node == ref:
                continue
            for s, i in rr:
                if final_map[key].get(s) != i:
                    v.append("%s shard %d: replica %s serves %s at seq %d, the leader %s" %
                             (key[0], key[1], node, i, s, final_map[key].get(s)))
                    break

    # 1, 4: acknowledged records
    acked = collections.defaultdict(set)
    for ev in history:
        if ev["k"] != "pub":
            continue
        figures["publishes"] += 1
        if ev["st"] != "ok":
            figures["publish_" + ev["st"]] += 1
            continue
        figures["acknowledged"] += 1
        key = (ev["stream"], ev["shard"])
        acked[key].add((ev["seq"], ev["id"]))
        got = final_map.get(key, {}).get(ev["seq"])
        if (ev["seq"], ev["id"]) in on_disk.get(key, ()):
            # kept, on a copy of a shard nobody serves yet
            figures["acknowledged_unavailable"] += 1
            continue
        if got != ev["id"]:
            if consistency[ev["stream"]] == "leader" and _failover_after(grants, key, ev["inv"], ev["node"]):
                figures["lost_in_leader_window"] += 1
                continue
            figures["lost"] += 1
            v.append("%s shard %d: record %s acknowledged at seq %d by %s (%.2f-%.2f s) is lost; "
                     "the seq holds %s" % (key[0], key[1], ev["id"], ev["seq"], ev["node"],
                                          ev["inv"], ev["ret"], got))
            continue
        gen = _gen_of(ref_gens.get(key, []), ev["seq"])
        later = [g for t, g, _ in grants.get(key, []) if t < ev["inv"] and gen is not None and g > gen]
        if later:
            figures["deposed_acks"] += 1
            v.append("%s shard %d: record %s at seq %d, written at generation %d, acknowledged by %s "
                     "for a publish begun at %.2f s, after generation %d was granted" %
                     (key[0], key[1], ev["id"], ev["seq"], gen, ev["node"], ev["inv"], max(later)))

    # 1, for transactions: every record of a committed INSERT is there,
    # in the shard it named (a commit returns no seqs)
    for ev in history:
        if ev["k"] != "commit":
            continue
        figures["commits"] += 1
        if ev["st"] != "ok":
            figures["commit_" + ev["st"]] += 1
            continue
        figures["commits_acknowledged"] += 1
        for shard, i in ev["ids"]:
            key = (ev["stream"], shard)
            if i in final_map.get(key, {}).values() or any(x == i for _, x in on_disk.get(key, ())):
                continue
            figures["lost"] += 1
            v.append("%s shard %d: record %s of a transaction committed through %s (%.2f-%.2f s) is lost" %
                     (key[0], key[1], i, ev["node"], ev["inv"], ev["ret"]))

    # 6: no shard unplaced by mistake
    restarted = {ev["target"] for ev in history if ev["k"] == "fault" and ev["kind"] in RESTARTING}
    for key, stored in stored_unplaced.items():
        full = sorted(n for n, rr in stored.items() if acked[key] <= {(s, i) for s, i in rr})
        if not full:
            continue
        figures["unplaced_with_full_copy"] += 1
        if not set(stored) & restarted:
            v.append("%s shard %d: unplaced at the end, although %s stores every acknowledged record "
                     "and no fault restarted or replaced any of its replicas" % (key[0], key[1], full[0]))

    # 3: what readers saw
    pubs = {ev["id"]: ev for ev in history if ev["k"] == "pub"}
    for ev in history:
        if ev["k"] != "read":
            continue
        figures["reads"] += 1
        key = (ev["stream"], ev["shard"])
        rows = ev["rows"]
        if rows and [s for s, _ in rows] != list(range(rows[0][0], rows[0][0] + len(rows))):
            v.append("%s shard %d: a read on %s returned seqs with a gap" % (key[0], key[1], ev["node"]))
        for s, i in rows:
            got = final_map.get(key, {}).get(s)
            if got == i or (s, i) in on_disk.get(key, ()):
                continue
            pub = pubs.get(i)
            if consistency[ev["stream"]] == "leader" and pub is not None and \
                    _failover_after(grants, key, pub["inv"], pub["node"]):
                # a record lost in a failover, served by a copy that has
                # not learned of it yet (the old leader, cut off)
                figures["reads_of_lost_leader_records"] += 1
                continue
            v.append("%s shard %d: seq %d was read on %s at %.2f s as %s, but holds %s" %
                     (key[0], key[1], s, ev["node"], ev["t"], i, got))
            break
    return v, figures, unavailable


def unavailability(history):
    """For each fault kind, the longest time any one shard went without an
    acknowledged publish, over the gaps that overlap a fault of that kind."""
    acks = collections.defaultdict(list)
    for ev in history:
        if ev["k"] == "pub" and ev["st"] == "ok":
            acks[(ev["stream"], ev["shard"])].append(ev["ret"])
    gaps = []
    for ts in acks.values():
        ts.sort()
        gaps.extend(zip(ts, ts[1:]))
    out = {}
    for ev in history:
        if ev["k"] != "fault":
            continue
        longest = max((b - a for a, b in gaps if a <= ev["t1"] and b >= ev["t0"]), default=0.0)
        out[ev["kind"]] = max(out.get(ev["kind"], 0.0), round(longest, 3))
    return out


def main(run_dir):
    with open(run_dir + "/history.json") as f:
        history = json.load(f)
    with open(run_dir + "/final.json") as f:
        final = json.load(f)
    v, figures, unavailable = check(history, final["shards"], final["consistency"])
    for line in v:
        print("VIOLATION:", line)
    for key in unavailable:
        print("UNAVAILABLE:", key)
    print(json.dumps(figures, sort_keys=True))
    return 1 if v else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
