# A node that never held a shard is never promoted.  Four nodes; a
# replication factor 2 stream whose replica set is {node2, node3}
# (node1 hosts the control plane, node4 is alive and has the stream's
# table but no copy of the shard).  Kill -9 both replicas: the lease
# lapses, nobody qualifies, and the shard stays unplaced -- the control
# plane keeps generation G and says why (felix_shards on node1 and node4
# show the reason), node1 and node4 refuse writes, and no node leads at
# G+1.  When the last leader comes back alone it waits: it was started
# again, and nothing tells a restart from a copy put back, so it leads
# only once the other replica has shown its log reaches theirs (finding 6
# of docs/formal).  The other replica's machine is then replaced -- a
# server under its node name with an empty felix directory, which is what
# an operator does for a replica that will not come back -- and the last
# leader gets the shard at G+1, with its records, and ships them to the
# replacement.
#
# Last, a grantee that has not claimed yet: the old leader is killed for
# good, and the replacement is granted the next generation while it
# cannot reach the control plane (forged: the grant as the duty holder
# writes it).  The grant lapses unclaimed, and nobody else qualifies: the
# grantee, which never took the generation, counts as started again and
# waits for the dead replica.  But the grant stands, so once the
# replacement is back its first heartbeat claims it, and it leads.
#
# tap-etcd: skip.  Its subject is who the duty holder may promote; the
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
use Time::HiRes qw(time usleep);
use File::Path ();

my $c = FelixCluster->new(nodes => 4, etcd_auth => 1);    # cut_from_store with etcd
my ($stream, @set) = $c->pick_stream_name('unplaced', 2,
	sub { join(',', sort @_) eq 'node2,node3' });
