"""workload.py: what the harness does to a cluster while faults happen, and
the history it keeps of it.

- Producers publish records whose payload is a unique id ({"id": "w3-17"})
  to the leader of a random shard, as a client would: through libpq, with
  a deadline on every connect and statement enforced on this side (a
  stopped server never answers, and its own statement_timeout cannot fire).
  Each publish is one history event: invoked at, returned at, and ok (with
  its seq), failed (with its SQLSTATE: nothing was acknowledged) or unknown
  (no answer in time: it may or may not have been).
- The last producer is a client that does not route: it connects to a
  random node with felix.forward_publishes on, and publishes to the
  quorum streams through whichever node that is -- a forwarded
  felix_publish (an event like the others), or a transactional INSERT of
  one record into each shard of the stream (a "commit" event: its ids,
  and ok only if COMMIT returned).  It publishes to quorum streams only,
  so that the checker's leader-stream window, which needs the
  acknowledging node, never applies to it.
- Readers read a random shard on a random node -- a leader, a follower, or
  a node that holds no copy of the shard -- and record what they saw.
- The watcher reads the control plane's shard assignments every 100 ms,
  through any node that answers, and records when it first saw each
  (generation, leader) of each shard.  It also tells the producers where
  the leaders are.

Times are the harness's monotonic clock, which every event shares.
The history is a list of dicts (JSON), appended under one lock.
"""

import json
import random
import select
import threading
import time

import psycopg2
import psycopg2.extensions as ext

PG_PORT = 5432


class Timeout(Exception):
    pass


def _wait(conn, deadline):
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout()
        state = conn.poll()
        if state == ext.POLL_OK:
            return
        if state == ext.POLL_READ:
            select.select([conn.fileno()], [], [], left)
        elif state == ext.POLL_WRITE:
            select.select([], [conn.fileno()], [], left)


class Conn:
    """An asynchronous libpq connection whose every wait has a deadline."""

    def __init__(self, addr, timeout):
        self.conn = psycopg2.connect(host=addr, port=PG_PORT, dbname="postgres", user="postgres",
                                     connect_timeout=max(1, int(timeout)), async_=True,
                                     application_name="felix fault workload")
        try:
            _wait(self.conn, time.monotonic() + timeout)
        except BaseException:
            self.close()
            raise

    def query(self, sql, args=None, timeout=4.0):
        cur = self.conn.cursor()
        cur.execute(sql, args)
        _wait(self.conn, time.monotonic() + timeout)
        return cur.fetchall() if cur.description else []

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


class History:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = []
        self.t0 = time.monotonic()

    def now(self):
        return round(time.monotonic() - self.t0, 4)

    def add(self, ev):
        with self.lock:
            self.events.append(ev)

    def dump(self, path):
        with self.lock:
            with open(path, "w") as f:
                json.dump(self.events, f)


