#!/usr/bin/env bash
# test/bench/run.sh -- felix vs heap benchmark (issue 2, "Benchmark").
#
# Starts ONE scratch PostgreSQL 15 server with felix preloaded and measures,
# in the same run and with the same settings (synchronous_commit = on,
# fsync = on, felix durable acknowledgements), 100-byte jsonb records:
#
#   1. felix_publish (1-shard and 8-shard leader streams) vs INSERT into a heap
#      table, pgbench -M prepared at 1, 8 and 32 clients;
#   2. felix_publish_batch of 1,000 records per call vs INSERT ... SELECT of the
#      same 1,000 rows, at 1 and 4 clients;
#   3. seek read of 100 records at seq 900,000 of a 1M-record shard vs the same
#      read at seq 0 (pgbench mean latency), plus EXPLAIN (ANALYZE);
#   4. full scan of the 1M records vs a heap seq scan of the same rows.
#
# Prints a Markdown report and writes it to test/bench/results-<date>.md.
#
# Usage:   test/bench/run.sh                 (as root or as a normal user)
# Env:     DURATION=20    seconds per pgbench point (publish and batch cases)
#          QUICK=1        smoke run: 3 s points, 100k records instead of 1M
#          RECORDS=N      records loaded for the read cases (default 1000000)
#          ROUNDS=2       rounds per publish/batch point, alternating the order
#                         of the variants (default 2, 1 when QUICK=1)
#          SEEK_SECONDS=5 seconds per seek-latency point
#          FSYNC_TEST=1   run pg_test_fsync for the machine section (default 1,
#                         0 when QUICK=1)
#          KEEP=1         keep /tmp/felix-bench (data dir, logs) after exit
#          PGBIN=/usr/lib/postgresql/15/bin
#
# As root the server and every client run as user `postgres`.  The server
# listens on 127.0.0.1:5497 and on a unix socket directory under
# /tmp/felix-bench; it is stopped and the directory removed on exit.
# Every loop is bounded and every wait has a timeout.
#
# Exit status: 0 when every point ran and every sanity check passed, 3 when a
# point failed or a check did not hold (the report says which), 1 when the
# server could not be set up, 2 on bad parameters.

set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BASE=/tmp/felix-bench
DATA=$BASE/data
SOCK=$BASE/sock
WORK=$BASE/work
PORT=5497
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
	DURATION=${DURATION:-3}
	RECORDS=${RECORDS:-100000}
	SEEK_SECONDS=${SEEK_SECONDS:-3}
	FSYNC_TEST=${FSYNC_TEST:-0}
	ROUNDS=${ROUNDS:-1}
else
	DURATION=${DURATION:-20}
	RECORDS=${RECORDS:-1000000}
	SEEK_SECONDS=${SEEK_SECONDS:-5}
	FSYNC_TEST=${FSYNC_TEST:-1}
	ROUNDS=${ROUNDS:-2}
fi
KEEP=${KEEP:-0}
CLIENTS_PUBLISH=(1 8 32)
CLIENTS_BATCH=(1 4)
BATCH_SIZE=1000
LOAD_CHUNK=10000

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMDLINE="DURATION=$DURATION ROUNDS=$ROUNDS QUICK=$QUICK RECORDS=$RECORDS SEEK_SECONDS=$SEEK_SECONDS FSYNC_TEST=$FSYNC_TEST $0${*:+ $*}"
STAMP=$(date -u +%Y-%m-%d-%H%M)
SUFFIX=""
[[ $QUICK == 1 ]] && SUFFIX="-quick"
RESULT_FILE=$SCRIPT_DIR/results-$STAMP$SUFFIX.md

for arg in "$@"; do
	case $arg in
		-h|--help) sed -n '2,38p' "$0"; exit 0 ;;
		*) echo "run.sh: unknown argument '$arg' (parameters are environment variables; see --help)" >&2; exit 2 ;;
	esac
done

[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 10 ]] || { echo "run.sh: ROUNDS must be 1..10" >&2; exit 2; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 ]] || { echo "run.sh: DURATION must be a positive integer" >&2; exit 2; }
[[ $RECORDS =~ ^[0-9]+$ && $RECORDS -ge $LOAD_CHUNK ]] || { echo "run.sh: RECORDS must be an integer >= $LOAD_CHUNK" >&2; exit 2; }
(( RECORDS % LOAD_CHUNK == 0 )) || { echo "run.sh: RECORDS must be a multiple of $LOAD_CHUNK" >&2; exit 2; }
SEEK_AT=$(( RECORDS * 9 / 10 ))

BENCH_NAME=bench
# shellcheck source=test/bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

# ---------------------------------------------------------------------------
# Who runs the server
# ---------------------------------------------------------------------------
bench_run_user
PGENV=(PGHOST="$SOCK" PGPORT="$PORT" PGUSER=postgres PGDATABASE=postgres PGAPPNAME=felix-bench
       PGOPTIONS="-c client_min_messages=warning")
# AS_PG: prefix that runs a command as the server's user with the connection
# environment set (usable after `timeout`).
if [[ $(id -u) == 0 ]]; then
	AS_PG=(runuser -u "$RUN_USER" -- env "${PGENV[@]}")
else
	AS_PG=(env "${PGENV[@]}")
fi
as_pg() { "${AS_PG[@]}" "$@"; }
# psql: quiet, no psqlrc, stop on the first error, unaligned tuples only.
q() { as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -At "$@"; }

bench_require postgres initdb pg_ctl psql pgbench pg_isready pg_config

