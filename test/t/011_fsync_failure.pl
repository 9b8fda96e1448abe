# A failed fsync of a segment file follows data_sync_retry, as PostgreSQL's
# own files do.  After a failed sync the kernel may have dropped the dirty
# pages, so a later sync that "succeeds" proves nothing: by default the
# server must PANIC and recover from what is really on disk; with
# data_sync_retry = on the call gets an ERROR and the server carries on.
#
# The failure is injected by fault_shim.c (compiled here into tmp_check and
# preloaded into the server with LD_PRELOAD): fsync and fdatasync of files
# under felix's data directory whose names end in ".seg" fail with EIO while
# a trigger file exists; a trigger reading "once" is removed by the first
# failure it causes.  PostgreSQL's pg_fsync and pg_fdatasync skip the system
# call altogether with fsync = off, which PostgreSQL::Test::Cluster sets, so
# the node runs with fsync = on.
#
#   a. data_sync_retry = off (the default): a publish whose flush fails
#      makes the server PANIC; the postmaster reinitializes (crash
#      recovery), every acknowledged record is still there at its seq, and
#      publishing works again.
#   b. data_sync_retry = on: each publish whose flush fails gets an ERROR
#      (SQLSTATE 58030 io_error) naming the segment file, the server stays
#      up and keeps serving reads, and once the trigger is removed
#      publishing resumes with every acknowledged record readable.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $t_start   = time;
my $tmp_check = $PostgreSQL::Test::Utils::tmp_check;
my $trigger   = "$tmp_check/fsync_fault_trigger";
my $faultlog  = "$tmp_check/fsync_fault.log";
unlink $trigger, $faultlog;

# --- The shim, built for this machine. ---
my $shim = fault_shim();
{

	# The shim itself, outside the server: Perl's IO::Handle::sync is fsync(2).
	my $dir = "$tmp_check/shim_selftest";
	mkdir $dir;
	write_file("$dir/x.seg", 'x');
	write_file($trigger, 'always');
	my $probe = q{use IO::Handle; open my $fh, '+<', $ARGV[0] or die $!;
		print $fh->sync ? "synced\n" : "failed: $!\n";};
	my $run = sub {
		my ($file) = @_;
		local $ENV{LD_PRELOAD}          = $shim;
		local $ENV{FELIX_FAULT_DIR}     = $dir;
		local $ENV{FELIX_FAULT_TRIGGER} = $trigger;
		local $ENV{FELIX_FAULT_SUFFIX}  = '.seg';
		my $o = '';
		IPC::Run::run([ $^X, '-e', $probe, $file ], '>', \$o, '2>&1');
		chomp $o;
		return $o;
	};
	write_file("$dir/x.idx", 'x');
	is($run->("$dir/x.seg"), 'failed: Input/output error',
		'shim: fsync of a .seg file under the directory fails with EIO while the trigger exists');
	is($run->("$dir/x.idx"), 'synced', 'shim: another file under the directory syncs');
	unlink $trigger;
	is($run->("$dir/x.seg"), 'synced', 'shim: without the trigger the .seg file syncs');
	write_file($trigger, 'once');
	is($run->("$dir/x.seg") . ' / ' . $run->("$dir/x.seg"),
		'failed: Input/output error / synced', 'shim: a "once" trigger fails one call');
	ok(!-e $trigger, 'shim: and the "once" trigger is gone');
}

my $node = PostgreSQL::Test::Cluster->new('fsync_failure');
$node->init;
$node->append_conf('postgresql.conf',
	join("\n",
		felix_base_conf(),
		'fsync = on',    # else pg_fdatasync never calls fdatasync
		'restart_after_crash = on',
		"felix.segment_bytes = '256kB'")
	  . "\n");
my $fdir = $node->data_dir . '/felix';

sub start_with_shim
{
	local $ENV{LD_PRELOAD}          = $shim;
	local $ENV{FELIX_FAULT_DIR}     = $fdir;
	local $ENV{FELIX_FAULT_TRIGGER} = $trigger;
	local $ENV{FELIX_FAULT_SUFFIX}  = '.seg';
	local $ENV{FELIX_FAULT_LOG}     = $faultlog;
	$node->start;
	my $maps = read_file('/proc/' . $node->{_pid} . '/maps');
	ok(index($maps, $shim) >= 0, 'the postmaster has the shim loaded');
	return;
}

