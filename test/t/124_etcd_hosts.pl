# etcd as the control-plane store: three hosts, each a felix node with an
# etcd member beside it.  kill -9 of each host in turn (its felix server
# and its etcd member together) -- the host running the control-plane
# duties first, then the etcd leader's host, then the last -- while every
# node publishes to every shard of a three-shard, replication factor 3
# quorum stream (each shard led by a different node):
#   - the shard the host led fails over to another node;
#   - the other shards keep acknowledging writes;
#   - the cluster heals when the host returns (its node alive again, every
#     shard led with a live lease);
# and at the end every quorum-acknowledged record is readable at its seq
# with its payload, and no seq holds two payloads.  The failover time of
# each kill (to the first acknowledgement of the shard the host led) is
# printed.  Default lease settings.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $c = FelixCluster->new(nodes => 3, store => 'etcd');
my $e = $c->etcd;

# A stream whose three shards are led by three different nodes.
my $stream;
for my $i (0 .. 199)
{
	my $name = "hosts_$i";
	my %lead = map { (($c->placement($name, $_, 3))[0] => 1) } 0 .. 2;
	if (keys %lead == 3) { $stream = $name; last; }
}
die 'no stream name spreads its leaders' unless $stream;
$c->create_stream(1, $stream, shards => 3, replication_factor => 3, consistency => 'quorum');
my %gen;
for my $shard (0 .. 2)
{
	my ($l, $g) = $c->wait_leader($stream, $shard);
	$gen{$shard} = $g;
	$c->wait_shipping($l, $stream, $shard, 2);
}

# Publishers: one session per (node, shard); refusals are caught and
# retried, so each keeps going through every failover it survives.  Each
# pauses 5 ms between publishes: nine sessions at full speed kept both
# cores of a CI machine busy and made the script run three minutes.
my @pubs;
sub start_round
{
	my ($tag) = @_;
	my @round;
	for my $node ($c->up_nodes)
	{
		for my $shard (0 .. 2)
		{
			push @round, $c->start_publishers(
				node      => $node,
				stream    => $stream,
				shard     => $shard,
				sessions  => 1,
				count     => 1000000,
				seconds   => 45,
				catch     => 1,
				err_sleep => 0.02,
				sleep     => 0.005,
				settings  => "SET felix.quorum_timeout = '3s';",
				tag       => "${tag}_$node->{felix_name}_s$shard");
		}
	}
	push @pubs, @round;
	return @round;
}

sub acks_of { return map { $c->acks($_) } @_; }

my @order;
my $first = $c->duty_node_name // 'node1';
push @order, $first;
my $leader_host = $e->leader // 'e2';
(my $lk = $leader_host) =~ s/^e/node/;
push @order, $lk ne $first ? $lk : (grep { $_ ne $first } map { "node$_" } 1 .. 3)[0];
push @order, grep { my $n = $_; !grep { $_ eq $n } @order } map { "node$_" } 1 .. 3;
note("kill order: @order (duties on $first, etcd leader $leader_host)");

