"""cluster.py: a felix cluster for the fault harness, one network namespace
per node.

Each node K runs in namespace fx<R>n<K> (R: the run's number, so that
concurrent runs never share a name, an address or a directory): a veth pair
joins it to the bridge fx<R>b in the root namespace, where the harness and
its clients live, at 10.213.R.K/24.  Node K's PostgreSQL server listens on
10.213.R.K:5432 and, with the etcd profile, its etcd member on ports 2379
and 2380 of the same address, so that a partition of the node cuts its etcd
member off too.  Servers run as the unprivileged user felixfault (created
when missing); the harness itself runs as root, to make namespaces, mount
each node's felix directory on a small tmpfs (for ENOSPC) and filter
packets with nftables.

Every server is started with two preloaded libraries: libfaketime, whose
offset and rate the harness changes through a file (the wall clock only:
the monotonic clock felix's leases use stays real, as the seeds assume),
and fault_shim.so, which makes fsync slow or fail on the node's felix files
while a trigger file says so.

Everything a cluster makes -- namespaces, the bridge, mounts, processes,
directories -- is removed by teardown(), which the harness always calls.
"""

import os
import re
import pwd
import shutil
import signal
import subprocess
import time

import psycopg2

PG_BIN = "/usr/lib/postgresql/15/bin"
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
RUN_USER = "felixfault"
PG_PORT = 5432
FELIX_TMPFS_BYTES = 256 * 1024 * 1024


