# Bootstrap after retention, both cases.
#
# A follower that was down while the leader's retention trimmed past its
# position cannot be shipped to from where it stopped: what it lacks is
# gone from the leader too.  The leader offers it a log that begins at its
# oldest surviving record (felix.replicate op 'bootstrap'):
#
# - a follower whose copy of the shard is empty takes it ('bootstrapped':
#   copies_bootstrapped on the follower) and is shipped to from there like
#   any follower, with no halt;
# - a follower holding records of its own refuses (a log placed over them
#   would hide a hole) and halts needs_bootstrap: felix_halted lists it on
#   every node, with what to run; the leader rebuilds it under its policy
#   (felix.rebuild_max_concurrent = 1 by default: rebuilds_started,
#   rebuilds_completed), and it ends with exactly the leader's records,
#   in segments of the same names holding byte-identical batches.
#
# And a rebuild that finds the follower's disk full: the discard of its
# copy fails (ENOSPC, from fault_shim.c); the shard closes rather than
# failing for good, and once there is space again the next shipment opens
# it from disk and the leader rebuilds it -- no restart.  (The fault
# harness found such a replica left 'failed' until a restart, seed 5096.)
#
# No acknowledged record is lost in any case.  The leader is node2 or
# node3, so that stopping a follower never stops the control plane.
#
# tap-etcd: skip.  Its subject is bootstrap of a follower after
# retention; the control-plane store plays the same part in it as in the
# scripts that run on both stores (FELIX_STORE=etcd runs it on etcd by
# hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use File::Path ();

my $c = FelixCluster->new(nodes => 3, conf => ["felix.segment_bytes = '64kB'"]);

