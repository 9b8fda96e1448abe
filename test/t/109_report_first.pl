# Report before acknowledgement: a quorum publish is acknowledged only once
# the leader's report of which followers hold the record has landed at the
# control plane.  Here reports are made to fail (felix_replication loses
# EXECUTE on felix.cp_report) while heartbeats, and so the lease, go on:
# the followers store the record, yet the quorum mark does not move and the
# publish fails with 55F01 after felix.quorum_timeout.  Once reports land
# again, publishing is acknowledged and the held-back record becomes
# visible.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3);

my ($stream, @set) = $c->pick_stream_name('report_first', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
my @followers = grep { $_ != $leader } $c->nodes;

sub publish
{
	my ($i) = @_;
	return psql_error($leader,
		"SET felix.quorum_timeout = '2s';\n"
		  . "SELECT seq FROM felix_publish('$stream', '{\"i\": $i}'::jsonb, shard => 0)");
}

my ($rc, $err, $out) = publish(0);
is($rc, 0, 'with reports landing, a quorum publish is acknowledged');

$c->cp->safe_psql('postgres',
	'REVOKE EXECUTE ON FUNCTION felix.cp_report(text, jsonb) FROM felix_replication');
($rc, $err) = publish(1);
isnt($rc, 0, 'with reports refused, the quorum publish is not acknowledged');
like($err, qr/ERROR:\s+55F01:/, 'it fails with 55F01 (no quorum within felix.quorum_timeout)');
like($err, qr/durable on the leader/, 'and says the record is durable on the leader');

# Both followers hold the record (a majority stored it), but the mark held.
for my $f (@followers)
{
	my $held = FelixCluster::poll(10, sub {
		return $f->safe_psql('postgres',
			"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") eq '2';
	}, 0.1);
	ok(defined $held, "$f->{felix_name} stored the unacknowledged record");
}
is($leader->safe_psql('postgres',
		"SELECT hwm FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
	'0', 'the leader\'s high-water mark stayed at the last acknowledged record');
is($leader->safe_psql('postgres', "SELECT count(*) FROM $stream"),
	'1', 'readers on the leader see only the acknowledged record');

$c->cp->safe_psql('postgres',
	'GRANT EXECUTE ON FUNCTION felix.cp_report(text, jsonb) TO felix_replication');
($rc, $err, $out) = publish(2);
is($rc, 0, 'once reports land again, publishing is acknowledged');
is($leader->safe_psql('postgres', "SELECT string_agg(seq::text, ',' ORDER BY seq) FROM $stream"),
	'0,1,2', 'and the held-back record is visible with it');

$c->teardown;
done_testing();
