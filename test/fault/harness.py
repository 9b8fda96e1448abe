#!/usr/bin/python3
"""harness.py: run seeded fault schedules against felix clusters and check
each history (test/fault/README.md).

    test/fault/run --profile short            # CI: about 10 schedules
    test/fault/run --profile long             # the figures in docs/reliability.md
    test/fault/run --store etcd --seed 1234   # replay one schedule

For every schedule: a fresh cluster (namespaces, etcd members or the
embedded store, servers copied from one initdb), a quorum and a leader
stream, producers and readers, the seed's faults, then every fault healed,
the replicas given time to catch up, the final state read, and the checker
run.  A failing schedule prints its seed, store and schedule, keeps its
directory (server logs, history.json, final.json) and makes the run fail.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checker  # noqa: E402
import cluster  # noqa: E402
import faults  # noqa: E402
import workload  # noqa: E402

STREAMS = {"q": ("quorum", 2), "l": ("leader", 2)}

PROFILES = {
    # schedules per store, nodes, seconds of faults, faults per schedule
    "short": dict(schedules=4, nodes=3, length=12.0, nfaults=3),
    "long": dict(schedules=125, nodes=3, length=15.0, nfaults=4),
    "long5": dict(schedules=125, nodes=5, length=15.0, nfaults=5),
}

SEGMENT_HEADER = 64
BATCH_HEADER = struct.Struct("<IIHHIQQqII")
BATCH_MAGIC = 0x31425846
BATCH_RECORDS = 1


# a record's id: w<writer>-<n>, and -s<shard> for a transaction's records
ID = re.compile(rb"w\d+-\d+(?:-s\d+)?")


def read_segments(shard_dir):
    """What a shard's segment files hold (docs/storage-format.md): the
    record batches as [base_seq, count, generation], and every record as
    [seq, id] (the id read from the payload's bytes: the workload's ids
    are unique ASCII strings), in seq order."""
    out, recs = [], []
    for name in sorted(os.listdir(shard_dir)):
        if not name.endswith(".seg"):
            continue
        with open(os.path.join(shard_dir, name), "rb") as f:
            data = f.read()
        off = SEGMENT_HEADER
        while off + BATCH_HEADER.size <= len(data):
            magic, _, kind, _, count, base, gen, _, blen, _ = BATCH_HEADER.unpack_from(data, off)
            if magic != BATCH_MAGIC or off + BATCH_HEADER.size + blen + 8 > len(data):
                break
            if kind == BATCH_RECORDS:
                out.append([base, count, gen])
                pos = off + BATCH_HEADER.size
                for i in range(count):
                    klen, plen = struct.unpack_from("<II", data, pos)
                    pos += 8 + (0 if klen == 0xFFFFFFFF else klen)
                    m = ID.search(data[pos:pos + plen])
                    recs.append([base + i, m.group().decode() if m else None])
                    pos += plen
            off += BATCH_HEADER.size + blen + 8
    out.sort()
    recs.sort()
    return out, recs


def converge(c, timeout):
    """Wait until every shard has a leader whose every replica serves what
    it acknowledged; returns {key: (leader, replicas)} and, per shard,
    whether it did."""
    deadline = time.monotonic() + timeout
    state = {}
    while True:
        state, done, ok = {}, True, {}
        try:
            rows = c.nodes[0].sql("SELECT value FROM felix.store_read('shards/')", timeout=5)
            for (value,) in rows:
                s = json.loads(value)
                if s["stream"] in STREAMS:
                    state[(s["stream"], s["shard"])] = (s.get("leader", ""), s["replicas"])
            for (stream, shard), (leader, replicas) in state.items():
                ok[(stream, shard)] = False
                if not leader:
                    done = False
                    continue
                lead = c.node(leader).sql(
                    "SELECT role, next_seq, hwm, lease_remaining_ms FROM felix_shards "
                    "WHERE stream = %s AND shard = %s", (stream, shard), timeout=5)
                if not lead or lead[0][0] != "leader" or (lead[0][3] or 0) <= 0:
                    done = False
                    continue
                level = True
                for r in replicas:
                    row = c.node(r).sql("SELECT next_seq, hwm FROM felix_shards "
                                        "WHERE stream = %s AND shard = %s", (stream, shard), timeout=5)
                    level = level and bool(row) and row[0][1] == lead[0][2]
                ok[(stream, shard)] = level
                done = done and level
        except Exception:
            done = False
        if (done and len(state) == sum(n for _, n in STREAMS.values())) or time.monotonic() > deadline:
            return state, ok
        time.sleep(0.5)


def note_late_grants(c, h):
    """The watcher stops with the producers; a generation granted after
    that (a failover the faults caused, finished late) goes into the
    history at the time it is seen here, so that a leader stream's loss to
    it is judged as one (seed 4089 of the long profile, embedded)."""
    newest = {}
    for e in h.events:
        if e["k"] == "grant":
            key = (e["stream"], e["shard"])
            newest[key] = max(newest.get(key, 0), e["gen"])
    for x in c.nodes:
        try:
            rows = x.sql("SELECT value FROM felix.store_read('shards/')", timeout=5)
        except Exception:
            continue
        for (value,) in rows:
            v = json.loads(value)
            key = (v["stream"], v["shard"])
            if v["stream"] in STREAMS and v.get("leader") and v["generation"] > newest.get(key, 0):
                h.add({"k": "grant", "stream": key[0], "shard": key[1], "gen": v["generation"],
                       "leader": v["leader"], "t": h.now(), "late": True})
        return


def why_unconverged(c, stream, shard, replicas):
    """What the control plane and each replica say of a shard that did not
    converge: its assignment and every replica's felix_shards row."""
    why = {}
    try:
        why["assignment"] = c.nodes[0].sql(
            "SELECT value FROM felix.store_read('shards/') WHERE key = %s",
            ("shards/%s/%06d" % (stream, shard),), timeout=5)[0][0]
    except Exception as e:
        why["assignment"] = "unreadable: %s" % e
    for r in replicas:
        try:
            why[r] = [list(map(str, row)) for row in c.node(r).sql(
                "SELECT role, generation, leader, next_seq, hwm, lease_remaining_ms, state, error, unplaced_reason "
                "FROM felix_shards WHERE stream = %s AND shard = %s", (stream, shard), timeout=5)]
        except Exception as e:
            why[r] = "unreadable: %s" % e
    return why


