# A heartbeat's transaction stays within what etcd takes in one
# (--max-txn-ops): whatever a node finds to rewrite, one heartbeat writes
# at most CP_MAX_REWRITES_PER_BEAT shard and report records and leaves the
# rest to its next beats.
#
# Found by reading the code (issue 20): the first claims of a heartbeat
# were capped, but a generation the node had taken already whose record
# still carried an unplaced reason (written by the duty holder while the
# lease was lapsing) was rewritten without a cap.  A node leading more than
# about 250 such shards sent a transaction that etcd refuses at every
# heartbeat ("too many operations in txn request"), and lost every lease.
#
# Three nodes on etcd members run with --max-txn-ops 259, the least
# docs/configuration.md asks for with the default settings; 900 shards in
# streams of 256 (felix.max_shards_per_stream, each created in one
# transaction) and 132, replication factor 3, so each node leads about 300.  An
# unplaced reason is forged on every shard node2 leads, as the duty holder
# writes one, 100 keys to a transaction.  node2's heartbeats clear them
# all within a few beats, and keep every lease: each of those shards is
# still led by node2 at the same generation.
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

my $c = FelixCluster->new(nodes => 3, store => 'etcd', etcd_max_txn_ops => 259);
my @sizes = (256, 256, 256, 132);
$c->create_stream(1, "ops$_", shards => $sizes[ $_ - 1 ], replication_factor => 3, consistency => 'quorum')
  for 1 .. 4;

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
cmp_ok($n, '>', 259, "node2 leads $n shards, more than one transaction may rewrite");

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
my $refused = () = slurp_file($c->node('node2')->logfile) =~ /too many operations/g;
is($refused, 0, "etcd refused none of node2's transactions for their size");

$c->teardown;
felix_done_testing();
