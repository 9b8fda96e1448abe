"""faults.py: the faults the harness injects, and the seeded schedule of them.

A schedule is a list of (start, kind, target, duration) drawn from a seeded
random generator, so the same seed gives the same schedule.  Each kind has
an injection and a healing; heal_all() ends whatever is still going on, so
that every schedule ends on a whole cluster the checker can read.

Kinds (the faults the seeds admit):
  kill9       kill -9 of a server, restarted after the duration
  pause       SIGSTOP of a server and all its processes for longer than a
              lease (1 s by default), then SIGCONT
  duty_stop   the same, of the node that holds the control-plane duties
  etcd_kill   kill -9 of an etcd member, restarted after the duration
  partition   one node cut off from the others, or two nodes from each
              other (nftables in their namespaces), then healed
  clock       the wall clock of a server moved by up to +-30 s, or run
              10% fast or slow (libfaketime); monotonic time stays real
  fsync_slow  every fsync of the node's felix files takes 100-300 ms
  fsync_fail  every fsync of the node's felix files fails with EIO
  enospc      the node's felix filesystem filled up
  wipe        the node killed, its felix directory emptied, restarted
  restore_old the node killed, its felix directory replaced by a copy taken
              at the start of the schedule, restarted
"""

import os
import random
import shutil
import subprocess
import threading
import time

KINDS = ["kill9", "pause", "duty_stop", "etcd_kill", "partition", "clock",
         "fsync_slow", "fsync_fail", "enospc", "wipe", "restore_old"]

DURATION = {
    "kill9": (0.5, 3.0), "pause": (1.5, 4.0), "duty_stop": (1.5, 4.0),
    "etcd_kill": (1.0, 4.0), "partition": (1.5, 5.0), "clock": (2.0, 6.0),
    "fsync_slow": (2.0, 5.0), "fsync_fail": (0.5, 2.0), "enospc": (1.0, 4.0),
    "wipe": (0.5, 2.0), "restore_old": (0.5, 2.0),
}


# Faults that destroy a node's copy.  A replication factor 3 shard survives
# the loss of one copy, not two (the seeds' failure model: a minority), so a
# schedule destroys at most one; crashes, pauses and the rest come freely.
DESTRUCTIVE = ("wipe", "restore_old")


