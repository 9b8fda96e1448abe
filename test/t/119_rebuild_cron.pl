# With automatic rebuilds off (felix.rebuild_max_concurrent = 0), a pg_cron
# job calling felix_rebuild_halted() on the leader rebuilds a halted
# follower.
#
# Why: rebuild_max_concurrent = 0 makes every halt an operator's
# (replication-design.txt, "Rebuilding a halted follower"), and
# felix_rebuild_halted() is the operator's way to ask for all of them on a
# schedule -- the SQL says it is meant for a pg_cron job.  This checks that
# it works from inside pg_cron, as pg_cron runs it (a background worker, in
# cron.database_name, as the job's owner), not just from psql.
#
# How: pg_cron is preloaded on every node (shared_preload_libraries =
# 'felix,pg_cron', cron.database_name = 'postgres', jobs run in background
# workers so no connection or password is involved).  A follower F
# (node2 or node3) of a stream led by L (the other one) holds records, is
# stopped while L's retention trims past them, and is started again: it
# refuses the bootstrap L offers and halts needs_bootstrap.  Nothing
# rebuilds it for a few seconds.  Then, on L: CREATE EXTENSION pg_cron and
# a job 'felix-rebuild' running SELECT felix_rebuild_halted() every minute
# (pg_cron 1.4 has no second schedules, so the first run can take up to a
# minute).  Asserted: L rebuilds F "as asked" (rebuilds_started and
# rebuilds_completed + 1, copies_rebuilt on F), F ends with exactly L's
# records in byte-identical record batches, felix_halted is empty again,
# and cron.job_run_details shows the job's run succeeded.
#
# tap-etcd: skip.  Its subject is a pg_cron job asking for rebuilds; the
# control-plane store plays the same part in it as in the scripts that
# run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $lib = `pg_config --pkglibdir`;
chomp $lib;
$lib ||= '/usr/lib/postgresql/15/lib';
plan skip_all => "pg_cron is not installed ($lib/pg_cron.so)" unless -e "$lib/pg_cron.so";

my $c = FelixCluster->new(
	nodes => 3,
	conf  => [
		"felix.segment_bytes = '64kB'",
		'felix.rebuild_max_concurrent = 0',
		"shared_preload_libraries = 'felix,pg_cron'",
		"cron.database_name = 'postgres'",
		'cron.use_background_workers = on',
		'max_worker_processes = 24',
	]);