class Workload:
    def __init__(self, cluster, history, streams, seed, producers=4, readers=2, forward_streams=()):
        self.cluster = cluster
        self.h = history
        self.streams = streams          # {name: shards}
        self.forward_streams = list(forward_streams)    # quorum streams
        self.stop = threading.Event()
        self.leaders = {}               # (stream, shard) -> node name
        self.rng = random.Random(seed)
        self.threads = []
        self.nprod = producers
        self.nread = readers
        self.ends = {}                  # (stream, shard) -> highest seq acked + 1

    def start(self):
        self.threads.append(threading.Thread(target=self.watch, daemon=True))
        for w in range(self.nprod):
            self.threads.append(threading.Thread(target=self.produce,
                                                 args=(w, self.rng.randrange(1 << 30)), daemon=True))
        for r in range(self.nread):
            self.threads.append(threading.Thread(target=self.read,
                                                 args=(r, self.rng.randrange(1 << 30)), daemon=True))
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def shards(self):
        return [(s, k) for s, n in sorted(self.streams.items()) for k in range(n)]

    # ---- the watcher -----------------------------------------------------
    def watch(self):
        seen = set()
        nodes = self.cluster.nodes
        i = 0
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = Conn(nodes[i % len(nodes)].addr, 1.0)
                rows = conn.query("SELECT value FROM felix.store_read('shards/')", timeout=1.5)
                for (value,) in rows:
                    v = json.loads(value)
                    key = (v["stream"], v["shard"], v["generation"], v.get("leader", ""))
                    if v["stream"] not in self.streams:
                        continue
                    if v.get("leader"):
                        self.leaders[(v["stream"], v["shard"])] = v["leader"]
                    if key not in seen:
                        seen.add(key)
                        self.h.add({"k": "grant", "stream": key[0], "shard": key[1],
                                    "gen": key[2], "leader": key[3], "t": self.h.now()})
            except (psycopg2.Error, Timeout, OSError, ValueError):
                if conn is not None:
                    conn.close()
                conn = None
                i += 1
            self.stop.wait(0.1)
        if conn is not None:
            conn.close()

    # ---- producers -------------------------------------------------------
    def produce(self, w, seed):
        rng = random.Random(seed)
        conns = {}
        n = 0
        forwarding = w == self.nprod - 1 and bool(self.forward_streams)
        while not self.stop.is_set():
            n += 1
            if forwarding:
                stream = rng.choice(self.forward_streams)
                shard = rng.randrange(self.streams[stream])
                name = rng.choice(self.cluster.nodes).name
            else:
                stream, shard = rng.choice(self.shards())
                name = self.leaders.get((stream, shard)) or rng.choice(self.cluster.nodes).name
            node = self.cluster.node(name)
            commit = forwarding and n % 2 == 0
            ev = {"k": "commit" if commit else "pub", "w": w, "stream": stream, "shard": shard,
                  "id": "w%d-%d" % (w, n), "node": name, "inv": self.h.now()}
            try:
                c = conns.get(name)
                if c is None:
                    c = conns[name] = Conn(node.addr, 2.0)
                    if forwarding:
                        c.query("SELECT set_config('felix.forward_publishes', 'on', false)", timeout=2.0)
                if commit:
                    # one record in each shard, all or nothing; a commit
                    # returns no seq, so the ids are what is checked
                    ev["ids"] = [[s, "%s-s%d" % (ev["id"], s)] for s in range(self.streams[stream])]
                    values = ", ".join(c.conn.cursor().mogrify("(%s, %s::jsonb)", (s, json.dumps({"id": i}))).decode()
                                       for s, i in ev["ids"])
                    c.query("INSERT INTO %s (shard, payload) VALUES %s" % (stream, values), timeout=8.0)
                    ev.update(st="ok")
                else:
                    rows = c.query("SELECT (felix_publish(%s, %s::jsonb, shard => %s)).seq",
                                   (stream, json.dumps({"id": ev["id"]}), shard), timeout=8.0 if forwarding else 4.0)
                    ev.update(st="ok", seq=rows[0][0])
            except Timeout:
                ev.update(st="unknown", code="timeout")
                self._drop(conns, name)
            except psycopg2.Error as e:
                if e.pgcode is None:
                    # the connection broke: the statement's fate is unknown,
                    # unless it never reached the server
                    ev.update(st="unknown" if name in conns else "fail", code="connection")
                    self._drop(conns, name)
                else:
                    ev.update(st="fail", code=e.pgcode)
            ev["ret"] = self.h.now()
            self.h.add(ev)
            if ev["st"] != "ok":
                self.stop.wait(0.05)
            else:
                self.stop.wait(0.002)
        for c in conns.values():
            c.close()

    @staticmethod
    def _drop(conns, name):
        c = conns.pop(name, None)
        if c is not None:
            c.close()

    # ---- readers ---------------------------------------------------------
    def read(self, r, seed):
        rng = random.Random(seed)
        while not self.stop.is_set():
            stream, shard = rng.choice(self.shards())
            node = rng.choice(self.cluster.nodes)
            t = self.h.now()
            try:
                c = Conn(node.addr, 2.0)
                try:
                    top = c.query("SELECT coalesce(max(seq), -1) FROM %s WHERE shard = %%s" % stream,
                                  (shard,), timeout=4.0)[0][0]
                    rows = c.query("SELECT seq, payload->>'id' FROM %s WHERE shard = %%s AND seq >= %%s "
                                   "ORDER BY seq LIMIT 200" % stream,
                                   (shard, max(0, top - 100)), timeout=4.0)
                finally:
                    c.close()
                self.h.add({"k": "read", "stream": stream, "shard": shard, "node": node.name,
                            "t": t, "ret": self.h.now(), "rows": [[s, i] for s, i in rows]})
            except (psycopg2.Error, Timeout, OSError):
                pass
            self.stop.wait(0.05)