def make_schedule(seed, n_nodes, store, length, nfaults):
    """[(start, kind, target, duration, extra)] for this seed."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS if store == "etcd" or k != "etcd_kill"]
    out = []
    for _ in range(nfaults):
        kind = rng.choice(kinds)
        if kind in DESTRUCTIVE:
            kinds = [k for k in kinds if k not in DESTRUCTIVE]
        lo, hi = DURATION[kind]
        dur = round(rng.uniform(lo, hi), 2)
        start = round(rng.uniform(1.5, max(1.6, length - dur)), 2)
        target = "node%d" % rng.randint(1, n_nodes)
        extra = None
        if kind == "partition":
            others = ["node%d" % k for k in range(1, n_nodes + 1) if "node%d" % k != target]
            extra = others if rng.random() < 0.5 else [rng.choice(others)]
        elif kind == "clock":
            extra = (("%+ds" % rng.choice([-30, -10, -3, 3, 10, 30])) if rng.random() < 0.5
                     else "+0 x%s" % rng.choice(["0.9", "1.1"]))
        elif kind == "fsync_slow":
            extra = rng.choice([100, 200, 300])
        out.append((start, kind, target, dur, extra))
    out.sort(key=lambda e: e[0])
    return out


class Injector:
    """Runs a schedule against a cluster in a thread; records each fault in
    the history ({"k": "fault", kind, target, t0, t1, note})."""

    def __init__(self, cluster, history, schedule):
        self.c = cluster
        self.h = history
        self.schedule = schedule
        self.thread = None
        self.snapshots = {}
        self.lock = threading.Lock()
        self.errors = []

    def snapshot_for_restores(self):
        """The old copies restore_old puts back: each such target's felix
        directory as it is now (a hot copy, as a file-system copy of a
        running node would be)."""
        for _, kind, target, _, _ in self.schedule:
            if kind == "restore_old" and target not in self.snapshots:
                x = self.c.node(target)
                dst = os.path.join(x.dir, "felix-old")
                subprocess.run(["cp", "-a", os.path.join(x.dir, "felix-mnt", "felix"), dst],
                               check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                self.snapshots[target] = dst

    def start(self):
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def join(self):
        self.thread.join()

    def _run(self):
        t_start = time.monotonic()
        timers = []
        for start, kind, target, dur, extra in self.schedule:
            delay = t_start + start - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                heal = self.inject(kind, target, extra)
            except Exception as e:       # a fault that could not be made
                self.errors.append("%s %s: %s" % (kind, target, e))
                continue
            ev = {"k": "fault", "kind": kind, "target": target, "t0": self.h.now(),
                  "extra": extra, "note": heal[1] if isinstance(heal, tuple) else None}
            fn = heal[0] if isinstance(heal, tuple) else heal
            t = threading.Timer(dur, self._heal, args=(fn, ev))
            t.start()
            timers.append(t)
        for t in timers:
            t.join()

    def _heal(self, fn, ev):
        try:
            fn()
        except Exception as e:
            self.errors.append("healing %s %s: %s" % (ev["kind"], ev["target"], e))
        ev["t1"] = self.h.now()
        self.h.add(ev)

    # ---- each kind: do it, and return what undoes it -----------------------
    def inject(self, kind, target, extra):
        x = self.c.node(target)
        with self.lock:
            if kind == "kill9":
                x.kill9()
                return self._restart(x)
            if kind in ("pause", "duty_stop"):
                if kind == "duty_stop":
                    x = self.duty_holder() or x
                if not x.up():
                    return lambda: None
                x.pause()
                return (lambda: self._resume(x), x.name)
            if kind == "etcd_kill":
                x.etcd_kill()
                return self._etcd_restart(x)
            if kind == "partition":
                others = [self.c.node(n) for n in extra]
                self.c.partition([x], others)
                return (lambda: self._heal_partition(x, others), ",".join(extra))
            if kind == "clock":
                x.set_faketime(extra)
                return lambda: x.set_faketime("+0")
            if kind == "fsync_slow":
                x.set_fsync("slow %d" % extra)
                return lambda: x.set_fsync(None)
            if kind == "fsync_fail":
                x.set_fsync("fail")
                return lambda: x.set_fsync(None)
            if kind == "enospc":
                x.ballast(True)
                return lambda: x.ballast(False)
            if kind == "wipe":
                x.kill9()
                self._empty(x)
                return self._restart(x)
            if kind == "restore_old":
                x.kill9()
                self._empty(x)
                old = self.snapshots.get(x.name)
                if old is not None:
                    subprocess.run(["cp", "-a", old + "/.", os.path.join(x.dir, "felix-mnt", "felix")],
                                   check=True)
                return self._restart(x)
        raise ValueError(kind)

    def duty_holder(self):
        for y in self.c.nodes:
            try:
                rows = y.sql("SELECT name FROM felix_nodes WHERE duty", timeout=2)
                if rows:
                    return self.c.node(rows[0][0])
            except Exception:
                continue
        return None

    @staticmethod
    def _empty(x):
        d = os.path.join(x.dir, "felix-mnt", "felix")
        for e in os.listdir(d):
            p = os.path.join(d, e)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    def _restart(self, x):
        def go():
            with self.lock:
                if not x.up():
                    x.start()
        return go

    def _resume(self, x):
        with self.lock:
            x.resume()

    def _etcd_restart(self, x):
        def go():
            with self.lock:
                if not x.etcd_up():
                    x.etcd_start()
        return go

    def _heal_partition(self, x, others):
        with self.lock:
            self.c.unpartition([x], others)

    def heal_all(self):
        """Whatever is still broken, mend it: every server and etcd member
        up and running, no partition, true clocks, healthy disks."""
        with self.lock:
            self.c.heal_partitions()
            for x in self.c.nodes:
                x.set_faketime("+0")
                x.set_fsync(None)
                x.ballast(False)
                if x.paused:
                    x.resume()
                if self.c.store == "etcd" and not x.etcd_up():
                    x.etcd_start()
                if not x.up():
                    # a server that stopped by itself (a PANIC after a
                    # failed fsync) is started again too
                    x.proc = None
                    x.start()