start_with_shim();
$node->safe_psql('postgres', q{
	CREATE EXTENSION felix;
	SELECT felix_create_stream('fs', payload_type => 'text');
	CREATE TABLE acks (i int PRIMARY KEY, seq bigint NOT NULL);
});
is($node->safe_psql('postgres', 'SHOW fsync'), 'on', 'the node runs with fsync = on');

sub payload_sql
{
	my ($i) = @_;
	return "format('fs-%s-%s', $i, repeat(md5(($i)::text), 8))";
}

# Publish records $from..$to (one call each) on shard 0, stopping at the
# first error; the acknowledged ones go into acks.  Returns psql's exit
# code, stderr, and the count acknowledged.
sub publish_loop
{
	my ($from, $to) = @_;
	my $payload = payload_sql('i');
	my ($rc, $err) = psql_error($node, qq{
		DO \$\$ DECLARE p felix_position; BEGIN
			FOR i IN $from..$to LOOP
				p := felix_publish('fs', $payload, shard => 0);
				RAISE NOTICE 'ack % %', i, p.seq;
			END LOOP; END \$\$;});
	my @acks;
	push @acks, "($1, $2)" while $err =~ /NOTICE:\s+(?:00000:\s+)?ack (\d+) (\d+)/g;
	return ($rc, $err, 0) unless @acks;
	# the server may be restarting: retry the bookkeeping (bounded)
	for my $try (1 .. 100)
	{
		last if $node->psql('postgres', 'INSERT INTO acks VALUES ' . join(',', @acks)) == 0;
		die 'could not record acknowledgements' if $try == 100;
		usleep(100_000);
	}
	return ($rc, $err, scalar @acks);
}

# Every acknowledged record at its seq; every other record is one of the
# publishes that failed ($failed: SQL list of their i); seqs contiguous.
sub check_acks
{
	my ($label, $failed) = @_;
	my $payload = payload_sql('a.i');
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM acks a
			 WHERE NOT EXISTS (SELECT 1 FROM fs f
			                    WHERE f.shard = 0 AND f.seq = a.seq AND f.payload = $payload)}),
		'0', "$label: every acknowledged record is readable at its seq with its payload");
	my $others = $node->safe_psql('postgres', q{
		SELECT coalesce(string_agg(split_part(payload, '-', 2), ',' ORDER BY seq), '')
		  FROM fs f WHERE NOT EXISTS (SELECT 1 FROM acks a WHERE a.seq = f.seq)});
	note("$label: records present that were never acknowledged: i = "
		  . ($others eq '' ? 'none' : $others));
	my %allowed = map { $_ => 1 } split /,/, $failed;
	is(join(',', grep { !$allowed{$_} } split /,/, $others), '',
		"$label: every other record is one whose publish failed");
	is( $node->safe_psql('postgres', q{
			SELECT coalesce(string_agg(format('%s records, seqs %s..%s, %s distinct', n, lo, hi, d), ''), '')
			  FROM (SELECT count(*) n, min(seq) lo, max(seq) hi, count(DISTINCT seq) d FROM fs) s
			 WHERE n > 0 AND (lo <> 0 OR hi <> n - 1 OR d <> n)}),
		'', "$label: seqs are contiguous from 0, no duplicate");
	return;
}

# The lines of the shim's log: one per failure injected.
sub fault_lines
{
	return () unless -e $faultlog;
	my @lines = split /\n/, read_file($faultlog);
	return @lines;
}

sub fault_count
{
	my @lines = fault_lines();
	return scalar @lines;
}

# Bounded wait until the server accepts connections and leads the shard.
sub wait_serving
{
	my $deadline = time + 60;
	while (time < $deadline)
	{
		my $out = '';
		if ($node->psql('postgres',
				"SELECT count(*) FROM felix_shards WHERE stream = 'fs' AND role = 'leader' AND state = 'open'",
				stdout => \$out) == 0
			&& $out eq '1')
		{
			return 1;
		}
		usleep(100_000);
	}
	return 0;
}

