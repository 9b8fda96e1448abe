# The embedded control-plane store put back from an older copy (issue 20).
#
# A store restored from a backup holds an older state than the nodes have
# seen: shards whose generation has moved on, streams created since.
# Serving it would hand out generations and leases that were handed out
# already.  Each node remembers the store's id and the highest revision
# it has seen (in its felix data directory), and the control plane refuses
# a heartbeat from a node that saw a later revision of the same store.
#
# Three nodes, node1 hosting the store.  A copy of the store is taken;
# a second stream is created and the first one publishes.  Then the store
# is put back from the copy (its rows and its revision sequence, as a
# restore would):
#   - every node's heartbeat is refused (55F07), and felix_nodes says why
#     on each node's own row;
#   - nothing goes back: the stream created after the copy stays on every
#     node, and no shard gets a new generation;
#   - node2, restarted meanwhile, is refused as well: it remembers;
#   - the store's latest state is put back (as a synchronous standby would
#     have it): every node is served again and both streams take publishes.
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
my @names = map { $c->name_of($_) } 1 .. 3;
$c->wait_alive(\@names);

$c->create_stream(1, 'rs_a', replication_factor => 3, consistency => 'quorum');
my ($la, $ga) = $c->wait_leader('rs_a', 0);
$la->safe_psql('postgres', "SELECT felix_publish('rs_a', '{\"n\": 1}'::jsonb, shard => 0)");

$cp->safe_psql('postgres', q{
	CREATE TABLE public.store_copy AS SELECT * FROM felix.cp_store;
	CREATE TABLE public.store_copy_rev AS SELECT last_value FROM felix.cp_store_revision;
});
$c->create_stream(2, 'rs_b', replication_factor => 2, consistency => 'quorum');
my ($lb, $gb) = $c->wait_leader('rs_b', 0);
$la->safe_psql('postgres', "SELECT felix_publish('rs_a', '{\"n\": 2}'::jsonb, shard => 0)");
sleep 2;	# every node sees later revisions, and writes them down

# put the store back from the copy, keeping its latest state aside
$cp->safe_psql('postgres', q{
	BEGIN;
	LOCK felix.cp_store;
	CREATE TABLE public.store_latest AS SELECT * FROM felix.cp_store;
	CREATE TABLE public.store_latest_rev AS SELECT last_value FROM felix.cp_store_revision;
	DELETE FROM felix.cp_store;
	INSERT INTO felix.cp_store SELECT * FROM public.store_copy;
	SELECT pg_catalog.setval('felix.cp_store_revision', (SELECT last_value FROM public.store_copy_rev));
	COMMIT;
});
my %offset = map { $_ => -s $c->node($_)->logfile } 1 .. 3;

for my $k (1 .. 3)
{
	my $node = $c->node($k);
	my $nm = $names[$k - 1];
	my $seen = '';
	my $took = FelixCluster::poll(30, sub {
		$seen = $node->safe_psql('postgres',
			"SELECT coalesce(store_error, '') FROM felix_nodes WHERE name = '$nm'");
		return $seen =~ /older than what node "\Q$nm\E" has seen of it/;
	}, 0.2);
	ok(defined $took, "$nm: its heartbeat is refused, and felix_nodes says why")
	  or diag("store_error: $seen");
}
like(substr(slurp_file($cp->logfile), $offset{1}), qr/55F07|older than what node/,
	'the control-plane server logs the refusal');

# node2 restarts while refused: it still knows better
$c->stop_node(2);
$c->start_node(2);
my $off2 = -s $c->node(2)->logfile;
my $name2 = $names[1];
ok(defined FelixCluster::poll(30, sub {
	substr(slurp_file($c->node(2)->logfile), $off2) =~ /older than what node "\Q$name2\E" has seen/ }, 0.2),
	"$name2, restarted, is refused too: it remembered the revision it saw");

sleep 3;	# several leases: nothing the old state says may be acted on
for my $k (1 .. 3)
{
	is($c->node($k)->safe_psql('postgres', "SELECT count(*) FROM felix_streams WHERE stream = 'rs_b'"),
		'1', "$names[$k - 1] keeps stream rs_b, which the old store does not list");
}
unlike(substr(slurp_file($cp->logfile), $offset{1}), qr/leads generation/,
	'no shard was given a new generation from the old state');

# the latest state comes back
$cp->safe_psql('postgres', q{
	BEGIN;
	LOCK felix.cp_store;
	DELETE FROM felix.cp_store;
	INSERT INTO felix.cp_store SELECT * FROM public.store_latest;
	SELECT pg_catalog.setval('felix.cp_store_revision', (SELECT last_value FROM public.store_latest_rev));
	COMMIT;
});
$c->wait_alive(\@names, 60);
for my $s ([ 'rs_a', 3 ], [ 'rs_b', 1 ])
{
	my ($leader) = $c->wait_leader($s->[0], 0);
	my ($rc, $err) = psql_error($leader,
		"SELECT felix_publish('$s->[0]', '{\"n\": $s->[1]}'::jsonb, shard => 0)");
	is($rc, 0, "with the latest state back, $s->[0] takes a publish on $leader->{felix_name}")
	  or diag($err);
}
my ($last) = $c->wait_leader('rs_a', 0);
is($last->safe_psql('postgres', "SELECT count(*) FROM rs_a"), '3', 'rs_a holds every record');

$c->teardown;
felix_done_testing();
