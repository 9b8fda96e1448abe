# Planned moves, under load, on a replication factor 3 quorum stream over
# four nodes:
#
# - felix_transfer_leadership hands the shard to a follower without
#   waiting out a lease: the leader stops admitting (publishes there are
#   refused with 55F02 naming the new leader), waits until the target
#   holds every record it wrote, releases its lease, and the control plane
#   grants the next generation to the target at once.  Every publish that
#   was acknowledged is on the new leader at its seq;
# - felix_drain_node, on a node, moves every leadership off it (and
#   refuses to run elsewhere, naming the node to run it on);
# - felix_move_replica replaces a replica -- here a stopped one, a dead
#   machine -- by the fourth node: it joins, is shipped the whole log while
#   quorum publishes go on (a majority of the old set and of the new set
#   acknowledge them), and the stopped node leaves the replica set once
#   the new one is reported caught up.
#
# At the end the replicas hold byte-identical record batches and no
# acknowledged record was lost.
#
# tap-etcd: skip.  Its subject is planned moves; the control-plane store
# plays the same part in it as in the scripts that run on both stores
# (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 4);

# Replica set of three among four nodes; node1 (the control plane) is a
# follower, so the follower stopped later is not the control plane.
my ($stream, @set) = $c->pick_stream_name('moves', 3,
	sub { $_[0] ne 'node1' && $_[1] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
my ($outsider) = grep { my $n = $_->{felix_name}; !grep { $_ eq $n } @set } $c->nodes;
note("replica set @set (leader $set[0]); $outsider->{felix_name} holds no copy");
$c->wait_shipping($leader, $stream, 0, 2);

my @all_acks;

sub publishers
{
	my ($node, $tag) = @_;
	return $c->start_publishers(
		node      => $node,
		stream    => $stream,
		shard     => 0,
		sessions  => 4,
		count     => 1000000,
		seconds   => 20,
		catch     => 1,
		err_sleep => 0.01,
		tag       => $tag);
}

sub check_acks_on
{
	my ($node, $what) = @_;
	my %have;
	for my $line (split /\n/, $c->records($node, $stream, 0))
	{
		my ($seq, $key, $payload) = split /\|/, $line, 3;
		$have{$seq} = $payload;
	}
	my @missing = grep { !defined $have{ $_->{seq} } || $have{ $_->{seq} } ne $_->{payload} } @all_acks;
	is(scalar(@missing), 0, "every acknowledged record (" . scalar(@all_acks) . ") is on $node->{felix_name}, at its seq ($what)")
	  or diag(join(', ', map { "$_->{seq}" } @missing[ 0 .. ($#missing < 9 ? $#missing : 9) ]));
}

# ---------------------------------------------------------------------
# 1. Transfer under load
# ---------------------------------------------------------------------
my $pub = publishers($leader, 'before');
ok($c->wait_acks($pub, 200, 30), 'publishers on the leader got 200 quorum acknowledgements');
my $target = $c->node($set[1]);
my $moves = $c->metric_of($leader, 'planned_moves');
my $said = $leader->safe_psql('postgres',
	"SELECT felix_transfer_leadership('$stream', 0, '$target->{felix_name}')");
is($said, "node \"$target->{felix_name}\" leads generation " . ($g + 1),
	"the transfer hands generation @{[$g + 1]} to $target->{felix_name}");
my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 10);
is($new->{felix_name}, $target->{felix_name}, 'which leads it with a live lease');
is($c->metric_of($leader, 'planned_moves'), $moves + 1, 'planned_moves counts it');
ok(defined FelixCluster::poll(10, sub {
	grep { $_->{sqlstate} eq '55F02' && $_->{message} =~ /\Q$target->{felix_name}\E/ } $c->errors($pub) }),
	"publishes on the old leader are refused with 55F02 naming $target->{felix_name}");
$c->stop_publishers($pub, 0);
push @all_acks, $c->acks($pub);
check_acks_on($new, 'after the transfer');

# The new leader acknowledges quorum publishes.
$pub = publishers($new, 'after');
ok($c->wait_acks($pub, 100, 30), "$new->{felix_name} acknowledges quorum publishes");
$c->stop_publishers($pub, 0);
push @all_acks, $c->acks($pub);

# ---------------------------------------------------------------------
# 2. Drain
# ---------------------------------------------------------------------
my ($rc, $err) = psql_error($leader, "SELECT felix_drain_node('$new->{felix_name}')");
like($err, qr/must run on the node it drains.*\n.*HINT:\s+Run it on node "$new->{felix_name}"/,
	'felix_drain_node refuses to run on another node, saying where to run it');
is($new->safe_psql('postgres', "SELECT felix_drain_node('$new->{felix_name}')"), '1',
	"felix_drain_node on $new->{felix_name} moves its one leadership");
my ($after_drain, $g3) = $c->wait_leader($stream, 0, min_generation => $g2 + 1, timeout => 10);
isnt($after_drain->{felix_name}, $new->{felix_name}, "another node ($after_drain->{felix_name}) leads now");
is($new->safe_psql('postgres',
		"SELECT count(*) FROM felix_shards WHERE role = 'leader' AND stream = '$stream'"),
	'0', "$new->{felix_name} leads nothing");
check_acks_on($after_drain, 'after the drain');

# ---------------------------------------------------------------------
# 3. Replace a dead replica by the fourth node
# ---------------------------------------------------------------------
my $lead = $after_drain;
my ($dead) = grep { $_ ne $lead->{felix_name} && $_ ne 'node1' } @set;
$dead = $c->node($dead);
$c->stop_node($dead);
note("$dead->{felix_name} is down for good; $outsider->{felix_name} replaces it");
$pub = publishers($lead, 'moving');
ok($c->wait_acks($pub, 50, 30), 'with one replica down, quorum publishes go on');
$moves = $c->metric_of($lead, 'planned_moves');
like($c->cp->safe_psql('postgres',
		"SELECT felix_move_replica('$stream', 0, '$dead->{felix_name}', '$outsider->{felix_name}')"),
	qr/node "$outsider->{felix_name}" joins/, 'felix_move_replica starts the move');
my $moved = FelixCluster::poll(60, sub {
	$c->state_query(
		"SELECT NOT ('$dead->{felix_name}' = ANY (replicas)) AND '$outsider->{felix_name}' = ANY (replicas) "
		  . "AND joining IS NULL FROM felix.assignments WHERE stream = '$stream' AND shard = 0") eq 't' }, 0.2);
ok(defined $moved, "$dead->{felix_name} left the replica set once $outsider->{felix_name} caught up")
  or $c->diag_shard($stream, 0);
$c->stop_publishers($pub, 0);
push @all_acks, $c->acks($pub);
cmp_ok(scalar(grep { $_->{sqlstate} ne '55F02' } $c->errors($pub)), '==', 0,
	'no publish failed during the move');
ok(defined FelixCluster::poll(10, sub { ($c->metric_of($lead, 'planned_moves') // 0) > $moves }),
	'the leader counted the completed move (planned_moves)');

# ---------------------------------------------------------------------
# The end: every acknowledged record everywhere; identical batches
# ---------------------------------------------------------------------
my @replicas = map { $c->node($_) } split /,/, $c->state_query(
	"SELECT array_to_string(replicas, ',') FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
my $want = $c->records($lead, $stream, 0);
for my $r (@replicas)
{
	ok(defined FelixCluster::poll(30, sub { $c->records($r, $stream, 0) eq $want }, 0.2),
		"$r->{felix_name} holds the leader's records");
	check_acks_on($r, 'at the end');
}
my %digest = map { $_->{felix_name} => segment_digest($_, $stream, 0) } @replicas;
is(scalar(keys %{ { reverse %digest } }), 1, 'the replicas hold byte-identical record batches')
  or diag(explain \%digest);

$c->teardown;
felix_done_testing();
