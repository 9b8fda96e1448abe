# What a `leader`-consistency stream loses at a failover, exactly
# (docs/replication.md, "What leader consistency can lose at a failover").
#
# A leader stream's leader acknowledges what is durable on it; shipping
# follows.  Its ship worker is stopped (SIGSTOP: no shipment and no report
# leaves it, while its heartbeat keeps its lease), N records are published
# and acknowledged, the leader makes its mark durable, and every process of
# it is killed.  The control plane promotes a follower its last report
# called caught up (felix.node_expiry is raised so that report is recent
# enough for a leader stream; see control-plane.md):
#
# - the new leader holds every record from before the stop and none of the
#   N: exactly those are lost;
# - the next record published takes the first lost seq (seqs are reused);
# - the old leader, started again, differs from the new leader at or below
#   its durable mark: the new leader halts it `diverged` (felix_halted lists
#   it at that position), and it serves none of the lost records;
# - felix_rebuild makes it a copy of the new leader's log: the lost records
#   are gone from every node.
#
# Automatic rebuilds are off (felix.rebuild_max_concurrent = 0) so the halt
# stays visible.  The leader is not node1 (the control plane).
#
# tap-etcd: skip.  Its subject is what a leader-consistency stream loses
# at a failover, a rule of the data path; the control-plane store plays
# the same part in it as in the scripts that run on both stores
# (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3,
	conf => ['felix.rebuild_max_concurrent = 0', "felix.node_expiry = '3s'"]);

my ($stream, @set) = $c->pick_stream_name('lloss', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'leader',
	payload_type => 'text');
my ($old, $g) = $c->wait_leader($stream, 0);
my $oname = $old->{felix_name};
my @followers = grep { $_ != $old } $c->nodes;
note("stream $stream: leader $oname at generation $g");
$c->wait_shipping($old, $stream, 0, 2);

sub next_seq
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

# How many records with a 'lost-' payload $node serves.
sub lost_on
{
	my ($node) = @_;
	return scalar(grep { /\|lost-/ } split /\n/, $c->records($node, $stream, 0));
}

# 1. 100 records everywhere.
$old->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', 'kept-' || i, shard => 0)) FROM generate_series(1, 100) i");
ok(defined FelixCluster::poll(30, sub { !grep { next_seq($_) ne '100' } @followers }),
	'both followers hold the first 100 records');
# a report after they got them: the followers are caught up at the control plane
ok(defined FelixCluster::poll(10, sub {
	$c->state_query(
		"SELECT count(*) FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0 "
		  . "AND caught_up AND acked_end >= 100") eq '2' }, 0.05),
	'the control plane has a report calling both followers caught up at 100');

# 2. Stop the leader's ship worker; 20 more records are acknowledged.
my $ship_pid = $old->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'felix ship'");
like($ship_pid, qr/^\d+$/, "${oname}'s ship worker is pid $ship_pid");
kill 'STOP', $ship_pid;
my @lost = split /\n/, $old->safe_psql('postgres',
	"SELECT (felix_publish('$stream', 'lost-' || i, shard => 0)).seq FROM generate_series(1, 20) i");
is(join(',', @lost), join(',', 100 .. 119), "$oname acknowledged 20 records at seqs 100..119");
is(join(',', map { next_seq($_) } @followers), '100,100', 'no follower received them');
my $dir = shard_dir($old, $stream, 0);
ok(defined FelixCluster::poll(5, sub { (durable_mark($dir) // 0) >= 120 }, 0.02),
	"$oname made its mark durable past them (120)");

# 3. The leader dies.
$c->kill_node($old);
my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30);
my $nname = $new->{felix_name};
note("$nname leads at generation $g2");
ok($new != $old, "a follower ($nname) leads at generation $g2");
is(next_seq($new), '100', "$nname holds the 100 records from before the stop and none of the 20");
is(lost_on($new), 0, 'no lost record is on the new leader');
is($new->safe_psql('postgres', "SELECT (felix_publish('$stream', 'after', shard => 0)).seq"), '100',
	'the next record takes the first lost seq (100)');

# 4. The old leader comes back: halted diverged at or below its mark.
$c->start_node($old);
my $halt = '';
ok(defined FelixCluster::poll(30, sub {
	$halt = $new->safe_psql('postgres',
		"SELECT reason || ' ' || position FROM felix_halted WHERE stream = '$stream' AND shard = 0 AND node = '$oname'");
	$halt =~ /^diverged /;
}, 0.1), "$nname halts $oname diverged ($halt)");
like($halt, qr/^diverged 10\d$/, 'at the first lost seq, or the batch holding it');
is($old->safe_psql('postgres',
	"SELECT count(*) FROM \"$stream\" WHERE shard = 0 AND seq >= 100"), '0',
	"$oname serves nothing from the difference on");
is($old->safe_psql('postgres',
	"SELECT count(*) FROM \"$stream\" WHERE shard = 0 AND seq < 100"), '100',
	'... and every record below it');

# 5. Rebuilt: the lost records are gone everywhere.
$new->safe_psql('postgres', "SELECT felix_rebuild('$stream', 0, '$oname')");
my $want = $c->records($new, $stream, 0);
ok(defined FelixCluster::poll(60, sub { $c->records($old, $stream, 0) eq $want }, 0.2),
	"$oname ends with exactly ${nname}'s records") or $c->diag_shard($stream, 0);
for my $n ($c->nodes)
{
	is(lost_on($n), 0, "$n->{felix_name} serves no lost record");
}

$c->teardown;
felix_done_testing();