note("stream $stream: replica set @set");
$c->create_stream(1, $stream, replication_factor => 2, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
is($leader->{felix_name}, $set[0], "$set[0] leads at generation $g");
my $follower = $c->node($set[1]);
is($c->state_query(
	"SELECT replicas::text FROM felix.assignments WHERE stream = '$stream' AND shard = 0"),
	"{$set[0],$set[1]}", 'the replica set excludes node1 and node4');

$leader->safe_psql('postgres',
	"SELECT felix_publish('$stream', jsonb_build_object('i', i), shard => 0) FROM generate_series(1, 20) i");
my $caught = FelixCluster::poll(10, sub {
	$c->shard_row($follower, $stream, 0)->{next_seq} == 20;
}, 0.1);
ok(defined $caught, "$set[1] holds the 20 records");

my $t_kill = time;
$c->kill_node($leader);
$c->kill_node($follower);
note('killed both replicas');

# The control plane notices the lapsed lease and finds nobody to promote.
my $reason = '';
my $took = FelixCluster::poll(15, sub {
	$reason = $c->state_query(
		"SELECT coalesce(unplaced_reason, '') FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
	return $reason ne '';
}, 0.1);
ok(defined $took, 'the control plane marks the shard unplaced');
note(sprintf('unplaced %.2f s after the kill: %s', time - $t_kill, $reason));

# Watch for a while longer: the generation never moves, nobody leads.
usleep(3_000_000);
my $cp = $c->state_query(
	"SELECT generation || ' ' || leader FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
is($cp, "$g $set[0]", "the control plane keeps generation $g and names the last leader");
for my $k (1, 4)
{
	my $node = $c->node($k);
	my $r;
	my $seen = FelixCluster::poll(5, sub {
		$r = $c->shard_row($node, $stream, 0);
		return $r->{unplaced_reason} ne '';
	}, 0.1);
	ok(defined $seen, "felix_shards on node$k says the shard is unplaced")
	  or diag("node$k: " . join(' ', map { "$_=$r->{$_}" } sort keys %$r));
	note("node$k felix_shards unplaced_reason: $r->{unplaced_reason}");
	like($r->{unplaced_reason}, qr/\S{3,}.*\S{3,}/, "node$k: the reason is a sentence");
	is($r->{generation}, $g, "node$k: generation $g");
	isnt($r->{role}, 'leader', "node$k does not lead the shard");
	my ($rc, $err) = psql_error($node,
		"SELECT felix_publish('$stream', '{\"x\": 1}'::jsonb, shard => 0)");
	like($err, qr/ERROR:\s+55F0[23]:/, "node$k refuses a publish (55F02/55F03)");
}
is($c->metric_of(4, 'promotions'), 0, 'node4 was never promoted');

# The last leader comes back alone: it waits for the other replica.
$c->start_node($leader);
my ($who, $g2) = eval { $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 6) };
ok(!defined $who, "$set[0], started again, does not lead while $set[1] is down")
  or diag("$who->{felix_name} leads generation $g2");
like($c->state_query(
	"SELECT coalesce(unplaced_reason, '') FROM felix.assignments WHERE stream = '$stream' AND shard = 0"),
	qr/started again since.*$set[1] is not alive/, 'the shard says it waits for it');

# The other replica's machine is replaced: its node name, an empty felix
# directory (a new incarnation).  Its log, empty, is within the last
# leader's, which gets G+1.
File::Path::rmtree($follower->data_dir . '/felix');
$c->start_node($follower);
eval { ($who, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30); 1 }
  or do { diag($@); $c->diag_shard($stream, 0); };
is(defined $who ? $who->{felix_name} : 'nobody', $set[0], "$set[0] leads again once it is back");
is($g2, $g + 1, 'at G+1') if defined $who;
if (defined $who)
{
	my $r = $c->shard_row($who, $stream, 0);
	is($r->{next_seq}, 20, 'with its 20 records');
	ok(defined FelixCluster::poll(30, sub { $c->shard_row($follower, $stream, 0)->{next_seq} == 20 }, 0.1),
		"the replacement $set[1] is shipped all 20");
	my $t0 = time;
	my $seen = '';
	ok(defined FelixCluster::poll(30, sub {
		$seen = $who->safe_psql('postgres', "SELECT count(*) FROM \"$stream\" WHERE shard = 0");
		return $seen eq '20' }, 0.05),
		"$set[0] serves all 20 once they are on a quorum again") or diag("it serves $seen");
	note(sprintf("served all 20 %.2f s after the replacement held them", time - $t0));
}

# A grantee that never claims, in the boot it was granted to.
{
	my $old = $who // die 'no leader to lose';
	my $fnode = $follower->{felix_name};
	my $g3 = $c->state_query("SELECT generation FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
	$c->kill_node($old);
	$c->cut_from_store($follower);
	my $inc = $c->state_query("SELECT incarnation FROM felix.nodes WHERE name = '$fnode'");
	$c->store_edit(sprintf('shards/%s/%06d', $stream, 0),
		"(v - 'unplaced_reason') || jsonb_build_object('generation', (v->>'generation')::bigint + 1, "
		  . "'leader', '$fnode', 'leader_incarnation', '$inc')");
	my $reason = '';
	ok(defined FelixCluster::poll(15, sub {
		$reason = $c->state_query(
			"SELECT coalesce(unplaced_reason, '') FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
		$reason =~ /never took its lease/ }, 0.1),
		"the grant lapses unclaimed and the shard says so") or diag("reason: '$reason'");
	$c->mend_store($follower);
	my ($lead, $g4) = eval { $c->wait_leader($stream, 0, min_generation => $g3 + 1, timeout => 30) };
	is($lead ? "$lead->{felix_name} $g4" : 'nobody', "$fnode " . ($g3 + 1),
		"$fnode, back, claims generation " . ($g3 + 1) . " as granted, with $set[0] still down")
	  or $c->diag_shard($stream, 0);
	is($lead ? $c->shard_row($lead, $stream, 0)->{next_seq} : -1, 20, 'with all 20 records');
}

$c->teardown;
felix_done_testing();