def sh(*cmd, check=True, quiet=False):
    """Run a command; its output is returned (and raised on failure)."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stdout))
    return r.stdout


def run_user():
    """The unprivileged user servers run as (created when missing)."""
    try:
        return pwd.getpwnam(RUN_USER)
    except KeyError:
        sh("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUN_USER)
        return pwd.getpwnam(RUN_USER)


def descendants(pid):
    """pid and every live process below it (PostgreSQL's children call
    setsid, so a process group does not reach them)."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                st = f.read()
        except OSError:
            continue
        rest = st[st.rfind(")") + 2:].split()
        if rest[0] == "Z":
            continue
        parent[int(d)] = int(rest[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in parent or p == pid:
            out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return [p for p in out if p in parent]


def signal_tree(pid, sig):
    for p in descendants(pid):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


class Node:
    def __init__(self, cluster, k):
        self.cluster = cluster
        self.k = k
        self.name = "node%d" % k
        self.ns = "fx%dn%d" % (cluster.run, k)
        self.addr = "10.213.%d.%d" % (cluster.run, k)
        self.dir = os.path.join(cluster.dir, self.name)
        self.pgdata = os.path.join(self.dir, "pgdata")
        self.felix_dir = os.path.join(self.dir, "felix")
        self.socket_dir = os.path.join(self.dir, "sock")
        self.log = os.path.join(self.dir, "postgres.log")
        self.faketime_file = os.path.join(self.dir, "faketime")
        self.fsync_trigger = os.path.join(self.dir, "fsync-trigger")
        self.proc = None
        self.paused = False
        self.etcd_proc = None

    # ---- the server -------------------------------------------------
    def up(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self):
        assert not self.up()
        u = self.cluster.user
        env = {
            "PATH": "/usr/bin:/bin",
            "FAKETIME_TIMESTAMP_FILE": self.faketime_file,
            "FAKETIME_CACHE_DURATION": "1",
            "DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DISABLE_SHM": "1",
            "FELIX_FAULT_DIR": self.felix_dir,
            "FELIX_FAULT_TRIGGER": self.fsync_trigger,
            "FELIX_FAULT_SUFFIX": "",
        }
        logf = open(self.log, "a")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "setpriv", "--reuid=%d" % u.pw_uid,
             "--regid=%d" % u.pw_gid, "--init-groups", "--",
             # preloaded into the server only, not into ip and setpriv
             "env", "LD_PRELOAD=%s %s" % (FAKETIME_LIB, self.cluster.shim),
             os.path.join(PG_BIN, "postgres"), "-D", self.pgdata],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, env=env,
            start_new_session=True)
        logf.close()
        self.paused = False

    def wait_ready(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.up():
                raise RuntimeError("%s exited while starting; see %s" % (self.name, self.log))
            try:
                c = self.connect(timeout=2)
                c.close()
                return
            except psycopg2.Error:
                time.sleep(0.2)
        raise RuntimeError("%s not ready after %ds; see %s" % (self.name, timeout, self.log))

    def connect(self, timeout=3, **kw):
        return psycopg2.connect(host=self.addr, port=PG_PORT, dbname="postgres",
                                user="postgres", connect_timeout=timeout,
                                application_name="felix fault harness", **kw)

    def sql(self, query, args=None, timeout=10):
        """One statement on a fresh connection, as superuser; the rows."""
        c = self.connect(timeout=min(timeout, 3),
                         options="-c statement_timeout=%d" % (timeout * 1000))
        try:
            c.autocommit = True
            with c.cursor() as cur:
                cur.execute(query, args)
                return cur.fetchall() if cur.description else []
        finally:
            c.close()

    def kill9(self):
        """kill -9 of the postmaster and every child at once; waits until
        they are gone (a restart on the same directory needs it)."""
        if self.proc is None:
            return
        pids = descendants(self.proc.pid)
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(os.path.exists("/proc/%d/stat" % p) and
                                                  not _zombie(p) for p in pids):
            time.sleep(0.05)
        self.proc = None
        self.paused = False
        pidfile = os.path.join(self.pgdata, "postmaster.pid")
        if os.path.exists(pidfile):
            os.unlink(pidfile)

    def pause(self):
        signal_tree(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self):
        if self.proc is not None:
            signal_tree(self.proc.pid, signal.SIGCONT)
        self.paused = False

    # ---- the node's surroundings --------------------------------------
    def set_faketime(self, spec):
        with open(self.faketime_file, "w") as f:
            f.write(spec + "\n")

    def set_fsync(self, mode):
        """mode: None (healthy), 'fail' (EIO), or 'slow N' (N ms each)."""
        if mode is None:
            if os.path.exists(self.fsync_trigger):
                os.unlink(self.fsync_trigger)
            return
        with open(self.fsync_trigger, "w") as f:
            f.write("fail\n" if mode == "fail" else mode + "\n")

    def ballast(self, fill):
        """Fill the node's felix filesystem (ENOSPC), or empty it again."""
        path = os.path.join(self.dir, "felix-mnt", "ballast")
        if not fill:
            if os.path.exists(path):
                os.unlink(path)
            return
        st = os.statvfs(os.path.dirname(path))
        free = st.f_bavail * st.f_frsize
        with open(path, "wb") as f:
            chunk = b"\0" * (1 << 20)
            try:
                while free > 0:
                    f.write(chunk[:min(len(chunk), free)])
                    free -= len(chunk)
            except OSError:
                pass

    def etcd_start(self):
        c = self.cluster
        logf = open(os.path.join(self.dir, "etcd.log"), "a")
        self.etcd_proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "etcd", "--name", "e%d" % self.k,
             "--data-dir", os.path.join(self.dir, "etcd"),
             "--listen-client-urls", "http://%s:2379" % self.addr,
             "--advertise-client-urls", "http://%s:2379" % self.addr,
             "--listen-peer-urls", "http://%s:2380" % self.addr,
             "--initial-advertise-peer-urls", "http://%s:2380" % self.addr,
             "--initial-cluster", c.etcd_initial,
             "--initial-cluster-state",
             "existing" if os.path.isdir(os.path.join(self.dir, "etcd", "member")) else "new",
             "--initial-cluster-token", "fx%d" % c.run,
             "--max-txn-ops", "4096", "--log-level", "warn"],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
        logf.close()

    def etcd_up(self):
        return self.etcd_proc is not None and self.etcd_proc.poll() is None

    def etcd_kill(self):
        if self.etcd_up():
            os.kill(self.etcd_proc.pid, signal.SIGKILL)
            self.etcd_proc.wait(timeout=30)
        self.etcd_proc = None


def _zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
        return st[st.rfind(")") + 2] == "Z"
    except OSError:
        return True


