# test/bench/lib.sh -- what the benchmark scripts share (sourced, not run).
#
# Before sourcing: BENCH_NAME (the log prefix) and PGBIN.  Provides:
#   log, die
#   bench_run_user   sets RUN_USER: postgres when run as root (created if
#                    missing), else the caller
#   bench_require    <binaries...>: each in PGBIN, and felix installed;
#                    sets PKGLIB and SHAREDIR
#   ratio, median, mark_ge, mark_le   for the reports
#   bench_log_errors <logs...>        their first distinct ERROR/FATAL/PANIC
#                                     lines, in a code block
#   bench_publish <report> <file>     print the report, copy it to file
#
# For the scripts that start servers (after bench_run_user; with BASE,
# SOCK, WORK, KEEP set, the arrays STARTED, BG_PIDS, PROBE_PIDS declared,
# and FPORTS holding the felix nodes' ports, node1 first):
#   bench_as_user    sets AS_USER (the command prefix that runs as RUN_USER)
#   pgc, q           a client command / quiet psql against a port
#   datadir, init_node, start_node, bench_cleanup (the EXIT trap)
#   felix_cluster_start   initdb and start node1..N (node1 hosts the
#                    embedded control plane, or with FETCD set every node
#                    lists those etcd endpoints), create the extension and
#                    node roles, wait until all are alive; data directories
#                    ${FPREFIX:-f}1..N
#   etcd_start_member, etcd_kill_member   etcd member k on ETCD_CLIENT[k-1]
#                    and ETCD_PEER[k-1], data in $BASE/etcd<k>
#   wait_alive, leader_port, pick_name, kill_node
#   sync_cluster_start    PostgreSQL synchronous replication on SPORTS
#   write_script, pgbench_run, start_probe, measure_failover   load (needs
#                    the array SANITY) and failover probes
#   record_point, mean_of   per-key sums of pgbench results (need the
#                    associative arrays TPS_SUM TPS_N TPS_LIST P50_SUM LAT_SUM)
#   proc_cpu_ticks, server_cpu_ticks, proc_pss_kb, server_pss_kb   CPU
#                    (clock ticks) and memory (Pss, kB) of processes / of a
#                    server's process tree
#   felix_cluster_stop    stop the FPORTS cluster, remove its data directories
#   bench_result_file <name>   sets STAMP and RESULT_FILE (SCRIPT_DIR/
#                    results-<name>-<stamp>[-quick].md)
#   bench_fresh_base      an empty BASE with SOCK and WORK, owned by RUN_USER;
#                    cd there

log() { printf '[%s %s] %s\n' "$BENCH_NAME" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

bench_run_user() {
	if [[ $(id -u) == 0 ]]; then
		RUN_USER=postgres
		if ! id -u "$RUN_USER" >/dev/null 2>&1; then
			log "creating system user $RUN_USER"
			useradd --system --home-dir /var/lib/postgresql --shell /bin/bash "$RUN_USER"
		fi
	else
		RUN_USER=$(id -un)
	fi
}

bench_require() {
	local b
	for b in "$@"; do
		[[ -x $PGBIN/$b ]] || die "$PGBIN/$b not found (install postgresql-15 and postgresql-contrib-15 / set PGBIN)"
	done
	PKGLIB=$("$PGBIN/pg_config" --pkglibdir)
	SHAREDIR=$("$PGBIN/pg_config" --sharedir)
	[[ -f $PKGLIB/felix.so && -f $SHAREDIR/extension/felix.control ]] ||
		die "felix is not installed in $PKGLIB (run: make PG_CONFIG=$PGBIN/pg_config && sudo make install PG_CONFIG=$PGBIN/pg_config)"
}

# a b -> a/b with three decimals, or n/a.  Targets are judged on this
# printed value, so 0.996 does not pass for 1.00.
ratio() {
	awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "n/a"; else printf "%.3f", a / b }'
}
# value target -> met / **MISSED** / n/a
mark_ge() { awk -v v="${1:-}" -v t="$2" 'BEGIN { if (v == "" || v == "n/a") print "n/a"; else if (v + 0 >= t + 0) print "met"; else print "**MISSED**" }'; }
mark_le() { awk -v v="${1:-}" -v t="$2" 'BEGIN { if (v == "" || v == "n/a") print "n/a"; else if (v + 0 <= t + 0) print "met"; else print "**MISSED**" }'; }
# values... -> their median (empty values ignored), or "" for none
median() { printf '%s\n' "$@" | grep . | sort -n | awk '{a[NR]=$1} END{ if (NR == 0) print ""; else if (NR % 2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2] + a[NR/2+1]) / 2 }'; }

