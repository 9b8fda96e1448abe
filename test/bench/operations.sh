#!/usr/bin/env bash
# test/bench/operations.sh -- felix operations benchmark (issue 7, "Benchmark").
#
# Three felix nodes on this machine (node1 hosts the control plane), the
# same server settings as test/bench/replication.sh.  Three measurements:
#
#   transfer  Planned leadership transfer under 8 publishing clients,
#             TRANSFERS times (median reported): a fresh 1-shard quorum
#             stream (replication_factor 3); 8 sessions publish a 100-byte
#             record in a loop on the leader and 8 on the target follower
#             (refused there with 55F02 until it leads; a refused session
#             retries after 2 ms), so 8 clients publish whichever node
#             leads; felix_transfer_leadership is called on the leader.  The
#             window is the longest interval around the call in which no
#             publish was acknowledged anywhere.  Target: <= 50 ms.
#   catch-up  Failover of a shard holding RECORDS records (published in
#             batches of 1,000 by felix_publish_batch): kill -9 of its
#             leader; once a follower leads and the other answered it, the
#             bytes the new leader shipped of the log below where its
#             generation began (catchup_bytes_shipped) before any new
#             record.  Target: at most one batch.
#   rebuild   Rebuild of a follower of a SIZE_MB shard (records of 100 kB):
#             the follower's copy is made stale (its copy_of stamp changed
#             while it is down), so it halts needs_bootstrap (every node runs
#             with felix.rebuild_max_concurrent = 0); felix_rebuild rebuilds
#             it, first with no cap, then with felix.rebuild_bytes_per_sec =
#             CAP_MB MB/s.  Rate = rebuild_bytes_shipped / the time from the
#             call to rebuilds_completed.
#
# Prints a Markdown report and writes it to
# test/bench/results-operations-<date>.md.
#
# Usage:   test/bench/operations.sh      (as root or as a normal user)
# Env:     TRANSFERS=5  RECORDS=1000000  SIZE_MB=1024  CAP_MB=100
#          QUICK=1      smoke run: 3 transfers, 100,000 records, 64 MB, cap 16 MB/s
#          KEEP=1       keep /tmp/felix-bench-ops after exit
#          PGBIN=/usr/lib/postgresql/15/bin
#
# As root the servers and every client run as user `postgres`.  The
# servers listen only on Unix sockets in /tmp/felix-bench-ops/sock, ports
# 5541-5543; everything is stopped and the directory removed on exit.
# Every loop is bounded and every wait has a timeout.

set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BASE=/tmp/felix-bench-ops
SOCK=$BASE/sock
WORK=$BASE/work
FPORTS=(5541 5542 5543)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
	TRANSFERS=${TRANSFERS:-3}; RECORDS=${RECORDS:-100000}; SIZE_MB=${SIZE_MB:-64}; CAP_MB=${CAP_MB:-16}
else
	TRANSFERS=${TRANSFERS:-5}; RECORDS=${RECORDS:-1000000}; SIZE_MB=${SIZE_MB:-1024}; CAP_MB=${CAP_MB:-100}
fi
KEEP=${KEEP:-0}

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMDLINE="TRANSFERS=$TRANSFERS RECORDS=$RECORDS SIZE_MB=$SIZE_MB CAP_MB=$CAP_MB QUICK=$QUICK $0${*:+ $*}"

for arg in "$@"; do
	case $arg in
		-h|--help) sed -n '2,45p' "$0"; exit 0 ;;
		*) echo "operations.sh: unknown argument '$arg' (parameters are environment variables; see --help)" >&2; exit 2 ;;
	esac