# The follower to stop must not be node1 (the control plane).
my ($stream, @set) = $c->pick_stream_name('boot', 3,
	sub { $_[0] ne 'node1' && $_[1] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text', retention_bytes => 200000);
my ($leader, $g) = $c->wait_leader($stream, 0);
my $f = $c->node($set[1]);
my $fname = $f->{felix_name};
note("leader $leader->{felix_name}, follower under test $fname");
$c->wait_shipping($leader, $stream, 0, 2);

# Publish $n records of ~1 kB on shard 0 of the leader.
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

sub wait_same_records
{
	my ($what) = @_;
	my $want = join("\n", $c->records($leader, $stream, 0));
	my $ok = FelixCluster::poll(60, sub { join("\n", $c->records($f, $stream, 0)) eq $want }, 0.2);
	ok(defined $ok, "$fname ends with exactly the leader's records ($what)")
	  or $c->diag_shard($stream, 0);
	return $ok;
}

# ---------------------------------------------------------------------
# 1. A follower holding records: halted needs_bootstrap, then rebuilt.
# ---------------------------------------------------------------------
publish('a', 100);
ok(defined FelixCluster::poll(30, sub {
	$f->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") eq '100' }),
	"$fname holds the first 100 records");
$c->stop_node($f);
publish('b', 600);
$leader->safe_psql('postgres', "SELECT felix_enforce_retention('$stream')");
my $start = start_seq($leader);
cmp_ok($start, '>', 100, "the leader's retention trimmed past ${fname}'s position (its log starts at $start)");
my $started = $c->metric_of($leader, 'rebuilds_started');
my $completed = $c->metric_of($leader, 'rebuilds_completed');
$c->start_node($f);

# The halt is listed until the rebuild begins (at the leader's next pass
# here, so it may come and go between two looks).
my $seen_halt = FelixCluster::poll(30, sub {
	my $r = $c->try_psql(1,
		"SELECT reason || ' ' || coalesce(\"position\"::text, '-') || ' ' || (action ~ 'felix_rebuild') "
		  . "FROM felix_halted WHERE stream = '$stream' AND shard = 0 AND node = '$fname'");
	return 1 if defined $r && $r =~ /^needs_bootstrap \d+ true$/;
	return ($c->metric_of($leader, 'rebuilds_started') // 0) > $started ? 2 : 0;
}, 0.02);
my $rebuilt = FelixCluster::poll(60, sub {
	($c->metric_of($leader, 'rebuilds_completed') // 0) > $completed }, 0.2);
ok(defined $rebuilt, "the leader rebuilt $fname on its own (rebuild_max_concurrent = 1)")
  or $c->diag_shard($stream, 0);
cmp_ok($c->metric_of($leader, 'rebuilds_started'), '>', $started, 'rebuilds_started counts it');
like(read_file($leader->logfile), qr/follower "$fname" halted \(needs_bootstrap\)/,
	'the leader halted it needs_bootstrap first');
note((defined $seen_halt && $seen_halt == 1)
	? 'felix_halted on node1 listed the halt, with felix_rebuild in its action'
	: 'the rebuild began before felix_halted was looked at');
cmp_ok($c->metric_of($f, 'copies_rebuilt'), '>=', 1, "$fname discarded its copy once (copies_rebuilt)");
wait_same_records('after its rebuild');
is(start_seq($f), $start, "${fname}'s log now begins at the leader's oldest record");
is(segment_digest($f, $stream, 0), segment_digest($leader, $stream, 0),
	"${fname}'s segments hold byte-identical record batches to the leader's");
ok(defined FelixCluster::poll(20, sub {
	$c->try_psql(1, "SELECT count(*) FROM felix_halted WHERE stream = '$stream'") eq '0' }),
	'felix_halted is empty again');

# Quorum publishes still count it.
publish('c', 10);
wait_same_records('after more publishes');

# ---------------------------------------------------------------------
# 2. An empty follower: bootstrapped, no halt.
# ---------------------------------------------------------------------
my $dir = shard_dir($f, $stream, 0);
$c->stop_node($f);
publish('d', 400);
$leader->safe_psql('postgres', "SELECT felix_enforce_retention('$stream')");
$start = start_seq($leader);
# Its copy of the shard is gone (a disk replaced under one stream, say).
ok(-d $dir, "${fname}'s shard directory is $dir");
File::Path::rmtree($dir);
my $halts = $c->metric_of($leader, 'rebuilds_started');
my $boots = 0;
$c->start_node($f);
ok(defined FelixCluster::poll(60, sub {
	$boots = $c->metric_of($f, 'copies_bootstrapped') // 0; $boots >= 1 }, 0.2),
	"$fname, empty, took the leader's log as offered (copies_bootstrapped = $boots)");
wait_same_records('after its bootstrap');
is(start_seq($f), $start, 'its log begins at the leader\'s oldest record');
is($c->metric_of($leader, 'rebuilds_started'), $halts, 'no rebuild was needed');

# ---------------------------------------------------------------------
# 3. A rebuild on a full disk, retried once there is space.
# ---------------------------------------------------------------------
my $trigger = "$PostgreSQL::Test::Utils::tmp_check/enospc_trigger";
my $faultlog = "$PostgreSQL::Test::Utils::tmp_check/enospc.log";
$c->stop_node($f);
publish('e', 600);
$leader->safe_psql('postgres', "SELECT felix_enforce_retention('$stream')");
$start = start_seq($leader);
$completed = $c->metric_of($leader, 'rebuilds_completed');
write_file($trigger, 'enospc');
{
	local $ENV{LD_PRELOAD}          = fault_shim();
	local $ENV{FELIX_FAULT_DIR}     = $f->data_dir . '/felix';
	local $ENV{FELIX_FAULT_TRIGGER} = $trigger;
	local $ENV{FELIX_FAULT_SUFFIX}  = '.seg';
	local $ENV{FELIX_FAULT_LOG}     = $faultlog;
	$c->start_node($f);
}
ok(defined FelixCluster::poll(60, sub { read_file($f->logfile) =~ /No space left on device/ }, 0.2),
	"${fname}'s rebuild ran into the full disk") or $c->diag_shard($stream, 0);
ok(-s $faultlog, 'the shim failed a segment write');
sleep 2;
is($c->metric_of($leader, 'rebuilds_completed'), $completed, 'no rebuild completes while the disk is full');
unlink $trigger;
ok(defined FelixCluster::poll(60, sub {
	($c->metric_of($leader, 'rebuilds_completed') // 0) > $completed }, 0.2),
	"once there is space the leader rebuilds $fname, without a restart")
  or $c->diag_shard($stream, 0);
is($f->safe_psql('postgres', "SELECT state FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
	'open', "${fname}'s shard serves again");
wait_same_records('after the rebuild on a full disk');
is(start_seq($f), $start, 'its log begins at the leader\'s oldest record');

$c->teardown;
felix_done_testing();
