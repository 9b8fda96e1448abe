#!/usr/bin/env bash
#
# docs/formal/check.sh -- model-check felix's replication models with spin.
#
# Runs every model of docs/formal/ (shard.pml, duty.pml) and every variant
# with spin: spin -a generates the verifier, gcc compiles it, pan searches
# the state space.  One line per run: whether it behaved as expected, what
# was expected (pass: no assertion can fail; FAIL: spin must find a
# counterexample, of the property named), the state count and the time.
#
# Exits 0 when every correct model passes and every broken variant yields
# a counterexample of the expected property; 1 otherwise; 2 when spin or
# gcc is missing.  Needs only bash, spin and gcc (and coreutils).
#
# Usage: docs/formal/check.sh [-j JOBS] [--only REGEX] [--trails] [--deep] [--keep]
#   -j JOBS   runs at once (default 2)
#   --only R  only the runs whose name matches the extended regex R
#   --trails  print the counterexample of each failing run (its MSC lines)
#   --deep    add larger bounds, searched with bitstate hashing (about
#             0.5-1 GB and up to ten minutes each; how complete a search
#             is, is the hash factor pan reports)
#   --keep    keep the scratch directory and say where it is
#
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jobs=2
trails=0
deep=0
keep=0
only=""
while [ $# -gt 0 ]; do
	case "$1" in
		-j) jobs="$2"; shift 2 ;;
		-j*) jobs="${1#-j}"; shift ;;
		--trails) trails=1; shift ;;
		--deep) deep=1; shift ;;
		--keep) keep=1; shift ;;
		--only) only="$2"; shift 2 ;;
		-h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
		*) echo "check.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
done

for tool in spin gcc; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "check.sh: '$tool' is not installed (Debian: apt-get install -y $tool)" >&2
		exit 2
	fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/felix-formal.XXXXXX")" || exit 2
declare -A pids=()
# each run is a job with its own process group (set -m), so an interrupt
# stops its spin, gcc and pan too
set -m
stop_runs() {
	for i in "${!pids[@]}"; do kill -TERM -- "-${pids[$i]}" 2>/dev/null; done
}
if [ "$keep" = 1 ]; then
	trap 'stop_runs; echo "scratch kept in $work"' EXIT
else
	trap 'stop_runs; rm -rf "$work"' EXIT
fi
trap 'exit 130' INT TERM

