# A follower that starts again is not called caught up before its leader
# has heard from it again (found by model-checking, docs/formal: finding 3).
#
# The control plane marks a restarted node's reports "not caught up" until
# its leaders confirm them, because what it holds after a restart is not
# known -- its felix directory may even have been put back from an older
# copy.  The leader kept believing the follower's last answer across the
# follower's restart, so its next periodic report confirmed the follower
# from before the restart, without a shipment.  A follower's answers are
# now believed only while the connection they came on lasts:
#
# - a follower restarted where its leader cannot reach it stays "not
#   caught up" for many report intervals, while the shard goes on
#   acknowledging with the others;
# - once the leader reaches it again, it is caught up and holds every
#   acknowledged record.
#
# The leader's connections are refused by the follower's database
# (CONNECTION LIMIT 0, which superusers and felix's own workers are
# exempt from) from before the restart.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3, store => 'embedded');
my ($stream, @set) = $c->pick_stream_name('frestart', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($lead, $g) = $c->wait_leader($stream, 0);
my $ln = $lead->{felix_name};
$c->wait_shipping($lead, $stream, 0, 2);
my ($fn) = grep { $_ ne $ln && $_ ne 'node1' } @set;

sub publish
{
	my ($from, $to) = @_;
	return $lead->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series($from, $to) i");
}

sub caught_up
{
	my ($min) = @_;
	return $c->state_query("SELECT coalesce(bool_and(caught_up AND acked_end >= $min), false) "
		  . "FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0 AND follower = '$fn'");
}

is(publish(1, 100), '100', '100 records acknowledged');
ok(defined FelixCluster::poll(30, sub { caught_up(100) eq 't' }, 0.05),
	"$ln reports $fn caught up at 100");

# the leader cannot connect to it once it restarts
$c->node($fn)->safe_psql('postgres', 'ALTER DATABASE postgres CONNECTION LIMIT 0');
$c->kill_node($fn);
$c->start_node($fn);
ok(defined FelixCluster::poll(30, sub { caught_up(0) eq 'f' }, 0.05),
	"the new start of $fn makes the control plane count it out");
my $confirmed = FelixCluster::poll(4, sub { caught_up(0) eq 't' }, 0.05);
ok(!defined $confirmed,
	"for 20 report intervals, $ln, which cannot reach $fn, does not report it caught up");
is(publish(101, 150), '50', 'the shard goes on acknowledging with the other two');
ok(caught_up(0) eq 'f', "$fn is still counted out");

$c->node($fn)->safe_psql('postgres', 'ALTER DATABASE postgres CONNECTION LIMIT -1');
ok(defined FelixCluster::poll(30, sub { caught_up(150) eq 't' }, 0.05),
	"once $ln reaches $fn again, it reports it caught up at 150");
is($c->records($c->node($fn), $stream, 0), $c->records($lead, $stream, 0),
	"$fn holds exactly the leader's 150 records");

$c->teardown;
felix_done_testing();