bench_log_errors() {
	echo '```'
	cat "$@" | grep -E 'ERROR|FATAL|PANIC|TRAP|terminated by signal' |
		sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //' | awk '!seen[$0]++' | head -20
	echo '```'
}

bench_publish() {
	cat "$1"
	if cp "$1" "$2" 2>/dev/null; then
		log "results written to $2"
	else
		log "could not write $2 (read-only checkout?); results are above"
	fi
}

# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------
bench_as_user() {
	if [[ $(id -u) == 0 ]]; then
		AS_USER=(runuser -u "$RUN_USER" --)
	else
		AS_USER=()
	fi
}
# pgc <port> cmd...: run a client command as the servers' user against a port.
pgc() {
	local port=$1; shift
	"${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres \
		PGOPTIONS="-c client_min_messages=warning" "$@"
}
# q <port> [psql args]: quiet, unaligned, stop on the first error.
q() { local port=$1; shift; pgc "$port" "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At "$@"; }

datadir() { echo "$BASE/$1"; }		# f1 f2 f3 p s1 s2

# The EXIT trap: stop every server started, remove $BASE unless KEEP=1.
bench_cleanup() {
	local rc=$? d p
	trap - EXIT INT TERM
	for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PROBE_PIDS[@]}"; do kill -- "-$p" 2>/dev/null || true; done
	pkill -9 -f -- "--data-dir $BASE/etcd" 2>/dev/null || true
	for d in "${STARTED[@]}"; do
		if [[ -f $(datadir "$d")/postmaster.pid ]]; then
			"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$(datadir "$d")" -m immediate -t 30 -w stop >/dev/null 2>&1 || true
		fi
	done
	if [[ $KEEP == 1 ]]; then
		log "KEEP=1: leaving $BASE in place"
	elif [[ -d $BASE ]]; then
		rm -rf "$BASE"
	fi
	exit "$rc"
}

# The settings every benchmark server has.
bench_common_conf() {
	cat <<EOC
listen_addresses = ''
unix_socket_directories = '$SOCK'
max_connections = 100
shared_buffers = 256MB
fsync = on
synchronous_commit = on
full_page_writes = on
wal_level = replica
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 30min
logging_collector = off
log_min_messages = warning
lc_messages = 'C'
EOC
}

init_node() {	# name port extra-conf
	local d; d=$(datadir "$1")
	mkdir -p "$d"; chmod 700 "$d"
	[[ $(id -u) == 0 ]] && chown "$RUN_USER": "$d"
	"${AS_USER[@]}" "$PGBIN/initdb" -D "$d" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$WORK/initdb-$1.log" 2>&1 ||
		"${AS_USER[@]}" "$PGBIN/initdb" -D "$d" -U postgres --auth=trust -E UTF8 --no-locale >"$WORK/initdb-$1.log" 2>&1 ||
		{ cat "$WORK/initdb-$1.log" >&2; die "initdb $1 failed"; }
	printf '%s\nport = %s\n%s\n' "$(bench_common_conf)" "$2" "$3" >>"$d/postgresql.conf"
}
start_node() {	# name
	local d; d=$(datadir "$1")
	"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$d" -l "$WORK/server-$1.log" -w -t 60 start >/dev/null ||
		{ tail -30 "$WORK/server-$1.log" >&2 || true; die "server $1 did not start"; }
	[[ " ${STARTED[*]} " == *" $1 "* ]] || STARTED+=("$1")
}