# ---------------------------------------------------------------------------
# Scratch directory, server start, cleanup
# ---------------------------------------------------------------------------
SERVER_STARTED=0
SAMPLER_PID=""
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [[ -n $SAMPLER_PID ]] && kill -0 "$SAMPLER_PID" 2>/dev/null; then
		kill "$SAMPLER_PID" 2>/dev/null || true
		wait "$SAMPLER_PID" 2>/dev/null || true
	fi
	if [[ $SERVER_STARTED == 1 ]]; then
		log "stopping server"
		as_pg "$PGBIN/pg_ctl" -D "$DATA" -m fast -t 60 -w stop >/dev/null 2>&1 ||
			as_pg "$PGBIN/pg_ctl" -D "$DATA" -m immediate -t 30 -w stop >/dev/null 2>&1 || true
	fi
	if [[ $KEEP == 1 ]]; then
		log "KEEP=1: leaving $BASE in place"
	elif [[ -d $BASE ]]; then
		rm -rf "$BASE"
	fi
	exit "$rc"
}

if [[ -f $DATA/postmaster.pid ]]; then
	oldpid=$(head -1 "$DATA/postmaster.pid" 2>/dev/null || true)
	if [[ -n $oldpid ]] && kill -0 "$oldpid" 2>/dev/null; then
		die "a server from an earlier bench run is still running on $DATA (pid $oldpid); stop it with: $PGBIN/pg_ctl -D $DATA stop"
	fi
fi
if "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -t 2; then
	die "something already listens on 127.0.0.1:$PORT; stop it first"
fi

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$BASE"
mkdir -p "$DATA" "$SOCK" "$WORK"
chmod 700 "$DATA"
chmod 755 "$BASE" "$WORK"
if [[ $(id -u) == 0 ]]; then
	chown -R "$RUN_USER": "$BASE"
fi
cd "$BASE"	# a directory the server's user can enter

log "initdb in $DATA (as $RUN_USER)"
as_pg "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 ||
	as_pg "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-locale >"$WORK/initdb.log" 2>&1 ||
	{ cat "$WORK/initdb.log" >&2; die "initdb failed"; }

cat >>"$DATA/postgresql.conf" <<EOF

# ---- felix bench settings (test/bench/run.sh) ----
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCK'
max_connections = 100
shared_buffers = 256MB
shared_preload_libraries = 'felix'
fsync = on
synchronous_commit = on
full_page_writes = on
wal_level = replica
max_wal_size = 8GB
min_wal_size = 1GB
checkpoint_timeout = 30min
logging_collector = off
log_min_messages = warning
log_checkpoints = on
felix.database = 'postgres'
EOF

log "starting server on 127.0.0.1:$PORT"
as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$WORK/server.log" -w -t 60 start >/dev/null ||
	{ tail -40 "$WORK/server.log" >&2 || true; die "server did not start"; }
SERVER_STARTED=1
q -c "CREATE EXTENSION felix" || { tail -20 "$WORK/server.log" >&2; die "CREATE EXTENSION felix failed"; }
# The node worker must have announced this node before a stream can be
# created (felix refuses with "no node is alive" until then): retry a
# probe stream for up to 60 s.
for (( i = 0; ; i++ )); do
	if q -c "SELECT felix_create_stream('bench_probe')" >/dev/null 2>"$WORK/probe.err"; then
		q -c "SELECT felix_drop_stream('bench_probe')" >/dev/null
		break
	fi
	(( i < 60 )) || { cat "$WORK/probe.err" >&2; die "felix_create_stream still fails after 60 s"; }
	sleep 1
done
SERVER_VERSION=$(q -c "SHOW server_version")
FELIX_SO="$(md5sum "$PKGLIB/felix.so" | cut -c1-12), installed $(date -u -r "$PKGLIB/felix.so" '+%Y-%m-%d %H:%M:%S UTC')"
GIT_STATE=$(git -C "$SCRIPT_DIR" log -1 --format='%h %cs' 2>/dev/null || echo "no commit")
FELIX_VERSION=$(q -c "SELECT extversion FROM pg_extension WHERE extname = 'felix'")

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
# The 100-byte payload: {"id": <n>, "pad": "xxx..."} whose jsonb text is
# 19 + digits(n) + pad characters; pad = 81 - digits(n) makes it 100.
PAYLOAD_SQL_CONST="jsonb_build_object('id', 0, 'pad', repeat('x', 80))"
payload_expr() { echo "jsonb_build_object('id', $1, 'pad', repeat('x', 81 - length(($1)::text)))"; }
PAYLOAD=$(q -c "SELECT $PAYLOAD_SQL_CONST::text")
PAYLOAD_LEN=$(q -c "SELECT length('$PAYLOAD'::jsonb::text)")
[[ $PAYLOAD_LEN == 100 ]] || die "payload text is $PAYLOAD_LEN bytes, expected 100"

write_script() {	# name, content -> path (readable by the server user)
	local f=$WORK/$1.sql
	printf '%s\n' "$2" >"$f"
	chmod 644 "$f"
	echo "$f"
}

# Wait (bounded) until the server accepts connections again, e.g. after a
# backend crash made the postmaster reinitialise.
wait_ready() {
	local i
	for (( i = 0; i < 120; i++ )); do
		if as_pg "$PGBIN/psql" -X -q -At -c "SELECT 1" >/dev/null 2>&1; then return 0; fi
		sleep 1
	done
	die "server did not come back within 120 s; see $WORK/server.log"
}
crashes() { grep -c 'was terminated by signal' "$WORK/server.log" || true; }

