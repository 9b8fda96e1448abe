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
