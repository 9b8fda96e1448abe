#!/usr/bin/env bash
# test/bench/replication.sh -- felix replication benchmark (issue 3, "Benchmark").
#
# On this machine, in the same run and with the same server settings
# (fsync = on, synchronous_commit = on, shared_buffers = 256MB):
#
#   felix:  three nodes (node1 hosts the control plane, nodes 2 and 3 point
#           felix.control_conninfo at it), a 1-shard stream with
#           replication_factor = 3 and consistency = 'quorum';
#           felix_publish of a 100-byte jsonb record per transaction on the
#           shard's leader;
#   sync:   PostgreSQL synchronous replication: a primary and two streaming
#           standbys s1, s2 with synchronous_standby_names = 'ANY 1 (s1, s2)';
#           INSERT of the same row into a heap table on the primary.
#
# pgbench -M prepared at 1, 8 and 32 clients (rounds alternate which system
# goes first): tps, and p50 latency from pgbench's per-transaction log.
# Then the failover time with default felix settings, FAILOVERS times
# (median reported): a fresh quorum stream led by node2 or node3, four
# pgbench clients publishing on its leader, kill -9 of every process of the
# leader, and the time until the first publish acknowledged by the new
# leader (probe sessions publish on both other nodes every 20 ms).
#
# Prints a Markdown report and writes it to
# test/bench/results-replication-<date>.md.
#
# Usage:   test/bench/replication.sh         (as root or as a normal user)
# Env:     DURATION=20   seconds per pgbench point
#          ROUNDS=2      rounds per point, alternating the order of the systems
#          FAILOVERS=5   failover measurements (median reported)
#          QUICK=1       smoke run: 3 s points, 1 round, 3 failovers
#          KEEP=1        keep /tmp/felix-bench-repl (data dirs, logs) after exit
#          PGBIN=/usr/lib/postgresql/15/bin
#
# As root the servers and every client run as user `postgres`.  Six servers
# listen only on Unix sockets in /tmp/felix-bench-repl/sock, ports 5521-5523
# (felix) and 5531-5533 (sync replication); everything is stopped and the
# directory removed on exit.  Every loop is bounded and every wait has a
# timeout.

set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BASE=/tmp/felix-bench-repl
SOCK=$BASE/sock
WORK=$BASE/work
FPORTS=(5521 5522 5523)
SPORTS=(5531 5532 5533)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
	DURATION=${DURATION:-3}
	ROUNDS=${ROUNDS:-1}
	FAILOVERS=${FAILOVERS:-3}
else
	DURATION=${DURATION:-20}
	ROUNDS=${ROUNDS:-2}
	FAILOVERS=${FAILOVERS:-5}
fi
KEEP=${KEEP:-0}
CLIENTS=(1 8 32)

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMDLINE="DURATION=$DURATION ROUNDS=$ROUNDS FAILOVERS=$FAILOVERS QUICK=$QUICK $0${*:+ $*}"

for arg in "$@"; do
	case $arg in
		-h|--help) sed -n '2,40p' "$0"; exit 0 ;;
		*) echo "replication.sh: unknown argument '$arg' (parameters are environment variables; see --help)" >&2; exit 2 ;;
	esac
done
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 10 ]] || { echo "replication.sh: ROUNDS must be 1..10" >&2; exit 2; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 ]] || { echo "replication.sh: DURATION must be a positive integer" >&2; exit 2; }
[[ $FAILOVERS =~ ^[0-9]+$ && $FAILOVERS -ge 1 && $FAILOVERS -le 20 ]] || { echo "replication.sh: FAILOVERS must be 1..20" >&2; exit 2; }

BENCH_NAME=bench-repl
# shellcheck source=test/bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
bench_result_file replication

bench_run_user
bench_as_user

bench_require postgres initdb pg_ctl psql pgbench pg_basebackup pg_isready pg_config

STARTED=()
BG_PIDS=()
PROBE_PIDS=()
for port in "${FPORTS[@]}" "${SPORTS[@]}"; do
	if "$PGBIN/pg_isready" -q -h "$SOCK" -p "$port" -t 1 2>/dev/null; then
		die "a server from an earlier run still listens on $SOCK port $port; stop it first"
	fi
done
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bench_fresh_base

# ---- felix: three nodes ----
felix_cluster_start

# ---- PostgreSQL synchronous replication: primary + s1 + s2 ----
sync_cluster_start