def final_state(c, state, ok):
    """What every replica of every shard serves, and the generations of its
    record batches (read from its segment files)."""
    out = {}
    for (stream, shard), (leader, replicas) in sorted(state.items()):
        f = {"leader": leader, "replicas": {}, "gens": {}, "stored": {}, "converged": ok.get((stream, shard), False)}
        if not f["converged"]:
            f["why"] = why_unconverged(c, stream, shard, replicas)
            # led (its leader serves it under a lease), only not level
            row = f["why"].get(leader) if leader else None
            f["led"] = bool(isinstance(row, list) and row and row[0][0] == "leader" and
                            row[0][5] not in ("None", "") and int(row[0][5]) > 0)
        for r in replicas:
            try:
                rows = c.node(r).sql("SELECT seq, payload->>'id' FROM %s WHERE shard = %%s ORDER BY seq"
                                     % stream, (shard,), timeout=30)
                f["replicas"][r] = [[s, i] for s, i in rows]
            except Exception:
                pass
        for r in replicas:
            try:
                ids = c.node(r).sql(
                    "SELECT d.oid, c.oid FROM pg_database d, pg_class c "
                    "WHERE d.datname = current_database() AND c.oid = %s::regclass", (stream,))
                f["gens"][r], f["stored"][r] = read_segments(os.path.join(
                    c.node(r).dir, "felix-mnt", "felix", str(ids[0][0]), str(ids[0][1]), str(shard)))
            except Exception:
                pass
        out["%s/%d" % (stream, shard)] = f
    return out


