# A `leader` stream whose leader loses its felix directory and starts
# again at once, while the control-plane duties move to a holder that never
# saw the old leader claim (found by the fault harness, test/fault: seed
# 3012 on etcd, and five more seeds on both stores).
#
# A leader stream's followers qualify for promotion only on reports made
# within a few of the leader's heartbeats of its last claim.  The duty
# holder learns that claim by watching the leader's node record; a holder
# that started watching after the leader came back found a record of the
# new boot, with no claim, and judged every follower's report "too old"
# for good: the shard stayed unplaced although both followers held all but
# the last few records.  The record of the new boot now keeps the previous
# boot's last heartbeat count when that boot took a generation still
# current, and the holder bounds the last claim by it:
#
# - a follower leads at the next generation within seconds;
# - every record acknowledged below the new leader's first seq is there,
#   unchanged, and at most the last half second's acknowledgements are
#   lost (the stream's documented loss window);
# - the old node, with its empty felix directory, is made a copy.
#
# node1 hosts the embedded store, leads the shard and is the only node that
# may hold the duties: the holder is always a boot that never saw the old
# one claim.
#
# Part 2: the leader's reports stop landing (felix.cp_report refused) for
# seconds while it goes on acknowledging, then it dies with its felix
# directory and starts again.  Its followers' reports are then too old to
# bound what it acknowledged since, and the holder used to wait for the old
# leader -- whose copy is gone, so the shard stayed unplaced for good (the
# fault harness, seed 4050 embedded).  A leader whose copy is gone (a new
# incarnation, or a log short of what it acknowledged) is waited for no
# longer: the most advanced follower leads, and the loss stays within the
# records its follower lacked.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use File::Path qw(remove_tree);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $c = FelixCluster->new(nodes => 3, store => 'embedded');
for my $k (2, 3)
{
	$c->node($k)->safe_psql('postgres',
		"ALTER SYSTEM SET felix.control_plane_duties = off; SELECT pg_reload_conf()");
}
ok(defined FelixCluster::poll(30, sub { ($c->duty_node_name // '') eq 'node1' }, 0.2),
	'node1 holds the duties, and only it may');

my ($stream, @set) = $c->pick_stream_name('lcopy', 3, sub { $_[0] eq 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'leader');
my ($old, $g) = $c->wait_leader($stream, 0);
is($old->{felix_name}, 'node1', "node1 leads generation $g");
$c->wait_shipping($old, $stream, 0, 2);

my $pub = $c->start_publishers(node => $old, stream => $stream, shard => 0, sessions => 2,
	seconds => 30, tag => 'c');
ok($c->wait_acks($pub, 1000, 60), 'the publishers are acknowledged steadily');
my $inc = $c->state_query("SELECT incarnation FROM felix.nodes WHERE name = 'node1'");

# node1 dies with its felix directory and starts again at once, empty
$c->kill_node($old);
my $t_kill = time;
remove_tree($old->data_dir . '/felix');
$c->stop_publishers($pub, 5);
my @acks = $c->acks($pub);
$c->start_node($old);
ok(defined FelixCluster::poll(30, sub {
	$c->state_query("SELECT incarnation <> '$inc' FROM felix.nodes WHERE name = 'node1'") eq 't' }, 0.2),
	'node1 is back, with a new felix data directory');

my ($new, $g2) = eval { $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30) };
ok($new && $new != $old, 'a follower ('
	  . ($new ? $new->{felix_name} : 'none') . ') leads the next generation')
  or do { $c->diag_shard($stream, 0); die 'no follower leads: nothing more to check' };
$c->leader_loss_ok($new, $stream, 0, $t_kill, @acks);
my $want;
ok(defined FelixCluster::poll(60, sub {
	$want = $c->records($new, $stream, 0);
	$c->records($old, $stream, 0) eq $want }, 0.5),
	'node1, started again with nothing, serves exactly the new leader\'s records')
  or $c->diag_shard($stream, 0);

# Part 2: stale reports, then the leader's copy lost.
my ($s2) = $c->pick_stream_name('lstale', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $s2, replication_factor => 3, consistency => 'leader');
my ($old2, $h) = $c->wait_leader($s2, 0);
$c->wait_shipping($old2, $s2, 0, 2);
my $pub2 = $c->start_publishers(node => $old2, stream => $s2, shard => 0, sessions => 2,
	seconds => 30, tag => 's');
ok($c->wait_acks($pub2, 500, 60), "$s2: the publishers are acknowledged steadily");
$c->break_reports;
my $n0 = $c->ack_count($pub2);
sleep 4;
cmp_ok($c->ack_count($pub2), '>', $n0 + 100, "$s2: acknowledged without its reports landing for 4 s");
$c->kill_node($old2);
my $t_kill2 = time;
remove_tree($old2->data_dir . '/felix');
$c->stop_publishers($pub2, 5);
my @acks2 = $c->acks($pub2);
$c->mend_reports;
$c->start_node($old2);
my ($new2) = eval { $c->wait_leader($s2, 0, min_generation => $h + 1, timeout => 30) };
ok($new2 && $new2 != $old2, "$s2: a follower ("
	  . ($new2 ? $new2->{felix_name} : 'none') . ") leads, its old leader's copy being gone")
  or do { $c->diag_shard($s2, 0); die 'no follower leads: nothing more to check' };
$c->leader_loss_ok($new2, $s2, 0, $t_kill2, @acks2);

$c->teardown;
felix_done_testing();