# ======================================================================
# a. data_sync_retry = off: PANIC and crash recovery
# ======================================================================
{
	is($node->safe_psql('postgres', 'SHOW data_sync_retry'), 'off', 'a: data_sync_retry is off');
	my ($rc, $err, $n) = publish_loop(1, 50);
	is($rc, 0, 'a: 50 records published and acknowledged') or diag($err);
	is(fault_count(), 0, 'a: no failure injected yet');

	my $pm      = $node->{_pid};
	my $log_off = -s $node->logfile;
	write_file($trigger, 'once');
	($rc, $err, $n) = publish_loop(51, 100);
	note("a: publish loop after the trigger: exit $rc, $n acknowledged; stderr:\n$err");
	is($n, 0, 'a: the first publish after the trigger is not acknowledged');
	isnt($rc, 0, 'a: it fails');
	like($err, qr/PANIC:\s+(?:\w{5}:\s+)?stream "fs" shard 0: could not fdatasync file "[^"]*\.seg": Input\/output error/,
		'a: with a PANIC naming the stream, shard, segment file and the I/O error');
	my @faults = fault_lines();
	is(scalar @faults, 1, 'a: exactly one sync failed');
	like($faults[0] // '', qr{^\d+ fdatasync \Q$fdir\E/\d+/\d+/0/\d{20}\.seg$},
		'a: an fdatasync of shard 0\'s segment file');
	ok(!-e $trigger, 'a: the one-shot trigger is gone');

	ok(wait_serving(), 'a: the server serves the shard again within 60 s');
	my $log = substr(read_file($node->logfile), $log_off);
	like($log, qr/PANIC:\s+stream "fs" shard 0: could not fdatasync file/, 'a: the server log shows the PANIC');
	like($log, qr/all server processes terminated; reinitializing/,
		'a: the postmaster reinitialized (crash recovery)');
	ok(kill(0, $pm), 'a: the postmaster itself survived');

	check_acks('a: after crash recovery', '51');
	($rc, $err, $n) = publish_loop(101, 120);
	is($rc, 0, 'a: publishing works again') or diag($err);
	check_acks('a: after publishing again', '51');
}

# ======================================================================
# b. data_sync_retry = on: an ERROR, and the server stays up
# ======================================================================
{
	$node->stop;
	$node->append_conf('postgresql.conf', "data_sync_retry = on\n");
	start_with_shim();
	ok(wait_serving(), 'b: the shard is served after the restart');
	is($node->safe_psql('postgres', 'SHOW data_sync_retry'), 'on', 'b: data_sync_retry is on');
	check_acks('b: after the restart', '51');

	my ($rc, $err, $n) = publish_loop(201, 220);
	is($rc, 0, 'b: 20 records published and acknowledged') or diag($err);

	my $pm      = $node->{_pid};
	my $t0      = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
	my $log_off = -s $node->logfile;
	my $faults0 = fault_count();
	write_file($trigger, 'always');

	# Three publishes while every sync of the segment fails.
	for my $i (221 .. 223)
	{
		($rc, $err, $n) = publish_loop($i, $i);
		is($n, 0, "b: publish $i while the sync fails is not acknowledged");
		my ($sev, $state, $msg) =
		  $err =~ /\b(ERROR|FATAL|PANIC):\s+([0-9A-Z]{5}):\s+([^\n]*)/;
		$sev //= '';
		$state //= '';
		$msg //= '';
		note("b: publish $i: $sev $state: $msg");
		is($sev, 'ERROR', "b: publish $i gets an ERROR (not a PANIC)") or diag($err);
		like($state, qr/^5[38]/, "b: publish $i: SQLSTATE class 58 or 53 ($state)");
		like($msg, qr/stream "fs" shard 0: could not fdatasync file "[^"]*\.seg": Input\/output error/,
			"b: publish $i: the message names the stream, shard, segment file and the I/O error");
	}
	is(fault_count() - $faults0, 3, 'b: three sync failures were injected');

	is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $t0,
		'b: the server stayed up (pg_postmaster_start_time unchanged)');
	ok(kill(0, $pm), 'b: the same postmaster runs');
	my $log = substr(read_file($node->logfile), $log_off);
	unlike($log, qr/PANIC|terminated by signal|reinitializing/,
		'b: no PANIC and no crash in the server log');
	check_acks('b: while syncs fail, reads', '51,221,222,223');

	unlink $trigger or die "unlink $trigger: $!";
	($rc, $err, $n) = publish_loop(301, 320);
	is($rc, 0, 'b: with the trigger removed, publishing resumes') or diag($err);
	is($n, 20, 'b: 20 more records acknowledged');
	check_acks('b: after the fault cleared', '51,221,222,223');
	is(fault_count() - $faults0, 3, 'b: no sync failed after the trigger was removed');

	$node->stop;
	$node->start;    # without the shim
	ok(wait_serving(), 'b: served after a clean restart');
	check_acks('b: after a restart', '51,221,222,223');
}

$node->stop;
note(sprintf('011_fsync_failure took %.1fs', time - $t_start));
felix_done_testing();
