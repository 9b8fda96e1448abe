# felix_create_stream reports failure only when it did nothing (issue 20).
#
# Creating 870 shards under concurrent heartbeats, one felix_create_stream
# failed with "the heartbeat lost to other control-plane writers 32 times
# in a row", yet its stream existed: the retry said "stream already
# exists".  The call had registered the stream at the control plane and
# made its table; only its last step, a heartbeat of its own that takes
# the new shards' leases at once, failed, and the error then had to undo a
# registration whose undo can fail the same way.
#
# Here that last heartbeat is made to fail for certain: on the embedded
# store's host, a trigger on felix.cp_store refuses every write of node2's
# record (40001, as a lost compare-and-set would end) once the stream is
# registered -- the heartbeat that registers node2 before the stream is
# placed still lands.  Then:
#   - felix_create_stream on node2 succeeds, with a WARNING that says the
#     stream is created and its leases are not taken yet, and why;
#   - the stream is there on node2 at once, and the control plane lists it;
#   - once heartbeats are allowed again, every node has the stream and
#     every shard takes a publish on its leader.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c  = FelixCluster->new(nodes => 3, store => 'embedded');
my $cp = $c->cp;
my $n2 = $c->node(2);
$c->wait_alive([ map { $c->name_of($_) } 1 .. 3 ]);

my $name2 = $c->name_of(2);
$cp->safe_psql('postgres', qq{
CREATE FUNCTION public.store_busy() RETURNS trigger LANGUAGE plpgsql AS \$\$
BEGIN
	IF NEW.key = 'nodes/$name2' AND
	   EXISTS (SELECT 1 FROM felix.cp_store WHERE key = 'streams/busy_s') THEN
		RAISE EXCEPTION 'the store is busy (test)' USING ERRCODE = '40001';
	END IF;
	RETURN NEW;
END \$\$;
CREATE TRIGGER store_busy BEFORE INSERT OR UPDATE ON felix.cp_store
	FOR EACH ROW EXECUTE FUNCTION public.store_busy();
});

my ($rc, $err) = psql_error($n2,
	"SELECT felix_create_stream('busy_s', shards => 4, replication_factor => 2)");
$cp->safe_psql('postgres', 'DROP TRIGGER store_busy ON felix.cp_store');

is($rc, 0, 'felix_create_stream succeeds although its own heartbeat failed')
  or diag($err);
like($err, qr/WARNING:\s+(?:01000:\s+)?stream "busy_s" is created, but this node has not taken its leases yet/,
	'a WARNING says the stream is created and its leases are not taken yet');
like($err, qr/DETAIL:.*the store is busy \(test\)/s,
	'... and why the heartbeat failed');
is($n2->safe_psql('postgres', "SELECT count(*) FROM felix_streams WHERE stream = 'busy_s'"),
	'1', 'node2 has the stream as soon as the call returns');
is($cp->safe_psql('postgres',
		"SELECT count(*) FROM felix.store_read('streams/') WHERE key = 'streams/busy_s'"),
	'1', 'the control plane lists it');

$c->wait_stream('busy_s', 4);
for my $shard (0 .. 3)
{
	my ($leader) = $c->wait_leader('busy_s', $shard);
	my ($prc, $perr) = psql_error($leader,
		"SELECT felix_publish('busy_s', '{\"n\": $shard}'::jsonb, shard => $shard)");
	is($prc, 0, "shard $shard takes a publish on its leader, $leader->{felix_name}")
	  or diag($perr);
}

felix_done_testing();