def run_schedule(args, store, seed, profile, template, shim, run_no):
    sched = faults.make_schedule(seed, profile["nodes"], store, profile["length"], profile["nfaults"])
    workdir = os.path.join(args.dir, "%s-%d" % (store, seed))
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    os.chmod(workdir, 0o755)
    c = cluster.Cluster(workdir, run_no, profile["nodes"], store, template, shim)
    h = workload.History()
    result = {"seed": seed, "store": store, "schedule": sched, "build": installed_build()}
    try:
        c.start()
        for name, (consistency, shards) in STREAMS.items():
            c.nodes[0].sql("SELECT felix_create_stream(%s, shards => %s, replication_factor => 3, "
                           "consistency => %s)", (name, shards, consistency), timeout=30)
        wl = workload.Workload(c, h, {n: s for n, (_, s) in STREAMS.items()}, seed,
                               forward_streams=[n for n, (k, _) in STREAMS.items() if k == "quorum"])
        inj = faults.Injector(c, h, sched)
        wl.start()
        time.sleep(1.0)
        inj.snapshot_for_restores()
        inj.start()
        inj.join()
        inj.heal_all()
        for x in c.nodes:
            x.wait_ready(60)
        time.sleep(3.0)          # the producers go on after the faults
        wl.finish()
        state, ok = converge(c, 60)
        note_late_grants(c, h)
        final = final_state(c, state, ok)
        consistency = {n: cons for n, (cons, _) in STREAMS.items()}
        violations, figures, unavailable = checker.check(h.events, final, consistency)
        result.update(violations=violations, figures=dict(figures), unavailable=unavailable,
                      unavailability=checker.unavailability(h.events),
                      faults=[e["kind"] for e in h.events if e["k"] == "fault"],
                      injector_errors=inj.errors)
        with open(os.path.join(workdir, "final.json"), "w") as f:
            json.dump({"shards": final, "consistency": consistency}, f)
    except Exception:
        result["violations"] = ["harness error: " + traceback.format_exc()]
    finally:
        h.dump(os.path.join(workdir, "history.json"))
        c.teardown()
    if not result["violations"] and not args.keep:
        if result.get("unavailable"):
            keep_only_logs(workdir)      # why a shard stayed unavailable
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def keep_only_logs(workdir):
    """Remove a schedule's data but keep its logs and history."""
    for root, dirs, files in os.walk(workdir, topdown=False):
        for f in files:
            if not (f.endswith(".log") or f.endswith(".json")):
                os.unlink(os.path.join(root, f))
        for d in dirs:
            try:
                os.rmdir(os.path.join(root, d))
            except OSError:
                pass


def installed_build():
    """The felix library the schedule's servers load, as a short digest: a
    long run may span a reinstall, and its figures are kept per build."""
    libdir = cluster.sh("pg_config", "--pkglibdir").strip()
    with open(os.path.join(libdir, "felix.so"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:12]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="short", choices=sorted(PROFILES))
    ap.add_argument("--store", default="both", choices=["both", "etcd", "embedded"])
    ap.add_argument("--seed", type=int, help="run just this seed")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--schedules", type=int, help="schedules per store (default: the profile's)")
    ap.add_argument("--dir", default="/tmp/felix-fault")
    ap.add_argument("--shim", required=True)
    ap.add_argument("--run", type=int, default=os.getpid() % 200 + 20,
                    help="the run's number: names, addresses (10.213.RUN.0/24)")
    ap.add_argument("--keep", action="store_true", help="keep every schedule's directory")
    args = ap.parse_args()
    profile = dict(PROFILES[args.profile])
    if args.schedules:
        profile["schedules"] = args.schedules
    stores = ["etcd", "embedded"] if args.store == "both" else [args.store]
    seeds = [args.seed] if args.seed is not None else \
        list(range(args.first_seed, args.first_seed + profile["schedules"]))

    os.makedirs(args.dir, exist_ok=True)
    os.chmod(args.dir, 0o755)
    cluster.clean_leftovers(args.dir)
    # a signal ends the run through the finally blocks: nothing is left
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(3))
    template = os.path.join(args.dir, "template")
    shutil.rmtree(template, ignore_errors=True)
    cluster.make_template(template)

    results = []
    t_start = time.monotonic()
    for seed in seeds:
        for store in stores:
            t0 = time.monotonic()
            r = run_schedule(args, store, seed, profile, template, args.shim, args.run)
            r["seconds"] = round(time.monotonic() - t0, 1)
            results.append(r)
            f = r.get("figures", {})
            print("seed %d %-8s %s  %5.1fs  acked %d lost %d (leader window %d) deposed %d%s  faults %s" % (
                seed, store, "FAIL" if r["violations"] else "ok  ", r["seconds"],
                f.get("acknowledged", 0), f.get("lost", 0), f.get("lost_in_leader_window", 0),
                f.get("deposed_acks", 0),
                "  UNAVAILABLE %s (with a full copy %d)" % (",".join(r["unavailable"]), f.get("unplaced_with_full_copy", 0))
                if r.get("unavailable") else "",
                ",".join(r.get("faults", []))), flush=True)
            # after every schedule, so that an interrupted run keeps its figures
            with open(os.path.join(args.dir, "results.json"), "w") as f:
                json.dump(results, f)
            if r["violations"]:
                print("  replay: test/fault/run --profile %s --store %s --seed %d" % (args.profile, store, seed))
                print("  schedule: %s" % json.dumps(r["schedule"]))
                for line in r["violations"][:20]:
                    print("  " + line)
    failed = [r for r in results if r["violations"]]
    print("%d schedules, %d failed, %.0f s; results in %s" % (
        len(results), len(failed), time.monotonic() - t_start, os.path.join(args.dir, "results.json")))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
