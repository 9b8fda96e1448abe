# Serving health is part of the lease.
#
# 1. A leader whose copy of a shard fails locally -- here a sealed segment
#    damaged on disk, found when the node restarts at once -- keeps
#    heartbeating, but no longer renews that shard's lease: after a lease
#    of failing to serve it, it tells the control plane it cannot
#    (felix.nodes.unable), its lease lapses, and a caught-up follower is
#    promoted.  Before, the node heartbeated on, was taken for the shard's
#    live leader, and the shard never failed over.  No acknowledged record
#    is lost, and the damaged node is never granted the shard again while
#    it cannot serve it.
# 2. A granted leader that dies before it takes its lease is replaced once
#    the grant expires.  Seen on a 3-node cluster: pause both followers
#    (one hosts the control plane) for half a second, kill the leader,
#    resume: the control plane, which had heard from the leader recently,
#    granted it the next generation, which was never taken, and the shard
#    stayed unplaced for good ("no replica was reported caught up at
#    generation 2").  Replicas the last landed report counted caught up
#    are eligible when the generations since wrote nothing.
#
# tap-etcd: skip.  Its subject is serving health in the lease; the
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
use Time::HiRes qw(usleep);

my $c = FelixCluster->new(nodes => 3, conf => ["felix.segment_bytes = '64kB'"]);

sub publish_n
{
	my ($node, $stream, $n, $tag) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', '$tag-' || i || '-' || repeat('y', 500), shard => 0)) "
		  . "FROM generate_series(1, $n) i");
}

sub records_match
{
	my ($stream, $from, $to) = @_;
	my $want = $c->records($from, $stream, 0);
	return FelixCluster::poll(30, sub { $c->records($to, $stream, 0) eq $want }, 0.2);
}

# ---------------------------------------------------------------------
# 1. A locally failed shard fails over
# ---------------------------------------------------------------------
my ($s1, @set1) = $c->pick_stream_name('health', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $s1, replication_factor => 3, consistency => 'quorum', payload_type => 'text');
my ($leader, $g) = $c->wait_leader($s1, 0);
$c->wait_shipping($leader, $s1, 0, 2);
is(publish_n($leader, $s1, 400, 'a'), '400', '400 quorum publishes acknowledged');
my @followers = grep { $_ != $leader } $c->nodes;
ok(records_match($s1, $leader, $_), "$_->{felix_name} holds them") for @followers;

# Damage the first sealed segment of the leader's copy, then restart it
# at once: recovery finds the damage and the shard refuses to serve.
my @segs = segment_files(shard_dir($leader, $s1, 0));
cmp_ok(scalar(@segs), '>=', 2, 'the leader has a sealed segment');
flip_byte($segs[0], 64 + 100);
$leader->restart;
my $lname = $leader->{felix_name};
is($leader->safe_psql('postgres', "SELECT state FROM felix_shards WHERE stream = '$s1' AND shard = 0"),
	'failed', "${lname}'s copy of the shard refuses to serve after the restart");

my $promoted = eval { ($c->wait_leader($s1, 0, min_generation => $g + 1, timeout => 30))[0] };
ok(defined $promoted && $promoted != $leader,
	'a follower leads the shard at a newer generation') or $c->diag_shard($s1, 0);
# (The promotion does not wait for it: a lapsed leader that gives no log
# end for the shard is not given it back.)
my $unable = '';
FelixCluster::poll(10, sub {
	$unable = $c->state_query("SELECT array_to_string(unable, ',') FROM felix.nodes WHERE name = '$lname'");
	$unable =~ /(^|,)\Q$s1\E\/0(,|$)/ }, 0.2);
like($unable, qr/(^|,)\Q$s1\E\/0(,|$)/, "the control plane knows $lname cannot serve it (felix.nodes.unable)");
if (defined $promoted)
{
	is(publish_n($promoted, $s1, 20, 'b'), '20', 'the new leader acknowledges quorum publishes');
	like($c->records($promoted, $s1, 0), qr/^399\|\|a-400-/m,
		'every record acknowledged before the damage is there');
}
is($c->state_query(
		"SELECT leader <> '$lname' FROM felix.assignments WHERE stream = '$s1' AND shard = 0"),
	't', "$lname is not granted the shard while it cannot serve it");

# ---------------------------------------------------------------------
# 2. A granted leader that dies before taking its lease is replaced
# ---------------------------------------------------------------------
my ($s2, @set2) = $c->pick_stream_name('grant', 3,
	sub { $_[0] ne 'node1' && $_[0] ne $lname });
$c->create_stream(1, $s2, replication_factor => 3, consistency => 'quorum', payload_type => 'text');
my ($l2, $g2) = $c->wait_leader($s2, 0);
$c->wait_shipping($l2, $s2, 0, 2);
is(publish_n($l2, $s2, 50, 'c'), '50', '50 quorum publishes acknowledged');
my @f2 = grep { $_ != $l2 } $c->nodes;
ok(records_match($s2, $l2, $_), "$_->{felix_name} holds them") for @f2;
usleep(300_000);    # a report after the last publish has landed

# The leader lives on for a moment while the control plane is paused: its
# last heartbeats wait in the control plane's socket and are taken in
# when it resumes, after the leader is dead.
$c->pause_node($_) for @f2;
usleep(300_000);
$c->kill_node($l2);
usleep(200_000);
$c->resume_node($_) for @f2;
note("paused $f2[0]{felix_name} and $f2[1]{felix_name}, killed $l2->{felix_name}, resumed");

my ($l3) = eval { $c->wait_leader($s2, 0, min_generation => $g2 + 1, timeout => 30) };
ok(defined $l3 && $l3 != $l2, 'a follower leads the shard after the dead leader\'s lease and any grant to it expired')
  or $c->diag_shard($s2, 0);
if (defined $l3)
{
	is(publish_n($l3, $s2, 10, 'd'), '10', 'and acknowledges quorum publishes');
	like($c->records($l3, $s2, 0), qr/^49\|\|c-50-/m, 'with every acknowledged record');
}

$c->teardown;
felix_done_testing();
