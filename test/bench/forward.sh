#!/usr/bin/env bash
# test/bench/forward.sh -- the cost of publishing on a node that does not
# lead the shard (issue 18, "publish on any node").
#
# Three felix nodes on this machine (node1 hosts the control plane), a
# 1-shard stream with replication_factor = 3 and consistency = 'quorum'.
# A 100-byte jsonb record per transaction, pgbench -M prepared at 1, 8
# and 32 clients, in the same run, published two ways -- felix_publish,
# and a one-row INSERT (a transaction committed through the pending
# buffer) -- each from two places:
#
#   leader:    the clients connect to the shard's leader;
#   forwarded: the clients connect to a follower, which forwards each
#              publish to the leader, or stages each INSERT's commit there
#              and then commits it (felix.forward_publishes = on).
#
# Rounds alternate which goes first.  Reports tps and p50 latency of each,
# the ratio forwarded / leader, and checks that the forwarded publishes
# were counted (felix_metrics publishes_forwarded) and that every record
# reached the shard.
#
# Usage:   test/bench/forward.sh            (as root or as a normal user)
# Env:     DURATION=15   seconds per pgbench point
#          ROUNDS=2      rounds per point
#          QUICK=1       smoke run: 3 s points, 1 round
#          KEEP=1        keep /tmp/felix-bench-fwd after exit
#          PGBIN=/usr/lib/postgresql/15/bin
#
# As root the servers and clients run as user `postgres`.  The servers
# listen only on Unix sockets in /tmp/felix-bench-fwd/sock, ports
# 5541-5543; everything is stopped and the directory removed on exit.

set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
BASE=/tmp/felix-bench-fwd
SOCK=$BASE/sock
WORK=$BASE/work
FPORTS=(5541 5542 5543)
QUICK=${QUICK:-0}
if [[ $QUICK == 1 ]]; then
	DURATION=${DURATION:-3}
	ROUNDS=${ROUNDS:-1}
else
	DURATION=${DURATION:-15}
	ROUNDS=${ROUNDS:-2}
fi
KEEP=${KEEP:-0}
CLIENTS=(1 8 32)

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CMDLINE="DURATION=$DURATION ROUNDS=$ROUNDS QUICK=$QUICK $0"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 10 ]] || { echo "forward.sh: ROUNDS must be 1..10" >&2; exit 2; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 ]] || { echo "forward.sh: DURATION must be a positive integer" >&2; exit 2; }

BENCH_NAME=bench-fwd
# shellcheck source=test/bench/lib.sh
. "$SCRIPT_DIR/lib.sh"

bench_run_user
bench_as_user
bench_require postgres initdb pg_ctl psql pgbench pg_isready pg_config

STARTED=()
BG_PIDS=()
PROBE_PIDS=()
SANITY=()
declare -A TPS_SUM TPS_N TPS_LIST P50_SUM LAT_SUM
for port in "${FPORTS[@]}"; do
	"$PGBIN/pg_isready" -q -h "$SOCK" -p "$port" -t 1 2>/dev/null &&
		die "a server from an earlier run still listens on $SOCK port $port; stop it first"
done
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bench_fresh_base

felix_cluster_start "felix.forward_publishes = on"
STREAM=fwd
q "${FPORTS[0]}" -c "SELECT felix_create_stream('$STREAM', shards => 1, replication_factor => 3, consistency => 'quorum')" >/dev/null
LEADER=$(leader_port "$STREAM") || die "no leader for $STREAM"
for p in "${FPORTS[@]}"; do [[ $p != "$LEADER" ]] && { FOLLOWER=$p; break; }; done
# the follower knows the leader's address once its heartbeat listed the nodes
for (( i = 0; i < 100; i++ )); do
	[[ $(q "$FOLLOWER" -c "SELECT count(*) FROM felix_shards WHERE stream = '$STREAM' AND role = 'follower'") == 1 ]] && break
	sleep 0.1
done
log "leader on port $LEADER, clients of the forwarded case on $FOLLOWER"

PAYLOAD=$(q "${FPORTS[0]}" -c "SELECT jsonb_build_object('id', 0, 'pad', repeat('x', 80))::text")
[[ ${#PAYLOAD} == 100 ]] || die "payload text is ${#PAYLOAD} bytes, expected 100"
declare -A SCRIPTS
SCRIPTS[publish]=$(write_script publish "SELECT felix_publish('$STREAM', '$PAYLOAD'::jsonb, shard => 0);")
SCRIPTS[insert]=$(write_script insert "INSERT INTO $STREAM (shard, payload) VALUES (0, '$PAYLOAD'::jsonb);")
KINDS=(publish insert)

fwd_before=$(q "$FOLLOWER" -c "SELECT value::bigint FROM felix_metrics WHERE name = 'publishes_forwarded'")
total=0
for (( r = 1; r <= ROUNDS; r++ )); do
	for k in "${KINDS[@]}"; do
		for c in "${CLIENTS[@]}"; do
			order=(leader forwarded)
			(( r % 2 == 0 )) && order=(forwarded leader)
			for v in "${order[@]}"; do
				port=$LEADER
				[[ $v == forwarded ]] && port=$FOLLOWER
				pgbench_run "$k-$v-c$c-r$r" "$port" "${SCRIPTS[$k]}" "$c" "$DURATION"
				record_point "$k-$v-$c"
				total=$(( total + ${PB_TX:-0} ))
			done
		done
	done
done
fwd_after=$(q "$FOLLOWER" -c "SELECT value::bigint FROM felix_metrics WHERE name = 'publishes_forwarded'")
records=$(q "$LEADER" -c "SELECT next_seq FROM felix_shards WHERE stream = '$STREAM'")
[[ $(( fwd_after - fwd_before )) -gt 0 ]] || SANITY+=("the follower counted no forwarded publish")
[[ $records -ge $total ]] || SANITY+=("the shard holds $records records, pgbench completed $total publishes")

report=$(
	echo "## Publishing on a follower (forwarded) vs on the leader"
	echo
	echo "Command: \`$CMDLINE\`; $(nproc) cores, $(uname -r); felix $(git -C "$SCRIPT_DIR" log -1 --format='%h' 2>/dev/null || echo '?')."
	echo "1-shard quorum stream, replication factor 3, three nodes on this machine; 100-byte jsonb, pgbench -M prepared, ${DURATION} s x ${ROUNDS} round(s)."
	echo
	echo "| how | clients | leader tps | forwarded tps | ratio | leader p50 ms | forwarded p50 ms | added p50 ms |"
	echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
	for k in "${KINDS[@]}"; do
		for c in "${CLIENTS[@]}"; do
			lt=$(mean_of TPS_SUM "$k-leader-$c"); ft=$(mean_of TPS_SUM "$k-forwarded-$c")
			lp=$(mean_of P50_SUM "$k-leader-$c"); fp=$(mean_of P50_SUM "$k-forwarded-$c")
			echo "| $k | $c | $lt | $ft | $(ratio "$ft" "$lt") | $lp | $fp | $(awk -v a="$fp" -v b="$lp" 'BEGIN{ if (a == "" || b == "") print "n/a"; else printf "%.3f", a - b }') |"
		done
	done
	echo
	echo "Forwarded publishes and commit parts counted by the follower: $(( fwd_after - fwd_before )); records in the shard: $records (pgbench completed $total)."
	if [[ ${#SANITY[@]} -gt 0 ]]; then
		echo
		echo "Problems:"
		printf -- '- %s\n' "${SANITY[@]}"
	fi
)
echo "$report"
[[ ${#SANITY[@]} -eq 0 ]] || exit 3