# pgbench_run <label> <script> <clients> <seconds> -> sets PB_TPS PB_LAT PB_TX PB_OK
pgbench_run() {
	local label=$1 script=$2 c=$3 t=$4 j out
	j=$(( c < 2 ? c : 2 ))
	out=$WORK/pgbench-$label.out
	PB_TPS=""; PB_LAT=""; PB_TX=""; PB_OK=1
	if ! timeout $(( t + 180 )) "${AS_PG[@]}" PGAPPNAME=felix-pgbench "$PGBIN/pgbench" -n -M prepared -f "$script" -c "$c" -j "$j" -T "$t" >"$out" 2>&1; then
		PB_OK=0
		log "pgbench $label FAILED; output:"
		tail -20 "$out" >&2
	fi
	PB_TPS=$(awk '/^tps = /{printf "%.1f", $3; exit}' "$out")
	PB_LAT=$(awk '/^latency average = /{print $4; exit}' "$out")
	PB_TX=$(awk '/^number of transactions actually processed:/{print $6; exit}' "$out")
	PB_TX=${PB_TX%%/*}
	if grep -q 'number of failed transactions: [1-9]\|aborted in command\|ERROR:' "$out"; then
		PB_OK=0
		log "pgbench $label reported errors:"
		grep -m5 'failed\|aborted\|ERROR' "$out" >&2 || true
	fi
	[[ -n $PB_TPS ]] || PB_OK=0
	if [[ $PB_OK == 0 ]]; then
		SANITY+=("pgbench point $label failed: $(grep -m1 'error' "$out" || echo 'no tps reported')")
		wait_ready
	fi
	log "  $label: c=$c tps=${PB_TPS:-?} lat=${PB_LAT:-?} ms tx=${PB_TX:-?}"
}

# Wait-event sampler: every 0.5 s, the wait events of active client
# backends (other than the sampler); bounded to the point's duration.
sampler_start() {	# file, seconds
	local f=$1 n=$(( $2 * 2 ))
	: >"$f"
	(
		for (( i = 0; i < n; i++ )); do
			q -c "SELECT coalesce(wait_event_type, 'CPU') || ':' || coalesce(wait_event, 'running')
			        FROM pg_stat_activity
			       WHERE backend_type = 'client backend' AND state = 'active'
			         AND application_name = 'felix-pgbench'" >>"$f" 2>/dev/null || true
			sleep 0.5
		done
	) &
	SAMPLER_PID=$!
}
sampler_stop() {
	if [[ -n $SAMPLER_PID ]]; then
		kill "$SAMPLER_PID" 2>/dev/null || true
		wait "$SAMPLER_PID" 2>/dev/null || true
		SAMPLER_PID=""
	fi
}
sampler_summary() {	# file -> "IPC:X 45%, CPU:running 30%, ..." (top 4)
	local f=$1 total
	total=$(grep -c . "$f" || true)
	if [[ ${total:-0} == 0 ]]; then echo "no samples"; return; fi
	sort "$f" | uniq -c | sort -rn | head -4 |
		awk -v t="$total" '{printf "%s%s %d%%", (NR>1?", ":""), $2, int(100*$1/t+0.5)} END {print ""}'
}

metric() { q -c "SELECT coalesce(max(value), 0)::bigint FROM felix_metrics WHERE name = '$1'"; }
wal_syncs() { q -c "SELECT wal_sync FROM pg_stat_wal"; }


# create_stream <name> <shards>: felix_create_stream, retried (bounded).  If
# the call fails but the stream exists afterwards (felix's node agent can
# create a stream's table from the control plane's catalog at the same
# moment), the stream is used and the failure recorded as a warning.
create_stream() {
	local name=$1 shards=$2 err i
	for (( i = 0; i < 5; i++ )); do
		if q -c "SELECT felix_create_stream('$name', shards => $shards)" >/dev/null 2>"$WORK/create.err"; then
			return 0
		fi
		err=$(grep -m1 'ERROR' "$WORK/create.err" || head -1 "$WORK/create.err")
		sleep 1
		if [[ $(q -c "SELECT count(*) FROM felix_shards WHERE stream = '$name'" 2>/dev/null) == "$shards" ]]; then
			WARNINGS+=("felix_create_stream('$name', shards => $shards) failed with \"$err\", yet the stream existed a second later; it was used")
			return 0
		fi
		WARNINGS+=("felix_create_stream('$name', shards => $shards) failed with \"$err\"; retrying")
	done
	die "felix_create_stream('$name') keeps failing; see $WORK/create.err"
}
drop_stream() {	# name; failures are warnings (the point is already measured)
	if ! q -c "SELECT felix_drop_stream('$1')" >/dev/null 2>"$WORK/drop.err"; then
		WARNINGS+=("felix_drop_stream('$1') failed: $(grep -m1 'ERROR' "$WORK/drop.err" || head -1 "$WORK/drop.err")")
	fi
}
recreate_heap() {	# name
	q -c "DROP TABLE IF EXISTS $1;
	      CREATE TABLE $1 (seq bigserial PRIMARY KEY, key text, payload jsonb,
	                       published_at timestamptz DEFAULT now())"
}
stream_records() { q -c "SELECT coalesce(sum(next_seq - start_seq), 0) FROM felix_shards WHERE stream = '$1'"; }

REPORT=$WORK/report.md
DIAG=$WORK/diag.md
: >"$REPORT"
: >"$DIAG"
SANITY=()
WARNINGS=()

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# measure_point <key> <kind heap|felix> <table/stream> <shards> <script> <clients> <rows per tx>
# Recreates the target empty, checkpoints, runs one pgbench point with the
# wait-event sampler, and accumulates into the arrays below (summed over
# rounds): tps, latency, felix flush counters or WAL syncs, wait samples.
declare -A T_SUM T_N T_LIST L_SUM D_FSYNC D_REC D_WAIT D_BATCH D_WAL D_ROWS
measure_point() {
	local key=$1 kind=$2 target=$3 shards=$4 script=$5 c=$6 per_tx=$7
	local r0 f0 w0 b0 ws0 r1 f1 w1 b1 ws1 n
	# Each felix point gets a stream of its own (name suffixed with the
	# point and round), dropped after the point; heap points recreate
	# their table.
	if [[ $kind == heap ]]; then
		recreate_heap "$target"
	else
		target="${target}_c${c}_r${ROUND}"
		create_stream "$target" "$shards"
	fi
	sed "s/@STREAM@/$target/g" "$script" >"$WORK/point.sql"
	chmod 644 "$WORK/point.sql"
	script=$WORK/point.sql
	q -c "CHECKPOINT"
	r0=$(metric records_published); f0=$(metric fsyncs); w0=$(metric flush_waits); b0=$(metric batches_appended)
	ws0=$(wal_syncs)
	sampler_start "$WORK/wait-$key.tmp" "$DURATION"
	pgbench_run "$key-r$ROUND" "$script" "$c" "$DURATION"
	sampler_stop
	cat "$WORK/wait-$key.tmp" >>"$WORK/wait-$key.txt"
	sleep 1	# let exiting backends flush their pg_stat_wal counters
	r1=$(metric records_published); f1=$(metric fsyncs); w1=$(metric flush_waits); b1=$(metric batches_appended)
	ws1=$(wal_syncs)
	if [[ $kind == heap ]]; then
		n=$(q -c "SELECT count(*) FROM $target")
	else
		n=$(stream_records "$target")
	fi
	T_LIST[$key]="${T_LIST[$key]:-}${T_LIST[$key]:+, }${PB_TPS:-error}"
	if [[ $PB_OK == 1 ]]; then
		T_SUM[$key]=$(awk -v a="${T_SUM[$key]:-0}" -v b="$PB_TPS" 'BEGIN{print a + b}')
		L_SUM[$key]=$(awk -v a="${L_SUM[$key]:-0}" -v b="${PB_LAT:-0}" 'BEGIN{print a + b}')
		T_N[$key]=$(( ${T_N[$key]:-0} + 1 ))
	fi
	D_FSYNC[$key]=$(( ${D_FSYNC[$key]:-0} + f1 - f0 ))
	D_REC[$key]=$(( ${D_REC[$key]:-0} + r1 - r0 ))
	D_WAIT[$key]=$(( ${D_WAIT[$key]:-0} + w1 - w0 ))
	D_BATCH[$key]=$(( ${D_BATCH[$key]:-0} + b1 - b0 ))
	D_WAL[$key]=$(( ${D_WAL[$key]:-0} + ws1 - ws0 ))
	D_ROWS[$key]=$(( ${D_ROWS[$key]:-0} + n ))
	if [[ -n ${PB_TX:-} && $n != "$(( PB_TX * per_tx ))" ]]; then
		SANITY+=("$key round $ROUND: pgbench processed $PB_TX transactions of $per_tx rows but $target holds $n rows/records")
	fi
	[[ $kind == heap ]] || drop_stream "$target"
}
mean_tps() {	# key [multiplier] -> mean tps over the successful rounds, or empty
	local k=$1 m=${2:-1}
	[[ ${T_N[$k]:-0} -gt 0 ]] || { echo ""; return; }
	awk -v s="${T_SUM[$k]}" -v n="${T_N[$k]}" -v m="$m" 'BEGIN{ if (m == 1) printf "%.1f", s / n * m; else printf "%.0f", s / n * m }'
}
mean_lat() {
	local k=$1
	[[ ${T_N[$k]:-0} -gt 0 ]] || { echo "?"; return; }
	awk -v s="${L_SUM[$k]}" -v n="${T_N[$k]}" 'BEGIN{printf "%.3f", s / n}'
}
flush_line() {	# key kind
	local k=$1
	if [[ $2 == heap ]]; then
		echo "${D_WAL[$k]} WAL syncs for ${D_ROWS[$k]} rows ($(ratio "${D_ROWS[$k]}" "${D_WAL[$k]}") rows/sync)"
	else
		echo "${D_FSYNC[$k]} fsyncs for ${D_REC[$k]} records in ${D_BATCH[$k]} batches ($(ratio "${D_REC[$k]}" "${D_FSYNC[$k]}") records/fsync); ${D_WAIT[$k]} flush waits"
	fi
}
# Rounds alternate the order of the variants (A B C, then C B A, ...), so
# drift in a shared machine's load hits every variant alike.
order() {	# round, variants... -> variants in this round's order
	local r=$1; shift
	if (( r % 2 == 1 )); then echo "$@"; else
		local out=() i
		for (( i = $#; i >= 1; i-- )); do out+=("${!i}"); done
		echo "${out[@]}"
	fi
}

# ---------------------------------------------------------------------------
# Case 1: single-record publish vs heap INSERT
# ---------------------------------------------------------------------------
log "case 1: felix_publish vs heap INSERT, ${DURATION}s per point, $ROUNDS round(s), clients ${CLIENTS_PUBLISH[*]}"
S_HEAP=$(write_script pub_heap "\\set k random(1, 1000000)
INSERT INTO bench_heap (key, payload) VALUES ('cust-' || :k, '$PAYLOAD'::jsonb);")
S_F1=$(write_script pub_felix1 "\\set k random(1, 1000000)
SELECT felix_publish('@STREAM@', '$PAYLOAD'::jsonb, key => 'cust-' || :k);")
S_F8=$(write_script pub_felix8 "\\set k random(1, 1000000)
SELECT felix_publish('@STREAM@', '$PAYLOAD'::jsonb, key => 'cust-' || :k);")

for c in "${CLIENTS_PUBLISH[@]}"; do
	for (( ROUND = 1; ROUND <= ROUNDS; ROUND++ )); do
		for variant in $(order "$ROUND" heap felix1 felix8); do
			case $variant in
				heap)   measure_point "pub-heap-c$c" heap bench_heap 0 "$S_HEAP" "$c" 1 ;;
				felix1) measure_point "pub-felix1-c$c" felix bench_pub1 1 "$S_F1" "$c" 1 ;;
				felix8) measure_point "pub-felix8-c$c" felix bench_pub8 8 "$S_F8" "$c" 1 ;;
			esac
		done
	done
done

{
	echo "### 1. Single-record publish: \`felix_publish\` vs heap \`INSERT\` (tps)"
	echo
	echo "pgbench -n -M prepared -T $DURATION, -j min(clients, 2); one record per transaction; 100-byte jsonb payload, random key. Mean of $ROUNDS round(s) per point (per-round values in brackets), rounds alternate the order of the three variants."
	echo
	echo "| clients | heap INSERT | felix 1 shard | ratio 1-shard/heap | felix 8 shards | ratio 8-shard/heap | target ≥ 1.0 (1 shard) |"
	echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
	for c in "${CLIENTS_PUBLISH[@]}"; do
		th=$(mean_tps "pub-heap-c$c"); t1=$(mean_tps "pub-felix1-c$c"); t8=$(mean_tps "pub-felix8-c$c")
		r1=$(ratio "$t1" "$th"); r8=$(ratio "$t8" "$th")
		echo "| $c | ${th:-error} [${T_LIST[pub-heap-c$c]}] | ${t1:-error} [${T_LIST[pub-felix1-c$c]}] | $r1 | ${t8:-error} [${T_LIST[pub-felix8-c$c]}] | $r8 | $(mark_ge "$r1" 1.0) |"
	done
	echo
	echo "Mean latency (ms):"
	echo
	for c in "${CLIENTS_PUBLISH[@]}"; do
		echo "- $c client(s): heap $(mean_lat "pub-heap-c$c"), felix 1 shard $(mean_lat "pub-felix1-c$c"), felix 8 shards $(mean_lat "pub-felix8-c$c")"
	done
	echo
} >>"$REPORT"
{
	echo "### Case 1 diagnostics: flushes and wait events"
	echo
	echo "Flushes summed over the rounds of a point (felix: felix_metrics deltas; heap: pg_stat_wal.wal_sync delta). Wait events: share of 0.5 s samples of active pgbench backends in pg_stat_activity (CPU:running = no wait event)."
	echo
	echo "| point | flushes | top wait events |"
	echo "| --- | --- | --- |"
	for c in "${CLIENTS_PUBLISH[@]}"; do
		for variant in heap felix1 felix8; do
			k="pub-$variant-c$c"
			echo "| $variant c=$c | $(flush_line "$k" "${variant%[18]}") | $(sampler_summary "$WORK/wait-$k.txt") |"
		done
	done
	echo
} >>"$DIAG"

# ---------------------------------------------------------------------------
# Case 2: batches of 1,000
# ---------------------------------------------------------------------------
log "case 2: felix_publish_batch($BATCH_SIZE) vs INSERT ... SELECT of $BATCH_SIZE rows, clients ${CLIENTS_BATCH[*]}"
q -c "DROP TABLE IF EXISTS bench_src;
      CREATE TABLE bench_src (keys text[], payloads jsonb[]);
      ALTER TABLE bench_src ALTER payloads SET STORAGE EXTERNAL, ALTER keys SET STORAGE EXTERNAL;
      INSERT INTO bench_src
      SELECT array_agg('cust-' || i ORDER BY i), array_agg($PAYLOAD_SQL_CONST ORDER BY i)
        FROM generate_series(1, $BATCH_SIZE) i;
      ANALYZE bench_src;"
S_BHEAP=$(write_script batch_heap "INSERT INTO bench_heap_batch (key, payload)
SELECT u.k, u.p FROM bench_src, unnest(bench_src.keys, bench_src.payloads) AS u(k, p);")
S_BFELIX=$(write_script batch_felix "SELECT count(*) FROM bench_src, felix_publish_batch('@STREAM@', bench_src.payloads, bench_src.keys);")
for c in "${CLIENTS_BATCH[@]}"; do
	for (( ROUND = 1; ROUND <= ROUNDS; ROUND++ )); do
		for variant in $(order "$ROUND" heap felix); do
			case $variant in
				heap)  measure_point "batch-heap-c$c" heap bench_heap_batch 0 "$S_BHEAP" "$c" "$BATCH_SIZE" ;;
				felix) measure_point "batch-felix-c$c" felix bench_batch 1 "$S_BFELIX" "$c" "$BATCH_SIZE" ;;
			esac
		done
	done
done
{
	echo "### 2. Batches: \`felix_publish_batch\` of $BATCH_SIZE records vs \`INSERT ... SELECT\` of the same $BATCH_SIZE rows (rows/s)"
	echo
	echo "pgbench -n -M prepared -T $DURATION; one call/statement of $BATCH_SIZE rows per transaction, both reading the same keys[]/payloads[] arrays from a one-row table; felix stream has 1 shard. Mean of $ROUNDS round(s) (per-round transactions/s in brackets)."
	echo
	echo "| clients | heap INSERT ... SELECT | felix_publish_batch | ratio felix/heap | target ≥ 3.0 |"
	echo "| ---: | ---: | ---: | ---: | --- |"
	for c in "${CLIENTS_BATCH[@]}"; do
		rh=$(mean_tps "batch-heap-c$c" "$BATCH_SIZE"); rf=$(mean_tps "batch-felix-c$c" "$BATCH_SIZE")
		r=$(ratio "$rf" "$rh")
		echo "| $c | ${rh:-error} [${T_LIST[batch-heap-c$c]}] | ${rf:-error} [${T_LIST[batch-felix-c$c]}] | $r | $(mark_ge "$r" 3.0) |"
	done
	echo
	echo "Mean latency per $BATCH_SIZE-row call (ms): $(for c in "${CLIENTS_BATCH[@]}"; do printf '%s client(s): heap %s, felix %s. ' "$c" "$(mean_lat "batch-heap-c$c")" "$(mean_lat "batch-felix-c$c")"; done)"
	echo
} >>"$REPORT"
{
	echo "### Case 2 diagnostics"
	echo
	echo "| point | flushes | top wait events |"
	echo "| --- | --- | --- |"
	for c in "${CLIENTS_BATCH[@]}"; do
		for variant in heap felix; do
			k="batch-$variant-c$c"
			echo "| batch $variant c=$c | $(flush_line "$k" "$variant") | $(sampler_summary "$WORK/wait-$k.txt") |"
		done
	done
	echo
} >>"$DIAG"

# ---------------------------------------------------------------------------
# Load RECORDS records into a 1-shard stream (cases 3 and 4)
# ---------------------------------------------------------------------------
log "loading $RECORDS records into stream bench_read (batches of $LOAD_CHUNK)"
create_stream bench_read 1
LOAD_T0=$(date +%s.%N)
q -c "DO \$\$
DECLARE
	chunk int;
	p jsonb[];
	k text[];
BEGIN
	FOR chunk IN 0 .. $(( RECORDS / LOAD_CHUNK - 1 )) LOOP
		SELECT array_agg($(payload_expr i) ORDER BY i), array_agg('cust-' || (i % 1000) ORDER BY i)
		  INTO p, k
		  FROM generate_series(chunk * $LOAD_CHUNK, chunk * $LOAD_CHUNK + $(( LOAD_CHUNK - 1 ))) i;
		PERFORM count(*) FROM felix_publish_batch('bench_read', p, k);
	END LOOP;
END
\$\$"
LOAD_T1=$(date +%s.%N)
LOAD_RATE=$(awk -v a="$LOAD_T0" -v b="$LOAD_T1" -v n="$RECORDS" 'BEGIN{printf "%.0f", n/(b-a)}')
LOADED=$(stream_records bench_read)
[[ $LOADED == "$RECORDS" ]] || SANITY+=("load: stream bench_read holds $LOADED records, expected $RECORDS")
log "  loaded $LOADED records at $LOAD_RATE records/s"

# Sanity: record with id i sits at seq i, payloads are 100 bytes.
CHECK=$(q -c "SELECT count(*) FILTER (WHERE (payload->>'id')::bigint = seq), count(*) FILTER (WHERE length(payload::text) = 100), min(seq), max(seq)
                FROM (SELECT seq, payload FROM bench_read WHERE shard = 0 AND seq >= $SEEK_AT LIMIT 100) x")
[[ $CHECK == "100|100|$SEEK_AT|$(( SEEK_AT + 99 ))" ]] ||
	SANITY+=("seek check: rows at seq >= $SEEK_AT returned (id=seq|100-byte|min|max) = $CHECK, expected 100|100|$SEEK_AT|$(( SEEK_AT + 99 ))")

log "copying the same rows into heap table bench_heap_read"
q -c "DROP TABLE IF EXISTS bench_heap_read;
      CREATE TABLE bench_heap_read (seq bigserial PRIMARY KEY, key text, payload jsonb,
                                    published_at timestamptz DEFAULT now());
      INSERT INTO bench_heap_read (seq, key, payload, published_at)
      SELECT seq, key, payload, published_at FROM bench_read;"
q -c "VACUUM ANALYZE bench_heap_read"
q -c "CHECKPOINT"
HEAP_ROWS=$(q -c "SELECT count(*) FROM bench_heap_read")
[[ $HEAP_ROWS == "$RECORDS" ]] || SANITY+=("heap copy: bench_heap_read holds $HEAP_ROWS rows, expected $RECORDS (felix full scan returned a different count)")
SIZES=$(q -c "SELECT pg_size_pretty(pg_table_size('bench_heap_read')) || ' heap table (+ ' || pg_size_pretty(pg_indexes_size('bench_heap_read')) || ' index), ' ||
                     pg_size_pretty((SELECT bytes FROM felix_shards WHERE stream = 'bench_read' AND shard = 0)) || ' felix shard'")

# ---------------------------------------------------------------------------
# Case 3: seek read
# ---------------------------------------------------------------------------
log "case 3: seek read at seq $SEEK_AT vs seq 0, ${SEEK_SECONDS}s each"
SEEK_Q="SELECT seq, payload FROM bench_read WHERE shard = 0 AND seq >= %s LIMIT 100;"
S_SEEK_HI=$(write_script seek_hi "$(printf "$SEEK_Q" "$SEEK_AT")")
S_SEEK_LO=$(write_script seek_lo "$(printf "$SEEK_Q" 0)")
S_SEEK_HEAP=$(write_script seek_heap "SELECT seq, payload FROM bench_heap_read WHERE seq >= $SEEK_AT ORDER BY seq LIMIT 100;")
declare -A SEEK_LAT SEEK_TPS
for v in lo hi heap; do
	case $v in lo) s=$S_SEEK_LO ;; hi) s=$S_SEEK_HI ;; heap) s=$S_SEEK_HEAP ;; esac
	pgbench_run "seek-$v-warm" "$s" 1 1
	pgbench_run "seek-$v" "$s" 1 "$SEEK_SECONDS"
	SEEK_LAT[$v]=$([[ $PB_OK == 1 ]] && echo "$PB_LAT" || echo "")
	SEEK_TPS[$v]=$PB_TPS
done
EXPLAIN_SEEK=$(q -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING ON) $(printf "$SEEK_Q" "$SEEK_AT")" 2>&1 || true)
if grep -qi 'custom scan' <<<"$EXPLAIN_SEEK" && grep -qi 'felix' <<<"$EXPLAIN_SEEK"; then
	SEEK_CUSTOM="yes"
else
	SEEK_CUSTOM="**no**"
fi
SEEK_RATIO=$(ratio "${SEEK_LAT[hi]}" "${SEEK_LAT[lo]}")
SEEK_UNDER_1=$(awk -v v="${SEEK_LAT[hi]:-}" 'BEGIN{ if (v == "") print "n/a"; else if (v + 0 < 1.0) print "met"; else print "**MISSED**" }')
SEEK_2X=$(awk -v v="$SEEK_RATIO" 'BEGIN{ if (v == "n/a") print "n/a"; else if (v + 0 <= 2.0) print "met"; else print "**MISSED**" }')
{
	echo "### 3. Seek read: 100 records at seq $SEEK_AT of a $RECORDS-record shard"
	echo
	echo "pgbench -n -M prepared -c 1 -T $SEEK_SECONDS (after a 1 s warm-up) on a one-line script; mean latency as reported by pgbench (includes the client round trip and transfer of 100 rows)."
	echo
	echo "| query | mean latency (ms) | tps | target |"
	echo "| --- | ---: | ---: | --- |"
	echo "| felix \`shard = 0 AND seq >= $SEEK_AT LIMIT 100\` | ${SEEK_LAT[hi]:-error} | ${SEEK_TPS[hi]:-} | < 1 ms: $SEEK_UNDER_1 |"
	echo "| felix \`shard = 0 AND seq >= 0 LIMIT 100\` | ${SEEK_LAT[lo]:-error} | ${SEEK_TPS[lo]:-} | |"
	echo "| ratio seq $SEEK_AT / seq 0 | $SEEK_RATIO | | ≤ 2.0: $SEEK_2X |"
	echo "| heap (reference) \`seq >= $SEEK_AT ORDER BY seq LIMIT 100\` via primary key | ${SEEK_LAT[heap]:-error} | ${SEEK_TPS[heap]:-} | |"
	echo
	echo "Custom scan (FelixScan) used: $SEEK_CUSTOM"
	echo
	echo '```'
	echo "EXPLAIN (ANALYZE, COSTS OFF) $(printf "$SEEK_Q" "$SEEK_AT")"
	echo "$EXPLAIN_SEEK"
	echo '```'
	echo
} >>"$REPORT"

# ---------------------------------------------------------------------------
# Case 4: full scan
# ---------------------------------------------------------------------------
log "case 4: full scan of $RECORDS records, felix vs heap (1 warm-up + 3 timed runs each)"
# time_query <sql> -> median of 3 runs (ms), after one warm-up, in one session,
# parallel query off so both sides use one process.
time_query() {
	local sql=$1 out
	out=$WORK/timing.out
	if ! q -c "SET max_parallel_workers_per_gather = 0" -c "\\timing on" \
		-c "$sql" -c "$sql" -c "$sql" -c "$sql" >"$out" 2>&1; then
		log "query failed: $sql"; cat "$out" >&2; echo ""; return
	fi
	awk '/^Time:/{print $2}' "$out" | tail -n 3 | sort -n | sed -n 2p
}
time_query_parallel() {
	local sql=$1 out
	out=$WORK/timing.out
	q -c "\\timing on" -c "$sql" -c "$sql" -c "$sql" -c "$sql" >"$out" 2>&1 || { echo ""; return; }
	awk '/^Time:/{print $2}' "$out" | tail -n 3 | sort -n | sed -n 2p
}
SCAN1_F="SELECT count(*) FROM (SELECT seq, payload FROM bench_read OFFSET 0) x"
SCAN1_H="SELECT count(*) FROM (SELECT seq, payload FROM bench_heap_read OFFSET 0) x"
declare -A SCAN_SQL=(
	[f1]=$SCAN1_F
	[h1]=$SCAN1_H
	[f2]="SELECT count(*), sum(pg_column_size(payload)) FROM bench_read"
	[h2]="SELECT count(*), sum(pg_column_size(payload)) FROM bench_heap_read"
	[f3]="SELECT count(*), sum(length(payload::text)) FROM bench_read"
	[h3]="SELECT count(*), sum(length(payload::text)) FROM bench_heap_read"
)
declare -A SCAN_MS
for v in 1 2 3; do
	SCAN_MS[h$v]=$(time_query "${SCAN_SQL[h$v]}")
	SCAN_MS[f$v]=$(time_query "${SCAN_SQL[f$v]}")
	log "  scan $v: heap ${SCAN_MS[h$v]:-?} ms, felix ${SCAN_MS[f$v]:-?} ms"
done
SCAN_MS[hpar]=$(time_query_parallel "$SCAN1_H")
EXPLAIN_SCAN=$(q -c "SET max_parallel_workers_per_gather = 0" -c "EXPLAIN (ANALYZE, COSTS OFF) $SCAN1_F" 2>&1 || true)
rows_per_s() { awk -v ms="${1:-}" -v n="$RECORDS" 'BEGIN{ if (ms == "" || ms + 0 == 0) print "n/a"; else printf "%.0f", n / (ms / 1000) }'; }
{
	echo "### 4. Full scan of $RECORDS records"
	echo
	echo "Median of 3 runs after one warm-up, one session, \`max_parallel_workers_per_gather = 0\` for both (felix scans are single-process). Data: $SIZES. Ratio = felix throughput / heap throughput."
	echo
	echo "| query | heap (ms) | felix (ms) | heap rows/s | felix rows/s | ratio felix/heap | target ≥ 1.0 |"
	echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |"
	labels=("\`count(*)\` over \`(SELECT seq, payload ... OFFSET 0)\`" "\`count(*), sum(pg_column_size(payload))\`" "\`count(*), sum(length(payload::text))\` (jsonb output per row)")
	for v in 1 2 3; do
		hr=$(rows_per_s "${SCAN_MS[h$v]}"); fr=$(rows_per_s "${SCAN_MS[f$v]}")
		r=$(ratio "$fr" "$hr")
		t=""; [[ $v == 1 ]] && t=$(mark_ge "$r" 1.0)
		echo "| ${labels[$((v-1))]} | ${SCAN_MS[h$v]:-error} | ${SCAN_MS[f$v]:-error} | $hr | $fr | $r | $t |"
	done
	echo
	echo "Reference: heap query 1 with parallel query allowed (default 2 workers on this machine): ${SCAN_MS[hpar]:-?} ms."
	echo
	echo '```'
	echo "EXPLAIN (ANALYZE, COSTS OFF) $SCAN1_F"
	echo "$EXPLAIN_SCAN"
	echo '```'
	echo
} >>"$REPORT"

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------
# Machine
# ---------------------------------------------------------------------------
FSYNC_RATE="not measured (FSYNC_TEST=0)"
if [[ $FSYNC_TEST == 1 ]]; then
	log "pg_test_fsync (about 20 s)"
	if timeout 120 "${AS_PG[@]}" "$PGBIN/pg_test_fsync" -s 1 -f "$WORK/fsync.test" >"$WORK/fsync.out" 2>&1; then
		FSYNC_RATE=$(awk '/fdatasync/ && /ops\/sec/ {print $(NF-3), "ops/s (" $(NF-1), "µs/op) fdatasync, 8kB write"; exit}' "$WORK/fsync.out")
		[[ -n $FSYNC_RATE ]] || FSYNC_RATE="unparsed (see pg_test_fsync)"
	else
		FSYNC_RATE="pg_test_fsync failed or timed out"
	fi
	rm -f "$WORK/fsync.test"
fi
# Appending + syncing (what a growing segment file does) vs overwriting a
# preallocated file + syncing (what WAL and pg_test_fsync do): 150-byte
# O_DSYNC writes with dd, alternated 4 times each, median writes/s.
APPEND_PROBE="not measured (FSYNC_TEST=0)"
if [[ $FSYNC_TEST == 1 ]]; then
	log "append vs overwrite sync probe (about 10 s)"
	dd_rate() {	# dd args... -> writes/s
		local secs
		secs=$(timeout 60 "${AS_PG[@]}" dd if=/dev/zero bs=150 count=2000 "$@" 2>&1 | awk '/copied/{for (i = 1; i <= NF; i++) if ($i == "s," || $i == "s") {print $(i-1); exit}}')
		awk -v s="${secs:-0}" 'BEGIN{ if (s + 0 > 0) printf "%.0f\n", 2000 / s }'
	}
	ap=(); ow=()
	for (( i = 0; i < 4; i++ )); do
		rm -f "$WORK/probe.append" "$WORK/probe.over"
		as_pg dd if=/dev/zero of="$WORK/probe.over" bs=1M count=8 conv=fsync status=none
		ap+=("$(dd_rate of="$WORK/probe.append" oflag=dsync,append conv=notrunc)")
		ow+=("$(dd_rate of="$WORK/probe.over" oflag=dsync conv=notrunc)")
	done
	rm -f "$WORK/probe.append" "$WORK/probe.over"
	ap_med=$(median "${ap[@]}"); ow_med=$(median "${ow[@]}")
	APPEND_PROBE="150-byte O_DSYNC writes: appending (file grows) ${ap_med:-?}/s vs overwriting a preallocated file ${ow_med:-?}/s (dd, median of 4 alternated runs: append ${ap[*]}; overwrite ${ow[*]})"
fi
CPU_MODEL=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
MEM=$(awk '/^MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)
FS=$(df -T "$BASE" | awk 'NR==2{print $2 " on " $1}')

{
	echo "# felix benchmark results ($(date -u '+%Y-%m-%d %H:%M UTC'))"
	echo
	if [[ $QUICK == 1 ]]; then
		echo "**QUICK smoke run: short points and $RECORDS records; not a measurement.**"
		echo
	fi
	echo "- command: \`$CMDLINE\`"
	echo "- machine: $(nproc) CPUs ($CPU_MODEL), $MEM RAM, kernel $(uname -r), $FS"
	echo "- disk: pg_test_fsync $FSYNC_RATE"
	echo "- disk: $APPEND_PROBE"
	echo "- load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER (the machine may be shared)"
	echo "- felix.so md5 $FELIX_SO; source tree at $GIT_STATE"
	echo "- PostgreSQL $SERVER_VERSION, felix $FELIX_VERSION; one server: shared_buffers = 256MB, max_connections = 100, fsync = on, synchronous_commit = on, full_page_writes = on, max_wal_size = 8GB, checkpoint_timeout = 30min, CHECKPOINT before every write point"
	echo "- payload: \`$PAYLOAD\` ($PAYLOAD_LEN bytes as text); keys \`cust-<n>\`"
	echo "- load of $RECORDS records in felix_publish_batch calls of $LOAD_CHUNK: $LOAD_RATE records/s"
	echo
	echo "## Results"
	echo
	cat "$REPORT"
	echo "## Diagnostics"
	echo
	cat "$DIAG"
	echo "### felix_metrics at the end of the run"
	echo
	echo "| name | value |"
	echo "| --- | ---: |"
	q -F ' | ' -c "SELECT name, value::bigint FROM felix_metrics ORDER BY name" | sed 's/^/| /; s/$/ |/'
	echo
	if (( ${#WARNINGS[@]} > 0 )); then
		echo "### Warnings"
		echo
		for w in "${WARNINGS[@]}"; do echo "- $w"; done
		echo
	fi
	echo "### Sanity checks"
	echo
	nc=$(crashes)
	[[ $nc == 0 ]] || SANITY+=("the server log shows $nc backend crash(es) during the run")
	if (( ${#SANITY[@]} == 0 )); then
		echo "All passed: every acknowledged publish/batch is counted in the stream (felix_shards) and heap table; the seek returns seq $SEEK_AT..$(( SEEK_AT + 99 )) with matching payload ids; the heap copy of the full felix scan has $RECORDS rows."
	else
		for s in "${SANITY[@]}"; do echo "- **FAILED**: $s"; done
		echo
		echo "First distinct ERROR/FATAL/PANIC lines of the server log:"
		echo
		bench_log_errors "$WORK/server.log"
	fi
	echo
} >"$WORK/final.md"

bench_publish "$WORK/final.md" "$RESULT_FILE"
if [[ $(crashes) != 0 ]] || grep -q 'PANIC\|TRAP' "$WORK/server.log"; then
	log "WARNING: the server log shows a crash; tail of $WORK/server.log:"
	tail -30 "$WORK/server.log" >&2
fi
(( ${#SANITY[@]} == 0 )) || exit 3
