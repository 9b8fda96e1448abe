# felix_promote_copy: an operator promotes a chosen copy of an unplaced
# shard (issue 20).
#
# Four nodes; two quorum streams, s1 and s2, each with replica set
# {A, B, C} led by A and node1 outside it.  Five records are published to
# each, B is killed, five more are published (A and C acknowledge them),
# then A and C are killed and B is started again.  No copy the control
# plane knows to hold every acknowledged record is alive: both shards are
# unplaced.
#   - a role that is not a superuser is refused (42501); a dead node, a node
#     outside the replica set and a led shard are refused (55000);
#   - s2: B's copy is promoted while A and C are down.  The call succeeds
#     with a WARNING saying what may be lost (whatever only A or C hold:
#     the control plane's reports may trail what was acknowledged); B
#     leads generation 2;
#   - C is started.  s1: promoting B is refused because C is alive and its
#     copy ends later (it names C); promoting C succeeds, its WARNING
#     naming only what the dead A alone may hold; C leads generation 2 and
#     s1 reads its ten records and the next;
#   - s2, with C back: C's longer copy is brought in line with B's, and B
#     takes a publish at seq 5.
#
# tap-etcd: skip.  Its subject is felix_promote_copy, a rule of the duty
# holder's code; the control-plane store plays the same part in it as in
# the scripts that run on both stores (FELIX_STORE=etcd runs it on etcd
# by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 4);
my $n1 = $c->node(1);
my %k = map { $c->name_of($_) => $_ } 1 .. 4;

# Two stream names with the same replica set, leader first, node1 outside it.
my ($s1, @set) = $c->pick_stream_name('pc_a', 3, sub { !grep { $_ eq $c->name_of(1) } @_ });
my $want = join(',', @set);
my ($s2) = $c->pick_stream_name('pc_b', 3, sub { join(',', @_) eq $want });
my ($A, $B, $C) = @set;
note("replica set of $s1 and $s2: $A (leader), $B, $C");

for my $s ($s1, $s2)
{
	$c->create_stream(1, $s, replication_factor => 3, consistency => 'quorum');
	$c->wait_leader($s, 0);
}
sub publish_n
{
	my ($k, $s, $n) = @_;
	$c->node($k)->safe_psql('postgres',
		"SELECT felix_publish('$s', jsonb_build_object('i', i), shard => 0) FROM generate_series(1, $n) i");
}
publish_n($k{$A}, $_, 5) for ($s1, $s2);
# a quorum of two acknowledged them: wait until B holds them too
for my $s ($s1, $s2)
{
	ok(defined FelixCluster::poll(30, sub {
		my $r = $c->shard_row($k{$B}, $s, 0);
		return $r && $r->{next_seq} eq '5' }, 0.1), "$s: $B holds the first five records");
}
$c->kill_node($k{$B});
publish_n($k{$A}, $_, 5) for ($s1, $s2);
$c->kill_node($k{$A});
$c->kill_node($k{$C});
$c->start_node($k{$B});

for my $s ($s1, $s2)
{
	my $reason = '';
	my $took = FelixCluster::poll(60, sub {
		my $r = $c->shard_row(1, $s, 0) or return 0;
		$reason = $r->{unplaced_reason};
		return $reason ne '';
	}, 0.2);
	ok(defined $took, "$s: shard 0 is unplaced with its leader and C down") or $c->diag_shard($s, 0);
	note("$s: $reason");
}

# who may, and what
$n1->safe_psql('postgres', 'CREATE ROLE pc_plain LOGIN');
my ($rc, $err) = psql_error($n1, "SET ROLE pc_plain; SELECT felix_promote_copy('$s2', 0, '$B')");
like($err, qr/42501/, 'a role that is not a superuser is refused');
ok(defined FelixCluster::poll(30, sub {
	$n1->safe_psql('postgres', "SELECT alive FROM felix_nodes WHERE name = '$A'") eq 'f' }, 0.2),
	"$A is no longer alive in felix_nodes");
($rc, $err) = psql_error($n1, "SELECT felix_promote_copy('$s2', 0, '$A')");
like($err, qr/55000:.*cannot be promoted.*\n.*DETAIL:  The node is not alive/,
	'a dead node is refused');
my $outside = $c->name_of(1);
($rc, $err) = psql_error($n1, "SELECT felix_promote_copy('$s2', 0, '$outside')");
like($err, qr/55000:.*DETAIL:  It is not in the shard's replica set/s,
	'a node outside the replica set is refused');