SERVER_VERSION=$(q "${FPORTS[0]}" -c "SHOW server_version")
FELIX_TIMING=$(q "${FPORTS[0]}" -c "SELECT string_agg(name || ' = ' || setting || coalesce(' ' || unit, ''), ', ' ORDER BY name)
	FROM pg_settings WHERE name IN ('felix.lease_duration', 'felix.lease_margin', 'felix.lease_epsilon',
	                                'felix.heartbeat_interval', 'felix.node_expiry', 'felix.quorum_timeout')")
FELIX_VERSION=$(q "${FPORTS[0]}" -c "SELECT extversion FROM pg_extension WHERE extname = 'felix'")
FELIX_SO="$(md5sum "$PKGLIB/felix.so" | cut -c1-12), installed $(date -u -r "$PKGLIB/felix.so" '+%Y-%m-%d %H:%M:%S UTC')"
GIT_STATE=$(git -C "$SCRIPT_DIR" log -1 --format='%h %cs' 2>/dev/null || echo "no commit")
[[ -n $(git -C "$SCRIPT_DIR" status --porcelain -- "$SCRIPT_DIR/../../src" 2>/dev/null) ]] && GIT_STATE="$GIT_STATE + uncommitted changes in src/"

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
# The 100-byte payload, as in test/bench/run.sh.
PAYLOAD=$(q "${FPORTS[0]}" -c "SELECT jsonb_build_object('id', 0, 'pad', repeat('x', 80))::text")
PAYLOAD_LEN=${#PAYLOAD}
[[ $PAYLOAD_LEN == 100 ]] || die "payload text is $PAYLOAD_LEN bytes, expected 100"

# fsnap <leader port>: the leader's records_published fsyncs report_requests
# replica_reports, then the fsyncs of the two other nodes summed.
fsnap() {
	local p m v out="" other=0
	for m in records_published fsyncs report_requests replica_reports; do
		v=$(q "$1" -c "SELECT coalesce(max(value), 0)::bigint FROM felix_metrics WHERE name = '$m'")
		out="$out $v"
	done
	for p in "${FPORTS[@]}"; do
		[[ $p == "$1" ]] && continue
		v=$(q "$p" -c "SELECT coalesce(max(value), 0)::bigint FROM felix_metrics WHERE name = 'fsyncs'")
		other=$(( other + v ))
	done
	echo "$out $other"
}
DIAG_ROWS=()

SANITY=()
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------
# Throughput and latency
# ---------------------------------------------------------------------------
S_HEAP=$(write_script heap "\\set k random(1, 1000000)
INSERT INTO bench_heap (key, payload) VALUES ('cust-' || :k, '$PAYLOAD'::jsonb);")
declare -A TPS_SUM TPS_N TPS_LIST P50_SUM LAT_SUM LEADER_OF
point=0
for c in "${CLIENTS[@]}"; do
	for (( ROUND = 1; ROUND <= ROUNDS; ROUND++ )); do
		order="sync felix"
		(( ROUND % 2 == 0 )) && order="felix sync"
		for sys in $order; do
			point=$((point + 1))
			key="$sys-c$c"
			if [[ $sys == sync ]]; then
				q "${SPORTS[0]}" -c "DROP TABLE IF EXISTS bench_heap;
					CREATE TABLE bench_heap (seq bigserial PRIMARY KEY, key text, payload jsonb,
					                         published_at timestamptz DEFAULT now())" >/dev/null
				q "${SPORTS[0]}" -c "CHECKPOINT" >/dev/null
				pgbench_run "$key-r$ROUND" "${SPORTS[0]}" "$S_HEAP" "$c" "$DURATION"
				n=$(q "${SPORTS[0]}" -c "SELECT count(*) FROM bench_heap")
				target="bench_heap"
			else
				stream="bench_q_$point"
				q "${FPORTS[0]}" -c "SELECT felix_create_stream('$stream', replication_factor => 3, consistency => 'quorum')" >/dev/null
				port=$(leader_port "$stream") || die "no leader for $stream after 30 s"
				LEADER_OF[$key]="${LEADER_OF[$key]:-}${LEADER_OF[$key]:+ }$port"
				for p in "${FPORTS[@]}"; do q "$p" -c "CHECKPOINT" >/dev/null; done
				script=$(write_script "felix-$point" "\\set k random(1, 1000000)
SELECT felix_publish('$stream', '$PAYLOAD'::jsonb, key => 'cust-' || :k);")
				snap0=$(fsnap "$port")
				pgbench_run "$key-r$ROUND" "$port" "$script" "$c" "$DURATION"
				snap1=$(fsnap "$port")
				DIAG_ROWS+=("$(awk -v a="$snap0" -v b="$snap1" -v k="$key r$ROUND" 'BEGIN {
					n = split(a, x, " "); split(b, y, " ");
					for (i = 1; i <= n; i++) d[i] = y[i] - x[i];
					# leader: records fsyncs report_requests replica_reports; others: fsyncs batches_replicated
					printf "| %s | %d | %d | %d | %.1f | %d | %.1f | %.2f |", k, d[1], d[2], d[5],
						(d[2] ? d[1] / d[2] : 0), d[3], (d[3] ? d[1] / d[3] : 0), (d[3] ? d[4] / d[3] : 0) }')")
				n=$(q "$port" -c "SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0")
				target="$stream"
			fi
			if [[ -n ${PB_TX:-} && $n != "$PB_TX" ]]; then
				SANITY+=("$key round $ROUND: pgbench processed $PB_TX transactions but $target holds $n rows/records")
			fi
			record_point "$key"
		done
	done
done

# ---------------------------------------------------------------------------
# Failover time
# ---------------------------------------------------------------------------
FAILOVER_TIMES=()
FAILOVER_NOTES=()
PROBE_PIDS=()
for (( r = 1; r <= FAILOVERS; r++ )); do
	stream=$(pick_name "failover_r$r")
	q "${FPORTS[0]}" -c "SELECT felix_create_stream('$stream', replication_factor => 3, consistency => 'quorum')" >/dev/null
	port=$(leader_port "$stream") || die "no leader for $stream after 30 s"
	k=0
	for i in 0 1 2; do [[ ${FPORTS[$i]} == "$port" ]] && k=$((i + 1)); done
	(( k == 2 || k == 3 )) || die "$stream is led by node$k, expected node2 or node3"
	measure_failover "r$r" "$stream" "$port" "$k" kill_node "$k"
	ft=$FO_TIME
	if [[ -n $ft ]]; then
		FAILOVER_TIMES+=("$ft")
		newl=$(q "${FPORTS[0]}" -c "SELECT leader || ' at generation ' || generation FROM felix.assignments WHERE stream = '$stream' AND shard = 0")
		FAILOVER_NOTES+=("round $r: killed node$k, $newl served after $ft s")
		log "  failover round $r: killed node$k; first acknowledged publish on the new leader ($newl) after $ft s"
	else
		why=$(q "${FPORTS[0]}" -c "SELECT format('control plane: generation %s, leader %s, unplaced: %s', generation, leader, coalesce(unplaced_reason, 'no')) FROM felix.assignments WHERE stream = '$stream' AND shard = 0")
		for i in 1 2 3; do
			(( i == k )) && continue
			rep=$(q "${FPORTS[$((i - 1))]}" -c "SELECT string_agg(format('%s %s%s', follower, state, coalesce(' (' || last_error || ')', '')), '; ') FROM felix_replication WHERE stream = '$stream' AND shard = 0" 2>/dev/null || true)
			[[ -n $rep ]] && why="$why; node$i's followers: $rep"
		done
		FAILOVER_NOTES+=("round $r: killed node$k, no publish acknowledged within 30 s ($why)")
		SANITY+=("failover round $r: no publish acknowledged within 30 s of killing node$k")
		log "  failover round $r: no new leader within 30 s"
	fi
	start_node "f$k"
	wait_alive 3
done
FAILOVER_MEDIAN=$(median "${FAILOVER_TIMES[@]}")

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
CPU_MODEL=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
MEM=$(awk '/^MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)
FS=$(df -T "$BASE" | awk 'NR==2{print $2 " on " $1}')
{
	echo "# felix replication benchmark results ($(date -u '+%Y-%m-%d %H:%M UTC'))"
	echo
	if [[ $QUICK == 1 ]]; then
		echo "**QUICK smoke run: short points; not a measurement.**"
		echo
	fi
	echo "- command: \`$CMDLINE\`"
	echo "- machine: $(nproc) CPUs ($CPU_MODEL), $MEM RAM, kernel $(uname -r), $FS; all six servers on this one machine, Unix sockets"
	echo "- load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (the machine may be shared)"
	echo "- felix.so md5 $FELIX_SO; source tree at $GIT_STATE"
	echo "- PostgreSQL $SERVER_VERSION, felix $FELIX_VERSION; every server: shared_buffers = 256MB, max_connections = 100, fsync = on, synchronous_commit = on, full_page_writes = on, wal_level = replica, max_wal_size = 8GB, checkpoint_timeout = 30min, CHECKPOINT before every point"
	echo "- felix: 3 nodes, node1 hosts the control plane; a fresh 1-shard stream per point, replication_factor = 3, consistency = 'quorum', default lease settings; pgbench runs against the shard's leader"
	echo "- sync replication: primary + standbys s1, s2 (streaming, pg_basebackup -X stream), synchronous_standby_names = 'ANY 1 (s1, s2)'; a fresh heap table (bigserial primary key, key text, payload jsonb, published_at timestamptz) per point"
	echo "- payload: \`$PAYLOAD\` ($PAYLOAD_LEN bytes as text); keys \`cust-<n>\`"
	echo
	echo "## Results"
	echo
	echo "### Quorum publish (felix) vs synchronous-replication INSERT (tps)"
	echo
	echo "pgbench -n -M prepared -T $DURATION, -j min(clients, 2); one row/record per transaction. Mean of $ROUNDS round(s) per point (per-round values in brackets); rounds alternate which system goes first."
	echo
	echo "| clients | sync replication INSERT | felix quorum publish | ratio felix/sync | target ≥ 1.0 (8, 32 clients) |"
	echo "| ---: | ---: | ---: | ---: | --- |"
	for c in "${CLIENTS[@]}"; do
		ts=$(mean_of TPS_SUM "sync-c$c"); tf=$(mean_of TPS_SUM "felix-c$c")
		ts=${ts:+$(printf '%.1f' "$ts")}; tf=${tf:+$(printf '%.1f' "$tf")}
		rr=$(ratio "$tf" "$ts")
		tgt=""; [[ $c != 1 ]] && tgt=$(mark_ge "$rr" 1.0)
		echo "| $c | ${ts:-error} [${TPS_LIST[sync-c$c]:-}] | ${tf:-error} [${TPS_LIST[felix-c$c]:-}] | $rr | $tgt |"
	done
	echo
	echo "### Latency (ms)"
	echo
	echo "p50 from pgbench's per-transaction log (-l), mean of the rounds; average as pgbench reports it."
	echo
	echo "| clients | sync p50 | felix p50 | ratio felix/sync | target ≤ 2.0 (1 client) | sync avg | felix avg |"
	echo "| ---: | ---: | ---: | ---: | --- | ---: | ---: |"
	for c in "${CLIENTS[@]}"; do
		ps=$(mean_of P50_SUM "sync-c$c"); pf=$(mean_of P50_SUM "felix-c$c")
		as=$(mean_of LAT_SUM "sync-c$c"); af=$(mean_of LAT_SUM "felix-c$c")
		rr=$(ratio "$pf" "$ps")
		tgt=""; [[ $c == 1 ]] && tgt=$(mark_le "$rr" 2.0)
		echo "| $c | ${ps:-error} | ${pf:-error} | $rr | $tgt | ${as:-?} | ${af:-?} |"
	done
	echo
	echo "### Failover time (kill -9 of the leader to the first publish acknowledged by the new leader)"
	echo
	echo "Default felix settings ($FELIX_TIMING). Each round: a fresh quorum stream led by node2 or node3, 4 pgbench clients publishing on the leader for 2 s, then every process of the leader killed with SIGKILL at once; probe sessions on the two other nodes publish every 20 ms until one is acknowledged. The killed node is restarted before the next round."
	echo
	echo "| rounds | times (s) | median (s) | target ≤ 3 s |"
	echo "| ---: | --- | ---: | --- |"
	echo "| ${#FAILOVER_TIMES[@]} of $FAILOVERS | ${FAILOVER_TIMES[*]:-none} | ${FAILOVER_MEDIAN:-n/a} | $(mark_le "${FAILOVER_MEDIAN:-}" 3.0) |"
	echo
	for n in "${FAILOVER_NOTES[@]}"; do echo "- $n"; done
	echo
	echo "## Diagnostics"
	echo
	echo "### felix points: flushes and control-plane reports"
	echo
	echo "felix_metrics deltas over each point: on the leader, records published, fsyncs (group flushes) and felix.cp_report requests (each a transaction on the control plane, node1: periodic and after lease renewals, and whenever a quorum mark cannot move until the control plane hears that a follower is behind); the followers' fsyncs summed."
	echo
	echo "| point | records | leader fsyncs | follower fsyncs | records/leader fsync | report requests | records/report | rows/report |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
	for r in "${DIAG_ROWS[@]}"; do echo "$r"; done
	echo
	echo "### felix_metrics on each node at the end of the run"
	echo
	echo "| name | node1 | node2 | node3 |"
	echo "| --- | ---: | ---: | ---: |"
	q "${FPORTS[0]}" -c "SELECT name FROM felix_metrics ORDER BY name" | while read -r m; do
		row="| $m"
		for p in "${FPORTS[@]}"; do row="$row | $(q "$p" -c "SELECT round(value::numeric, 2) FROM felix_metrics WHERE name = '$m'" 2>/dev/null || echo '?')"; done
		echo "$row |"
	done
	echo
	echo "### Sanity checks"
	echo
	if (( ${#SANITY[@]} == 0 )); then
		echo "All passed: every pgbench transaction is one row in the heap table / one record in the felix shard (next_seq), and every failover round served a publish on a new leader."
	else
		for s in "${SANITY[@]}"; do echo "- **FAILED**: $s"; done
		echo
		echo "First distinct ERROR/FATAL/PANIC lines of the felix servers' logs:"
		echo
		bench_log_errors "$WORK"/server-f*.log
	fi
	echo
} >"$WORK/final.md"

bench_publish "$WORK/final.md" "$RESULT_FILE"
