#!/usr/bin/python3
"""test_checker.py: the checker, on histories made by hand -- each property
broken once, and the allowed cases allowed.  test/fault/run runs it before
any schedule: a checker that cannot fail would make every run pass."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checker  # noqa: E402


def pub(i, seq, node="node1", inv=1.0, st="ok", stream="q", shard=0):
    return {"k": "pub", "w": 0, "stream": stream, "shard": shard, "id": i, "node": node,
            "inv": inv, "ret": inv + 0.01, "st": st, "seq": seq}


def grant(gen, leader, t, stream="q", shard=0):
    return {"k": "grant", "stream": stream, "shard": shard, "gen": gen, "leader": leader, "t": t}


def fault(kind, target, t0=2.0, t1=3.0):
    return {"k": "fault", "kind": kind, "target": target, "t0": t0, "t1": t1, "extra": None, "note": None}


def final(recs, stream="q", leader="node1", others=None, gens=None, converged=True):
    reps = {leader: [[s, i] for s, i in recs]}
    for n, rr in (others or {}).items():
        reps[n] = [[s, i] for s, i in rr]
    return {"%s/0" % stream: {"leader": leader, "replicas": reps, "converged": converged,
                              "gens": {leader: gens or [[0, len(recs), 1]]}}}


CONS = {"q": "quorum", "l": "leader"}


class Checks(unittest.TestCase):
    def test_clean(self):
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1)]
        v, f, _ = checker.check(h, final([(0, "a"), (1, "b")]), CONS)
        self.assertEqual(v, [])
        self.assertEqual(f["acknowledged"], 2)

    def test_commit(self):
        # a committed transaction's records must all be there; one that
        # failed is not held to it
        c = {"k": "commit", "w": 3, "stream": "q", "shard": 0, "id": "t", "node": "node2",
             "inv": 1.0, "ret": 1.1, "st": "ok", "ids": [[0, "t-s0"]]}
        failed = dict(c, st="fail", ids=[[0, "u-s0"]])
        h = [grant(1, "node1", 0.5), pub("a", 0), c, failed]
        v, f, _ = checker.check(h, final([(0, "a"), (1, "t-s0")]), CONS)
        self.assertEqual(v, [])
        self.assertEqual(f["commits_acknowledged"], 1)
        v, _, _ = checker.check(h, final([(0, "a")]), CONS)
        self.assertTrue(any("of a transaction committed through node2" in x for x in v), v)

    def test_quorum_loss(self):
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1), grant(2, "node2", 2.0)]
        v, _, _ = checker.check(h, final([(0, "a")], leader="node2"), CONS)
        self.assertTrue(any("is lost" in x for x in v), v)

    def test_leader_window(self):
        h = [grant(1, "node1", 0.5, "l"), pub("a", 0, stream="l"), pub("b", 1, stream="l"),
             grant(2, "node2", 2.0, "l")]
        v, f, _ = checker.check(h, final([(0, "a"), (1, "c")], "l", leader="node2"), CONS)
        self.assertEqual(v, [])
        self.assertEqual(f["lost_in_leader_window"], 1)

    def test_leader_loss_without_failover(self):
        h = [grant(1, "node1", 0.5, "l"), pub("a", 0, stream="l"), pub("b", 1, stream="l")]
        v, _, _ = checker.check(h, final([(0, "a")], "l"), CONS)
        self.assertTrue(any("is lost" in x for x in v), v)

    def test_deposed_ack(self):
        # b was written at generation 1 and acknowledged for a publish begun
        # after generation 2 was granted
        h = [grant(1, "node1", 0.5), pub("a", 0), grant(2, "node2", 2.0), pub("b", 1, inv=3.0)]
        v, f, _ = checker.check(h, final([(0, "a"), (1, "b")], gens=[[0, 2, 1]]), CONS)
        self.assertTrue(any("after generation 2 was granted" in x for x in v), v)
        self.assertEqual(f["deposed_acks"], 1)

    def test_ack_at_new_generation(self):
        h = [grant(1, "node1", 0.5), pub("a", 0), grant(2, "node2", 2.0), pub("b", 1, node="node2", inv=3.0)]
        v, _, _ = checker.check(h, final([(0, "a"), (1, "b")], gens=[[0, 1, 1], [1, 1, 2]]), CONS)
        self.assertEqual(v, [])

    def test_read_of_another_payload(self):
        h = [grant(1, "node1", 0.5), pub("a", 0),
             {"k": "read", "stream": "q", "shard": 0, "node": "node2", "t": 1.5, "ret": 1.6,
              "rows": [[0, "x"]]}]
        v, _, _ = checker.check(h, final([(0, "a")]), CONS)
        self.assertTrue(any("was read on node2" in x for x in v), v)

    def test_read_gap(self):
        h = [{"k": "read", "stream": "q", "shard": 0, "node": "node2", "t": 1.5, "ret": 1.6,
              "rows": [[0, "a"], [2, "c"]]}]
        v, _, _ = checker.check(h, final([(0, "a"), (1, "b"), (2, "c")]), CONS)
        self.assertTrue(any("gap" in x for x in v), v)

    def test_replicas_disagree(self):
        v, _, _ = checker.check([], final([(0, "a"), (1, "b")], others={"node2": [(0, "a"), (1, "z")]}), CONS)
        self.assertTrue(any("replica node2 serves z" in x for x in v), v)

    def test_not_contiguous(self):
        v, _, _ = checker.check([], final([(0, "a"), (2, "b")]), CONS)
        self.assertTrue(any("not contiguous" in x for x in v), v)

    def test_stored_twice(self):
        v, _, _ = checker.check([], final([(0, "a"), (1, "a")]), CONS)
        self.assertTrue(any("stored 2 times" in x for x in v), v)

    def test_not_served(self):
        # judged on what the copies store; unavailable, not lost (a copy
        # may be doubtful after the restart)
        f = final([(0, "a")], converged=False)
        f["q/0"]["stored"] = {"node1": [[0, "a"], [1, "b"]], "node2": [[0, "a"]]}
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1), fault("kill9", "node2")]
        v, fig, unavailable = checker.check(h, f, CONS)
        self.assertEqual(v, [])
        self.assertEqual(unavailable, ["q/0"])
        self.assertEqual(fig["acknowledged_unavailable"], 2)
        self.assertEqual(fig["unplaced_with_full_copy"], 1)

    def test_unplaced_by_mistake(self):
        # a copy stores every acknowledged record and nothing restarted
        # or replaced a replica: felix had to place it
        f = final([(0, "a")], converged=False)
        f["q/0"]["stored"] = {"node1": [[0, "a"]], "node2": [[0, "a"], [1, "b"]]}
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1), fault("pause", "node1"),
             fault("kill9", "node3")]
        v, _, _ = checker.check(h, f, CONS)
        self.assertTrue(any("unplaced at the end, although node2 stores every acknowledged" in x
                            for x in v), v)

    def test_led_but_not_level(self):
        # led at the end, a copy not level yet: not unplaced
        f = final([(0, "a")], converged=False)
        f["q/0"]["stored"] = {"node1": [[0, "a"]], "node2": [[0, "a"], [1, "b"]]}
        f["q/0"]["led"] = True
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1)]
        v, fig, _ = checker.check(h, f, CONS)
        self.assertFalse(any("unplaced at the end" in x for x in v), v)
        self.assertEqual(fig["unplaced_with_full_copy"], 0)

    def test_unplaced_without_full_copy(self):
        # each copy lacks an acknowledged record: lost, not placeable
        f = final([(0, "a")], converged=False)
        f["q/0"]["stored"] = {"node1": [[0, "a"]], "node2": [[1, "b"]]}
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1)]
        v, fig, _ = checker.check(h, f, CONS)
        self.assertFalse(any("unplaced at the end" in x for x in v), v)
        self.assertEqual(fig["unplaced_with_full_copy"], 0)

    def test_not_served_and_lost(self):
        f = final([(0, "a")], converged=False)
        f["q/0"]["stored"] = {"node1": [[0, "a"]]}
        h = [grant(1, "node1", 0.5), pub("a", 0), pub("b", 1)]
        v, _, _ = checker.check(h, f, CONS)
        self.assertTrue(any("is lost" in x for x in v), v)


if __name__ == "__main__":
    unittest.main()