class Cluster:
    """n nodes; store 'etcd' (an etcd member beside each node) or
    'embedded' (node1 hosts the control plane)."""

    def __init__(self, workdir, run, n, store, template, shim):
        self.run = run
        self.n = n
        self.store = store
        self.dir = workdir
        self.shim = shim
        self.user = run_user()
        self.bridge = "fx%db" % run
        self.nodes = [Node(self, k) for k in range(1, n + 1)]
        self.etcd_initial = ",".join("e%d=http://%s:2380" % (x.k, x.addr) for x in self.nodes)
        self.partitions = []            # [(names of one side, of the other)]
        self.template = template
        self.mounts = []

    def node(self, name):
        for x in self.nodes:
            if x.name == name:
                return x
        raise KeyError(name)

    # ---- the network ----------------------------------------------------
    def make_network(self):
        open(os.path.join(os.path.dirname(self.dir), ".run%d" % self.run), "w").close()
        # what an interrupted run with this number left (its names are ours)
        for ns in sh("ip", "netns", "list", check=False).split():
            if ns.startswith("fx%dn" % self.run):
                sh("ip", "netns", "del", ns, check=False)
        for line in sh("ip", "-o", "link", "show", check=False).splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if re.match(r"fx%d[bvp]\d*$" % self.run, name):
                sh("ip", "link", "del", name, check=False, quiet=True)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", "10.213.%d.254/24" % self.run, "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for x in self.nodes:
            outer, inner = "fx%dv%d" % (self.run, x.k), "fx%dp%d" % (self.run, x.k)
            sh("ip", "netns", "add", x.ns)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", x.ns)
            sh("ip", "link", "set", outer, "master", self.bridge)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "netns", "exec", x.ns, "ip", "addr", "add", x.addr + "/24", "dev", inner)
            sh("ip", "netns", "exec", x.ns, "ip", "link", "set", inner, "up")
            sh("ip", "netns", "exec", x.ns, "ip", "link", "set", "lo", "up")
            sh("ip", "netns", "exec", x.ns, "nft", "add", "table", "inet", "fxpart")
            for hook in ("input", "output"):
                sh("ip", "netns", "exec", x.ns, "nft", "add", "chain", "inet", "fxpart", hook,
                   "{ type filter hook %s priority 0 ; }" % hook)

    def partition(self, side_a, side_b):
        """Drop every packet between the nodes of side_a and side_b (the
        harness still reaches all of them)."""
        self.partitions.append((tuple(x.name for x in side_a), tuple(y.name for y in side_b)))
        self._apply_partitions()

    def unpartition(self, side_a, side_b):
        self.partitions.remove((tuple(x.name for x in side_a), tuple(y.name for y in side_b)))
        self._apply_partitions()

    def heal_partitions(self):
        self.partitions = []
        self._apply_partitions()

    def _apply_partitions(self):
        for x in self.nodes:
            for hook in ("input", "output"):
                sh("ip", "netns", "exec", x.ns, "nft", "flush", "chain", "inet", "fxpart", hook)
        for side_a, side_b in self.partitions:
            for a in side_a:
                for b in side_b:
                    for x, y in ((self.node(a), self.node(b)), (self.node(b), self.node(a))):
                        sh("ip", "netns", "exec", x.ns, "nft", "add", "rule", "inet", "fxpart",
                           "input", "ip", "saddr", y.addr, "drop")
                        sh("ip", "netns", "exec", x.ns, "nft", "add", "rule", "inet", "fxpart",
                           "output", "ip", "daddr", y.addr, "drop")

    # ---- servers ----------------------------------------------------------
    def conf(self, x):
        lines = [
            "listen_addresses = '%s'" % x.addr,
            "port = %d" % PG_PORT,
            "unix_socket_directories = '%s'" % x.socket_dir,
            "shared_preload_libraries = 'felix'",
            "felix.database = 'postgres'",
            "felix.node_name = '%s'" % x.name,
            "felix.node_conninfo = 'host=%s port=%d dbname=postgres'" % (x.addr, PG_PORT),
            "felix.data_directory = '%s'" % x.felix_dir,
            # the producers route themselves, except the one that turns
            # forwarding on in its own sessions (workload.py)
            "felix.forward_publishes = off",
            "lc_messages = 'C'",
            "max_connections = 80",
            "fsync = on",
            "log_line_prefix = '%m [%p] '",
        ]
        if self.store == "etcd":
            lines.append("felix.etcd_endpoints = '%s'" % ",".join(
                "http://%s:2379" % y.addr for y in self.nodes))
            lines.append("felix.etcd_prefix = '/felix/'")
        else:
            lines.append("felix.control_conninfo = '%s'" % (
                "" if x.k == 1 else "host=%s port=%d dbname=postgres" % (self.nodes[0].addr, PG_PORT)))
        return "\n".join(lines) + "\n"

    def start(self):
        """Network, etcd members, servers, the extension and node roles;
        returns once node1 sees every node alive."""
        self.make_network()
        u = self.user
        for x in self.nodes:
            os.makedirs(x.dir)
            shutil.copytree(self.template, x.pgdata, symlinks=True)
            mnt = os.path.join(x.dir, "felix-mnt")
            os.makedirs(mnt)
            sh("mount", "-t", "tmpfs", "-o", "size=%d,mode=0755" % FELIX_TMPFS_BYTES,
               "fxfelix%d" % x.k, mnt)
            self.mounts.append(mnt)
            os.makedirs(os.path.join(mnt, "felix"))
            os.symlink(os.path.join(mnt, "felix"), x.felix_dir)
            os.makedirs(x.socket_dir)
            with open(os.path.join(x.pgdata, "postgresql.conf"), "a") as f:
                f.write(self.conf(x))
            with open(os.path.join(x.pgdata, "pg_hba.conf"), "w") as f:
                f.write("local all all trust\nhost all all 10.213.%d.0/24 trust\n" % self.run)
            x.set_faketime("+0")
            sh("chown", "-R", "%d:%d" % (u.pw_uid, u.pw_gid), x.dir)
            sh("chown", "-R", "%d:%d" % (u.pw_uid, u.pw_gid), mnt)
        if self.store == "etcd":
            for x in self.nodes:
                x.etcd_start()
            self.wait_etcd()
        for x in self.nodes:
            x.start()
        for x in self.nodes:
            x.wait_ready()
        self.nodes[0].sql("CREATE EXTENSION felix")
        for x in self.nodes[1:]:
            x.sql("CREATE EXTENSION felix")
        roles = ", ".join("felix_create_node_role('%s')" % x.name for x in self.nodes)
        for x in self.nodes:
            x.sql("SELECT " + roles)
        self.wait_alive(60)

    def wait_etcd(self, timeout=30):
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen("http://%s:2379/health" % self.nodes[0].addr, timeout=1).read()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("etcd not healthy after %ds" % timeout)

    def wait_alive(self, timeout):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                rows = self.nodes[0].sql("SELECT count(*) FROM felix_nodes WHERE state = 'alive'")
                last = rows[0][0]
                if last == self.n:
                    return
            except psycopg2.Error as e:
                last = str(e).strip()
            time.sleep(0.2)
        raise RuntimeError("not every node alive after %ds (last: %s)" % (timeout, last))

    def teardown(self):
        for x in self.nodes:
            try:
                if x.proc is not None:
                    x.kill9()
            except Exception:
                pass
            try:
                x.etcd_kill()
            except Exception:
                pass
        for x in self.nodes:
            sh("ip", "netns", "del", x.ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)
        for m in self.mounts:
            sh("umount", "-l", m, check=False)
        self.mounts = []
        marker = os.path.join(os.path.dirname(self.dir), ".run%d" % self.run)
        if os.path.exists(marker):
            os.unlink(marker)


