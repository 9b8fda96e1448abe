# Every control-plane transaction stays within what etcd takes in one
# (--max-txn-ops): whatever a node finds to rewrite, one heartbeat writes
# at most CP_MAX_REWRITES_PER_BEAT shard and report records and leaves the
# rest to its next beats, and a leader reports at most REPORT_MAX_SHARDS
# shards a request.
#
# Found by reading the code (issue 20): the first claims of a heartbeat
# were capped, but a generation the node had taken already whose record
# still carried an unplaced reason (written by the duty holder while the
# lease was lapsing) was rewritten without a cap.  A node leading more than
# about 250 such shards sent a transaction that etcd refuses at every
# heartbeat ("too many operations in txn request"), and lost every lease.
#
# Three nodes on etcd members run with --max-txn-ops 256, the least
# docs/configuration.md asks for with felix.max_shards_per_stream = 100;
# 900 shards in 9 streams of 100, replication factor 3, so each node leads
# about 300.
#   1. An unplaced reason is forged on every shard node2 leads, as the duty
#      holder writes one, 100 keys to a transaction.  node2's heartbeats
#      clear them all within a few beats, and keep every lease: each of
#      those shards is still led by node2 at the same generation.
#   2. node3 is started again: its peers, leading the ~600 shards it
#      follows, report all of them again at once, 100 shards to a request
#      (REPORT_MAX_SHARDS; 500 before, which etcd refused, and report before
#      mark then acknowledged nothing); every shard takes a publish.
#   3. A stream of 100 shards is dropped, in one transaction.
#
# tap-etcd: skip.  It makes its own etcd members (with the limit above) in
# either suite.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3, store => 'etcd', etcd_max_txn_ops => 256,
	conf => ['felix.max_shards_per_stream = 100']);
$c->create_stream(1, "ops$_", shards => 100, replication_factor => 3, consistency => 'quorum')
  for 1 .. 9;

my $taken = "(value::jsonb->>'taken_generation') = (value::jsonb->>'generation')";
ok(defined FelixCluster::poll(60, sub {
	$c->state_query("SELECT count(*) FROM felix.store_read('shards/') WHERE $taken") eq '900' }, 0.2),
	'every one of the 900 shards has a leader that took its generation');

# node2's shards, as "key generation"
sub led_by_node2
{
	return $c->state_query("SELECT string_agg(key || ' ' || (value::jsonb->>'generation'), ',' ORDER BY key) "
		  . "FROM felix.store_read('shards/') WHERE value::jsonb->>'leader' = 'node2' AND $taken");
}
my $before = led_by_node2();
my $n = scalar(split /,/, $before);
cmp_ok($n, '>', 256, "node2 leads $n shards, more than one transaction may rewrite");

my @rows = split /\n/, $c->state_query(
	"SELECT key || E'\\t' || (value::jsonb || jsonb_build_object('unplaced_reason', "
	  . "'no replica qualifies (forged by the test)'))::text "
	  . "FROM felix.store_read('shards/') WHERE value::jsonb->>'leader' = 'node2' ORDER BY key");
my $prefix = $c->{etcd_prefix};
while (my @batch = splice(@rows, 0, 100))
{
	my %kv = map { my ($k, $v) = split /\t/, $_, 2; ("$prefix$k" => $v) } @batch;
	$c->etcd->put_all(%kv, "${prefix}marks/shards/" => '{}');
}

my $left;
ok(defined FelixCluster::poll(30, sub {
	$left = $c->state_query("SELECT count(*) FROM felix.store_read('shards/') "
		  . "WHERE value::jsonb->>'leader' = 'node2' AND value::jsonb ? 'unplaced_reason'");
	$left eq '0' }, 0.2),
	"node2's heartbeats cleared the reason from all $n shards (left: $left)");
is(led_by_node2(), $before, "node2 still leads each of them at the same generation: no lease lapsed");

# 2. node3 started again: its peers report every shard it follows anew.
$c->stop_node('node3');
$c->start_node('node3');
$c->wait_alive([ map { $c->name_of($_) } $c->nodes ]);
my $live = "role = 'leader' AND lease_remaining_ms > 0";
my $led = 0;
ok(defined FelixCluster::poll(60, sub {
	$led = 0;
	$led += $c->node($_)->safe_psql('postgres', "SELECT count(*) FROM felix_shards WHERE $live") for 1 .. 3;
	$led == 900 }, 0.2),
	"every shard is led with a live lease again (led: $led)");
my $published = 0;
for my $k (1, 2, 3)
{
	my ($rc, $out, $err) = $c->node($k)->psql('postgres',
		"SET felix.forward_publishes = off; "
		  . "SELECT count(felix_publish(stream, '{\"after\": \"restart\"}'::jsonb, shard => shard)) "
		  . "FROM felix_shards WHERE $live", timeout => 180);
	is($rc, 0, "node$k: each shard it leads ($out) took a publish after node3 came back")
	  or diag($err);
	$published += $out if $rc == 0;
}
is($published, 900, 'every shard took a publish on its leader');

# 3. A stream of max_shards_per_stream shards is dropped in one transaction.
$c->node(1)->safe_psql('postgres', "SELECT felix_drop_stream('ops9')");
ok(defined FelixCluster::poll(30, sub {
	$c->state_query("SELECT count(*) FROM felix.store_read('shards/ops9/')") eq '0' }, 0.2),
	'the drop of a stream of 100 shards took all its keys');

my $refused = 0;
$refused += () = slurp_file($_->logfile) =~ /too many operations/g for $c->nodes;
is($refused, 0, 'etcd refused no transaction of any node for its size');

$c->teardown;
felix_done_testing();
