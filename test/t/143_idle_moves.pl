# Planned moves of idle shards (issue 18, part 2).
#
# A shard with no write acknowledged in its current generation -- a new
# stream, or any shard after a failover -- could not be moved:
# felix_transfer_leadership and felix_drain_node failed with "did not
# catch up within felix.quorum_timeout ... It holds seqs below 0; the log
# ends at 0" while felix_replication showed the follower shipping with lag
# 0, and a rerun failed the same way.  Here, on three nodes, nothing is
# published before each move:
#
#   1. a new quorum stream's shard is handed to a follower, which then
#      leads it and takes publishes;
#   2. a new leader-acknowledged stream's shard likewise;
#   3. after a failover (kill -9 of the leader of a stream with records),
#      with no write at the new generation, the new leader hands the shard
#      on (to the follower that was not the old leader) and keeps every
#      record;
#   4. felix_drain_node moves every leadership of a node whose shards are
#      all idle.
#
# Each move must complete well within felix.quorum_timeout; the test
# prints the time each took (the issue's target is under a second), but
# asserts only that it succeeded, not a time.
#
# tap-etcd: skip.  Its subject is planned moves of idle shards; the
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

my $c = FelixCluster->new(nodes => 3);

# Hand shard 0 of $stream from its leader to $target; returns the seconds it took.
sub transfer
{
	my ($leader, $stream, $target) = @_;
	my $t0 = time;
	my ($rc, $err, $out) = psql_error($leader,
		"SELECT felix_transfer_leadership('$stream', 0, '$target')");
	my $took = time - $t0;
	is($rc, 0, "$stream: $leader->{felix_name} hands idle shard 0 to $target")
	  or diag($err);
	note(sprintf("%s: transfer took %.3f s", $stream, $took));
	return $took;
}

for my $cons ('quorum', 'leader')
{
	my ($stream, @set) = $c->pick_stream_name("idle_$cons", 3, sub { 1 });
	$c->create_stream(1, $stream, replication_factor => 3, consistency => $cons);
	my ($leader, $g) = $c->wait_leader($stream, 0);
	$c->wait_shipping($leader, $stream, 0, 2);
	my $target = $set[1];
	transfer($leader, $stream, $target);
	my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1);
	is($new->{felix_name}, $target, "$stream: $target leads generation $g2");
	is($new->safe_psql('postgres', "SELECT seq FROM felix_publish('$stream', '{}'::jsonb, shard => 0)"),
		'0', "$stream: the new leader takes the first record at seq 0");
}

# 3. an idle shard after a failover
{
	my ($stream, @set) = $c->pick_stream_name('idle_failover', 3, sub { $_[0] ne 'node1' });
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($leader, $g) = $c->wait_leader($stream, 0);
	$c->wait_shipping($leader, $stream, 0, 2);
	$leader->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', jsonb_build_object('i', i), shard => 0)) FROM generate_series(1, 10) i");
	$c->kill_node($leader->{felix_name});
	my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1);
	my ($other) = grep { $_ ne $new->{felix_name} && $_ ne $leader->{felix_name} } @set;
	ok( FelixCluster::poll(20,
			sub { $new->safe_psql('postgres',
					"SELECT count(*) FROM felix_replication WHERE stream = '$stream' AND shard = 0 "
					  . "AND follower = '$other' AND state = 'shipping' AND last_answer IS NOT NULL") eq '1' }),
		"$stream: $other is shipped to at generation $g2");
	transfer($new, $stream, $other);
	my ($third) = $c->wait_leader($stream, 0, min_generation => $g2 + 1);
	is($third->{felix_name}, $other, "$stream: $other leads after the failover and the transfer");
	is($third->safe_psql('postgres', "SELECT count(*) FROM $stream WHERE shard = 0"), '10',
		"$stream: every record is there");
	$c->start_node($leader->{felix_name});
	$c->wait_alive([ map { $_->{felix_name} } $c->nodes ], 60);
}

# 4. drain a node whose leaderships are all idle
{
	my ($stream) = $c->pick_stream_name('idle_drain', 3, sub { $_[0] eq 'node2' });
	$c->create_stream(1, $stream, shards => 4, replication_factor => 3, consistency => 'quorum');
	for my $sh (0 .. 3) { $c->wait_leader($stream, $sh) }
	my $n2 = $c->node(2);
	my $led = $n2->safe_psql('postgres',
		"SELECT count(*) FROM felix_shards WHERE role = 'leader' AND leader = 'node2'");
	ok($led > 0, "node2 leads $led idle shards");
	for my $sh (0 .. 3)
	{
		next unless ($c->leader_of($stream, $sh, 2))[0] eq 'node2';
		$c->wait_shipping($n2, $stream, $sh, 2);
	}
	my $t0 = time;
	my ($rc, $err, $out) = psql_error($n2, "SELECT felix_drain_node('node2')");
	is($rc, 0, 'felix_drain_node moves every idle leadership off node2') or diag($err);
	note(sprintf("drain took %.3f s", time - $t0));
	ok( FelixCluster::poll(10,
			sub { $n2->safe_psql('postgres',
					"SELECT count(*) FROM felix_shards WHERE role = 'leader' AND leader = 'node2'") eq '0' }),
		'node2 leads nothing afterwards');
}

$c->teardown;
felix_done_testing();
