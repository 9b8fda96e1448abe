# A survivor whose heartbeats come slower than two heartbeat intervals
# still takes its share of a failover (issue 20).
#
# The duty holder grants a dead leader's shard to a follower it has heard
# from lately.  "Lately" was two of its heartbeat intervals; under load a
# heartbeat's round trip to etcd takes a few tenths of a second, so a
# healthy survivor's record changed less often than that, the tick that
# granted a thousand shards passed it over, and all of them went to the
# other survivor (test/bench/scale.sh, etcd, 3,000 shards).  The bound is
# now a lease less an interval (at least two intervals).
#
# Three nodes, a 3 s lease, node expiry 6 s; node3 heartbeats every 2 s,
# the others every 200 ms (so two intervals of the duty holder are 0.4 s,
# and node3 was heard from within them at about one tick in five).  A
# quorum stream of 48 shards; the node that leads some and does not hold
# the duties (not node3) is killed.  Each of its shards must get a new
# leader that takes a publish, and node3 must lead some of them: both
# survivors qualify, and the score splits them (all to the other one has a
# chance of 2^-n for n shards).
#
# tap-etcd: skip.  Its subject is who the duty holder may promote, the same
# C over either store (FELIX_STORE=etcd runs it on etcd by hand; it passed
# there when written).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use Test::More;

my $c = FelixCluster->new(
	nodes     => 3,
	conf      => [ "felix.lease_duration = '3s'", "felix.node_expiry = '6s'" ],
	node_conf => { 3 => ["felix.heartbeat_interval = '2s'"] });

$c->create_stream(1, 'slow', shards => 48, replication_factor => 3,
	consistency => 'quorum', payload_type => 'text');
$c->wait_stream('slow', 48);

# the victim: not node3, not the duty holder (whose loss adds a takeover)
my $duty = $c->duty_node_name;
ok(defined $duty, "the duties run on " . ($duty // 'nobody'));
my ($victim) = grep { $c->name_of($_) ne ($duty // '') } (1, 2);
my $vname = $c->name_of($victim);
my %led;
ok(defined FelixCluster::poll(30, sub {
	%led = ();
	for my $shard (0 .. 47)
	{
		my ($who) = $c->leader_of('slow', $shard, 3);
		$led{$shard} = 1 if defined $who && $who eq $vname;
	}
	return scalar(keys %led) >= 8;
}, 0.5), "$vname leads " . scalar(keys %led) . " of the 48 shards");

$c->kill_node($victim);

my %new;
for my $shard (sort { $a <=> $b } keys %led)
{
	my ($node) = $c->wait_leader('slow', $shard, min_generation => 2, timeout => 60);
	$new{$shard} = $node->{felix_name};
}
my $n3 = grep { $_ eq $c->name_of(3) } values %new;
my $total = scalar(keys %new);
cmp_ok($n3, '>', 0,
	"node3, heartbeating every 2 s, leads $n3 of the $total shards $vname led");
cmp_ok($n3, '<', $total, 'and the other survivor leads the rest');

# every one of them publishes again on its new leader
my $published = 0;
for my $shard (sort { $a <=> $b } keys %new)
{
	my ($k) = grep { $c->name_of($_) eq $new{$shard} } (1 .. 3);
	my $took = FelixCluster::poll(30, sub {
		my ($rc) = $c->node($k)->psql('postgres',
			"SELECT felix_publish('slow', 'after'::text, shard => $shard)");
		return $rc == 0;
	}, 0.2);
	$published++ if defined $took;
}
is($published, $total, "every shard $vname led takes a publish on its new leader");

done_testing();
