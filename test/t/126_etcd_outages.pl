# etcd outages under load (etcd store, felix nodes untouched), on a
# replication factor 3 quorum stream with publishers on the leader:
#   1. an etcd member that is not the leader is killed and restarted;
#   2. the etcd leader is killed: the other members elect another;
#   3. every etcd member is down for longer than a lease: writes stop --
#      nothing is acknowledged without a lease -- and resume by themselves
#      once etcd is back.
# Each time no acknowledged record is lost; how long writes stalled is
# printed (the longest gap between two acknowledgements around the event).
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
my $lease_s = 1.0;

my ($stream) = $c->pick_stream_name('outage', 3, sub { 1 });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
note("stream $stream led by $leader->{felix_name}");

my @pubs;
sub publish_for
{
	my ($tag, $secs) = @_;
	my ($l) = $c->wait_leader($stream, 0);
	my $pub = $c->start_publishers(node => $l, stream => $stream, shard => 0,
		sessions => 2, count => 1000000, seconds => $secs, catch => 1, err_sleep => 0.02,
		settings => "SET felix.quorum_timeout = '2s';", tag => $tag);
	push @pubs, $pub;
	return $pub;
}

# The longest time without an acknowledgement in [t0, t1].
sub longest_gap
{
	my ($pub, $t0, $t1) = @_;
	my @t = sort { $a <=> $b } grep { $_ >= $t0 && $_ <= $t1 } map { $_->{t} } $c->acks($pub);
	return $t1 - $t0 unless @t;
	my $gap = $t[0] - $t0;
	for my $i (1 .. $#t) { $gap = $t[$i] - $t[ $i - 1 ] if $t[$i] - $t[ $i - 1 ] > $gap; }
	$gap = $t1 - $t[-1] if $t1 - $t[-1] > $gap;
	return $gap;
}

sub member_of { my ($name) = @_; (my $k = $name) =~ s/^e//; return $k; }

# 1 and 2: a follower member, then the leader member.
for my $which ('follower', 'leader')
{
	my $pub = publish_for("m_$which", 20);
	ok($c->wait_acks($pub, 100, 20), "$which member: publishes are acknowledged before");
	my $lead = $e->leader // die 'etcd has no leader';
	my $k = $which eq 'leader' ? member_of($lead)
	  : (grep { "e$_" ne $lead } 1 .. 3)[0];
	my $t0 = time;
	$e->kill_member($k);
	note("killed etcd member e$k (the etcd leader was $lead)");
	usleep(2_500_000);
	$e->start_member($k);
	my $t1 = time;
	ok(defined FelixCluster::poll(20, sub { scalar(grep { $_->{t} > $t1 } $c->acks($pub)) >= 20 }, 0.1),
		"$which member restarted: publishes are acknowledged");
	my $gap = longest_gap($pub, $t0 - 0.5, time);
	note(sprintf("STALL (etcd %s member killed and restarted): %.3f s without an acknowledgement", $which, $gap));
	diag(sprintf("etcd %s member restart: writes stalled %.3f s at most", $which, $gap));
	$c->stop_publishers($pub, 0);
	ok(defined eval { $e->wait_ready(30) }, "$which member: etcd has a leader again");
}

# 3: every member down for longer than a lease.
{
	my $pub = publish_for('all_down', 40);
	ok($c->wait_acks($pub, 100, 20), 'all down: publishes are acknowledged before');
	my $t_down = time;
	$e->kill_member($_) for 1 .. 3;
	note('every etcd member is down');
	usleep(int(($lease_s + 2.5) * 1e6));
	my $t_refusing = time;
	# from a lease after the outage began, nothing is acknowledged
	usleep(1_500_000);
	my @during = grep { $_->{t_start} > $t_down + $lease_s + 0.5 && $_->{t} <= time } $c->acks($pub);
	is(scalar(@during), 0, 'no publish that began a lease into the outage is acknowledged');
	my @refused = grep { $_->{t} && $_->{t} > $t_down + $lease_s } $c->errors($pub);
	ok(scalar(@refused) > 0, 'publishes are refused meanwhile');
	my %codes;
	$codes{ $_->{sqlstate} }++ for @refused;
	note('refusals while etcd was down: ' . join(', ', map { "$_ x$codes{$_}" } sort keys %codes));
	for my $node ($c->nodes)
	{
		my $r = $c->shard_row($node, $stream, 0);
		ok(!$r->{lease_remaining_ms}, "$node->{felix_name} holds no live lease while etcd is down");
	}
	my $t_up = time;
	$e->start_member($_) for 1 .. 3;
	ok(defined eval { $e->wait_ready(30) }, 'etcd is back');
	my $back = FelixCluster::poll(30, sub { scalar(grep { $_->{t_start} > $t_up } $c->acks($pub)) >= 20 }, 0.1);
	ok(defined $back, 'writes resume by themselves once etcd is back');
	note(sprintf('writes resumed %.2f s after the members were started', $back)) if defined $back;
	$c->stop_publishers($pub, 0);
}

# Nothing acknowledged was lost.
my ($l) = $c->wait_leader($stream, 0);
my %have;
for (split /\n/, $c->records($l, $stream, 0))
{
	my ($seq, $k, $p) = split /\|/, $_, 3;
	$have{$seq} = $p;
}
my @acks = map { $c->acks($_) } @pubs;
my @lost = grep { ($have{ $_->{seq} } // '') ne $_->{payload} } @acks;
is(scalar(@lost), 0, 'every one of ' . scalar(@acks) . ' quorum-acknowledged records is readable at its seq')
  or diag("first lost: seq $lost[0]{seq}");
my %seen;
is(scalar(grep { $seen{ $_->{seq} }++ } @acks), 0, 'no seq was acknowledged twice');

$c->teardown;
$e->stop_all;
felix_done_testing();
