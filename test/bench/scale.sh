#!/usr/bin/env bash
# test/bench/scale.sh -- felix at scale: what idle shards cost (issue 20).
#
# On this machine, felix clusters of 3 and of 5 nodes, on both control-plane
# stores (embedded: node1 hosts it; etcd: a 3-member etcd cluster on
# 127.0.0.1 started with --max-txn-ops 528), grown through shard points
# (default 10, 30, 300, 1000, 3000 shards; streams of at most STREAM_SHARDS
# shards, replication_factor 3, consistency 'quorum', created on node1 as
# the superuser postgres; felix.max_shards = MAX_SHARDS on every node so
# that 3000 fit, the per-role quotas do not apply to a superuser).  At
# each point:
#
#   idle (nothing published, IDLE_SECONDS):
#     - CPU of each node's PostgreSQL processes, in % of one core: utime +
#       stime of the postmaster and its live children plus the postmaster's
#       cutime + cstime (what its reaped children used), /proc/<pid>/stat;
#       and of each etcd member;
#     - control-plane traffic per second: felix_metrics store_requests,
#       store_bytes_read, store_bytes_written, summed over the nodes (with
#       the embedded store the host, node1, counts every node's requests),
#       and how many reads of the whole state the window held
#       (store_whole_reads: none is on a timer, so an idle window should
#       show 0);
#     - memory per shard: the Pss (/proc/<pid>/smaps_rollup) of a node's
#       processes summed, its difference from the first point divided by
#       the difference in shards (a node restarted by a failover test is
#       measured again after it settles, and from there on);
#   under load (LOAD_SECONDS): the same CPU and traffic figures while
#       pgbench publishes (felix_publish, 100-byte jsonb) to random shards
#       on their leaders: one pgbench per node leading shards, on that
#       node, over the shards it leads, LOAD_RATE publishes/s in all
#       (pgbench -R, split evenly), ceil(LOAD_CLIENTS / nodes) clients each;
#   creation: every felix_create_stream call is timed; the CREATE_N shards
#       created from CREATE_FROM on (10 streams of 100 when the cluster
#       grows from 1000 to 3000) are the "create 1000 shards" figure;
#       refused calls are counted and their errors reported;
#   failover (3-node clusters, at FAILOVER_POINTS): kill -9 of every
#       process of the node (not node1, not running the duties if possible)
#       leading the most shards; before the kill each of its shards takes
#       one publish (the pre-check); then probe sessions on the surviving
#       nodes (PROBE_SESSIONS each) loop over the shards not yet done, find
#       the ones that node now leads with a live lease (felix_shards: looked
#       at again when the node took new leads, after a look that published,
#       or every half second -- see bench_probe) and publish there
#       (felix.forward_publishes = off).  Reported: the time
#       from the kill until EVERY shard the node led has acknowledged a
#       publish again (and the median shard), bounded at FO_BOUND seconds,
#       with how many were still not publishing at the bound and why
#       (felix.assignments).  The node is started again afterwards.  Each
#       session publishes one shard at a time, and a quorum publish takes
#       some 20 ms on a busy 2-core machine: with 2 sessions a node the
#       probes alone needed 5 s for a thousand shards (6.8 s measured,
#       4.0 s with 8), so 8 is the default;
#   restart (3-node clusters, at RESTART_POINTS): every node stopped
#       (fast) and started again at once; the time until the cluster has
#       settled again.  With the embedded store every control-plane
#       session starts cold then (it once never settled at 3000 shards).
#
# Targets (issue 20), judged on the 3-node clusters: idle CPU <= 5% of one
# core per node (the busiest node) at 30 shards, and at 3000 shards <= 2x
# the 30-shard figure; control-plane traffic (bytes read + written per
# second) at 3000 shards <= 2x that at 30; 1000 shards created in <= 10 s
# with no refusal; every shard of a killed node publishing again within
# 5 s at ~1000 shards (about a third led by it) and within 3 s at 10.
#
# Prints a Markdown report and writes it to
# test/bench/results-scale-<date>.md (-quick.md in QUICK mode).  The report
# is written even when the run stops early (what was measured so far).
#
# Usage:   test/bench/scale.sh            (as root or as a normal user)
# Env:     QUICK=1         smoke run, <= 10 minutes: 3 nodes, points 10 and
#                          300, both stores, 5 s windows, failovers at both
#                          points (60 s bound), a restart at 300
#          STORES="embedded etcd"   NODES="3 5"
#          POINTS="10 30 300 1000 3000"   FAILOVER_POINTS="10 1000 3000"
#          RESTART_POINTS="3000"
#          IDLE_SECONDS=20 LOAD_SECONDS=10 LOAD_RATE=400 LOAD_CLIENTS=4
#          FO_BOUND=120 PROBE_SESSIONS=8 STREAM_SHARDS=100 MAX_SHARDS=4096
#          CREATE_FROM=1000 CREATE_N=1000
#          BUDGET_MIN=55   wall-clock budget of the measurements (full run
#                          <= 60 minutes): it is shared among the
#                          configurations, and a point, step or failover
#                          that does not fit is skipped and reported so
#          KEEP=1          keep /tmp/felix-bench-scale (data dirs, logs)
#          PGBIN=/usr/lib/postgresql/15/bin
#
# As root the servers and every client run as user `postgres`.  Servers
# listen only on Unix sockets in /tmp/felix-bench-scale/sock, ports
# 5571-5575; etcd members on 127.0.0.1:23571-23573 (client) and
# 23671-23673 (peer), started afresh for each etcd configuration.  One
# configuration runs at a time; everything is stopped and the directory
# removed on exit.  Every loop is bounded and every wait has a timeout.

set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BASE=/tmp/felix-bench-scale
SOCK=$BASE/sock
WORK=$BASE/work
ALL_FPORTS=(5571 5572 5573 5574 5575)
ETCD_CLIENT=(23571 23572 23573)
ETCD_PEER=(23671 23672 23673)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
	NODES=${NODES:-3}; POINTS=${POINTS:-10 300}; FAILOVER_POINTS=${FAILOVER_POINTS:-10 300}; RESTART_POINTS=${RESTART_POINTS:-300}
	IDLE_SECONDS=${IDLE_SECONDS:-5}; LOAD_SECONDS=${LOAD_SECONDS:-5}; FO_BOUND=${FO_BOUND:-60}
	BUDGET_MIN=${BUDGET_MIN:-9}; CREATE_FROM=${CREATE_FROM:-10}; CREATE_N=${CREATE_N:-290}
else
	NODES=${NODES:-3 5}; POINTS=${POINTS:-10 30 300 1000 3000}; FAILOVER_POINTS=${FAILOVER_POINTS:-10 1000 3000}; RESTART_POINTS=${RESTART_POINTS:-3000}
	IDLE_SECONDS=${IDLE_SECONDS:-20}; LOAD_SECONDS=${LOAD_SECONDS:-10}; FO_BOUND=${FO_BOUND:-120}
	BUDGET_MIN=${BUDGET_MIN:-55}; CREATE_FROM=${CREATE_FROM:-1000}; CREATE_N=${CREATE_N:-1000}
fi
STORES=${STORES:-embedded etcd}
LOAD_RATE=${LOAD_RATE:-400}
LOAD_CLIENTS=${LOAD_CLIENTS:-4}
PROBE_SESSIONS=${PROBE_SESSIONS:-8}
STREAM_SHARDS=${STREAM_SHARDS:-100}
MAX_SHARDS=${MAX_SHARDS:-4096}
SETTLE_MAX=${SETTLE_MAX:-120}
KEEP=${KEEP:-0}

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMDLINE="QUICK=$QUICK STORES='$STORES' NODES='$NODES' POINTS='$POINTS' FAILOVER_POINTS='$FAILOVER_POINTS' RESTART_POINTS='$RESTART_POINTS' IDLE_SECONDS=$IDLE_SECONDS LOAD_SECONDS=$LOAD_SECONDS LOAD_RATE=$LOAD_RATE FO_BOUND=$FO_BOUND BUDGET_MIN=$BUDGET_MIN $0${*:+ $*}"

for arg in "$@"; do
	case $arg in
		-h|--help) sed -n '2,90p' "$0"; exit 0 ;;
		*) echo "scale.sh: unknown argument '$arg' (parameters are environment variables; see --help)" >&2; exit 2 ;;
	esac
done
isnum() { [[ $1 =~ ^[0-9]+$ ]]; }
for v in IDLE_SECONDS LOAD_SECONDS LOAD_RATE LOAD_CLIENTS FO_BOUND PROBE_SESSIONS STREAM_SHARDS MAX_SHARDS BUDGET_MIN CREATE_FROM CREATE_N SETTLE_MAX; do
	isnum "${!v}" && (( ${!v} >= 1 )) || { echo "scale.sh: $v must be a positive integer" >&2; exit 2; }
