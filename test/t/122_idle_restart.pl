# A follower that restarts while its shard is idle is heard again.
#
# The leader ships to a follower only when there is something to send:
# records it lacks, a mark it has not heard on its current connection, no
# answer yet.  After a follower restarts, the leader's first shipment on
# the new connection can be refused (55F04: the follower has not yet
# learned who leads the generation, which takes it one heartbeat).  The
# follower then still has not heard the leader on this connection, and the
# leader must ship again once the retry time passes, even though no new
# record arrived -- otherwise, on an idle shard, it never learns where the
# restarted follower stands: it never confirms it (so the control plane
# does not count it promotable after its restart), and a copy the follower
# no longer holds for its incarnation is never found and halted.
#
# Whether the first shipment meets the follower before or after its first
# heartbeat is a race, so each case runs several rounds; every round must
# pass.
#
# 1. A follower restarted (fast stop, start) while nothing is published:
#    the leader's last_answer for it moves past the restart within 10 s,
#    every round.
# 2. A follower whose copy was stamped with another incarnation while it
#    was down (copy_of), nothing published: the leader halts it
#    needs_bootstrap within 10 s, every round (rebuilds are manual here,
#    felix.rebuild_max_concurrent = 0, so the halt stays visible); it is
#    then rebuilt with felix_rebuild and answers again.
#
# The leader and the follower under test are not node1 (the control plane).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3, conf => ['felix.rebuild_max_concurrent = 0']);

my ($stream, @set) = $c->pick_stream_name('idle', 3,
	sub { $_[0] ne 'node1' && $_[1] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text');
my ($leader, $g) = $c->wait_leader($stream, 0);
my $f = $c->node($set[1]);
my $fname = $f->{felix_name};
note("stream $stream: leader $leader->{felix_name}, follower under test $fname");
$c->wait_shipping($leader, $stream, 0, 2);

$leader->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', 'r' || i, shard => 0)) FROM generate_series(1, 50) i");
ok(defined FelixCluster::poll(30, sub {
	$f->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") eq '50' }),
	"$fname holds the 50 records");

# The leader's row for the follower under test.
sub follower_row
{
	my ($cols) = @_;
	return $leader->safe_psql('postgres',
		"SELECT $cols FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'");
}

# ---------------------------------------------------------------------
# 1. Restarted on an idle shard: heard again.
# ---------------------------------------------------------------------
for my $round (1 .. 5)
{
	$c->stop_node($f);
	# any answer from here on is the restarted follower's
	my $since = $leader->safe_psql('postgres', 'SELECT now()');
	$c->start_node($f);
	my $took = FelixCluster::poll(10, sub {
		follower_row("state = 'shipping' AND last_error IS NULL AND last_answer > '$since'") eq 't' }, 0.05);
	ok(defined $took, "1.$round: the leader hears $fname again after its restart, with nothing published")
	  or diag('follower row: ' . follower_row('state, last_answer, last_error'));
}

# ---------------------------------------------------------------------
# 2. A copy of another incarnation on an idle shard: halted, then rebuilt.
# ---------------------------------------------------------------------
my $dir = shard_dir($f, $stream, 0);
for my $round (1 .. 3)
{
	$c->stop_node($f);
	write_file("$dir/copy_of", sprintf("00000000-0000-4000-8000-%012d\n", $round));
	$c->start_node($f);
	my $took = FelixCluster::poll(10, sub { follower_row('state') eq 'halted_needs_bootstrap' }, 0.05);
	ok(defined $took, "2.$round: a copy stamped with another incarnation halts needs_bootstrap, with nothing published")
	  or diag('follower row: ' . follower_row('state, last_answer, last_error'));
	$leader->safe_psql('postgres', "SELECT felix_rebuild('$stream', 0, '$fname')") if defined $took;
	ok(defined FelixCluster::poll(30, sub {
		follower_row("state = 'shipping' AND last_error IS NULL AND last_answer IS NOT NULL") eq 't' }, 0.1),
		"2.$round: $fname is rebuilt and answers the leader")
	  or diag('follower row: ' . follower_row('state, last_answer, last_error'));
}
is(join(',', $c->records($f, $stream, 0)), join(',', $c->records($leader, $stream, 0)),
	"$fname ends with exactly the leader's records");

$c->teardown;
felix_done_testing();