# s2: the only copy alive, behind what was acknowledged
my $out;
my $took = FelixCluster::poll(30, sub {
	($rc, $err, $out) = psql_error($n1, "SELECT felix_promote_copy('$s2', 0, '$B')");
	return $rc == 0 || $err !~ /has not said where its copy ends|not alive/;
}, 0.5);
is($rc, 0, "$s2: the copy on $B is promoted") or diag($err);
like($out, qr/node "\Q$B\E" leads generation 2 of stream "\Q$s2\E" shard 0 from its copy ending at seq 5/,
	'... and the call says which generation, from which end');
like($err, qr/WARNING:.*records may be lost by promoting the copy on node "\Q$B\E"/, '... with a WARNING');
like($err, qr/DETAIL:  What may be lost: .*only node "\Q$A\E" holds \(it is not alive.*only node "\Q$C\E" holds \(it is not alive/s,
	'... saying what may be lost: what only the copies that are not alive hold');
my ($leader, $g) = $c->wait_leader($s2, 0, min_generation => 2);
is($leader->{felix_name}, $B, "$s2: $B leads generation 2");
($rc, $err) = psql_error($n1, "SELECT felix_promote_copy('$s2', 0, '$B')");
like($err, qr/55000:.*is not unplaced: node "\Q$B\E" leads generation 2/, 'a led shard is refused');

# s1: C returns, with a longer copy than B's (while C is not alive yet,
# promoting B would be allowed, with a WARNING)
$c->start_node($k{$C});
# (the control plane's word, not felix_nodes: a node's view of the node
# list is refreshed once a second, and may still show C alive from before
# it was declared dead -- a promotion of B then would be allowed)
ok(defined FelixCluster::poll(30, sub {
	$c->state_query("SELECT (value::jsonb->'nodes') ? '$C' FROM felix.store_read('alive')") eq 't'
	  && $c->state_query("SELECT count(*) FROM felix.nodes, unnest(ends) e "
		  . "WHERE name = '$C' AND e LIKE '$s1/0=%'") eq '1' }, 0.2),
	"$C is alive again at the control plane, and has said where its copy ends");
$took = FelixCluster::poll(30, sub {
	($rc, $err) = psql_error($n1, "SELECT felix_promote_copy('$s1', 0, '$B')");
	return $err =~ /copy ends at seq 10/;
}, 0.5);
like($err, qr/55000:.*Node "\Q$C\E" is alive and its copy ends at seq 10, after this one's \(5\).*HINT:  Promote the copy on node "\Q$C\E" instead/s,
	"$s1: promoting $B is refused while $C, alive, holds more");
($rc, $err, $out) = psql_error($n1, "SELECT felix_promote_copy('$s1', 0, '$C')");
is($rc, 0, "$s1: the copy on $C is promoted") or diag($err);
like($err, qr/DETAIL:  What may be lost: whatever only node "\Q$A\E" holds \(it is not alive[^)]*\)\.\n/,
	'... with a WARNING naming only the dead old leader: nothing acknowledged is known to be lost');
($leader, $g) = $c->wait_leader($s1, 0, min_generation => 2);
is($leader->{felix_name}, $C, "$s1: $C leads generation 2");
is($leader->safe_psql('postgres', "SELECT (felix_publish('$s1', '{\"after\": 1}'::jsonb, shard => 0)).seq"),
	'10', '... takes a publish at seq 10');
is($leader->safe_psql('postgres', "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM $s1 WHERE shard = 0"),
	join(',', 0 .. 10), '... and reads every record');

# s2 with C back: C's copy went past B's (records 5 to 9 of generation 1)
# and is brought in line with B's, so B has its quorum again
my $seq = '';
ok(defined FelixCluster::poll(90, sub {
	(undef, undef, $seq) = psql_error($c->node($k{$B}),
		"SELECT (felix_publish('$s2', '{\"after\": 1}'::jsonb, shard => 0)).seq");
	return $seq =~ /^\d+$/;
}, 1), "$s2: $B takes a publish once $C is back") or $c->diag_shard($s2, 0);
is($seq, '5', '... at seq 5: the records beyond its copy are gone');

# felix_remove_node through a node (the control plane's refusals come back
# with their SQLSTATE): A, dead, still holds replicas; an unknown name
($rc, $err) = psql_error($n1, "SELECT felix_remove_node('$A')");
like($err, qr/ERROR:  55006: node "\Q$A\E" still holds a replica/, "felix_remove_node('$A') is refused while it holds replicas (55006)");
($rc, $err) = psql_error($n1, "SELECT felix_remove_node('no_such_node')");
like($err, qr/ERROR:  42704:/, 'felix_remove_node of an unknown node is refused (42704)');

$c->teardown;
felix_done_testing();
