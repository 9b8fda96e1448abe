# The log ends a node's heartbeat gives (issue 20): while publishes keep
# every copy's end moving they are given every fifth heartbeat, not at
# every one, and a heartbeat that gives none is not counted as a read of
# them; once the ends stop moving they are given at once, so the control
# plane holds the ends the copies really have.
#
# Three nodes, a quorum stream of three shards with a copy on every node.
#   1. Idle: every heartbeat of node2 counts as a read of its ends
#      (ends_beat in its node record moves with beat): nothing is given
#      less often when nothing moves.
#   2. Publishing through node1 without a pause, so node2's copies move at
#      every heartbeat: ends_beat moves at most half as fast as beat (it
#      moved with every beat when every heartbeat gave them).
#   3. The publishing stops: ends/<node2> comes to hold, for each shard,
#      node2's log end as felix_shards shows it there.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

# node1 forwards each publish to its shard's leader
my $c = FelixCluster->new(nodes => 3, conf => ["felix.forward_publishes = on"]);
my $stream = 'cadence';
my $n2name = $c->name_of(2);
$c->create_stream(1, $stream, shards => 3, replication_factor => 3,
	consistency => 'quorum');
$c->wait_leader($stream, $_) for 0 .. 2;

# node2's heartbeat count and how many of its heartbeats read its ends
sub beats
{
	my $v = $c->state_query(
		"SELECT (value::jsonb->>'beat') || ' ' || (value::jsonb->>'ends_beat') "
		  . "FROM felix.store_read('nodes/$n2name') WHERE key = 'nodes/$n2name'");
	return split / /, $v;
}

# the beats and ends_beats node2 made over $secs seconds
sub over
{
	my ($secs) = @_;
	my ($b0, $e0) = beats();
	usleep($secs * 1_000_000);
	my ($b1, $e1) = beats();
	return ($b1 - $b0, $e1 - $e0);
}

# 1. Idle.
ok(defined FelixCluster::poll(30, sub {
	my ($db, $de) = over(1);
	return $db >= 3 && $de >= $db - 1;
}, 0.2), 'idle: every heartbeat of node2 counts as a read of its log ends');

# 2. Publishing without a pause.
my $pub = $c->start_publishers(node => 1, stream => $stream, sessions => 2,
	seconds => 30, tag => 'cad');
ok(defined FelixCluster::poll(30, sub { $c->ack_count($pub) >= 200 }, 0.1),
	'publishes are acknowledged');
my ($db, $de) = over(3);
cmp_ok($db, '>=', 5, "node2 heartbeats while publishing ($db in 3 s)");
cmp_ok($de, '<=', $db / 2,
	"while its ends keep moving, at most every other heartbeat gives them ($de of $db)");
$c->stop_publishers($pub, 5);

# 3. Stopped: the control plane holds node2's ends as they are.
sub ends_match
{
	my %have;
	for my $row (split /\n/, $c->node(2)->safe_psql('postgres',
		"SELECT shard || ' ' || next_seq FROM felix_shards WHERE stream = '$stream'"))
	{
		my ($shard, $next) = split / /, $row;
		$have{$shard} = $next;
	}
	my $given = $c->state_query(
		"SELECT string_agg(e, ' ') FROM felix.store_read('ends/$n2name'), "
		  . "jsonb_array_elements_text(value::jsonb->'ends') e "
		  . "WHERE key = 'ends/$n2name' AND e LIKE '$stream/%'");
	my %told = map { m{^\Q$stream\E/(\d+)=(\d+)} ? ($1 => $2) : () } split / /, $given;
	return 0 unless scalar(keys %have) == 3 && scalar(keys %told) == 3;
	for my $s (keys %have)
	{
		return 0 unless defined $told{$s} && $told{$s} == $have{$s};
	}
	return 1;
}
ok(defined FelixCluster::poll(30, \&ends_match, 0.1),
	"once publishing stops, the control plane holds node2's log end of every shard");
cmp_ok(scalar(grep { $_ > 0 } map { $c->node(2)->safe_psql('postgres',
	"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = $_") } 0 .. 2),
	'==', 3, 'node2 holds records of every shard');

$c->teardown;
done_testing();