# Neither the leader nor the follower under test is node1 (the control
# plane), so stopping the follower leaves the control plane up.
my ($stream, @set) = $c->pick_stream_name('cronrb', 3,
	sub { $_[0] ne 'node1' && $_[1] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text', retention_bytes => 200000);
my ($leader, $g) = $c->wait_leader($stream, 0);
my $lname = $leader->{felix_name};
my $f = $c->node($set[1]);
my $fname = $f->{felix_name};
note("leader $lname, follower under test $fname");
$c->wait_shipping($leader, $stream, 0, 2, 30);
is($leader->safe_psql('postgres', 'SHOW felix.rebuild_max_concurrent'), '0',
	"automatic rebuilds are off on $lname");

sub publish
{
	my ($tag, $n) = @_;
	$leader->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', '$tag-' || i || '-' || repeat('x', 1000), shard => 0)) "
		  . "FROM generate_series(1, $n) i");
}

sub start_seq
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT start_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

# ---------------------------------------------------------------------
# A follower halted needs_bootstrap
# ---------------------------------------------------------------------
publish('a', 100);
ok(defined FelixCluster::poll(30, sub {
	$f->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") eq '100' }, 0.1),
	"$fname holds the first 100 records");
$c->stop_node($f);
publish('b', 600);
$leader->safe_psql('postgres', "SELECT felix_enforce_retention('$stream')");
my $start = start_seq($leader);
cmp_ok($start, '>', 100, "${lname}'s retention trimmed past ${fname}'s position (its log starts at $start)");
my %base = map { $_ => $c->metric_of($leader, $_) // 0 } qw(rebuilds_started rebuilds_completed);
$c->start_node($f);

my $state = '';
ok(defined FelixCluster::poll(60, sub {
	$state = $leader->safe_psql('postgres',
		"SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'");
	$state eq 'halted_needs_bootstrap' }, 0.1),
	"$lname halted $fname needs_bootstrap ($state)")
  or $c->diag_shard($stream, 0);
ok(defined FelixCluster::poll(20, sub {
	$c->cp->safe_psql('postgres',
		"SELECT reason || ' ' || (action ~ 'felix_rebuild') FROM felix_halted "
		  . "WHERE stream = '$stream' AND node = '$fname'") eq 'needs_bootstrap true' }, 0.1),
	'felix_halted lists it, with felix_rebuild in its action');

# It stays halted: nothing rebuilds it on its own.
sleep 3;
is($leader->safe_psql('postgres',
		"SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'"),
	'halted_needs_bootstrap', "3 s later $fname is still halted");
is($c->metric_of($leader, 'rebuilds_started') // 0, $base{rebuilds_started}, 'no rebuild was started');

# ---------------------------------------------------------------------
# The pg_cron job
# ---------------------------------------------------------------------
$leader->safe_psql('postgres', 'CREATE EXTENSION pg_cron');
note('pg_cron ' . $leader->safe_psql('postgres',
	"SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'"));
my $jobid = $leader->safe_psql('postgres',
	"SELECT cron.schedule('felix-rebuild', '* * * * *', 'SELECT felix_rebuild_halted()')");
like($jobid, qr/^\d+$/, "job felix-rebuild scheduled on $lname (job $jobid), every minute");
my $t0 = time;

my $rebuilt = FelixCluster::poll(90, sub {
	($c->metric_of($leader, 'rebuilds_completed') // 0) > $base{rebuilds_completed} }, 0.5);
ok(defined $rebuilt, sprintf('the job had %s rebuilt %.0f s after it was scheduled', $fname, time - $t0))
  or $c->diag_shard($stream, 0);
is($c->metric_of($leader, 'rebuilds_started'), $base{rebuilds_started} + 1, 'rebuilds_started + 1');
is($c->metric_of($leader, 'rebuilds_completed'), $base{rebuilds_completed} + 1, 'rebuilds_completed + 1');
like(read_file($leader->logfile),
	qr/felix ship: stream "$stream" shard 0: rebuilding follower "$fname" \(halted needs_bootstrap\) from seq $start, as asked/,
	"$lname logged the rebuild as asked for");
cmp_ok($c->metric_of($f, 'copies_rebuilt') // 0, '>=', 1, "$fname discarded its copy (copies_rebuilt)");

# The job's run, as pg_cron recorded it.
my $runs = '';
ok(defined FelixCluster::poll(30, sub {
	$runs = $leader->safe_psql('postgres',
		"SELECT string_agg(status || ': ' || coalesce(return_message, ''), '; ' ORDER BY runid) "
		  . "FROM cron.job_run_details WHERE jobid = $jobid AND status NOT IN ('starting', 'running')");
	$runs =~ /succeeded/ }, 0.2),
	"cron.job_run_details shows job felix-rebuild ran successfully ($runs)");
unlike($runs, qr/failed/, 'no run of the job failed');

# The outcome.
my $want = $c->records($leader, $stream, 0);
ok(defined FelixCluster::poll(60, sub { $c->records($f, $stream, 0) eq $want }, 0.2),
	"$fname serves exactly ${lname}'s records");
is(start_seq($f), $start, "${fname}'s log begins at ${lname}'s oldest record");
is(segment_digest($f, $stream, 0), segment_digest($leader, $stream, 0),
	"${fname}'s segments hold byte-identical record batches to ${lname}'s");
ok(defined FelixCluster::poll(20, sub {
	!grep { $_->safe_psql('postgres', "SELECT count(*) FROM felix_halted WHERE stream = '$stream'") ne '0' }
	  $c->nodes }, 0.1),
	'felix_halted is empty again on every node');
is($leader->safe_psql('postgres', 'SELECT felix_rebuild_halted()'), '0',
	'felix_rebuild_halted() finds nothing more to ask for');

# Quorum publishes reach it as an ordinary follower.
publish('c', 10);
$want = $c->records($leader, $stream, 0);
ok(defined FelixCluster::poll(30, sub { $c->records($f, $stream, 0) eq $want }, 0.2),
	"$fname takes new records like any follower");

$leader->safe_psql('postgres', "SELECT cron.unschedule('felix-rebuild')");
$c->teardown;
felix_done_testing();