done
for p in $POINTS $FAILOVER_POINTS $RESTART_POINTS; do
	isnum "$p" && (( p >= 1 && p <= 20000 )) || { echo "scale.sh: shard points must be 1..20000" >&2; exit 2; }
done
for n in $NODES; do [[ $n == 3 || $n == 5 ]] || { echo "scale.sh: NODES holds 3 and/or 5" >&2; exit 2; }; done
for s in $STORES; do [[ $s == embedded || $s == etcd ]] || { echo "scale.sh: STORES holds embedded and/or etcd" >&2; exit 2; }; done
(( IDLE_SECONDS <= 600 && LOAD_SECONDS <= 600 && FO_BOUND <= 600 && BUDGET_MIN <= 240 && PROBE_SESSIONS <= 8 )) ||
	{ echo "scale.sh: windows and FO_BOUND at most 600 s, BUDGET_MIN at most 240, PROBE_SESSIONS at most 8" >&2; exit 2; }

BENCH_NAME=bench-scale
# shellcheck source=test/bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
bench_result_file scale
bench_run_user
bench_as_user
bench_require postgres initdb pg_ctl psql pgbench pg_isready pg_config
[[ " $STORES " == *" etcd "* ]] && { command -v etcd >/dev/null || die "etcd is not installed (Debian package etcd-server)"; }
[[ -r /proc/self/smaps_rollup ]] || die "/proc/<pid>/smaps_rollup is not available (Linux >= 4.14)"
CLK_TCK=$(getconf CLK_TCK)

STARTED=()
BG_PIDS=()
PROBE_PIDS=()
for port in "${ALL_FPORTS[@]}"; do
	if "$PGBIN/pg_isready" -q -h "$SOCK" -p "$port" -t 1 2>/dev/null; then
		die "a server from an earlier run still listens on $SOCK port $port; stop it first"
	fi
done

REPORT_DONE=0
exec 3>&1			# the report goes here even from inside a redirection
scale_exit() {
	local rc=$?
	exec 1>&3
	if [[ $REPORT_DONE == 0 && -n ${RUN_T0:-} ]]; then
		REPORT_DONE=1
		log "stopping early (exit $rc): writing what was measured so far"
		NOTES+=("The run stopped early (exit status $rc) during: ${PHASE:-?}; the tables hold what was measured before.")
		write_report || true
	fi
	set +e				# bench_cleanup takes the status from $?
	(exit "$rc")
	bench_cleanup
}
trap scale_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bench_fresh_base

# qt <port> [psql args]: q with a time bound (QT seconds, default 30) and a
# statement_timeout, for everything that runs while the cluster may be
# overloaded.
qt() {
	local port=$1; shift
	timeout "${QT:-30}" "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$port" PGUSER=postgres PGDATABASE=postgres \
		PGOPTIONS="-c client_min_messages=warning -c statement_timeout=${QT:-30}s" \
		"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At "$@"
}
now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
fmt1() { awk -v v="${1:-}" 'BEGIN { if (v == "" || v == "n/a") print "n/a"; else printf "%.1f", v }'; }
fmt2() { awk -v v="${1:-}" 'BEGIN { if (v == "" || v == "n/a") print "n/a"; else printf "%.2f", v }'; }
left_s() { awk -v d="$1" -v n="$(now)" 'BEGIN { printf "%d", d - n }'; }	# seconds until deadline $1

# ---------------------------------------------------------------------------
# Results (keys: <store>-<nodes>-<point>, or <store>-<nodes>)
# ---------------------------------------------------------------------------
declare -A ACT IDLE LOADR MEM SETTLE FO CRE GROW SKIP LOAD_ERRS RS
HELD=(); LED=()	# per node (1..NN): copies held, shards led, as of the last settle
ROWS=()			# point keys, in the order measured
CFGS=()			# configuration keys
NOTES=()
SANITY=()
CREATE_ERRORS=()
PHASE=setup

# ---------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------
use_config() {	# store nodes
	STORE=$1; NN=$2
	FPORTS=("${ALL_FPORTS[@]:0:$NN}")
	FPREFIX="${STORE:0:2}${NN}n"		# em3n1.., et5n1..
	FNAMES=()
	local i
	for (( i = 1; i <= NN; i++ )); do FNAMES+=("node$i"); done
	if [[ $STORE == etcd ]]; then FETCD=$(etcd_endpoints); else FETCD=""; fi
	CK="$STORE-$NN"
}
node_dir() { datadir "$FPREFIX$1"; }	# k (1..NN)
etcd_fresh() {	# a new, empty 3-member etcd cluster
	local k i ok
	for k in 1 2 3; do etcd_kill_member "$k"; done
	sleep 0.5
	for k in 1 2 3; do rm -rf "$BASE/etcd$k"; done
	for k in 1 2 3; do etcd_start_member "$k"; done
	for (( i = 0; i < 150; i++ )); do
		ok=0
		for k in 1 2 3; do
			curl -s -m 1 "http://127.0.0.1:${ETCD_CLIENT[$((k - 1))]}/health" 2>/dev/null | grep -q '"health":"true"' && ok=$((ok + 1))
		done
		(( ok == 3 )) && return 0
		sleep 0.2
	done
	die "etcd: the three members are not healthy after 30 s (see $WORK/etcd*.log)"
}
etcd_pid() { pgrep -f -- "^etcd --name e$1 --data-dir $BASE/etcd$1" 2>/dev/null | head -1 || true; }

# The probe every node gets: loop over the target shards ('stream/shard')
# not yet done, publish to those this node leads with a live lease, NOTICE
# 'ack <key> <epoch>' for each, 'err <key> <sqlstate message>' for the
# first 20 distinct errors; until all are done or the deadline (epoch).
# A look at felix_shards builds a row for every shard (10-30 ms at 3,000
# shards), and 16 sessions looking ten times a second while they waited
# for the new leaders took most of this 2-core machine from the failover
# they measured.  So a session looks again at once after a look that
# published, when this node took new leads since its last look (felix_metrics
# promotions, a counter in shared memory), and otherwise every half second.
PROBE_FN=$(cat <<'EOSQL'
CREATE OR REPLACE FUNCTION bench_probe(targets text[], deadline double precision, poll double precision)
RETURNS integer LANGUAGE plpgsql AS $f$
DECLARE
	todo jsonb;
	seen jsonb := '{}';
	nseen integer := 0;
	r record;
	k text;
	e text;
	remaining integer;
	did boolean := true;
	took double precision;
	took_then double precision;
	looked double precision := 0;
BEGIN
	SELECT coalesce(jsonb_object_agg(t, true), '{}'), count(*) INTO todo, remaining FROM unnest(targets) t;
	WHILE remaining > 0 AND extract(epoch FROM clock_timestamp()) < deadline LOOP
		SELECT value INTO took FROM felix_metrics WHERE name = 'promotions';
		IF NOT did AND took IS NOT DISTINCT FROM took_then
		   AND extract(epoch FROM clock_timestamp()) < looked + 0.5 THEN
			PERFORM pg_sleep(poll);
			CONTINUE;
		END IF;
		did := false;
		took_then := took;
		looked := extract(epoch FROM clock_timestamp());
		FOR r IN SELECT s.stream, s.shard FROM felix_shards s WHERE s.role = 'leader' AND s.lease_remaining_ms > 0 LOOP
			k := r.stream || '/' || r.shard;
			CONTINUE WHEN NOT todo ? k;
			EXIT WHEN extract(epoch FROM clock_timestamp()) >= deadline;
			BEGIN
				PERFORM felix_publish(r.stream, '{"probe": 1}'::jsonb, shard => r.shard);
				RAISE NOTICE 'ack % %', k, extract(epoch FROM clock_timestamp());
				todo := todo - k;
				remaining := remaining - 1;
				did := true;
			EXCEPTION WHEN OTHERS THEN
				e := SQLSTATE || ' ' || regexp_replace(SQLERRM, '\s+', ' ', 'g');
				IF nseen < 20 AND NOT seen ? e THEN
					seen := seen || jsonb_build_object(e, true);
					nseen := nseen + 1;
					RAISE NOTICE 'err % %', k, e;
				END IF;
			END;
		END LOOP;
		IF NOT did THEN PERFORM pg_sleep(poll); END IF;
	END LOOP;
	RETURN remaining;
END $f$;
EOSQL
)
# The load's publish: refusals are counted in bench_err (message with names
# and numbers masked) instead of ending the pgbench client.
PUB_FN=$(cat <<'EOSQL'
CREATE UNLOGGED TABLE IF NOT EXISTS bench_err (msg text PRIMARY KEY, n bigint NOT NULL);
CREATE OR REPLACE FUNCTION bench_pub(s text, p jsonb, sh integer) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
	PERFORM felix_publish(s, p, shard => sh);
	RETURN true;
EXCEPTION WHEN OTHERS THEN
	INSERT INTO bench_err VALUES (SQLSTATE || ' ' || regexp_replace(regexp_replace(regexp_replace(SQLERRM, '\s+', ' ', 'g'), '"[^"]*"', '"..."', 'g'), '[0-9]+', 'N', 'g'), 1)
		ON CONFLICT (msg) DO UPDATE SET n = bench_err.n + 1;
	RETURN false;
END $f$;
EOSQL
)