# name | model | spin -D flags | gcc -O level (O0 compiles 5x faster, O2
# searches faster), with "+bfs" for a breadth-first search (the shortest
# counterexample; duty.pml only), "+prev" for pan's reversed process order
# (-DP_REVERSE: only the order of the search, so a run that must fail meets
# its counterexample sooner; an exhaustive search stores the same states)
# or "+mN" for a search depth of N, or "+bit" for bitstate hashing (a
# counterexample too deep for an exhaustive search's memory; its "pass"
# would not be complete, so only for runs that must fail) |
# expect: pass, or the property tags a counterexample must break (a regex
# over the tag written after the failed assert)
runs=(
	# the implemented design with S as well (S adds no states to these)
	"shard: implemented design, 2 records, gen<=2|shard.pml|-DSERVED -DNREC=2 -DMAXGEN=2 -DMAXCRASH=0|O2|pass"
	"shard: implemented design, 1 record, gen<=3|shard.pml|-DSERVED -DNREC=1 -DMAXGEN=3 -DMAXCRASH=0|O2|pass"
	"shard: implemented design, 1 record, a crash|shard.pml|-DSERVED -DNREC=1 -DMAXGEN=2 -DMAXCRASH=1|O2|pass"
	"shard: report in flight across steps|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=0 -DREPORT_WINDOW|O2|pass"
	"shard: BROKEN_REPORT_ORDER|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DBROKEN_REPORT_ORDER|O0|P1"
	"shard: BROKEN_WAITER_GENERATION|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DBROKEN_WAITER_GENERATION|O0|P2: at the publisher"
	"shard: BROKEN_WAITER_GENERATION, P1 only, 3 rec|shard.pml|-DNREC=3 -DMAXGEN=2 -DMAXCRASH=0 -DBROKEN_WAITER_GENERATION -DONLY_P1|O2|P1"
	"shard: guard deleted: lease at the mark|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=0 -DREPORT_WINDOW -DNO_LEASE_AT_MARK|O0|P2: at the mark"
	"shard: guard deleted: lease_recheck|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DNO_RECHECK|O0|P3"
	"shard: guard deleted: caught-up gate|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DPROMOTE_ANY|O0|P1"
	# finding 1: the code before C2-C4, and each of C2, C3, C4 at work on
	# its own route -- all with C8 and C9 undone, as C2-C4 left the code
	"shard: restore: the code before C2-C4|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DOLD_REPORT_WITHOUT_LEASE -DOLD_CLAIM_WITHOUT_CHECK -DOLD_LEADER_CHECK_REPORTS_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED|O0|P1"
	"shard: restore, marks reported|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DMARKS_REPORTED -DOLD_CLAIM_FLOOR_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED|O2|pass"
	"shard: restore, marks reported, C2 undone|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DMARKS_REPORTED -DOLD_CLAIM_FLOOR_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED -DOLD_REPORT_WITHOUT_LEASE|O0|P1"
	"shard: restore, marks reported, C3 undone|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DMARKS_REPORTED -DOLD_CLAIM_FLOOR_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED -DOLD_CLAIM_WITHOUT_CHECK|O0|P1"
	"shard: restore after claim, C4's case|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_TAKEN_ONLY -DMARKS_WITNESSED -DCAUGHT_UP_HEARD -DOLD_CLAIM_FLOOR_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED|O2|pass"
	"shard: ... C4's case, C4 undone|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_TAKEN_ONLY -DMARKS_WITNESSED -DCAUGHT_UP_HEARD -DOLD_CLAIM_FLOOR_ONLY -DOLD_RESTARTED_LEADER_UNCHECKED -DOLD_LEADER_CHECK_REPORTS_ONLY|O0|P1"
	# finding 6: the implemented design (C8, C9) with the restore anywhere,
	# and on the paths of routes c and d; C8 undone finds route d, C9
	# undone route b
	"shard: restore, implemented design|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT|O2|pass"
	"shard: restore, C8 undone|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DOLD_CLAIM_FLOOR_ONLY|O0|P1"
	"shard: restore, C9 undone|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DOLD_RESTARTED_LEADER_UNCHECKED|O0|P1"
	"shard: caught-up follower's end stale|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_TAKEN_ONLY -DMARKS_WITNESSED -DCAUGHT_UP_ALIVE|O2|pass"
	"shard: restored between grant and claim|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_UNTAKEN_ONLY -DMARKS_WITNESSED -DCAUGHT_UP_HEARD|O2|pass"
	# what-if, not the C code: grant_boot exempts a grantee that has not
	# claimed yet but is still in the boot it was granted to (finding 6)
	"shard: what-if grant_boot, 1 record, gen<=3|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=0 -DGRANT_BOOT|O2|pass"
	"shard: several shards per node|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=0 -DSEVERAL_SHARDS|O2|pass"
	"shard: several shards, old confirm without rows|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=0 -DSEVERAL_SHARDS -DOLD_CONFIRM_WITHOUT_ROWS|O0+prev|P1"
	"shard: repair at seq 0|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DPROBE_REPAIR_AT_ZERO|O2|pass"
	"shard: repair at seq 0, the code before 6fe9809|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DPROBE_REPAIR_AT_ZERO -DOLD_NO_REPAIR_AT_ZERO|O0+prev|R"
	# promotion by log (copies_candidate): any node may come back from an
	# older copy; each guard of the rule deleted in turn
	"shard: by log, any node restored|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_ANY_NODE|O2|pass"
	"shard: by log, any node restored, gen<=3|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_ANY_NODE|O2|pass"
	"shard: by log, a copy restored, another restarted|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=2 -DRESTORE_FAULT -DRESTORE_ANY_NODE|O2|pass"
	"shard: by log, guard deleted: token|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_ANY_NODE -DBY_LOG_ANY_COPY|O0|P1"
	"shard: by log, guard deleted: n - n/2|shard.pml|-DNREC=1 -DMAXGEN=2 -DMAXCRASH=2 -DBY_LOG_NEED_ONE|O0|P1"
	# S: below any node's mark, one history -- the follower's side of bugs
	# 4 and 12 (docs/reliability.md); the code before their fixes breaks it
	"shard: S, the tail trusted (before bugs 4 and 12)|shard.pml|-DSERVED -DOLD_TAIL_TRUSTED -DNREC=3 -DMAXGEN=3 -DMAXCRASH=0|O2+bit|S"
	"shard: by log, tokens recorded at the grant|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=1 -DRESTORE_FAULT -DRESTORE_ANY_NODE -DBY_LOG_TOKENS_AT_GRANT|O0|P1"
	"shard: by log, guard deleted: past the taken log|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=2 -DRESTORE_FAULT -DRESTORE_ANY_NODE -DBY_LOG_NOT_PAST_TAKEN|O0|P1"
	"duty: implemented design, rates 1..2|duty.pml||O0|pass"
	"duty: implemented design, rates 2..3|duty.pml|-DRMIN=2 -DRMAX=3 -DLEASE=6 -DEPS=1 -DMARGIN=2|O0|pass"
	"duty: BROKEN_GRANT_AT_ONCE|duty.pml|-DBROKEN_GRANT_AT_ONCE|O0+bfs|D1|D2"
	"duty: BROKEN_GRANT_AT_ONCE, two leaders|duty.pml|-DBROKEN_GRANT_AT_ONCE -DTWO_LEADERS_ONLY|O0+bfs|D2"
	"duty: guard deleted: claim compare|duty.pml|-DNO_CLAIM_CAS|O0+bfs|D1|D2"
	"duty: no epsilon, no margin, rates 1..2|duty.pml|-DEPS=0 -DMARGIN=0|O0+bfs|D1|D2"
	"duty: no margin, rates 2..3|duty.pml|-DRMIN=2 -DRMAX=3 -DLEASE=6 -DEPS=1 -DMARGIN=0|O0+bfs|D1|D2"
	"duty: duty-key compare removed (redundant)|duty.pml|-DNO_DUTY_CAS|O0|pass"
)
if [ "$deep" = 1 ]; then
	runs+=(
		"deep shard: any caught-up follower, no order|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DANY_CAUGHT_UP|O2|pass"
		"deep shard: 2 records, gen<=3|shard.pml|-DNREC=2 -DMAXGEN=3 -DMAXCRASH=0|O2|pass"
		"deep shard: 2 records, a crash|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=1|O2|pass"
		"deep shard: 2 records, report in flight|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=0 -DREPORT_WINDOW|O2|pass"
		"deep shard: no caught-up row, 2 crashes|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=2 -DRESTORE_FAULT -DRESTORE_TAKEN_ONLY -DCAUGHT_UP_HEARD|O2|pass"
		"deep shard: no caught-up row, C9 undone|shard.pml|-DNREC=2 -DMAXGEN=2 -DMAXCRASH=2 -DRESTORE_FAULT -DRESTORE_TAKEN_ONLY -DCAUGHT_UP_HEARD -DOLD_RESTARTED_LEADER_UNCHECKED|O2|P1"
		"deep shard: restore, 3 generations|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=1 -DRESTORE_FAULT|O2|pass"
		"deep shard: restore, 3 gens, what-if grant_boot|shard.pml|-DNREC=1 -DMAXGEN=3 -DMAXCRASH=1 -DRESTORE_FAULT -DGRANT_BOOT|O2|pass"
		"deep duty: 5 generations, rates 2..3|duty.pml|-DMAXGEN=5 -DRMIN=2 -DRMAX=3 -DLEASE=6 -DEPS=1 -DMARGIN=2|O2+m5000000|pass"
		"deep duty: takeover after a lease unchanged|duty.pml|-DDUTY_TIMING|O2+m5000000|pass"
	)