for my $victim (@order)
{
	(my $k = $victim) =~ s/^node//;
	my $vnode = $c->node($k);
	my @round = start_round("r$k");
	ok(defined FelixCluster::poll(30, sub { scalar(acks_of(@round)) >= 200 }, 0.1),
		"before killing host $victim: the publishers are acknowledged");

	# which shards it leads now
	my @led = grep {
		my $r = $c->shard_row($vnode, $stream, $_);
		$r && $r->{role} eq 'leader' && ($r->{lease_remaining_ms} || 0) > 0
	} 0 .. 2;
	my %g_before = map { my $r = $c->shard_row($vnode, $stream, $_); ($_ => $r->{generation}) } @led;
	my $duty_before = $c->duty_node_name // '';
	my $etcd_leader = $e->leader // '';
	my $t_kill = time;
	$c->kill_node($vnode);
	$e->kill_member($k);
	note("killed host $victim (felix and etcd member e$k): it led shard(s) @led; duties on $duty_before; etcd leader $etcd_leader");

	# acknowledgements after the kill count only from publishers on the survivors
	my @survivors = grep { $_->{tag} !~ /_\Q$victim\E_s/ } @round;
	for my $shard (@led)
	{
		my ($new, $g2);
		eval { ($new, $g2) = $c->wait_leader($stream, $shard, min_generation => $g_before{$shard} + 1, timeout => 30); 1 }
		  or diag($@);
		ok(defined $new && $new != $vnode, "$victim down: shard $shard fails over to another node")
		  or $c->diag_shard($stream, $shard);
		my $took = FelixCluster::poll(20, sub {
			grep { $_->{shard} == $shard && $_->{t_start} > $t_kill } acks_of(@survivors) }, 0.02);
		my ($first_ack) = sort { $a->{t} <=> $b->{t} }
		  grep { $_->{shard} == $shard && $_->{t_start} > $t_kill } acks_of(@survivors);
		ok(defined $first_ack, "$victim down: shard $shard acknowledges writes again");
		if ($first_ack)
		{
			my $fo = $first_ack->{t} - $t_kill;
			note(sprintf("FAILOVER TIME (etcd, host %s%s): %.3f s, shard %d",
				$victim, ($victim eq $duty_before ? ', the duty host' : '')
				  . ($etcd_leader eq "e$k" ? ', the etcd leader' : ''), $fo, $shard));
			diag(sprintf("failover of shard %d after kill -9 of host %s: %.3f s", $shard, $victim, $fo));
		}
	}
	for my $shard (grep { my $s = $_; !grep { $_ == $s } @led } 0 .. 2)
	{
		my $more = FelixCluster::poll(20, sub {
			scalar(grep { $_->{shard} == $shard && $_->{t_start} > $t_kill + 0.2 } acks_of(@survivors)) >= 20 }, 0.05);
		ok(defined $more, "$victim down: shard $shard, led elsewhere, keeps acknowledging writes");
	}
	my $new_duty;
	ok(defined FelixCluster::poll(30, sub { $new_duty = $c->duty_node_name; defined $new_duty && $new_duty ne $victim }, 0.2),
		"$victim down: the duties run on a node that is up") or diag("duties: " . ($new_duty // 'nobody'));

	# The host returns.
	$c->stop_publishers($_, 0) for @round;
	$e->start_member($k);
	$c->start_node($vnode);
	ok(defined eval { $c->wait_alive([ map { "node$_" } 1 .. 3 ], 60) }, "host $victim is back and alive")
	  or diag($@);
	for my $shard (0 .. 2)
	{
		my ($l, $g) = eval { $c->wait_leader($stream, $shard, timeout => 30) };
		ok(defined $l, "after $victim returns, shard $shard is led");
		$c->wait_shipping($l, $stream, $shard, 2, 30) if defined $l;
	}
}

# Every quorum-acknowledged record is there, once, with its payload.
$c->stop_publishers($_, 0) for @pubs;
my @acks = acks_of(@pubs);
note(scalar(@acks) . ' quorum acknowledgements in all');
for my $shard (0 .. 2)
{
	my ($l) = $c->wait_leader($stream, $shard);
	my %have;
	for (split /\n/, $c->records($l, $stream, $shard))
	{
		my ($seq, $k, $p) = split /\|/, $_, 3;
		$have{$seq} = $p;
	}
	my @mine = grep { $_->{shard} == $shard } @acks;
	my @lost = grep { ($have{ $_->{seq} } // '') ne $_->{payload} } @mine;
	is(scalar(@lost), 0, "shard $shard: every one of " . scalar(@mine) . " acknowledged records is readable at its seq")
	  or diag("first lost: seq $lost[0]{seq} $lost[0]{payload}, found " . ($have{ $lost[0]{seq} } // 'nothing'));
	my %seen;
	my @twice = grep { $seen{ $_->{seq} }++ } @mine;
	is(scalar(@twice), 0, "shard $shard: no seq was acknowledged twice");
}

$c->teardown;
$e->stop_all;
felix_done_testing();