# ---------------------------------------------------------------------------
# A felix cluster: node<i> on FPORTS[i-1], data directory f<i>
# ---------------------------------------------------------------------------
# Where a node is; each logs in as its own role, felix_node_node<i> (the
# servers trust local connections).
fconn() { echo "host=$SOCK port=$1 dbname=postgres"; }

felix_cluster_start() {	# [extra conf lines for every node]
	local i n=${#FPORTS[@]} cp_conn roles="" p
	FNAMES=()
	for (( i = 1; i <= n; i++ )); do
		FNAMES+=("node$i")
		roles="$roles${roles:+, }felix_create_node_role('node$i')"
		cp_conn=""
		[[ $i != 1 ]] && cp_conn=$(fconn "${FPORTS[0]}")
		log "felix node$i: initdb (port ${FPORTS[$((i-1))]})"
		local store="felix.control_conninfo = '$cp_conn'"
		[[ -n ${FETCD:-} ]] && store="felix.etcd_endpoints = '$FETCD'
felix.etcd_prefix = '/felix/bench/'"
		init_node "${FPREFIX:-f}$i" "${FPORTS[$((i-1))]}" "shared_preload_libraries = 'felix'
felix.database = 'postgres'
felix.forward_publishes = off
felix.node_name = 'node$i'
felix.node_conninfo = '$(fconn "${FPORTS[$((i-1))]}")'
$store
${1:-}"
	done
	for (( i = 1; i <= n; i++ )); do start_node "${FPREFIX:-f}$i"; done
	for p in "${FPORTS[@]}"; do q "$p" -c "CREATE EXTENSION felix" >/dev/null; done
	for p in "${FPORTS[@]}"; do q "$p" -c "SELECT $roles" >/dev/null; done
	wait_alive "$n"
	log "felix: $n nodes alive"
}

wait_alive() {	# n -> waits (60 s) until node1's felix_nodes shows n nodes alive
	local i
	for (( i = 0; i < 300; i++ )); do
		[[ $(q "${FPORTS[0]}" -c "SELECT count(*) FROM felix_nodes WHERE alive" 2>/dev/null || echo 0) == "$1" ]] && return 0
		sleep 0.2
	done
	die "felix: fewer than $1 nodes alive after 60 s: $(q "${FPORTS[0]}" -c "SELECT string_agg(name || ':' || alive, ' ') FROM felix_nodes" 2>&1)"
}

# The port of the node whose felix_shards says it leads (stream, 0) with a
# live lease; waits up to 30 s.
leader_port() {	# stream
	local i k r
	for (( i = 0; i < 150; i++ )); do
		for k in "${!FPORTS[@]}"; do
			r=$(q "${FPORTS[$k]}" -c "SELECT 1 FROM felix_shards WHERE stream = '$1' AND shard = 0 AND role = 'leader' AND leader = '${FNAMES[$k]}' AND lease_remaining_ms > 0" 2>/dev/null || true)
			[[ $r == 1 ]] && { echo "${FPORTS[$k]}"; return 0; }
		done
		sleep 0.2
	done
	return 1
}
# A stream name with prefix $1 whose shard 0 the control plane would give
# to a node other than node1 (same score and tie order as cp_create_stream).
pick_name() {	# prefix
	local i name lead names
	names=$(printf "'%s'," "${FNAMES[@]}"); names=${names%,}
	for (( i = 0; i < 200; i++ )); do
		name="$1_$i"
		lead=$(q "${FPORTS[0]}" -c "SELECT n FROM unnest(ARRAY[$names]) n ORDER BY felix.cp_score(n, '$name', 0) DESC, n COLLATE \"C\" LIMIT 1")
		[[ $lead != node1 && -z $(q "${FPORTS[0]}" -c "SELECT 1 FROM felix.cluster_streams WHERE name = '$name'") ]] && { echo "$name"; return 0; }
	done
	die "no stream name with prefix $1 is led by a node other than node1"
}

# Every process of the server on data directory $1, postmaster first.
server_pids() {
	local pm
	pm=$(head -1 "$1/postmaster.pid" 2>/dev/null) || return 0
	# one ps for the whole tree: a ps per process took most of a second on
	# a busy machine, and a kill timed from before it counted that time
	ps -e -o pid=,ppid= | awk -v root="$pm" '
		{ parent[$1] = $2 }
		END {
			print root; n = 1; q[1] = root
			for (i = 1; i <= n; i++)
				for (p in parent)
					if (parent[p] == q[i]) { print p; q[++n] = p }
		}'
}
alive_pid() {	# not gone and not a zombie
	[[ -r /proc/$1/stat ]] || return 1
	! awk '{exit ($3 == "Z") ? 0 : 1}' "/proc/$1/stat"
}
# kill -9 every process of node f$1 at once, wait until they are gone and
# clear the lock files a dead (possibly unreaped) postmaster leaves.
# KILLED_AT is the instant (date +%s.%N) of the kill itself.
KILLED_AT=""
kill_node() {
	local d pids=() p i left
	d=$(datadir "${FPREFIX:-f}$1")
	mapfile -t pids < <(server_pids "$d")
	KILLED_AT=$(date +%s.%N)
	kill -9 "${pids[@]}" 2>/dev/null || true
	for (( i = 0; i < 600; i++ )); do
		left=0
		for p in "${pids[@]}"; do alive_pid "$p" && left=1; done
		(( left == 0 )) && break
		sleep 0.05
	done
	(( left == 0 )) || die "processes of ${FPREFIX:-f}$1 survived SIGKILL for 30 s"
	rm -f "$d/postmaster.pid" "$SOCK/.s.PGSQL.${FPORTS[$(( $1 - 1 ))]}.lock"
}

# ---------------------------------------------------------------------------
# etcd members: e<k> on 127.0.0.1, client port ETCD_CLIENT[k-1], peer port
# ETCD_PEER[k-1], data in $BASE/etcd<k>; PIDs in ETCD_PIDS[k-1]
# ---------------------------------------------------------------------------
ETCD_PIDS=()
etcd_endpoints() {
	local k out=""
	for k in "${!ETCD_CLIENT[@]}"; do out="$out${out:+,}http://127.0.0.1:${ETCD_CLIENT[$k]}"; done
	echo "$out"
}
etcd_start_member() {	# k
	local k=$1 i cluster="" state=new
	for i in "${!ETCD_PEER[@]}"; do cluster="$cluster${cluster:+,}e$((i + 1))=http://127.0.0.1:${ETCD_PEER[$i]}"; done
	[[ -d $BASE/etcd$k/member ]] && state=existing
	# --max-txn-ops: the least docs/configuration.md asks for with the defaults, up to 8 nodes
	setsid "${AS_USER[@]}" etcd --name "e$k" --data-dir "$BASE/etcd$k" \
		--listen-client-urls "http://127.0.0.1:${ETCD_CLIENT[$((k - 1))]}" \
		--advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT[$((k - 1))]}" \
		--listen-peer-urls "http://127.0.0.1:${ETCD_PEER[$((k - 1))]}" \
		--initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER[$((k - 1))]}" \
		--initial-cluster "$cluster" --initial-cluster-state "$state" \
		--initial-cluster-token felix-bench --max-txn-ops 528 --log-level warn \
		>>"$WORK/etcd$k.log" 2>&1 &
	ETCD_PIDS[$((k - 1))]=$!
	BG_PIDS+=($!)
	disown $!			# its kill -9 is ours, not worth a shell notice
}
etcd_kill_member() {	# k
	local pid=${ETCD_PIDS[$(( $1 - 1 ))]:-}
	[[ -n $pid ]] || return 0
	pkill -9 -P "$pid" 2>/dev/null || true
	kill -9 "$pid" 2>/dev/null || true
	pkill -9 -f -- "--name e$1 --data-dir $BASE/etcd$1" 2>/dev/null || true
	ETCD_PIDS[$(( $1 - 1 ))]=""
}