fi

if [ -n "$only" ]; then
	kept=()
	for spec in "${runs[@]}"; do
		if echo "${spec%%|*}" | grep -Eq -- "$only"; then kept+=("$spec"); fi
	done
	runs=("${kept[@]+"${kept[@]}"}")
	if [ ${#runs[@]} -eq 0 ]; then
		echo "check.sh: no run matches '$only'" >&2
		exit 2
	fi
fi

# One run, in its own directory: writes result (one line) and, for a
# counterexample, trail.txt.
run_one() {
	local idx="$1" spec="$2"
	local name model defs opt expect want
	IFS='|' read -r name model defs opt expect <<<"$spec"
	[ "$expect" = "pass" ] && want="pass" || want="FAIL"
	local dir="$work/$idx"
	mkdir -p "$dir"
	cp "$here/$model" "$dir/"
	local cflags="" hashw=24 depth=500000
	case "$name" in deep*) cflags="-DBITSTATE"; hashw=32 ;; esac
	case "$opt" in *+bfs) opt="${opt%+bfs}"; cflags="$cflags -DBFS"; defs="$defs -DTRAIL_BFS" ;; esac
	case "$opt" in *+prev) opt="${opt%+prev}"; cflags="$cflags -DP_REVERSE" ;; esac
	case "$opt" in *+bit) opt="${opt%+bit}"; cflags="$cflags -DBITSTATE"; hashw=28 ;; esac
	case "$opt" in *+m*) depth="${opt#*+m}"; opt="${opt%%+m*}" ;; esac
	local t0 t1 secs states errors outcome verdict tag line
	t0=$(date +%s.%N)
	(
		cd "$dir" || exit 1
		# shellcheck disable=SC2086
		spin -a $defs "$model" >spin.out 2>&1 &&
		gcc -w -$opt -DSAFETY -DNOBOUNDCHECK $cflags -o pan pan.c >gcc.out 2>&1 &&
		./pan -m"$depth" -w$hashw >pan.out 2>&1
	)
	local built=$?
	t1=$(date +%s.%N)
	secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	if [ ! -s "$dir/pan.out" ]; then
		printf 'FAIL|%s|%s|could not build or run (see spin.out, gcc.out)|-|%s\n' \
			"$name" "$want" "$secs" >"$dir/result"
		return
	fi
	states=$(awk '/states, stored/ { print $1; exit }' "$dir/pan.out")
	errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$dir/pan.out" | head -1)
	[ -n "$states" ] || states="-"
	[ -n "$errors" ] || errors="?"
	if [ "$errors" = "0" ]; then
		if grep -q "max search depth too small" "$dir/pan.out" ||
			! grep -Eq "(Full|Bit) statespace search" "$dir/pan.out"; then
			outcome="incomplete search"
		elif grep -q "Bit statespace search" "$dir/pan.out"; then
			outcome="no counterexample (bitstate, hash factor $(awk '/hash factor:/ { print $3; exit }' "$dir/pan.out"))"
		else
			outcome="no counterexample"
		fi
	elif [ "$errors" = "?" ]; then
		outcome="pan did not finish (exit $built)"
	else
		# replay the trail: a counterexample must be real
		(cd "$dir" && spin -t $defs "$model" >trail.out 2>&1)
		line=$(sed -n "s/^spin: $model:\([0-9][0-9]*\), Error: assertion violated.*/\1/p" "$dir/trail.out" | head -1)
		if [ -n "$line" ]; then
			tag=$(sed -n "${line}p" "$dir/$model" | sed -n 's|.*/\* *\([A-Z][0-9A-Z]*: [^*]*\)\*/.*|\1|p; s|.*/\* *\([A-Z][0-9]*\) *\*/.*|\1|p' | head -1)
			tag="$(echo "$tag" | sed 's/ *$//')"
			[ -n "$tag" ] || tag="assertion at $model:$line"
			outcome="counterexample: $tag"
			grep 'MSC:' "$dir/trail.out" | sed 's/^[[:space:]]*MSC: /    /' >"$dir/trail.txt"
			grep -E '^spin: .*Error' "$dir/trail.out" | head -2 | sed 's/^/    /' >>"$dir/trail.txt"
		else
			outcome="error without a replayable trail"
		fi
	fi
	if [ "$expect" = "pass" ]; then
		case "$outcome" in "no counterexample"*) verdict=ok ;; *) verdict=FAIL ;; esac
	else
		verdict=FAIL
		case "$outcome" in
			"counterexample: "*)
				tag="${outcome#counterexample: }"
				if echo "$tag" | grep -Eq "^($expect)"; then verdict=ok; fi ;;
		esac
	fi
	printf '%s|%s|%s|%s|%s|%s\n' "$verdict" "$name" "$want" "$outcome" "$states" "$secs" >"$dir/result"
}

