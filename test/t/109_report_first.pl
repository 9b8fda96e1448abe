# The control plane is never behind an acknowledgement: whenever a quorum
# publish is acknowledged, every follower the control plane takes for
# caught up holds the record.  Reports are made to fail (felix_replication
# loses EXECUTE on felix.cp_report; with etcd, the nodes' etcd user loses
# its write permission on the reports keys) while heartbeats, and so the
# lease, go on:
#
# - with both followers keeping up, the standing report (both caught up)
#   stays true of every new record, so publishes are still acknowledged,
#   and both followers do hold them;
# - with one follower stopped (SIGSTOP), the control plane would still take
#   it for caught up, so the next record may not be acknowledged before a
#   report saying otherwise lands: the other follower stores it, the mark
#   does not move, readers do not see it, and the publish fails with 55F01
#   after felix.quorum_timeout;
# - once reports land again the held-back record is acknowledged, and the
#   control plane then says the stopped follower is not caught up.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3, etcd_auth => 1);

# Led by node2 or node3; node1 (the control plane) is one follower.
my ($stream, @set) = $c->pick_stream_name('report_first', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
my @followers = grep { $_ != $leader } $c->nodes;
my ($stopped) = grep { $_->{felix_name} ne 'node1' } @followers;
my ($running) = grep { $_->{felix_name} eq 'node1' } @followers;

sub publish
{
	my ($i) = @_;
	return psql_error($leader,
		"SET felix.quorum_timeout = '2s';\n"
		  . "SELECT seq FROM felix_publish('$stream', '{\"i\": $i}'::jsonb, shard => 0)");
}

sub next_seq_on
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

sub cp_caught_up
{
	my ($node) = @_;
	return $c->state_query(
		"SELECT caught_up FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0 "
		  . "AND follower = '$node->{felix_name}'");
}

my ($rc, $err, $out) = publish(0);
is($rc, 0, 'with reports landing, a quorum publish is acknowledged');
ok(defined FelixCluster::poll(10, sub {
			cp_caught_up($stopped) eq 't' && cp_caught_up($running) eq 't' }),
	'the control plane holds a report naming both followers caught up');

$c->break_reports;

# Both followers keep up: what the control plane believes stays true.
($rc, $err) = publish(1);
is($rc, 0, 'reports refused, followers keeping up: the publish is still acknowledged');
is(next_seq_on($_), '2', "$_->{felix_name}, taken for caught up, holds the record")
  for @followers;
is(cp_caught_up($stopped) . cp_caught_up($running), 'tt',
	'the control plane still takes both followers for caught up');

# One follower stops: the standing report would now be false of a new record.
$c->pause_node($stopped);
($rc, $err) = publish(2);
isnt($rc, 0, 'a follower stopped, reports refused: the publish is not acknowledged');
like($err, qr/ERROR:\s+55F01:/, 'it fails with 55F01 (no quorum within felix.quorum_timeout)');
like($err, qr/durable on the leader/, 'and says the record is durable on the leader');
ok(defined FelixCluster::poll(10, sub { next_seq_on($running) eq '3' }),
	"$running->{felix_name} stored it: leader and one follower are a majority");
is(cp_caught_up($stopped), 't',
	"the control plane still takes the stopped $stopped->{felix_name} for caught up");
is($leader->safe_psql('postgres',
		"SELECT hwm FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
	'1', 'so the leader\'s high-water mark stayed at the last acknowledged record');
is($leader->safe_psql('postgres', "SELECT count(*) FROM $stream"),
	'2', 'and readers on the leader do not see the record');

$c->mend_reports;
($rc, $err, $out) = publish(3);
is($rc, 0, 'once reports land again, publishing is acknowledged (leader and one follower)');
is(cp_caught_up($stopped), 'f',
	'and by then the control plane no longer takes the stopped follower for caught up');
is($leader->safe_psql('postgres', "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM $stream"),
	'0,1,2,3', 'the held-back record is visible with it');

$c->resume_node($stopped);
ok(defined FelixCluster::poll(20, sub { next_seq_on($stopped) eq '4' }),
	"$stopped->{felix_name} catches up once it runs again");

$c->teardown;
felix_done_testing();