# ---------------------------------------------------------------------------
# PostgreSQL synchronous replication: primary p on SPORTS[0], standbys s1,
# s2 on SPORTS[1..2] with synchronous_standby_names = 'ANY 1 (s1, s2)'
# ---------------------------------------------------------------------------
sync_cluster_start() {
	local i d n
	log "sync replication: primary (port ${SPORTS[0]}) and standbys s1, s2"
	init_node p "${SPORTS[0]}" "max_wal_senders = 10
synchronous_standby_names = 'ANY 1 (s1, s2)'"
	start_node p
	for i in 1 2; do
		d=$(datadir "s$i")
		"${AS_USER[@]}" "$PGBIN/pg_basebackup" -h "$SOCK" -p "${SPORTS[0]}" -U postgres -D "$d" -X stream -R -c fast >"$WORK/basebackup-s$i.log" 2>&1 ||
			{ cat "$WORK/basebackup-s$i.log" >&2; die "pg_basebackup for s$i failed"; }
		chmod 700 "$d"
		printf "port = %s\nprimary_conninfo = 'host=%s port=%s user=postgres application_name=s%s'\n" \
			"${SPORTS[$i]}" "$SOCK" "${SPORTS[0]}" "$i" >>"$d/postgresql.auto.conf"
		start_node "s$i"
	done
	for (( i = 0; i < 300; i++ )); do
		n=$(q "${SPORTS[0]}" -c "SELECT count(*) FROM pg_stat_replication WHERE application_name IN ('s1', 's2') AND sync_state = 'quorum' AND state = 'streaming'")
		[[ $n == 2 ]] && break
		sleep 0.2
	done
	[[ $n == 2 ]] || die "the standbys are not both quorum-synchronous: $(q "${SPORTS[0]}" -c "SELECT application_name, state, sync_state FROM pg_stat_replication")"
	log "sync replication: s1 and s2 streaming, sync_state quorum"
}

