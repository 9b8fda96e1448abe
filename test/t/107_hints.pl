# Clients and privileges.
#
# - A publish on a node that does not lead the shard fails with 55F02 and
#   the hint names the leader and its conninfo -- on each follower, and on
#   the node that created the stream right after felix_create_stream
#   returned (it must not take writes for a shard another node leads).
# - felix's internal functions (felix.replicate, felix.cp_*, ...) and the
#   control-plane tables are refused (42501) to an ordinary role, and a
#   node's role may call the cp_* entry points.
#
# tap-etcd: skip.  Its subject is the errors, hints and privileges of
# felix's SQL functions; the control-plane store plays the same part in
# it as in the scripts that run on both stores (FELIX_STORE=etcd runs it
# on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3);

# Created through node1, led by another node.
my ($stream, @set) = $c->pick_stream_name('hints', 3, sub { $_[0] ne 'node1' });
my $lnode = $c->node($set[0]);
$c->cp->safe_psql('postgres',
	"SELECT felix_create_stream('$stream', replication_factor => 3, consistency => 'quorum')");
my ($rc, $err) = psql_error($c->cp,
	"SELECT felix_publish('$stream', '{\"early\": 1}'::jsonb, shard => 0)");
isnt($rc, 0, "node1 refuses a publish right after creating a stream that $set[0] leads");
like($err, qr/ERROR:\s+55F0[23]:/, 'with 55F02 (or 55F03)');

$c->wait_stream($stream, 1);
my ($leader, $g) = $c->wait_leader($stream, 0);
is($leader->{felix_name}, $set[0], "$set[0] leads");
my $conninfo = $c->conninfo($leader);
for my $f (grep { $_ != $leader } $c->nodes)
{
	my $fname = $f->{felix_name};
	my ($rc2, $err2) = psql_error($f,
		"SELECT felix_publish('$stream', '{\"x\": 1}'::jsonb, shard => 0)");
	isnt($rc2, 0, "publishing on follower $fname fails");
	like($err2, qr/ERROR:\s+55F02:/, "$fname: SQLSTATE 55F02");
	like($err2, qr/ERROR:.*\Q$stream\E/, "$fname: the message names the stream");
	my ($hint) = $err2 =~ /HINT:\s+(.*)/;
	$hint //= '';
	note("$fname hint: $hint");
	like($hint, qr/\b\Q$set[0]\E\b/, "$fname: the hint names the leader $set[0]");
	# The conninfo's keywords in any order (the node may normalise it).
	my %want = map { split /=/, $_, 2 } split / /, $conninfo;
	my ($given) = $hint =~ /\(([^()]*=[^()]*)\)/;
	my %got = map { split /=/, $_, 2 } split / /, $given // '';
	is(join(' ', map { "$_=" . ($got{$_} // '') } sort keys %want),
		join(' ', map { "$_=$want{$_}" } sort keys %want),
		"$fname: the hint gives the leader's conninfo");

	# Batch and INSERT paths say the same.
	my ($rc3, $err3) = psql_error($f,
		"INSERT INTO \"$stream\" (shard, payload) VALUES (0, '{\"y\": 1}')");
	like($err3, qr/ERROR:\s+55F02:/, "$fname: INSERT is refused with 55F02 too");
	like($err3, qr/HINT:.*\Q$set[0]\E/, "$fname: and its hint names the leader");
}
my $ok = $leader->safe_psql('postgres',
	"SELECT (felix_publish('$stream', '{\"x\": 1}'::jsonb, shard => 0)).seq");
like($ok, qr/^\d+$/, 'the leader takes the publish');

# Privileges, on every node (node1's control-plane functions matter most).
for my $node ($c->nodes)
{
	my $name = $node->{felix_name};
	$node->safe_psql('postgres', 'CREATE ROLE mallory LOGIN');
	my @calls = (
		"felix.replicate('$stream', 0, 99, 'x', 'x', 'ship', 0, 0, ''::bytea)",
		"felix.cp_heartbeat('mallory', 'host=/nowhere', '00000000-0000-4000-8000-000000000000', 1, '00000000-0000-4000-8000-000000000000')",
		"felix.cp_halted()",
		"felix.node_identity()",
		"felix_rebuild('$stream', 0, 'x')",
		"felix.cp_tick('mallory', '00000000-0000-4000-8000-000000000000')",
		"felix.cp_remove_node('node1')",
		"felix.store_read('')",
		"felix.cp_report('$set[0]', '[]'::jsonb)",
		"felix.cp_create_stream('evil', 1, 1, 'leader', 'jsonb', 'local', NULL, NULL)",
		"felix.cp_drop_stream('$stream', '00000000-0000-0000-0000-000000000000')",
		"felix.cp_nodes()",
		"felix.truncate_after('$stream', 0, 0)",
	);
	for my $call (@calls)
	{
		my ($out, $e) = ('', '');
		$node->psql('postgres', "\\set VERBOSITY verbose\nSELECT * FROM $call",
			stdout => \$out, stderr => \$e,
			extra_params => [ '-U', 'mallory' ]);
		(my $fn = $call) =~ s/\(.*//;
		like($e, qr/ERROR:\s+42501:/, "$name: $fn is refused to an ordinary role (42501)");
	}
	for my $table (qw(felix.assignments felix.nodes felix.replica_reports felix.cluster_streams))
	{
		my ($out, $e) = ('', '');
		$node->psql('postgres', "\\set VERBOSITY verbose\nSELECT count(*) FROM $table",
			stdout => \$out, stderr => \$e, extra_params => [ '-U', 'mallory' ]);
		like($e, qr/ERROR:\s+42501:/, "$name: $table is not readable by an ordinary role");
	}
}

if ($c->store eq 'embedded')
{
	# A node's role may call the entry points (here: cp_nodes on node1).
	my $n = $c->cp->safe_psql('postgres', 'SELECT count(*) FROM felix.cp_nodes()',
		extra_params => [ '-U', 'felix_node_node2' ]);
	is($n, 3, "node2's role may call felix.cp_nodes()");
}
else
{
	# With etcd no server holds control-plane state: the entry points say so.
	my ($rc, $err) = psql_error($c->cp, 'SELECT count(*) FROM felix.cp_nodes()');
	like($err, qr/ERROR:\s+55000:.*control plane is in etcd/,
		'with etcd, felix.cp_nodes() says the control plane is in etcd');
}
# Nothing of mallory's attempts changed the control plane.
is($c->state_query(
	"SELECT count(*) FROM felix.cluster_streams WHERE name IN ('evil', '$stream')"),
	1, 'the control plane has the stream and no "evil" one');
is($c->state_query("SELECT count(*) FROM felix.nodes WHERE name = 'mallory'"),
	0, 'no node "mallory" was registered');

$c->teardown;
felix_done_testing();
