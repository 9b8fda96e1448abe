# Control plane down: stop the node that hosts it (node1) -- with etcd as
# the store, every etcd member -- while a leader on another node publishes.  Writes go on until the leader's lease runs
# out (no renewal can arrive), then every write is refused (55F03, or
# 55F02); nothing is promoted meanwhile.  Once the control plane is back,
# writes resume with every record the leader acknowledged (it was alive
# throughout): the leader, still the same server, claims its lease again
# at its generation -- nobody else was granted one -- or, had the duties
# meanwhile granted the next generation, some node leads that.
#
# A stream with leader acknowledgement: a quorum stream would stop at
# once, since its leader must report to the control plane before it
# acknowledges.  Default lease settings.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $c = FelixCluster->new(nodes => 3);
my $lease_ms = $c->cp->safe_psql('postgres',
	"SELECT setting FROM pg_settings WHERE name = 'felix.lease_duration'");

my ($stream, @set) = $c->pick_stream_name('cpdown', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'leader');
my ($leader, $g) = $c->wait_leader($stream, 0);
my $lname = $leader->{felix_name};
note("stream $stream led by $lname at generation $g; lease $lease_ms ms");

my $pub = $c->start_publishers(
	node      => $leader,
	stream    => $stream,
	shard     => 0,
	sessions  => 1,
	count     => 1000000,
	seconds   => 90,
	catch     => 1,
	err_sleep => 0.02,
	sleep     => 0.01,
	tag       => 'cp');
ok($c->wait_acks($pub, 50, 30), "$lname acknowledges publishes");
my @early_errs = $c->errors($pub);
is(scalar(@early_errs), 0, 'no refusal while the control plane is up');

# The control plane goes away: node1's server (embedded), or every etcd
# member (etcd).
sub cp_down
{
	if ($c->store eq 'etcd') { $c->etcd->kill_member($_) for 1 .. 3; return time; }
	return $c->stop_node(1);
}
sub cp_up
{
	if ($c->store eq 'etcd') { $c->etcd->start_member($_) for 1 .. 3; return time; }
	return $c->start_node(1);
}
my $t_stop0 = time;
my $t_stop  = cp_down();
note(sprintf('control plane (%s) stopped in %.2f s', $c->store eq 'etcd' ? 'every etcd member' : 'node1',
	$t_stop - $t_stop0));

# Wait for the first refusal of a publish started after the stop began.
my $first_refusal;
my $took = FelixCluster::poll(15, sub {
	($first_refusal) = sort { $a->{t_start} <=> $b->{t_start} }
	  grep { $_->{t_start} > $t_stop0 } $c->errors($pub);
	return defined $first_refusal;
}, 0.05);
ok(defined $took, "$lname refuses writes within 15 s of the control plane going down");

my @acks_after = grep { $_->{t_start} > $t_stop0 } $c->acks($pub);
my ($last_ack) = sort { $b->{t} <=> $a->{t} } @acks_after;
ok(@acks_after > 0, 'writes went on after the control plane began to stop');
if (defined $first_refusal)
{
	my $ran = $first_refusal->{t_start} - $t_stop0;
	note(sprintf('%d publishes acknowledged after the stop began; last at +%.3f s; first refusal (%s) at +%.3f s',
		scalar(@acks_after), ($last_ack ? $last_ack->{t} - $t_stop0 : 0),
		$first_refusal->{sqlstate}, $ran));
	# The last renewal was sent before the stop began; the leader stops
	# lease - epsilon after that send.  Allow the time pg_ctl took.
	cmp_ok($ran, '<=', $lease_ms / 1000 + ($t_stop - $t_stop0) + 0.5,
		'the first refusal comes no later than one lease after the control plane went away');
}

# Down a while longer: everything refused, nobody promoted.
usleep(1_500_000);
my $t_up0 = time;
my @refused =
  $first_refusal ? grep { $_->{t_start} > $first_refusal->{t_start} } $c->errors($pub) : ();
my @acked_when_down =
  grep { $first_refusal && $_->{t_start} > $first_refusal->{t_start} } $c->acks($pub);
is(scalar(@acked_when_down), 0, 'no publish acknowledged after the first refusal while the control plane is down');
my %codes;
$codes{ $_->{sqlstate} }++ for @refused, ($first_refusal // ());
note('refusals while down: ' . join(', ', map { "$_ x$codes{$_}" } sort keys %codes));
ok(%codes && !(grep { $_ ne '55F03' && $_ ne '55F02' } keys %codes),
	'refusals are 55F03 (lease expired) or 55F02');
for my $node ($c->up_nodes)
{
	my $r = $c->shard_row($node, $stream, 0);
	is($r->{generation}, $g, "$node->{felix_name} is still at generation $g (no promotion without a control plane)");
	ok($r->{lease_remaining_ms} eq '' || $r->{lease_remaining_ms} == 0,
		"$node->{felix_name} holds no live lease");
}

# Control plane back: writes resume.
my $t_up = cp_up();
note(sprintf('control plane started in %.2f s', $t_up - $t_up0));
my ($new, $g2);
eval { ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g, timeout => 30); 1 }
  or do { diag($@); $c->diag_shard($stream, 0); };
ok(defined $new, 'a node leads the shard again once the control plane is back');
ok(!defined $new || $g2 > $g || $new == $leader,
	"at generation $g only its leader $lname leads it again");
if (defined $new)
{
	note(sprintf('%s leads at generation %d, %.2f s after the control plane started',
		$new->{felix_name}, $g2, time - $t_up));
	if ($new == $leader)
	{
		my $resumed = FelixCluster::poll(10, sub {
			grep { $_->{t_start} > $t_up } $c->acks($pub);
		}, 0.05);
		ok(defined $resumed, "the publisher on $lname is acknowledged again");
		my ($first) = sort { $a->{t} <=> $b->{t} } grep { $_->{t_start} > $t_up } $c->acks($pub);
		note(sprintf("first acknowledgement %.2f s after the control plane started", $first->{t} - $t_up))
		  if $first;
	}
	else
	{
		my $ok = $c->try_psql($new, "SELECT felix_publish('$stream', '{\"after\": 1}'::jsonb, shard => 0)");
		ok(defined $ok, "the new leader $new->{felix_name} acknowledges a publish");
		# The old leader was alive all along and holds every record it
		# acknowledged; a control-plane outage must not hand the shard to
		# a replica without them (docs/control-plane.md, cp_tick: "a
		# leader that lost its lease to ... a control-plane outage comes
		# back this way").
		my $recs = $c->records($new, $stream, 0);
		my %have = map { my ($seq, $k, $p) = split /\|/, $_, 3; ($seq => $p) } split /\n/, $recs;
		my @lost = grep { ($have{ $_->{seq} } // '') ne $_->{payload} } $c->acks($pub);
		is(scalar(@lost), 0, "every record $lname acknowledged is on the new leader $new->{felix_name}")
		  or diag(scalar(@lost) . " acknowledged records missing on $new->{felix_name}, the first at seq $lost[0]{seq}");
	}
}
$c->stop_publishers($pub, 0);

$c->teardown;
felix_done_testing();