done
for v in TRANSFERS RECORDS SIZE_MB CAP_MB; do
	[[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || { echo "operations.sh: $v must be a positive integer" >&2; exit 2; }
done
(( TRANSFERS <= 20 )) || { echo "operations.sh: TRANSFERS must be 1..20" >&2; exit 2; }

BENCH_NAME=bench-ops
# shellcheck source=test/bench/lib.sh
. "$SCRIPT_DIR/lib.sh"
bench_result_file operations
bench_run_user
bench_as_user
bench_require postgres initdb pg_ctl psql pg_isready pg_config

STARTED=()
BG_PIDS=()
PROBE_PIDS=()
for port in "${FPORTS[@]}"; do
	if "$PGBIN/pg_isready" -q -h "$SOCK" -p "$port" -t 1 2>/dev/null; then
		die "a server from an earlier run still listens on $SOCK port $port; stop it first"
	fi
done
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bench_fresh_base
# Rebuilds happen only when asked (part 3 times them).
felix_cluster_start "felix.rebuild_max_concurrent = 0"

SERVER_VERSION=$(q "${FPORTS[0]}" -c "SHOW server_version")
FELIX_SO="$(md5sum "$PKGLIB/felix.so" | cut -c1-12), installed $(date -u -r "$PKGLIB/felix.so" '+%Y-%m-%d %H:%M:%S UTC')"
GIT_STATE=$(git -C "$SCRIPT_DIR" log -1 --format='%h %cs' 2>/dev/null || echo "no commit")
[[ -n $(git -C "$SCRIPT_DIR" status --porcelain -- "$SCRIPT_DIR/../../src" 2>/dev/null) ]] && GIT_STATE="$GIT_STATE + uncommitted changes in src/"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
SANITY=()

metric() {	# port name
	q "$1" -c "SELECT coalesce(max(value), 0)::bigint FROM felix_metrics WHERE name = '$2'"
}
node_of_port() {
	local k
	for k in "${!FPORTS[@]}"; do
		if [[ ${FPORTS[$k]} == "$1" ]]; then echo $((k + 1)); fi
	done
}
# Wait (bounded) until felix_replication on the leader shows every follower
# of (stream, 0) shipping with an answer.
wait_shipping() {	# leader-port stream followers
	local i
	for (( i = 0; i < 300; i++ )); do
		[[ $(q "$1" -c "SELECT count(*) FROM felix_replication WHERE stream = '$2' AND shard = 0 AND state = 'shipping' AND last_answer IS NOT NULL") == "$3" ]] && return 0
		sleep 0.1
	done
	return 1
}

# ---------------------------------------------------------------------------
# 1. Planned transfer under 8 publishing clients
# ---------------------------------------------------------------------------
# A session on port $1 publishing to stream $2 for $3 seconds: each
# acknowledgement logged as "NOTICE:  ack <epoch>", each refusal as
# "NOTICE:  err <sqlstate> <epoch>" followed by a 2 ms pause.
start_client() {	# port stream seconds file
	setsid "${AS_USER[@]}" env PGHOST="$SOCK" PGPORT="$1" PGUSER=postgres PGDATABASE=postgres \
		timeout $(( $3 + 30 )) "$PGBIN/psql" -X -q -c "SET client_min_messages = notice; DO \$\$
		DECLARE p felix_position; t_end timestamptz := clock_timestamp() + interval '$3 seconds';
		BEGIN
		WHILE clock_timestamp() < t_end LOOP
			BEGIN
				p := felix_publish('$2', '{\"op\": \"transfer\", \"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}'::jsonb, shard => 0);
				RAISE NOTICE 'ack %', extract(epoch FROM clock_timestamp());
			EXCEPTION WHEN OTHERS THEN
				RAISE NOTICE 'err % %', SQLSTATE, extract(epoch FROM clock_timestamp());
				PERFORM pg_sleep(0.002);
			END;
		END LOOP; END \$\$" >/dev/null 2>"$4" &
	PROBE_PIDS+=($!)
}

TRANSFER_WINDOWS=()
TRANSFER_NOTES=()
for (( r = 1; r <= TRANSFERS; r++ )); do
	stream="transfer_r$r"
	q "${FPORTS[0]}" -c "SELECT felix_create_stream('$stream', replication_factor => 3, consistency => 'quorum')" >/dev/null
	lport=$(leader_port "$stream") || die "no leader for $stream after 30 s"
	wait_shipping "$lport" "$stream" 2 || die "$stream: followers not shipping after 30 s"
	tport=""
	for p in "${FPORTS[@]}"; do
		if [[ $p != "$lport" ]]; then tport=$p; break; fi
	done
	tname=node$(node_of_port "$tport")
	files=()
	for (( c = 1; c <= 8; c++ )); do
		start_client "$lport" "$stream" 4 "$WORK/transfer-$r-leader-$c.txt"
		start_client "$tport" "$stream" 4 "$WORK/transfer-$r-target-$c.txt"
		files+=("$WORK/transfer-$r-leader-$c.txt" "$WORK/transfer-$r-target-$c.txt")
	done
	sleep 1.5
	t0=$(date +%s.%N)
	said=$(q "$lport" -c "SELECT felix_transfer_leadership('$stream', 0, '$tname')" 2>&1) || said="FAILED: $said"
	t1=$(date +%s.%N)
	for p in "${PROBE_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	PROBE_PIDS=()
	# The longest gap between consecutive acknowledgements (all clients)
	# that overlaps [t0, t1 + 1 s], and the refusals inside it.
	cat "${files[@]}" | awk '/NOTICE: +ack /{print $NF}' | sort -n >"$WORK/transfer-$r-acks"
	cat "${files[@]}" | awk '/NOTICE: +err /{print $NF}' | sort -n >"$WORK/transfer-$r-errs"
	read -r gap from to < <(awk -v t0="$t0" -v t1="$t1" '
		NR > 1 && $1 >= t0 && prev <= t1 + 1 && $1 - prev > best { best = $1 - prev; bf = prev; bt = $1 }
		{ prev = $1 }
		END { printf "%.1f %.6f %.6f\n", best * 1000, bf, bt }' "$WORK/transfer-$r-acks")
	refused=$(awk -v a="$from" -v b="$to" '$1 >= a && $1 <= b' "$WORK/transfer-$r-errs" | wc -l)
	acks=$(cat "${files[@]}" | grep -c 'NOTICE: *ack' || true)
	call_ms=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", (b - a) * 1000}')
	newl=$(q "${FPORTS[0]}" -c "SELECT leader || ' at generation ' || generation FROM felix.assignments WHERE stream = '$stream' AND shard = 0")
	if [[ $said == FAILED* || $newl != "$tname at generation 2" ]]; then
		SANITY+=("transfer round $r: $said; control plane says $newl")
	fi
	TRANSFER_WINDOWS+=("$gap")
	TRANSFER_NOTES+=("round $r: node$(node_of_port "$lport") -> $tname: window $gap ms ($refused refusals in it), the call took $call_ms ms, $acks publishes acknowledged in 4 s")
	log "  transfer round $r: window $gap ms, call $call_ms ms ($said)"
done
TRANSFER_MEDIAN=$(median "${TRANSFER_WINDOWS[@]}")

# ---------------------------------------------------------------------------
# 2. Catch-up after a failover of a shard holding RECORDS records
# ---------------------------------------------------------------------------
stream=$(pick_name catchup)
q "${FPORTS[0]}" -c "SELECT felix_create_stream('$stream', replication_factor => 3, consistency => 'quorum')" >/dev/null
lport=$(leader_port "$stream") || die "no leader for $stream after 30 s"
log "catch-up: publishing $RECORDS records on node$(node_of_port "$lport")"
t0=$(date +%s)
q "$lport" -c "DO \$\$ BEGIN
	FOR b IN 1..ceil($RECORDS / 1000.0)::int LOOP
		PERFORM count(*) FROM felix_publish_batch('$stream',
			(SELECT array_agg(jsonb_build_object('b', b, 'i', i, 'pad', repeat('z', 60))) FROM generate_series(1, 1000) i),
			shard => 0);
		COMMIT;
	END LOOP; END \$\$" >/dev/null
log "catch-up: published in $(( $(date +%s) - t0 )) s"
for (( i = 0; i < 600; i++ )); do
	[[ $(q "$lport" -c "SELECT count(*) FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND lag_records = 0") == 2 ]] && break
	sleep 0.1
done
total=$(q "$lport" -c "SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0")
BATCH_BYTES=$(q "$lport" -c "SELECT pg_size_pretty(bytes / greatest(next_seq / 1000, 1)) FROM felix_shards WHERE stream = '$stream' AND shard = 0")
BATCH_B=$(q "$lport" -c "SELECT bytes / greatest(next_seq / 1000, 1) FROM felix_shards WHERE stream = '$stream' AND shard = 0")
declare -A CU0 BS0
for p in "${FPORTS[@]}"; do
	if [[ $p == "$lport" ]]; then continue; fi
	CU0[$p]=$(metric "$p" catchup_bytes_shipped)
	BS0[$p]=$(metric "$p" bytes_shipped)
done
k=$(node_of_port "$lport")
t_kill=$(date +%s.%N)
kill_node "$k"
nport=$(leader_port "$stream") || die "no new leader for $stream after 30 s"
t_lead=$(date +%s.%N)
wait_shipping "$nport" "$stream" 1 || SANITY+=("catch-up: the surviving follower did not answer the new leader within 30 s")
CATCHUP_BYTES=$(( $(metric "$nport" catchup_bytes_shipped) - CU0[$nport] ))
CATCHUP_BATCHES=$(ratio "$CATCHUP_BYTES" "$BATCH_B")
SHIPPED_BYTES=$(( $(metric "$nport" bytes_shipped) - BS0[$nport] ))
CATCHUP_NOTE="$total records ($(q "$nport" -c "SELECT pg_size_pretty(bytes) FROM felix_shards WHERE stream = '$stream' AND shard = 0")); node$k killed; node$(node_of_port "$nport") led after $(awk -v a="$t_kill" -v b="$t_lead" 'BEGIN{printf "%.2f", b - a}') s"
start_node "f$k"
wait_alive 3

# ---------------------------------------------------------------------------
# 3. Rebuild of a follower of a SIZE_MB shard, without and with a cap
# ---------------------------------------------------------------------------
stream=$(pick_name rebuild)
q "${FPORTS[0]}" -c "SELECT felix_create_stream('$stream', replication_factor => 3, payload_type => 'text')" >/dev/null
lport=$(leader_port "$stream") || die "no leader for $stream after 30 s"
wait_shipping "$lport" "$stream" 2 || die "$stream: followers not shipping after 30 s"
log "rebuild: publishing $SIZE_MB MB on node$(node_of_port "$lport")"
q "$lport" -c "DO \$\$ BEGIN
	FOR b IN 1..$SIZE_MB LOOP
		PERFORM count(*) FROM felix_publish_batch('$stream',
			(SELECT array_agg(b || '-' || i || '-' || repeat('r', 102400)) FROM generate_series(1, 10) i), shard => 0);
		COMMIT;
	END LOOP; END \$\$" >/dev/null
fport=""
for p in "${FPORTS[@]}"; do
	if [[ $p != "$lport" && $p != "${FPORTS[0]}" ]]; then fport=$p; break; fi
done
[[ -n $fport ]] || die "rebuild: no follower other than node1"
fk=$(node_of_port "$fport")
for (( i = 0; i < 1200; i++ )); do
	[[ $(q "$lport" -c "SELECT lag_records FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = 'node$fk'") == 0 ]] && break
	sleep 0.1
done
SHARD_DIR=$(q "$fport" -c "SELECT current_setting('data_directory') || '/felix/' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '/' || '$stream'::regclass::oid || '/0'")

# rebuild_once <label> -> REB_SECS REB_BYTES REB_RATE
rebuild_once() {
	local i s0 c0 t0 t1
	"${AS_USER[@]}" "$PGBIN/pg_ctl" -D "$(datadir "f$fk")" -m fast -w -t 60 stop >/dev/null
	# another incarnation's copy: the follower must be rebuilt
	echo "00000000-0000-4000-8000-00000000000$fk" | "${AS_USER[@]}" tee "$SHARD_DIR/copy_of" >/dev/null
	start_node "f$fk"
	for (( i = 0; i < 600; i++ )); do
		[[ $(q "$lport" -c "SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = 'node$fk'") == halted_needs_bootstrap ]] && break
		sleep 0.1
	done
	s0=$(metric "$lport" rebuild_bytes_shipped)
	c0=$(metric "$lport" rebuilds_completed)
	t0=$(date +%s.%N)
	q "$lport" -c "SELECT felix_rebuild('$stream', 0, 'node$fk')" >/dev/null
	for (( i = 0; i < 36000; i++ )); do	# 1 hour
		(( $(metric "$lport" rebuilds_completed) > c0 )) && break
		sleep 0.1
	done
	t1=$(date +%s.%N)
	REB_BYTES=$(( $(metric "$lport" rebuild_bytes_shipped) - s0 ))
	REB_SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}')
	REB_RATE=$(awk -v n="$REB_BYTES" -v s="$REB_SECS" 'BEGIN{printf "%.1f", n / s / 1048576}')
	(( $(metric "$lport" rebuilds_completed) > c0 )) || SANITY+=("rebuild $1 did not complete within an hour")
	log "  rebuild $1: $REB_BYTES bytes in $REB_SECS s ($REB_RATE MB/s)"
}
rebuild_once uncapped
U_SECS=$REB_SECS; U_BYTES=$REB_BYTES; U_RATE=$REB_RATE
q "$lport" -c "ALTER SYSTEM SET felix.rebuild_bytes_per_sec = '${CAP_MB}MB'" -c "SELECT pg_reload_conf()" >/dev/null
rebuild_once capped
C_SECS=$REB_SECS; C_BYTES=$REB_BYTES; C_RATE=$REB_RATE
C_RATIO=$(ratio "$C_RATE" "$CAP_MB")
same=$(q "$lport" -c "SELECT md5(string_agg(payload, '' ORDER BY seq)) FROM \"$stream\" WHERE shard = 0")
[[ $(q "$fport" -c "SELECT md5(string_agg(payload, '' ORDER BY seq)) FROM \"$stream\" WHERE shard = 0") == "$same" ]] ||
	SANITY+=("the rebuilt follower does not hold the leader's records")

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------
CPU_MODEL=$(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo)
MEM=$(awk '/^MemTotal/{printf "%.1f GiB", $2/1048576}' /proc/meminfo)
FS=$(df -T "$BASE" | awk 'NR==2{print $2 " on " $1}')
{
	echo "# felix operations benchmark results ($(date -u '+%Y-%m-%d %H:%M UTC'))"
	echo
	[[ $QUICK == 1 ]] && { echo "**QUICK smoke run: small sizes; not a measurement.**"; echo; }
	echo "- command: \`$CMDLINE\`"
	echo "- machine: $(nproc) CPUs ($CPU_MODEL), $MEM RAM, kernel $(uname -r), $FS; three felix nodes on this one machine, Unix sockets"
	echo "- load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER"
	echo "- felix.so md5 $FELIX_SO; source tree at $GIT_STATE; PostgreSQL $SERVER_VERSION; default felix settings"
	echo
	echo "## Planned transfer under 8 publishing clients"
	echo
	echo "| rounds | windows (ms) | median (ms) | target ≤ 50 ms |"
	echo "| ---: | --- | ---: | --- |"
	echo "| $TRANSFERS | ${TRANSFER_WINDOWS[*]} | ${TRANSFER_MEDIAN:-n/a} | $(mark_le "${TRANSFER_MEDIAN:-}" 50) |"
	echo
	for n in "${TRANSFER_NOTES[@]}"; do echo "- $n"; done
	echo
	echo "## Catch-up after a failover"
	echo
	echo "Batches of 1,000 records differ by a few hundred bytes (their numbers have different lengths), so the bytes are given in batches of the mean stored size: one batch is 1.0 ± 0.05."
	echo
	echo "| shard | bytes shipped below the new generation's start | mean stored batch | in batches | target ≤ one batch | all bytes shipped by the new leader before new records |"
	echo "| --- | ---: | ---: | ---: | --- | ---: |"
	echo "| $CATCHUP_NOTE | $CATCHUP_BYTES | $BATCH_B ($BATCH_BYTES) | $CATCHUP_BATCHES | $(mark_le "$CATCHUP_BATCHES" 1.05) | $SHIPPED_BYTES |"
	echo
	echo "## Rebuild rate ($SIZE_MB MB shard, records of 100 kB)"
	echo
	echo "| cap | bytes | seconds | rate (MB/s) | rate / cap |"
	echo "| --- | ---: | ---: | ---: | ---: |"
	echo "| none | $U_BYTES | $U_SECS | $U_RATE | |"
	echo "| $CAP_MB MB/s | $C_BYTES | $C_SECS | $C_RATE | $C_RATIO |"
	echo
	echo "## Sanity checks"
	echo
	if (( ${#SANITY[@]} == 0 )); then
		echo "All passed: every transfer handed the shard to its target at the next generation, the surviving follower answered the new leader, and the rebuilt follower holds the leader's records."
	else
		for s in "${SANITY[@]}"; do echo "- **FAILED**: $s"; done
		echo
		bench_log_errors "$WORK"/server-f*.log
	fi
	echo
} >"$WORK/final.md"

bench_publish "$WORK/final.md" "$RESULT_FILE"