start_config() {	# store nodes
	use_config "$1" "$2"
	PHASE="starting $CK"
	[[ $STORE == etcd ]] && etcd_fresh
	felix_cluster_start "felix.max_shards = $MAX_SHARDS
max_connections = 200"
	local p
	for p in "${FPORTS[@]}"; do q "$p" -c "$PROBE_FN" -c "$PUB_FN" >/dev/null; done
	[[ -n ${PAYLOAD:-} ]] || PAYLOAD=$(q "${FPORTS[0]}" -c "SELECT jsonb_build_object('id', 0, 'pad', repeat('x', 80))::text")
	TOTAL=0; SEQ=0
	declare -gA PSS_BASE=() PSS_BASE_P=() PSS_BASE_HELD=()
	CFGS+=("$CK")
}
stop_config() {
	PHASE="stopping $CK"
	felix_cluster_stop
	[[ $STORE == etcd ]] && { local k; for k in 1 2 3; do etcd_kill_member "$k"; done; }
	return 0
}

# ---------------------------------------------------------------------------
# Waiting for the cluster to settle
# ---------------------------------------------------------------------------
names_array() { local s; s=$(printf "'%s'," "${FNAMES[@]}"); echo "ARRAY[${s%,}]"; }
# expected_counts -> per node "held led" lines (node1 first), from
# felix.assignments read on node $1 (default 1), plus a last line
# "total unplaced"
expected_counts() {
	local k=${1:-1}
	qt "${FPORTS[$((k - 1))]}" -c "SELECT count(*) FILTER (WHERE n = ANY(a.replicas)), count(*) FILTER (WHERE a.leader = n)
		FROM unnest($(names_array)) WITH ORDINALITY AS x(n, o) LEFT JOIN felix.assignments a ON true
		GROUP BY o ORDER BY o" 2>/dev/null | tr '|' ' ' || return 1
	qt "${FPORTS[$((k - 1))]}" -c "SELECT count(*), count(*) FILTER (WHERE leader IS NULL OR unplaced_reason IS NOT NULL) FROM felix.assignments" 2>/dev/null | tr '|' ' ' || return 1
}
# settle [from-node]: wait (SETTLE_MAX s) until every node has every copy
# it is assigned open and a live lease on every shard it is assigned to
# lead, and the control plane lists TOTAL shards, all placed.  Sets
# SETTLED (1/0), SETTLE_S, HELD[k], LED[k], SETTLE_WHY.
settle() {
	local from=${1:-1} t0 i k exp=() got ok total unpl
	t0=$(now); SETTLED=0; SETTLE_WHY=""
	for (( i = 0; i < SETTLE_MAX; i++ )); do
		(( i > 0 && $(left_s "$(awk -v t="$t0" -v m="$SETTLE_MAX" 'BEGIN { printf "%.3f", t + m }')") <= 0 )) && break
		ok=1
		mapfile -t exp < <(QT=15 expected_counts "$from" || true)
		if (( ${#exp[@]} != NN + 1 )); then
			ok=0; SETTLE_WHY="felix.assignments could not be read on node$from"
		else
			read -r total unpl <<<"${exp[$NN]}"
			if [[ $total != "$TOTAL" || $unpl != 0 ]]; then
				ok=0; SETTLE_WHY="the control plane lists $total shards ($TOTAL expected), $unpl unplaced"
			fi
			for (( k = 1; k <= NN && ok; k++ )); do
				read -r HELD[$k] LED[$k] <<<"${exp[$((k - 1))]}"
				# a node lists every shard; the copies it holds name it in replicas
				got=$(QT=15 qt "${FPORTS[$((k - 1))]}" -c "SELECT count(*) FILTER (WHERE state = 'open' AND 'node$k' = ANY(replicas)) || ' ' || count(*) FILTER (WHERE role = 'leader' AND lease_remaining_ms > 0) FROM felix_shards" 2>/dev/null || echo "? ?")
				if [[ $got != "${HELD[$k]} ${LED[$k]}" ]]; then
					ok=0; SETTLE_WHY="node$k has $got open / leading with a lease, the control plane gives it ${HELD[$k]} / ${LED[$k]}"
				fi
			done
		fi
		if (( ok )); then SETTLED=1; break; fi
		sleep 1
	done
	SETTLE_S=$(secs_since "$t0")
	if (( SETTLED )); then
		log "  settled in $SETTLE_S s (copies held per node: ${HELD[*]:1:$NN}; led: ${LED[*]:1:$NN})"
	else
		log "  NOT settled after $SETTLE_S s: $SETTLE_WHY"
	fi
	return 0
}
wait_alive_soft() {	# n seconds -> 0 when node1 sees n nodes alive
	local i
	for (( i = 0; i < $2 * 5; i++ )); do
		[[ $(qt "${FPORTS[0]}" -c "SELECT count(*) FROM felix_nodes WHERE alive" 2>/dev/null || echo 0) == "$1" ]] && return 0
		sleep 0.2
	done
	return 1
}

# ---------------------------------------------------------------------------
# Growing the cluster: felix_create_stream on node1, timed
# ---------------------------------------------------------------------------
# grow_to TARGET DEADLINE: create streams of at most STREAM_SHARDS shards
# until TOTAL reaches TARGET, the deadline passes, or three calls in a row
# are refused.  Sets G_CALLS G_SHARDS G_SECS G_REFUSED.
grow_to() {
	local target=$1 deadline=$2 n name t0 dt err fails=0 calls=0 before extra
	G_CALLS=0; G_SHARDS=0; G_SECS=0; G_REFUSED=0
	while (( TOTAL < target && calls < 200 )); do
		if (( $(left_s "$deadline") <= 0 )); then
			SANITY+=("$CK: growing to $target shards stopped at $TOTAL: the time budget ran out")
			break
		fi
		n=$(( target - TOTAL < STREAM_SHARDS ? target - TOTAL : STREAM_SHARDS ))
		SEQ=$(( SEQ + 1 )); calls=$(( calls + 1 ))
		name=$(printf 's%04d' "$SEQ")
		before=$TOTAL
		t0=$(now)
		if timeout 300 "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="${FPORTS[0]}" PGUSER=postgres PGDATABASE=postgres \
			"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At -c "SELECT felix_create_stream('$name', shards => $n, replication_factor => 3, consistency => 'quorum')" \
			>/dev/null 2>"$WORK/create.err"; then
			dt=$(secs_since "$t0")
			TOTAL=$(( TOTAL + n )); fails=0
		else
			dt=$(secs_since "$t0")
			err=$(grep -v '^\s*$' "$WORK/create.err" 2>/dev/null | sed -n 1,3p | tr '\n' ' ' || true)
			[[ -n $err ]] || err="(no message; psql exit status non-zero, perhaps the 300 s timeout)"
			G_REFUSED=$(( G_REFUSED + 1 )); fails=$(( fails + 1 ))
			CREATE_ERRORS+=("$CK, stream $name ($n shards, after $before, ${dt} s): $err")
			log "  felix_create_stream('$name', $n) refused after $dt s: $err"
			# A call that failed may still have registered the stream.
			extra=$(qt "${FPORTS[0]}" -c "SELECT shards FROM felix.cluster_streams WHERE name = '$name'" 2>/dev/null || true)
			if [[ $extra =~ ^[0-9]+$ ]]; then
				TOTAL=$(( TOTAL + extra ))
				CREATE_ERRORS+=("$CK, stream $name: registered by the control plane despite the error ($extra shards)")
			fi
		fi
		G_CALLS=$(( G_CALLS + 1 )); G_SHARDS=$(( G_SHARDS + TOTAL - before ))
		G_SECS=$(awk -v a="$G_SECS" -v b="$dt" 'BEGIN { printf "%.3f", a + b }')
		# the "create CREATE_N shards" block: calls that start in [CREATE_FROM, CREATE_FROM + CREATE_N)
		if (( before >= CREATE_FROM && before < CREATE_FROM + CREATE_N )); then
			CRE[$CK-calls]=$(( ${CRE[$CK-calls]:-0} + 1 ))
			CRE[$CK-shards]=$(( ${CRE[$CK-shards]:-0} + TOTAL - before ))
			CRE[$CK-secs]=$(awk -v a="${CRE[$CK-secs]:-0}" -v b="$dt" 'BEGIN { printf "%.3f", a + b }')
			CRE[$CK-refused]=$(( ${CRE[$CK-refused]:-0} + (TOTAL - before < n ? 1 : 0) ))
			CRE[$CK-max]=$(awk -v a="${CRE[$CK-max]:-0}" -v b="$dt" 'BEGIN { printf "%.3f", (b > a) ? b : a }')
		fi
		(( fails >= 3 )) && { SANITY+=("$CK: growing to $target shards stopped at $TOTAL after three refused calls in a row"); break; }
	done
	return 0
}

# ---------------------------------------------------------------------------
# Measuring a window
# ---------------------------------------------------------------------------
METRIC_NAMES="'store_requests','store_bytes_read','store_bytes_written','store_failures','heartbeats_sent','heartbeats_failed','lease_expiries','promotions','store_whole_reads'"
# metrics_sum -> the metrics above summed over the nodes (space separated),
# or "" when a node did not answer
metrics_sum() {
	local p v sums="0 0 0 0 0 0 0 0 0"
	for p in "${FPORTS[@]}"; do
		v=$(qt "$p" -c "SELECT string_agg(coalesce(m.value, 0)::bigint::text, ' ' ORDER BY o)
			FROM unnest(ARRAY[$METRIC_NAMES]) WITH ORDINALITY AS x(n, o) LEFT JOIN felix_metrics m ON m.name = x.n" 2>/dev/null) || { echo ""; return 0; }
		sums=$(awk -v a="$sums" -v b="$v" 'BEGIN { n = split(a, x, " "); split(b, y, " "); for (i = 1; i <= n; i++) printf "%s%.0f", (i > 1 ? " " : ""), x[i] + y[i]; print "" }')
	done
	echo "$sums"
}
ticks_now() {	# -> "node1 .. nodeN | e1 e2 e3" clock ticks
	local k out=""
	for (( k = 1; k <= NN; k++ )); do out="$out $(server_cpu_ticks "$(node_dir "$k")")"; done
	out="$out |"
	if [[ $STORE == etcd ]]; then
		for k in 1 2 3; do out="$out $(proc_cpu_ticks $(etcd_pid "$k"))"; done
	fi
	echo "$out"
}
# measure_window SECONDS -> W_NODES (per node %), W_MEAN, W_MAX, W_ETCD
# (per member %, list), W_ETCD_MEAN, W_REQ, W_RD, W_WR (per second; KB),
# W_DIAG (heartbeats failed, store failures, lease expiries, promotions, whole reads of the state)
measure_window() {
	local s=$1 m0 m1 t0 t1 a0 a1 dt b0 b1 mdt
	b0=$(now); m0=$(metrics_sum); b0=$(awk -v a="$b0" -v b="$(now)" 'BEGIN { printf "%.6f", (a + b) / 2 }')
	t0=$(ticks_now); a0=$(now)
	sleep "$s"
	t1=$(ticks_now); a1=$(now)
	b1=$(now); m1=$(metrics_sum); b1=$(awk -v a="$b1" -v b="$(now)" 'BEGIN { printf "%.6f", (a + b) / 2 }')
	dt=$(awk -v a="$a0" -v b="$a1" 'BEGIN { printf "%.6f", b - a }')
	mdt=$(awk -v a="$b0" -v b="$b1" 'BEGIN { printf "%.6f", b - a }')
	read -r W_NODES W_MEAN W_MAX <<<"$(awk -v a="${t0%|*}" -v b="${t1%|*}" -v dt="$dt" -v hz="$CLK_TCK" 'BEGIN {
		n = split(a, x, " "); split(b, y, " "); l = ""; sum = 0; mx = 0
		for (i = 1; i <= n; i++) { v = (y[i] - x[i]) / hz / dt * 100; l = l (i > 1 ? "/" : "") sprintf("%.1f", v); sum += v; if (v > mx) mx = v }
		printf "%s %.2f %.2f\n", l, sum / n, mx }')"
	W_ETCD="n/a"; W_ETCD_MEAN="n/a"
	if [[ $STORE == etcd ]]; then
		read -r W_ETCD W_ETCD_MEAN <<<"$(awk -v a="${t0#*|}" -v b="${t1#*|}" -v dt="$dt" -v hz="$CLK_TCK" 'BEGIN {
			n = split(a, x, " "); split(b, y, " "); l = ""; sum = 0
			for (i = 1; i <= n; i++) { v = (y[i] - x[i]) / hz / dt * 100; l = l (i > 1 ? "/" : "") sprintf("%.1f", v); sum += v }
			printf "%s %.2f\n", l, sum / n }')"
	fi
	W_REQ="n/a"; W_RD="n/a"; W_WR="n/a"; W_DIAG="metrics not readable"
	if [[ -n $m0 && -n $m1 ]]; then
		read -r W_REQ W_RD W_WR W_DIAG <<<"$(awk -v a="$m0" -v b="$m1" -v dt="$mdt" 'BEGIN {
			split(a, x, " "); split(b, y, " ")
			printf "%.1f %.1f %.1f hb-failed=%d,store-failures=%d,lease-expiries=%d,promotions=%d,whole-reads=%d\n",
				(y[1] - x[1]) / dt, (y[2] - x[2]) / dt / 1024, (y[3] - x[3]) / dt / 1024,
				y[6] - x[6], y[4] - x[4], y[7] - x[7], y[8] - x[8], y[9] - x[9] }')"
	fi
	return 0
}

# ---------------------------------------------------------------------------
# Load: pgbench on each node over the shards it leads
# ---------------------------------------------------------------------------
run_load() {	# key
	local key=$1 k n leaders=() counts=() pids=() rate c script total_tx=0 failed=0 out tx tps tpsl="" errs="" v refused="" refused_n=0 line
	script=$(write_script scale-load "\\set r random(1, :nled)
SELECT bench_pub(l.stream, '$PAYLOAD'::jsonb, l.shard) FROM bench_led l WHERE l.i = :r;")
	for (( k = 1; k <= NN; k++ )); do
		n=$(qt "${FPORTS[$((k - 1))]}" -c "TRUNCATE bench_err; DROP TABLE IF EXISTS bench_led;
			CREATE TABLE bench_led AS SELECT (row_number() OVER ())::int AS i, stream, shard FROM felix_shards WHERE role = 'leader' AND lease_remaining_ms > 0;
			SELECT count(*) FROM bench_led" 2>/dev/null || echo 0)
		counts[$k]=$n
		[[ $n =~ ^[0-9]+$ && $n -gt 0 ]] && leaders+=("$k")
	done
	if (( ${#leaders[@]} == 0 )); then
		SANITY+=("$key: no node leads a shard with a live lease; no load run")
		return 0
	fi
	rate=$(( (LOAD_RATE + ${#leaders[@]} - 1) / ${#leaders[@]} ))
	c=$(( (LOAD_CLIENTS + NN - 1) / NN ))
	for k in "${leaders[@]}"; do
		timeout $(( LOAD_SECONDS + 60 )) "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="${FPORTS[$((k - 1))]}" PGUSER=postgres PGDATABASE=postgres \
			"$PGBIN/pgbench" -n -M prepared -f "$script" -D nled="${counts[$k]}" -c "$c" -j 1 -R "$rate" -T $(( LOAD_SECONDS + 2 )) \
			>"$WORK/load-$key-node$k.out" 2>&1 &
		pids+=($!); BG_PIDS+=($!)
	done
	sleep 1
	measure_window "$LOAD_SECONDS"
	for (( k = 0; k < ${#pids[@]}; k++ )); do wait "${pids[$k]}" 2>/dev/null || true; done
	for k in "${leaders[@]}"; do
		out=$WORK/load-$key-node$k.out
		tx=$(awk '/^number of transactions actually processed:/ { split($6, a, "/"); print a[1]; exit }' "$out")
		tps=$(awk '/^tps = / { printf "%.0f", $3; exit }' "$out")
		total_tx=$(( total_tx + ${tx:-0} ))
		tpsl="$tpsl${tpsl:+/}${tps:-?}"
		if grep -q 'number of failed transactions: [1-9]\|aborted in command\|ERROR:\|FATAL:' "$out" || [[ -z $tx ]]; then
			failed=$(( failed + 1 ))
			errs="$errs node$k: $(grep -m1 -E 'ERROR|FATAL|aborted|failed transactions' "$out" | cut -c1-200 || true)"
		fi
		# publishes refused (bench_pub caught and counted them)
		v=$(qt "${FPORTS[$((k - 1))]}" -c "SELECT coalesce(sum(n), 0) FROM bench_err" 2>/dev/null || echo "?")
		refused="$refused${refused:+/}$v"
		[[ $v =~ ^[0-9]+$ ]] && refused_n=$(( refused_n + v ))
		while IFS= read -r line; do
			[[ -n $line ]] && LOAD_ERRS[$key]="${LOAD_ERRS[$key]:-}${LOAD_ERRS[$key]:+; }node$k: $line"
		done < <(qt "${FPORTS[$((k - 1))]}" -c "SELECT n || ' x ' || msg FROM bench_err ORDER BY n DESC LIMIT 3" 2>/dev/null || true)
	done
	LOADR[$key-refused]="$refused_n ($refused)"
	LOADR[$key-ok]=$(awk -v t="$total_tx" -v r="$refused_n" -v s="$(( LOAD_SECONDS + 2 ))" 'BEGIN { printf "%.0f", (t - r) / s }')
	LOADR[$key-tps]=$(awk -v t="$total_tx" -v s="$(( LOAD_SECONDS + 2 ))" 'BEGIN { printf "%.0f", t / s }')
	LOADR[$key-tpsl]=$tpsl
	LOADR[$key-failed]=$failed
	LOADR[$key-leaders]=${#leaders[@]}
	LOADR[$key-live]=$(for (( k = 1; k <= NN; k++ )); do printf '%s%s' "${counts[$k]:-?}" "$( (( k < NN )) && echo / || true)"; done)
	[[ -n $errs ]] && SANITY+=("$key load: pgbench errors on $failed node(s):$errs")
	LOADR[$key-cpu]=$W_NODES; LOADR[$key-mean]=$W_MEAN; LOADR[$key-max]=$W_MAX
	LOADR[$key-etcd]=$W_ETCD; LOADR[$key-etcdmean]=$W_ETCD_MEAN
	LOADR[$key-req]=$W_REQ; LOADR[$key-rd]=$W_RD; LOADR[$key-wr]=$W_WR; LOADR[$key-diag]=$W_DIAG
	log "  load: ${LOADR[$key-tps]} publish calls/s (per node $tpsl), ${LOADR[$key-refused]} refused, CPU % per node $W_NODES, etcd $W_ETCD, store $W_REQ req/s, $W_RD KB/s read, $W_WR KB/s written"
	for k in "${leaders[@]}"; do qt "${FPORTS[$((k - 1))]}" -c "DROP TABLE IF EXISTS bench_led" >/dev/null 2>&1 || true; done
	return 0
}

# ---------------------------------------------------------------------------
# Failover
# ---------------------------------------------------------------------------
# run_probe_files NODE-K TARGETS-FILE DEADLINE LABEL -> starts PROBE_SESSIONS
# sessions on node K; their outputs are $WORK/probe-LABEL-nodeK-j.txt
start_probes() {
	local k=$1 tf=$2 deadline=$3 label=$4 j arr f poll=0.05
	(( $(wc -l <"$tf") > 100 )) && poll=0.1
	for (( j = 0; j < PROBE_SESSIONS; j++ )); do
		arr=$(awk -v j="$j" -v s="$PROBE_SESSIONS" '(NR - 1) % s == j { printf "%s'\''%s'\''", (n++ ? "," : ""), $0 }' "$tf")
		[[ -n $arr ]] || continue
		f=$WORK/probe-$label-node$k-$j.sql
		printf "SET client_min_messages = notice;\nSELECT bench_probe(ARRAY[%s]::text[], %s, %s);\n" "$arr" "$deadline" "$poll" >"$f"
		chmod 644 "$f"
		setsid "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="${FPORTS[$((k - 1))]}" PGUSER=postgres PGDATABASE=postgres \
			timeout $(( FO_BOUND + 90 )) "$PGBIN/psql" -X -q -At -f "$f" \
			>"$WORK/probe-$label-node$k-$j.out" 2>"$WORK/probe-$label-node$k-$j.txt" &
		PROBE_PIDS+=($!)
	done
}
stop_probes() {
	local p k
	for p in "${PROBE_PIDS[@]}"; do kill -- "-$p" 2>/dev/null || true; done
	for p in "${PROBE_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	PROBE_PIDS=()
	# a backend whose psql went away runs bench_probe on until its
	# deadline, scanning felix_shards ten times a second: the next point's
	# idle CPU measured those scans (28% instead of 12% at 3,000 shards)
	for (( k = 1; k <= NN; k++ )); do
		qt "${FPORTS[$((k - 1))]}" -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query LIKE 'SELECT bench_probe(%' AND pid <> pg_backend_pid()" >/dev/null 2>&1 || true
	done
}
acks_of() { cat "$@" 2>/dev/null | awk '/NOTICE: +ack / { print $(NF - 1), $NF }' | sort -k1,1 -k2,2n | awk '!seen[$1]++'; }

failover() {	# key
	local key=$1 k victim="" best=-1 duty led tf n t_kill i done_n files=() pre_left pre_t0 stats d remain why
	PHASE="$key failover"
	duty=$(qt "${FPORTS[0]}" -c "SELECT string_agg(name, ',') FROM felix_nodes WHERE duty" 2>/dev/null || true)
	for (( k = 2; k <= NN; k++ )); do
		[[ ",$duty," == *",node$k,"* ]] && continue
		n=${LED[$k]:-0}
		(( n > best )) && { best=$n; victim=$k; }
	done
	[[ -n $victim ]] || { victim=2; best=${LED[2]:-0}; }
	tf=$WORK/targets-$key.txt
	qt "${FPORTS[0]}" -c "SELECT stream || '/' || shard FROM felix.assignments WHERE leader = 'node$victim' ORDER BY 1" >"$tf" 2>/dev/null || : >"$tf"
	n=$(wc -l <"$tf")
	FO[$key-victim]="node$victim"; FO[$key-led]=$n; FO[$key-duty]=${duty:-none}
	if (( n == 0 )); then
		SANITY+=("$key failover: node$victim leads no shard; not measured")
		return 0
	fi
	log "  failover: node$victim leads $n of $TOTAL shards (duties on ${duty:-?}); pre-check: one publish to each"
	# pre-check on the victim: every shard it leads takes a publish now
	pre_t0=$(now)
	start_probes "$victim" "$tf" "$(awk -v t="$(now)" 'BEGIN { printf "%.3f", t + 60 }')" "$key-pre"
	for (( i = 0; i < 700; i++ )); do
		done_n=$(acks_of "$WORK"/probe-"$key"-pre-node*.txt | wc -l)
		(( done_n >= n )) && break
		sleep 0.1
	done
	stop_probes
	pre_left=$(( n - done_n ))
	FO[$key-pre]="$done_n of $n in $(secs_since "$pre_t0") s"
	(( pre_left > 0 )) && SANITY+=("$key failover: before the kill, $pre_left of the $n shards node$victim leads took no publish within 60 s; first errors: $(cat "$WORK"/probe-"$key"-pre-node*.txt 2>/dev/null | awk '/NOTICE: +err /' | sed -E 's/^.*NOTICE: +//' | sed -n 1,3p | tr '\n' ';' || true)")
	sleep 1
	# probes on the survivors, then the kill
	local deadline
	deadline=$(awk -v t="$(now)" -v b="$FO_BOUND" 'BEGIN { printf "%.3f", t + 0.5 + b }')
	for (( k = 1; k <= NN; k++ )); do
		(( k == victim )) && continue
		start_probes "$k" "$tf" "$deadline" "$key"
	done
	sleep 0.5
	kill_node "$victim"
	t_kill=$KILLED_AT
	log "  killed node$victim (kill -9) at $(date +%H:%M:%S); probing on the other nodes (bound $FO_BOUND s)"
	for (( i = 0; i < (FO_BOUND + 5) * 10; i++ )); do
		done_n=$(acks_of "$WORK"/probe-"$key"-node*.txt | wc -l)
		(( done_n >= n )) && break
		(( $(left_s "$deadline") < -2 )) && break
		sleep 0.1
	done
	stop_probes
	files=("$WORK"/probe-"$key"-node*.txt)
	stats=$(acks_of "${files[@]}" | awk -v t="$t_kill" '{ print $2 - t }' | sort -n |
		awk '{ a[NR] = $1 } END { if (NR == 0) print "0 n/a n/a n/a"; else printf "%d %.3f %.3f %.3f\n", NR, a[1], a[int((NR + 1) / 2)], a[NR] }')
	read -r done_n FO[$key-first] FO[$key-median] FO[$key-last] <<<"$stats"
	remain=$(( n - done_n ))
	FO[$key-done]=$done_n; FO[$key-remain]=$remain
	if (( remain == 0 )); then FO[$key-all]=${FO[$key-last]}; else FO[$key-all]=""; fi
	FO[$key-errs]=$(cat "${files[@]}" 2>/dev/null | awk '/NOTICE: +err /' | sed -E 's/^.*NOTICE: +err [^ ]+ //' | cut -c1-220 | sort | uniq -c | sort -rn | sed -n 1,5p | awk '{ $1 = $1; print }' | tr '\n' ';' || true)
	if (( remain > 0 )); then
		why=$(comm -23 <(sort "$tf") <(acks_of "${files[@]}" | awk '{ print $1 }' | sort) | sed -n 1,200p | awk '{ printf "%s'\''%s'\''", (n++ ? "," : ""), $0 }')
		d=1; (( victim == 1 )) && d=2
		FO[$key-why]=$(qt "${FPORTS[$((d - 1))]}" -c "SELECT coalesce(leader, '-') || ' gen ' || generation || coalesce(': ' || unplaced_reason, ''), count(*)
			FROM felix.assignments WHERE stream || '/' || shard IN ($why) GROUP BY 1 ORDER BY 2 DESC LIMIT 4" 2>/dev/null | tr '\n' ';' | cut -c1-600 || true)
		log "  failover: $remain of $n shards NOT publishing after $FO_BOUND s (done: $done_n; first ${FO[$key-first]} s, median ${FO[$key-median]} s); now: ${FO[$key-why]}"
	else
		log "  failover: all $n shards publishing again after ${FO[$key-all]} s (first ${FO[$key-first]} s, median ${FO[$key-median]} s)"
	fi
	# bring the node back
	PHASE="$key restart of node$victim"
	local t0
	t0=$(now)
	if "${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$(node_dir "$victim")" -l "$WORK/server-$FPREFIX$victim.log" -w -t 300 start >/dev/null 2>&1; then
		if wait_alive_soft "$NN" 120; then
			settle
			FO[$key-back]="node$victim back and alive after $(secs_since "$t0") s; settled: $( ((SETTLED)) && echo "yes, in $SETTLE_S s" || echo "NO ($SETTLE_WHY)")"
			# its memory is measured afresh from here on
			if (( SETTLED )); then
				PSS_BASE[$victim]=$(server_pss_kb "$(node_dir "$victim")"); PSS_BASE_P[$victim]=$TOTAL; PSS_BASE_HELD[$victim]=${HELD[$victim]}
			fi
		else
			FO[$key-back]="node$victim started but not seen alive within 120 s"
			SANITY+=("$key: node$victim started again but node1 does not see $NN nodes alive within 120 s")
		fi
	else
		FO[$key-back]="node$victim did NOT start again within 300 s"
		SANITY+=("$key: node$victim did not start again within 300 s: $(tail -3 "$WORK/server-$FPREFIX$victim.log" | tr '\n' ' ')")
	fi
	sleep 2
	return 0
}

# restart_all key: stop every node at once (fast shutdown) and start them
# again; the time until the cluster has settled (every copy open, every
# lead with a live lease) is the figure.  With the embedded store every
# control-plane session then starts with an empty copy of the state.
restart_all() {
	local key=$1 k t0
	PHASE="$key restart of every node"
	log "  restart of every node at once"
	for (( k = 1; k <= NN; k++ )); do
		"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$(node_dir "$k")" -m fast -w -t 120 stop >/dev/null 2>&1 || true
	done
	t0=$(now)
	for (( k = 1; k <= NN; k++ )); do
		"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$(node_dir "$k")" -l "$WORK/server-$FPREFIX$k.log" -w -t 300 start >/dev/null 2>&1 ||
			{ RS[$key]="node$k did NOT start again"; SANITY+=("$key: node$k did not start again after the restart of every node"); return 0; }
	done
	settle
	RS[$key]=$( ((SETTLED)) && echo "settled $(secs_since "$t0") s after the start" || echo "**NOT settled** $(secs_since "$t0") s after the start: $SETTLE_WHY")
	log "  restart of every node: ${RS[$key]}"
	(( SETTLED )) || SANITY+=("$key: after the restart of every node the cluster did not settle within $SETTLE_MAX s ($SETTLE_WHY)")
	return 0
}

# ---------------------------------------------------------------------------
# One point
# ---------------------------------------------------------------------------
measure_point() {	# point deadline
	local P=$1 deadline=$2 key k pss held diffs="" perc=""
	key="$CK-$P"
	PHASE="$key: growing from $TOTAL"
	if (( $(left_s "$deadline") < IDLE_SECONDS + LOAD_SECONDS + 30 )); then
		SKIP[$key]="time budget"; ROWS+=("$key"); log "$key: skipped (time budget)"; return 0
	fi
	log "$key: growing from $TOTAL to $P shards"
	local from=$TOTAL
	grow_to "$P" "$deadline"
	GROW[$key]="$from -> $TOTAL: $G_SHARDS shards in $G_CALLS calls, $G_SECS s in felix_create_stream ($G_REFUSED refused)"
	log "  ${GROW[$key]}"
	ACT[$key]=$TOTAL
	ROWS+=("$key")
	PHASE="$key: settling"
	settle
	SETTLE[$key]=$( ((SETTLED)) && echo "$SETTLE_S" || echo "NOT settled after $SETTLE_S s: $SETTLE_WHY")
	(( SETTLED )) || SANITY+=("$key: the cluster did not settle within $SETTLE_MAX s ($SETTLE_WHY); measured anyway")
	sleep 3
	PHASE="$key: idle window"
	measure_window "$IDLE_SECONDS"
	IDLE[$key-cpu]=$W_NODES; IDLE[$key-mean]=$W_MEAN; IDLE[$key-max]=$W_MAX
	IDLE[$key-etcd]=$W_ETCD; IDLE[$key-etcdmean]=$W_ETCD_MEAN
	IDLE[$key-req]=$W_REQ; IDLE[$key-rd]=$W_RD; IDLE[$key-wr]=$W_WR; IDLE[$key-diag]=$W_DIAG
	log "  idle: CPU % per node $W_NODES (etcd members $W_ETCD), store $W_REQ req/s, $W_RD KB/s read, $W_WR KB/s written; $W_DIAG"
	# memory
	for (( k = 1; k <= NN; k++ )); do
		pss=$(server_pss_kb "$(node_dir "$k")")
		held=${HELD[$k]:-0}
		MEM[$key-pss$k]=$pss
		if [[ -z ${PSS_BASE[$k]:-} ]]; then
			PSS_BASE[$k]=$pss; PSS_BASE_P[$k]=$TOTAL; PSS_BASE_HELD[$k]=$held
		elif (( TOTAL > ${PSS_BASE_P[$k]} )); then
			diffs="$diffs $(awk -v a="${PSS_BASE[$k]}" -v b="$pss" -v s=$(( TOTAL - PSS_BASE_P[$k] )) 'BEGIN { printf "%.2f", (b - a) / s }')"
			(( held > ${PSS_BASE_HELD[$k]} )) &&
				perc="$perc $(awk -v a="${PSS_BASE[$k]}" -v b="$pss" -v s=$(( held - PSS_BASE_HELD[$k] )) 'BEGIN { printf "%.2f", (b - a) / s }')"
		fi
	done
	MEM[$key-pss]=""
	for (( k = 1; k <= NN; k++ )); do MEM[$key-pss]="${MEM[$key-pss]}${MEM[$key-pss]:+/}$(( ${MEM[$key-pss$k]} / 1024 ))"; done
	if [[ -n $diffs ]]; then
		MEM[$key-per]=$(echo "$diffs" | awk '{ s = 0; m = $1; for (i = 1; i <= NF; i++) { s += $i; if ($i > m) m = $i } printf "%.2f / %.2f", s / NF, m }')
		[[ -n $perc ]] && MEM[$key-percopy]=$(echo "$perc" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF }')
	fi
	log "  memory: Pss MB per node ${MEM[$key-pss]}; KB per shard (mean / max over nodes) ${MEM[$key-per]:-n/a}"
	PHASE="$key: load window"
	run_load "$key"
	# failover
	if [[ $NN == 3 && " $FAILOVER_POINTS " == *" $P "* ]]; then
		if (( $(left_s "$deadline") < 45 )); then
			FO[$key-skip]="time budget"; log "  failover skipped (time budget)"
		else
			FO[$key-run]=1
			failover "$key"
		fi
	fi
	if [[ $NN == 3 && " $RESTART_POINTS " == *" $P "* ]]; then
		if (( $(left_s "$deadline") < 60 )); then
			RS[$key]="skipped (time budget)"; log "  restart of every node skipped (time budget)"
		else
			restart_all "$key"
		fi
	fi
	return 0
}

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
log_error_summary() {	# logs... -> the 15 most frequent error lines, masked, with counts
	cat "$@" 2>/dev/null | grep -E 'ERROR|FATAL|PANIC|TRAP|terminated by signal' |
		sed -E 's/^[0-9-]+ [0-9:.]+ [A-Z]+ \[[0-9]+\] //; s/"[^"]*"/"..."/g; s/[0-9]+/N/g' | cut -c1-300 |
		sort | uniq -c | sort -rn | sed -n 1,15p || true
}
write_report() {
	local key s n P c r v a b fk
	{
		echo "## Scale benchmark: idle cost, creation and failover by shard count ($(date -u '+%Y-%m-%d %H:%M UTC'))"
		echo
		echo "Command: \`$CMDLINE\`"
		echo
		echo "Machine: $(nproc) CPUs ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), $(awk '/MemTotal/{printf "%.0f GB", $2 / 1048576}' /proc/meminfo), load before $LOAD_BEFORE; run took $(awk -v a="$RUN_T0" -v b="$(now)" 'BEGIN { printf "%.1f", (b - a) / 60 }') min."
		echo "PostgreSQL ${SERVER_VERSION:-?}, etcd ${ETCD_VERSION:-n/a}, felix.so ${FELIX_SO:-?}, tree ${GIT_STATE:-?}."
		echo "Streams of at most $STREAM_SHARDS shards, replication_factor 3, quorum; felix.max_shards = $MAX_SHARDS; other felix settings default (${FELIX_TIMING:-?})."
		echo "CPU is in % of one core (a 2-core machine has 200%); per node figures are listed node1/node2/..., node1 hosting the embedded store."
		echo
		echo "### Targets (issue 20; 3-node clusters)"
		echo
		echo "| target | store | measured | verdict |"
		echo "| --- | --- | --- | --- |"
		for s in $STORES; do
			a=${IDLE[$s-3-30-max]:-}; b=${IDLE[$s-3-3000-max]:-}
			echo "| idle CPU at 30 shards <= 5% of a core per node (busiest node) | $s | $(fmt2 "$a") % (mean $(fmt2 "${IDLE[$s-3-30-mean]:-}") %) | $(mark_le "$a" 5) |"
			r=$(ratio "$b" "$a")
			echo "| idle CPU at 3000 shards <= 2x 30 shards (busiest node) | $s | $(fmt2 "$b") % = ${r}x | $(mark_le "$r" 2) |"
			if [[ $s == etcd ]]; then
				a=$(awk -v x="${IDLE[$s-3-30-mean]:-}" -v y="${IDLE[$s-3-30-etcdmean]:-}" 'BEGIN { if (x == "" || y == "" || y == "n/a") print ""; else printf "%.2f", x + y }')
				b=$(awk -v x="${IDLE[$s-3-3000-mean]:-}" -v y="${IDLE[$s-3-3000-etcdmean]:-}" 'BEGIN { if (x == "" || y == "" || y == "n/a") print ""; else printf "%.2f", x + y }')
				echo "| (informational) idle CPU per host, felix node + etcd member, mean, 30 -> 3000 shards | $s | $(fmt2 "$a") % -> $(fmt2 "$b") % = $(ratio "$b" "$a")x | $(mark_le "$a" 5) / $(mark_le "$(ratio "$b" "$a")" 2) |"
			fi
			a=$(awk -v x="${IDLE[$s-3-30-rd]:-}" -v y="${IDLE[$s-3-30-wr]:-}" 'BEGIN { if (x == "" || y == "" || x == "n/a") print ""; else printf "%.1f", x + y }')
			b=$(awk -v x="${IDLE[$s-3-3000-rd]:-}" -v y="${IDLE[$s-3-3000-wr]:-}" 'BEGIN { if (x == "" || y == "" || x == "n/a") print ""; else printf "%.1f", x + y }')
			r=$(ratio "$b" "$a")
			echo "| idle control-plane traffic at 3000 shards <= 2x 30 shards (KB/s read + written) | $s | $(fmt1 "$a") -> $(fmt1 "$b") KB/s = ${r}x | $(mark_le "$r" 2) |"
			fk="$s-3"
			if [[ -n ${CRE[$fk-calls]:-} ]]; then
				v=${CRE[$fk-secs]}
				local lim
				lim=$(awk -v n="$CREATE_N" 'BEGIN { printf "%.1f", 10 * n / 1000 }')
				echo "| $CREATE_N shards created (from $CREATE_FROM) in <= $lim s, no refusal | $s | $v s, ${CRE[$fk-shards]} shards in ${CRE[$fk-calls]} calls, ${CRE[$fk-refused]} refused | $(mark_le "$v" "$lim") / $( ((${CRE[$fk-refused]} == 0 && ${CRE[$fk-shards]} >= CREATE_N)) && echo met || echo '**MISSED**') |"
			else
				echo "| $CREATE_N shards created (from $CREATE_FROM) in <= 10 s, no refusal | $s | not measured | n/a |"
			fi
			for P in $FAILOVER_POINTS; do
				key="$s-3-$P"
				local lim=5
				(( P <= 30 )) && lim=3
				if [[ -n ${FO[$key-run]:-} && -n ${FO[$key-led]:-} ]]; then
					if [[ -n ${FO[$key-all]:-} ]]; then v=${FO[$key-all]}; else v=""; fi
					echo "| every shard of a killed node publishing again <= $lim s ($P shards; it led ${FO[$key-led]}) | $s | $( [[ -n $v ]] && echo "$v s" || echo "${FO[$key-remain]:-?} of ${FO[$key-led]} still not publishing after $FO_BOUND s") (median shard ${FO[$key-median]:-n/a} s) | $( [[ -n $v ]] && mark_le "$v" "$lim" || echo '**MISSED**') |"
				else
					echo "| every shard of a killed node publishing again <= $lim s ($P shards) | $s | not measured${FO[$key-skip]:+ (${FO[$key-skip]})} | n/a |"
				fi
			done
		done
		echo
		echo "### Idle (${IDLE_SECONDS} s window, nothing published)"
		echo
		echo "| store | nodes | shards | CPU % per node (node1/...) | mean | max | etcd members % | store req/s | store KB/s read | store KB/s written | Pss MB per node | KB per shard per node (mean / max) | KB per copy held | settle s | control-plane health in window |"
		echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
		for key in "${ROWS[@]}"; do
			s=${key%%-*}; n=${key#*-}; n=${n%%-*}; P=${key##*-}
			if [[ -n ${SKIP[$key]:-} ]]; then
				echo "| $s | $n | $P | skipped: ${SKIP[$key]} | | | | | | | | | | | |"
				continue
			fi
			echo "| $s | $n | ${ACT[$key]}$( [[ ${ACT[$key]} != "$P" ]] && echo " (of $P)") | ${IDLE[$key-cpu]:-n/a} | $(fmt2 "${IDLE[$key-mean]:-}") | $(fmt2 "${IDLE[$key-max]:-}") | ${IDLE[$key-etcd]:-n/a} | ${IDLE[$key-req]:-n/a} | ${IDLE[$key-rd]:-n/a} | ${IDLE[$key-wr]:-n/a} | ${MEM[$key-pss]:-n/a} | ${MEM[$key-per]:-(base)} | ${MEM[$key-percopy]:-(base)} | ${SETTLE[$key]:-n/a} | ${IDLE[$key-diag]:-n/a} |"
		done
		echo
		echo "### Under load ($LOAD_RATE publishes/s in all, pgbench -R on each node leading shards over the shards it leads, $(( LOAD_CLIENTS )) clients split over the nodes; ${LOAD_SECONDS} s window)"
		echo
		echo "| store | nodes | shards | shards led with a live lease at the start, per node | publish calls/s (per loaded node) | acknowledged/s | refused (per loaded node) | CPU % per node | mean | max | etcd members % | store req/s | store KB/s read | store KB/s written | control-plane health |"
		echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
		for key in "${ROWS[@]}"; do
			[[ -n ${SKIP[$key]:-} || -z ${LOADR[$key-cpu]:-} ]] && continue
			s=${key%%-*}; n=${key#*-}; n=${n%%-*}
			echo "| $s | $n | ${ACT[$key]} | ${LOADR[$key-live]:-?} | ${LOADR[$key-tps]} (${LOADR[$key-tpsl]}) | ${LOADR[$key-ok]} | ${LOADR[$key-refused]} | ${LOADR[$key-cpu]} | $(fmt2 "${LOADR[$key-mean]}") | $(fmt2 "${LOADR[$key-max]}") | ${LOADR[$key-etcd]} | ${LOADR[$key-req]} | ${LOADR[$key-rd]} | ${LOADR[$key-wr]} | ${LOADR[$key-diag]} |"
		done
		for key in "${ROWS[@]}"; do
			[[ -n ${LOAD_ERRS[$key]:-} ]] && echo && echo "- $key, publishes refused under load (count x SQLSTATE message, names and numbers masked): ${LOAD_ERRS[$key]}"
		done
		echo
		echo "### Stream creation (felix_create_stream on node1, one call per stream)"
		echo
		echo "| store | nodes | step | time in calls, shards, refusals |"
		echo "| --- | --- | --- | --- |"
		for key in "${ROWS[@]}"; do
			[[ -n ${GROW[$key]:-} ]] || continue
			s=${key%%-*}; n=${key#*-}; n=${n%%-*}
			echo "| $s | $n | to ${key##*-} | ${GROW[$key]} |"
		done
		for c in "${CFGS[@]}"; do
			[[ -n ${CRE[$c-calls]:-} ]] || continue
			echo
			echo "- $c: the $CREATE_N shards from $CREATE_FROM on: ${CRE[$c-shards]} created in ${CRE[$c-calls]} calls, ${CRE[$c-secs]} s in all (slowest call ${CRE[$c-max]} s), ${CRE[$c-refused]} refused"
		done
		if (( ${#CREATE_ERRORS[@]} )); then
			echo
			echo "Refused calls:"
			echo
			for v in "${CREATE_ERRORS[@]:0:30}"; do echo "- $v"; done
		fi
		echo
		echo "### Failover: kill -9 of a node leading about a third of the shards (3-node clusters)"
		echo
		echo "| store | shards | node killed (duties on) | shards it led | pre-check publishes | all publishing again after | first / median / last shard s | not publishing at the ${FO_BOUND} s bound | node back |"
		echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
		for key in "${ROWS[@]}"; do
			[[ -n ${FO[$key-run]:-} || -n ${FO[$key-skip]:-} ]] || continue
			s=${key%%-*}
			if [[ -n ${FO[$key-skip]:-} ]]; then echo "| $s | ${ACT[$key]:-?} | skipped: ${FO[$key-skip]} | | | | | | |"; continue; fi
			echo "| $s | ${ACT[$key]} | ${FO[$key-victim]:-?} (${FO[$key-duty]:-?}) | ${FO[$key-led]:-?} | ${FO[$key-pre]:-n/a} | $( [[ -n ${FO[$key-all]:-} ]] && echo "${FO[$key-all]} s" || echo "**not within ${FO_BOUND} s**") | ${FO[$key-first]:-n/a} / ${FO[$key-median]:-n/a} / ${FO[$key-last]:-n/a} | ${FO[$key-remain]:-?} | ${FO[$key-back]:-?} |"
		done
		for key in "${ROWS[@]}"; do
			[[ -n ${FO[$key-errs]:-} || -n ${FO[$key-why]:-} ]] || continue
			echo
			echo "- $key: errors the probes got (count, first 20 distinct per session): ${FO[$key-errs]:-none}"
			[[ -n ${FO[$key-why]:-} ]] && echo "  - the shards still not publishing at the bound, as felix.assignments had them (leader, generation, reason: count): ${FO[$key-why]}"
		done
		echo
		echo "### Restart of every node at once (3-node clusters, at RESTART_POINTS)"
		echo
		for key in "${ROWS[@]}"; do
			[[ -n ${RS[$key]:-} ]] && echo "- $key: ${RS[$key]}"
		done
		echo
		echo "### Notes"
		echo
		echo "- Memory: Pss summed over a node's processes; KB per shard = (Pss now - Pss at the first point) / (shards now - shards then), per node, mean / max over the nodes; per copy held divides by the copies the node holds instead (3/5 of the shards on 5 nodes). A node restarted by a failover is measured again once it has settled, and compared with that from then on."
		echo "- Control-plane traffic: felix_metrics store_bytes_read / store_bytes_written (key + value bytes) / store_requests, summed over the nodes; with the embedded store node1 counts them for every node."
		echo "- After a failover the shards the killed node led stay with their new leaders, so later points of that cluster lead unevenly (new streams are placed over all nodes)."
		for v in "${NOTES[@]}"; do echo "- $v"; done
		if (( ${#SANITY[@]} )); then
			echo
			echo "### Problems"
			echo
			for v in "${SANITY[@]}"; do echo "- $v"; done
		fi
		echo
		echo "### Server log errors (the most frequent ERROR / FATAL / PANIC lines of each configuration's servers)"
		for c in "${CFGS[@]}"; do
			local pre logs=()
			pre="${c%%-*}"; pre="${pre:0:2}${c##*-}n"
			mapfile -t logs < <(ls "$WORK"/server-"$pre"*.log 2>/dev/null)
			(( ${#logs[@]} )) || continue
			echo
			echo "$c ($(cat "${logs[@]}" | grep -cE 'ERROR|FATAL|PANIC' || true) lines in all; count, then the line with names and numbers masked):"
			echo
			echo '```'
			log_error_summary "${logs[@]}"
			echo '```'
		done
	} >"$WORK/report.md"
	REPORT_DONE=1
	bench_publish "$WORK/report.md" "$RESULT_FILE"
}

# ---------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------
RUN_T0=$(now)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
GLOBAL_END=$(awk -v t="$RUN_T0" -v b="$BUDGET_MIN" 'BEGIN { printf "%.0f", t + b * 60 }')
FELIX_SO="$(md5sum "$PKGLIB/felix.so" | cut -c1-12)"
GIT_STATE=$(git -C "$SCRIPT_DIR" log -1 --format='%h %cs' 2>/dev/null || echo "no commit")
[[ -n $(git -C "$SCRIPT_DIR" status --porcelain -- "$SCRIPT_DIR/../../src" 2>/dev/null) ]] && GIT_STATE="$GIT_STATE + uncommitted changes in src/"
ETCD_VERSION=$(etcd --version 2>/dev/null | awk '/etcd Version/{print $3}' || true)

# configurations, 3-node ones first (they carry the targets), weighted for
# the budget: a 3-node one (failovers) counts 1.5
CONF_LIST=()
for n in 3 5; do
	[[ " $NODES " == *" $n "* ]] || continue
	for s in $STORES; do CONF_LIST+=("$s:$n"); done
done
weight() { [[ ${1#*:} == 3 ]] && echo 1.5 || echo 1; }
for (( ci = 0; ci < ${#CONF_LIST[@]}; ci++ )); do
	cfg=${CONF_LIST[$ci]}
	wsum=0
	for (( cj = ci; cj < ${#CONF_LIST[@]}; cj++ )); do wsum=$(awk -v a="$wsum" -v b="$(weight "${CONF_LIST[$cj]}")" 'BEGIN { print a + b }'); done
	CFG_DEADLINE=$(awk -v e="$GLOBAL_END" -v n="$(now)" -v w="$(weight "$cfg")" -v s="$wsum" 'BEGIN { printf "%.0f", n + (e - n) * w / s }')
	if (( $(left_s "$CFG_DEADLINE") < 60 )); then
		SANITY+=("configuration ${cfg/:/ with } nodes skipped: the time budget ran out")
		continue
	fi
	log "=== ${cfg%:*} store, ${cfg#*:} nodes (budget $(left_s "$CFG_DEADLINE") s) ==="
	start_config "${cfg%:*}" "${cfg#*:}"
	if [[ -z ${SERVER_VERSION:-} ]]; then
		SERVER_VERSION=$(q "${FPORTS[0]}" -c "SHOW server_version")
		FELIX_TIMING=$(q "${FPORTS[0]}" -c "SELECT string_agg(name || ' = ' || setting || coalesce(' ' || unit, ''), ', ' ORDER BY name)
			FROM pg_settings WHERE name IN ('felix.lease_duration', 'felix.heartbeat_interval', 'felix.node_expiry', 'felix.quorum_timeout', 'felix.max_shards_per_stream')")
		MAXPS=$(q "${FPORTS[0]}" -c "SHOW felix.max_shards_per_stream")
		(( STREAM_SHARDS <= MAXPS )) || { NOTES+=("STREAM_SHARDS $STREAM_SHARDS is above felix.max_shards_per_stream ($MAXPS); streams of $MAXPS used"); STREAM_SHARDS=$MAXPS; }
	fi
	for P in $POINTS; do
		(( P >= TOTAL )) || continue
		measure_point "$P" "$CFG_DEADLINE"
	done
	stop_config
done
PHASE=report
write_report
