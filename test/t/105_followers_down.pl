# Followers down, replication factor 3, quorum acknowledgement.
#
# One follower stopped: quorum publishes are still acknowledged (leader +
# the other follower make two of three), and the replication lag --
# felix_metrics replication_lag_records and felix_replication's lag for
# the stopped follower -- grows with every record.
#
# Both followers stopped: a quorum publish fails with SQLSTATE 55F01 once
# felix.quorum_timeout (2 s here) has passed, saying its records are
# durable on the leader; quorum_timeouts counts it.  A follower back
# makes quorum publishes acknowledged again.
#
# The leader is node1, which hosts the control plane: stopping both
# followers must leave the control plane (and so the leader's lease) up.
#
# tap-etcd: skip.  Its subject is quorum acknowledgement with followers
# down; the control-plane store plays the same part in it as in the
# scripts that run on both stores (FELIX_STORE=etcd runs it on etcd by
# hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $c = FelixCluster->new(nodes => 3, conf => ["felix.quorum_timeout = 2000"]);
my ($stream, @set) = $c->pick_stream_name('fdown', 3, sub { $_[0] eq 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
is($leader->{felix_name}, 'node1', 'node1 leads the shard');
my ($f1, $f2) = map { $c->node($_) } @set[ 1, 2 ];
note("followers $set[1] and $set[2]");

sub publish_n
{
	my ($n, $tag) = @_;
	my $t0 = time;
	my ($rc, $err, $out) = psql_error($leader,
		"SELECT count(*) FROM generate_series(1, $n) i, "
		  . "LATERAL felix_publish('$stream', jsonb_build_object('tag', '$tag', 'i', i), shard => 0) p");
	return ($rc, $err, $out, time - $t0);
}

sub lag_of
{
	my ($follower) = @_;
	return $leader->safe_psql('postgres',
		"SELECT lag_records FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$follower'");
}

my ($rc, $err, $out, $secs) = publish_n(20, 'all up');
is($rc, 0, '20 quorum publishes with every node up') or diag($err);
FelixCluster::poll(10, sub { lag_of($set[1]) eq '0' && lag_of($set[2]) eq '0' }, 0.1);
my $lag0 = $c->metric_of($leader, 'replication_lag_records');
is($lag0, 0, 'replication_lag_records is 0 with both followers caught up');

# One follower down.
$c->stop_node($f2);
($rc, $err, $out, $secs) = publish_n(50, 'one down');
is($rc, 0, "50 quorum publishes acknowledged with $set[2] down") or diag($err);
note(sprintf('50 quorum publishes with one follower down took %.2f s', $secs));
my $lag1 = $c->metric_of($leader, 'replication_lag_records');
my $flag1 = lag_of($set[2]);
note('replication_lag_records ' . ($lag1 // 'missing') . ", felix_replication lag of $set[2] $flag1");
cmp_ok($lag1 // -1, '>=', 50, 'replication_lag_records counts at least the 50 records the stopped follower lacks');
cmp_ok($flag1 || 0, '>=', 50, "felix_replication shows $set[2] at least 50 records behind");

($rc, $err, $out, $secs) = publish_n(30, 'one down 2');
is($rc, 0, '30 more quorum publishes acknowledged') or diag($err);
my $lag2 = $c->metric_of($leader, 'replication_lag_records');
note('replication_lag_records after 30 more: ' . ($lag2 // 'missing'));
is(($lag2 // 0) - ($lag1 // 0), 30, 'replication_lag_records grew by the 30 records');
is(lag_of($set[1]), '0', "$set[1] (up) is not behind");

# Both followers down: the quorum wait runs out.
$c->stop_node($f1);
my $before_timeouts = $c->metric_of($leader, 'quorum_timeouts') // 0;
my $next_before = $c->shard_row($leader, $stream, 0)->{next_seq};
($rc, $err, $out, $secs) = publish_n(1, 'both down');
isnt($rc, 0, 'a quorum publish with both followers down fails');
like($err, qr/ERROR:\s+55F01:/, 'with SQLSTATE 55F01');
like($err, qr/durable on the leader/, 'the error says the record is durable on the leader');
note(sprintf('the quorum publish failed after %.2f s: %s', $secs, $err =~ /(ERROR:.*)/ ? $1 : $err));
cmp_ok($secs, '>=', 1.9, 'it waited felix.quorum_timeout (2 s)');
cmp_ok($secs, '<=', 5, 'and not much longer');
is(($c->metric_of($leader, 'quorum_timeouts') // 0) - $before_timeouts, 1, 'quorum_timeouts counted it');
my $row = $c->shard_row($leader, $stream, 0);
is($row->{next_seq}, $next_before + 1, 'the record is stored on the leader');
is($row->{hwm}, $next_before - 1, 'but not below the high-water mark');

# One follower back: the pending record reaches a majority, publishing works.
$c->start_node($f1);
my $t0 = time;
my $back = FelixCluster::poll(30, sub {
	my ($rc2) = publish_n(1, 'back');
	return $rc2 == 0;
}, 0.2);
ok(defined $back, "quorum publishes are acknowledged again once $set[1] is back");
note(sprintf('first quorum acknowledgement %.2f s after starting %s', time - $t0, $set[1])) if defined $back;
$row = $c->shard_row($leader, $stream, 0);
is($row->{hwm}, $row->{next_seq} - 1, 'the high-water mark covers every record, the timed-out one included');

$c->teardown;
felix_done_testing();