print_result() {
	local idx="$1" verdict name want outcome states secs
	IFS='|' read -r verdict name want outcome states secs <"$work/$idx/result"
	printf '%-4s %-47s expect %-4s  %-46s %9s states %6ss\n' \
		"$verdict" "$name" "$want" "$outcome" "$states" "$secs"
	if [ "$trails" = 1 ] && [ -s "$work/$idx/trail.txt" ]; then
		cat "$work/$idx/trail.txt"
	fi
	[ "$verdict" = ok ]
}

echo "felix formal models: $(spin -V 2>&1 | head -1); $(gcc --version | head -1); $jobs at once"
start=$(date +%s.%N)
total=${#runs[@]}
next=0          # next run to start
shown=0         # next result to print
running=0
failed=0
while [ "$shown" -lt "$total" ]; do
	while [ "$running" -lt "$jobs" ] && [ "$next" -lt "$total" ]; do
		run_one "$next" "${runs[$next]}" &
		pids[$next]=$!
		running=$((running + 1))
		next=$((next + 1))
	done
	wait -n 2>/dev/null || true
	running=0
	for i in "${!pids[@]}"; do
		if kill -0 "${pids[$i]}" 2>/dev/null; then
			running=$((running + 1))
		else
			wait "${pids[$i]}" 2>/dev/null
			unset "pids[$i]"
		fi
	done
	while [ "$shown" -lt "$total" ] && [ -f "$work/$shown/result" ] &&
		[ -z "${pids[$shown]+x}" ]; do
		print_result "$shown" || failed=$((failed + 1))
		shown=$((shown + 1))
	done
done
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')
if [ "$failed" -eq 0 ]; then
	echo "all $total runs as expected, ${elapsed}s"
	exit 0
fi
echo "$failed of $total runs NOT as expected, ${elapsed}s"
exit 1
