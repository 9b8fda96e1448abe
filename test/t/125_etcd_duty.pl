# The control-plane duties move between nodes (etcd store): SIGSTOP of the
# node running them, past its lease.  Another node takes the duties over;
# while the stopped one is still stopped, the leader of a quorum shard is
# killed, and the new holder promotes a follower -- exactly once, after
# waiting out a lease and margin of its own.  After SIGCONT the stopped
# node grants nothing: it logs that it no longer runs the duties, no
# promotion appears in its log, the duties stay where they went, and the
# shard's generation moves no further.  No quorum-acknowledged record is
# lost.
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

my $duty;
ok(defined FelixCluster::poll(30, sub { $duty = $c->duty_node_name; defined $duty }, 0.1),
	'one node runs the control-plane duties') or BAIL_OUT('no duty holder');
my $dnode = $c->node($duty);
note("$duty runs the duties");

# A quorum shard led by a node that does not run the duties.
my ($stream, @set) = $c->pick_stream_name('duty', 3, sub { $_[0] ne $duty });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
my $lname = $leader->{felix_name};
my ($third) = grep { $_ != $leader && $_ != $dnode } $c->nodes;
note("stream $stream led by $lname at generation $g; the third node is $third->{felix_name}");

my $pub = $c->start_publishers(node => $leader, stream => $stream, shard => 0,
	sessions => 2, count => 1000000, seconds => 30, tag => 'before');
ok($c->wait_acks($pub, 200, 30), 'quorum publishes are acknowledged');

# Stop the duty holder past its lease.
my $log_off = -s $dnode->logfile;
my $t_pause = time;
$c->pause_node($dnode);
my $new_duty;
ok(defined FelixCluster::poll(20, sub {
	my $d = $c->try_psql($leader, 'SELECT name FROM felix_nodes WHERE duty', 5);
	chomp $d if defined $d;
	$new_duty = $d;
	defined $d && $d ne '' && $d ne $duty }, 0.1),
	"another node takes the duties over while $duty is stopped")
  or diag('duties: ' . ($new_duty // 'nobody'));
note(sprintf('%s runs the duties %.2f s after %s was stopped', $new_duty // '?', time - $t_pause, $duty));

# The leader dies while the old holder is stopped: the new holder promotes.
$c->stop_publishers($pub, 0);
my $t_kill = $c->kill_node($leader);
my ($new, $g2);
eval { ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30); 1 }
  or diag($@);
ok(defined $new && $new == $third, "$third->{felix_name} leads the shard at a newer generation")
  or $c->diag_shard($stream, 0);
is($g2, $g + 1, 'one promotion: generation G+1') if defined $g2;
note(sprintf('promoted %.2f s after the kill', time - $t_kill)) if defined $new;

# Wake the old holder: it grants nothing.  The holder to compare with is
# the one running the duties now: when the duties went to the shard's
# leader, the kill moved them once more, to the third node.
my $holder;
FelixCluster::poll(20, sub {
	$holder = $c->try_psql($third, 'SELECT name FROM felix_nodes WHERE duty', 5);
	chomp $holder if defined $holder;
	defined $holder && $holder ne '' && $holder ne $lname }, 0.1);
note('the duties are with ' . ($holder // 'nobody') . ' before ' . $duty . ' is woken');
usleep(200_000);
$c->resume_node($dnode);
my $probe = $c->start_publishers(node => $third, stream => $stream, shard => 0,
	sessions => 1, count => 1000000, seconds => 10, catch => 1, err_sleep => 0.02, tag => 'after');
FelixCluster::poll(4, sub { 0 }, 0.5);
my $since = substr(read_file($dnode->logfile), $log_off);
like($since, qr/no longer runs the control-plane duties|stops running the control-plane duties/,
	"$duty, woken, says it no longer runs the duties");
unlike($since, qr/felix: stream "[^"]*" shard \d+: \S+ leads generation/, "$duty granted nothing after it was woken");
my $d_now = $c->duty_node_name;
is($d_now, $holder, 'the duties stay with ' . ($holder // 'nobody'));
my ($l3, $g3) = $c->wait_leader($stream, 0);
is($g3, $g + 1, 'the shard is still at generation G+1') and is($l3, $third, "led by $third->{felix_name}");
$c->stop_publishers($probe, 0);
ok($c->ack_count($probe) > 0, "the promoted leader acknowledges quorum publishes");

# Nothing acknowledged was lost.
my %have;
for (split /\n/, $c->records($third, $stream, 0))
{
	my ($seq, $k, $p) = split /\|/, $_, 3;
	$have{$seq} = $p;
}
my @acks = ($c->acks($pub), $c->acks($probe));
my @lost = grep { ($have{ $_->{seq} } // '') ne $_->{payload} } @acks;
is(scalar(@lost), 0, 'every one of ' . scalar(@acks) . ' quorum-acknowledged records is readable at its seq');

$c->teardown;
$c->etcd->stop_all;
felix_done_testing();
