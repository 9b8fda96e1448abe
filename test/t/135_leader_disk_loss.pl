# A `leader` stream whose leader's disk is lost while it publishes without
# pause (found by the fault harness, test/fault: seed 2 on etcd).
#
# Under steady publishing a leader stream's followers are never level with
# the leader, so no report ever called one caught up.  The control plane
# required a caught-up follower to promote, and with the leader's felix
# directory wiped the shard stayed unplaced for good, although both
# followers held all but the last few records.  Now the most advanced
# follower the leader recently reported on is promoted, and what is lost
# is at most its lag -- the stream's documented loss window:
#
# - a follower leads at the next generation within seconds;
# - every record acknowledged below the new leader's first seq is there,
#   unchanged; the acknowledged records lost are exactly seqs at or above
#   it, and fewer than the records published in the last second;
# - the old node, started again with an empty felix directory, is made a
#   copy of the new leader's log.
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

my $c = FelixCluster->new(nodes => 3);
my ($stream, @set) = $c->pick_stream_name('dloss', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'leader');
my ($old, $g) = $c->wait_leader($stream, 0);
my $oname = $old->{felix_name};
$c->wait_shipping($old, $stream, 0, 2);

my $pub = $c->start_publishers(node => $old, stream => $stream, shard => 0, sessions => 4,
	seconds => 30, tag => 'd');
ok($c->wait_acks($pub, 3000, 60), 'the publishers are acknowledged steadily');
my $behind = $c->state_query(
	"SELECT count(*) FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0 AND NOT caught_up");
note("reports calling a follower behind: $behind");

# The leader's machine dies with its disk: kill -9, felix directory gone.
$c->kill_node($old);
my $t_kill = time;
remove_tree($old->data_dir . '/felix');
$c->stop_publishers($pub, 5);
my @acks = $c->acks($pub);

my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30);
ok($new && $new != $old, "a follower ($new->{felix_name}) leads at generation $g2")
  or $c->diag_shard($stream, 0);
$c->leader_loss_ok($new, $stream, 0, $t_kill, @acks);

# The node comes back with an empty felix directory and is made a copy.
$c->start_node($old);
my $want;
ok(defined FelixCluster::poll(60, sub {
	$want = $c->records($new, $stream, 0);
	$c->records($old, $stream, 0) eq $want }, 0.5),
	"$oname, started again with nothing, serves exactly the new leader's records")
  or $c->diag_shard($stream, 0);

$c->teardown;
felix_done_testing();