# ---------------------------------------------------------------------------
# Load and probes
# ---------------------------------------------------------------------------
write_script() {	# name content -> path
	local f=$WORK/$1.sql
	printf '%s\n' "$2" >"$f"
	chmod 644 "$f"
	echo "$f"
}

# pgbench_run <label> <port> <script> <clients> <seconds> -> PB_TPS PB_LAT PB_P50 PB_TX PB_OK
pgbench_run() {
	local label=$1 port=$2 script=$3 c=$4 t=$5 j out
	j=$(( c < 2 ? c : 2 ))
	out=$WORK/pgbench-$label.out
	rm -f "$WORK/pgblog-$label".*
	PB_TPS=""; PB_LAT=""; PB_P50=""; PB_TX=""; PB_OK=1
	if ! timeout $(( t + 120 )) "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres \
		"$PGBIN/pgbench" -n -M prepared -f "$script" -c "$c" -j "$j" -T "$t" \
		-l --log-prefix="$WORK/pgblog-$label" >"$out" 2>&1; then
		PB_OK=0
		log "pgbench $label FAILED; output:"
		tail -20 "$out" >&2
	fi
	PB_TPS=$(awk '/^tps = /{printf "%.1f", $3; exit}' "$out")
	PB_LAT=$(awk '/^latency average = /{print $4; exit}' "$out")
	PB_TX=$(awk '/^number of transactions actually processed:/{print $6; exit}' "$out")
	PB_TX=${PB_TX%%/*}
	# p50 of the per-transaction latencies (3rd field, µs) over every client log.
	PB_P50=$(cat "$WORK/pgblog-$label".* 2>/dev/null | awk '{print $3}' | sort -n |
		awk '{a[NR]=$1} END{ if (NR) printf "%.3f", a[int((NR+1)/2)] / 1000 }')
	rm -f "$WORK/pgblog-$label".*
	if grep -q 'number of failed transactions: [1-9]\|aborted in command\|ERROR:' "$out"; then
		PB_OK=0
		log "pgbench $label reported errors:"
		grep -m5 'failed\|aborted\|ERROR' "$out" >&2 || true
	fi
	[[ -n $PB_TPS ]] || PB_OK=0
	[[ $PB_OK == 1 ]] || SANITY+=("pgbench point $label failed: $(grep -m1 -i 'error' "$out" || echo 'no tps reported')")
	log "  $label: c=$c tps=${PB_TPS:-?} avg=${PB_LAT:-?} ms p50=${PB_P50:-?} ms tx=${PB_TX:-?}"
}

# record_point KEY: add the last pgbench_run's results to KEY's sums.
record_point() {
	local key=$1
	TPS_LIST[$key]="${TPS_LIST[$key]:-}${TPS_LIST[$key]:+, }${PB_TPS:-error}"
	[[ $PB_OK == 1 ]] || return 0
	TPS_SUM[$key]=$(awk -v a="${TPS_SUM[$key]:-0}" -v b="$PB_TPS" 'BEGIN{print a + b}')
	P50_SUM[$key]=$(awk -v a="${P50_SUM[$key]:-0}" -v b="${PB_P50:-0}" 'BEGIN{print a + b}')
	LAT_SUM[$key]=$(awk -v a="${LAT_SUM[$key]:-0}" -v b="${PB_LAT:-0}" 'BEGIN{print a + b}')
	TPS_N[$key]=$(( ${TPS_N[$key]:-0} + 1 ))
}
# mean_of ARRAY KEY: the mean of KEY's recorded values in ARRAY, or "".
mean_of() {
	local -n arr=$1
	[[ ${TPS_N[$2]:-0} -gt 0 ]] || { echo ""; return; }
	awk -v s="${arr[$2]}" -v n="${TPS_N[$2]}" 'BEGIN{printf "%.3f", s / n}'
}


# Probe: a session on port $1 that publishes to $2 every 20 ms, logging the
# epoch of each acknowledgement (NOTICE ack <epoch>), refusals ignored.
start_probe() {	# port stream file
	setsid "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$1" PGUSER=postgres PGDATABASE=postgres \
		timeout 60 "$PGBIN/psql" -X -q -c "SET client_min_messages = notice; DO \$\$ DECLARE p felix_position; BEGIN
		FOR i IN 1..3000 LOOP
			BEGIN
				p := felix_publish('$2', '{\"probe\": 1}'::jsonb, shard => 0);
				RAISE NOTICE 'ack %', extract(epoch FROM clock_timestamp());
				EXIT;
			EXCEPTION WHEN OTHERS THEN
				PERFORM pg_sleep(0.02);
			END;
		END LOOP; END \$\$" >/dev/null 2>"$3" &
	PROBE_PIDS+=($!)
}


# measure_failover LABEL STREAM PORT K KILL-COMMAND...: four pgbench clients
# publish on STREAM's leader (node K, on PORT); probes publish on every
# other node every 20 ms; KILL-COMMAND runs; FO_TIME is the seconds from
# it to the first publish a probe got acknowledged ("" if none within
# 30 s).  Needs PAYLOAD.
measure_failover() {
	local label=$1 stream=$2 port=$3 k=$4 load load_pid probes=() i p t_kill first
	shift 4
	load=$(write_script "fo-load-$label" "\\set k random(1, 1000000)
SELECT felix_publish('$stream', '$PAYLOAD'::jsonb, key => 'cust-' || :k);")
	timeout 40 "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres \
		"$PGBIN/pgbench" -n -M prepared -f "$load" -c 4 -j 2 -T 20 >"$WORK/fo-load-$label.out" 2>&1 &
	load_pid=$!
	BG_PIDS+=("$load_pid")
	sleep 2
	for (( i = 1; i <= ${#FPORTS[@]}; i++ )); do
		(( i == k )) && continue
		start_probe "${FPORTS[$((i - 1))]}" "$stream" "$WORK/probe-$label-node$i.txt"
		probes+=("$WORK/probe-$label-node$i.txt")
	done
	sleep 0.3
	t_kill=$(date +%s.%N)
	KILLED_AT=""
	"$@"
	# from the kill itself when the command was kill_node
	[[ -n $KILLED_AT ]] && t_kill=$KILLED_AT
	first=""
	for (( i = 0; i < 1500; i++ )); do		# 30 s
		first=$(cat "${probes[@]}" 2>/dev/null | awk '/NOTICE: +ack /{print $NF}' | sort -n | head -1)
		[[ -n $first ]] && break
		sleep 0.02
	done
	for p in "${PROBE_PIDS[@]}"; do kill -- "-$p" 2>/dev/null || true; done
	PROBE_PIDS=()
	wait "$load_pid" 2>/dev/null || true
	FO_TIME=""
	[[ -n $first ]] && FO_TIME=$(awk -v a="$t_kill" -v b="$first" 'BEGIN{printf "%.3f", b - a}')
	return 0
}

# ---------------------------------------------------------------------------
# Resource use of running servers (test/bench/scale.sh)
# ---------------------------------------------------------------------------
# proc_cpu_ticks <pids...>: utime + stime (clock ticks, getconf CLK_TCK) of
# those processes, summed; gone ones count 0.
proc_cpu_ticks() {
	(( $# )) || { echo 0; return 0; }
	local p
	for p in "$@"; do cat "/proc/$p/stat" 2>/dev/null || true; done |
		awk '{ sub(/^.*\) /, ""); t += $12 + $13 } END { printf "%d\n", t }'
}
# server_cpu_ticks <datadir>: the CPU the server on that data directory has
# used, in clock ticks: utime + stime of its live processes, plus the
# cutime + cstime of its postmaster (what its reaped children used).  The
# difference of two readings is what the server used in between, backends
# that came and went included.  0 when it is not running.
server_cpu_ticks() {
	local pm pids=() p
	pm=$(head -1 "$1/postmaster.pid" 2>/dev/null) || { echo 0; return 0; }
	[[ $pm =~ ^[0-9]+$ ]] || { echo 0; return 0; }
	mapfile -t pids < <(server_pids "$1")
	for p in "${pids[@]}"; do cat "/proc/$p/stat" 2>/dev/null || true; done |
		awk -v pm="$pm" '{ pid = $1; sub(/^.*\) /, ""); t += $12 + $13; if (pid == pm) t += $14 + $15 }
			END { printf "%d\n", t }'
}
# proc_pss_kb <pids...>: the sum of their proportional set sizes (Pss,
# /proc/<pid>/smaps_rollup, kB); shared memory is split among the
# processes that map it, so the sum counts it once.  Needs root or the
# processes' owner.
proc_pss_kb() {
	(( $# )) || { echo 0; return 0; }
	local p
	for p in "$@"; do cat "/proc/$p/smaps_rollup" 2>/dev/null || true; done |
		awk '/^Pss:/ { s += $2 } END { printf "%d\n", s }'
}
# server_pss_kb <datadir>: proc_pss_kb over every process of that server.
server_pss_kb() {
	local pids=()
	mapfile -t pids < <(server_pids "$1")
	proc_pss_kb "${pids[@]}"
}
# felix_cluster_stop: stop (immediate) every node of the current FPORTS /
# FPREFIX cluster and remove its data directories; logs stay in $WORK.
felix_cluster_stop() {
	local i d
	for (( i = 1; i <= ${#FPORTS[@]}; i++ )); do
		d=$(datadir "${FPREFIX:-f}$i")
		if [[ -f $d/postmaster.pid ]]; then
			"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$d" -m immediate -t 60 -w stop >/dev/null 2>&1 || true
		fi
		rm -rf "$d"
	done
}

# ---------------------------------------------------------------------------
# What every benchmark script sets up the same way
# ---------------------------------------------------------------------------
bench_result_file() {	# name
	STAMP=$(date -u +%Y-%m-%d-%H%M)
	local suffix=""
	[[ ${QUICK:-0} == 1 ]] && suffix="-quick"
	RESULT_FILE=$SCRIPT_DIR/results-$1-$STAMP$suffix.md
}
bench_fresh_base() {
	rm -rf "$BASE"
	mkdir -p "$SOCK" "$WORK"
	chmod 755 "$BASE" "$WORK" "$SOCK"
	[[ $(id -u) == 0 ]] && chown -R "$RUN_USER": "$BASE"
	cd "$BASE"
}