def make_template(path):
    """initdb once per run, as the run user; every node starts from a copy."""
    u = run_user()
    os.makedirs(path)
    sh("chown", "%d:%d" % (u.pw_uid, u.pw_gid), path)
    sh("setpriv", "--reuid=%d" % u.pw_uid, "--regid=%d" % u.pw_gid, "--init-groups", "--",
       os.path.join(PG_BIN, "initdb"), "-D", path, "-A", "trust", "-U", "postgres",
       "--no-sync", "-E", "UTF8", "--locale=C")


def clean_leftovers(workdir):
    """What a run killed before its teardown left under workdir: servers,
    etcd members, tmpfs mounts, and the namespaces and bridge of every run
    whose marker (.run<R>, removed by a clean end) is still there."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        prog = os.path.basename(argv[0])
        if (prog in ("postgres", "etcd") or prog.startswith("postgres:")) and \
                workdir + "/" in " ".join(argv):
            try:
                os.kill(int(d), signal.SIGKILL)
            except ProcessLookupError:
                pass
    with open("/proc/mounts") as f:
        for line in f:
            mnt = line.split()[1]
            if mnt.startswith(workdir + "/"):
                sh("umount", "-l", mnt, check=False)
    # runs that used this directory and did not end: their network
    for marker in os.listdir(workdir):
        if marker.startswith(".run") and marker[4:].isdigit():
            r = marker[4:]
            for ns in sh("ip", "netns", "list", check=False).split():
                if ns.startswith("fx%sn" % r):
                    sh("ip", "netns", "del", ns, check=False)
            sh("ip", "link", "del", "fx%sb" % r, check=False, quiet=True)
            os.unlink(os.path.join(workdir, marker))
