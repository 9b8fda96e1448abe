# Two servers given the same felix.node_name (issue 18, part 3), and what
# the views say while a node cannot reach the control plane (part 4).
#
# Part 1.  A node is its felix data directory (its incarnation), not its
# name.  node1 and node2 run a stream whose shard node2 leads.  A third
# server, "twin", is started as node2 too.  Before the fix the control
# plane took each server's heartbeat in turn as "a new felix data
# directory" of node2: each voided the other's copies, and leadership went
# elsewhere.  Now the twin's heartbeats are refused with 42710 naming both
# servers, as long as the real node2 is alive:
#   - the twin's log says the name is in use by the server at node2's
#     address, and its felix_nodes row for itself says refused, and why;
#   - node2 logs that another server tried to register as node2, and
#     felix_nodes on node1 and node2 shows the attempt on node2's row;
#   - node1 never logs "has a new felix data directory", node2 keeps its
#     incarnation, and the shard keeps its leader and generation.
# The twin is then stopped; node2 goes on.  While node2 cannot log in to
# node1, felix_replication on node2 shows node1 unreachable, not shipping.
#
# Part 2.  With the control plane stopped (the embedded store's host, or
# every etcd member), node2 can renew nothing.  Before, felix_nodes showed
# every node alive and well and felix_shards showed node2 leading; now,
# after a lease, node2's own row says "cut off" (not alive) with the time
# since and the error, the other rows say "unknown", and the shard it
# leads says its lease lapsed.  When the control plane returns, all of it
# clears.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c  = FelixCluster->new(nodes => 2);
my $n1 = $c->node(1);
my $n2 = $c->node(2);

my ($stream) = $c->pick_stream_name('clash', 2, sub { $_[0] eq 'node2' });
$c->create_stream(1, $stream, replication_factor => 2, consistency => 'quorum');
my ($leader, $gen) = $c->wait_leader($stream, 0);
is($leader->{felix_name}, 'node2', 'node2 leads the shard');
my $inc2 = $n2->safe_psql('postgres', 'SELECT incarnation FROM felix.node_identity()');

# ---------------------------------------------------------------------
# Part 1: a second server named node2
# ---------------------------------------------------------------------
# (a log file may hold an earlier run's lines, of the other store: read
# each from where this part began)
sub log_from
{
	my ($file, $off) = @_;
	return '' unless -e $file;
	my $all = slurp_file($file);
	return substr($all, $off // 0);
}
my $twin_log = "$PostgreSQL::Test::Utils::log_path/144_name_clash_twin.log";
my %off = (twin => (-s $twin_log) // 0, n1 => -s $n1->logfile, n2 => -s $n2->logfile);
my $twin = $c->extra_server('twin', 'node2', 2);
$twin_log = $twin->logfile;
ok( FelixCluster::poll(20,
		sub { log_from($twin_log, $off{twin}) =~ /node name "node2" is in use by another server, at "[^"]+"/ }),
	"the twin's heartbeats are refused: node2's name is in use");
like(log_from($twin_log, $off{twin}), qr/DETAIL:  The control plane knows node "node2" as felix data directory incarnation \Q$inc2\E, alive; this server, at "[^"]+", is incarnation [0-9a-f-]{36}\./,
	'... naming both servers and both incarnations');
my $row;
ok( FelixCluster::poll(10,
		sub {
			$row = $twin->safe_psql('postgres',
				"SELECT state || ': ' || coalesce(reason, '') FROM felix_nodes WHERE name = 'node2' AND NOT alive");
			$row =~ /^refused: .*in use by another server/;
		}),
	"the twin's felix_nodes says it is refused, and why")
  or diag($row, "\n", $twin->safe_psql('postgres', 'SELECT * FROM felix_nodes'));

ok( FelixCluster::poll(20,
		sub { log_from($n2->logfile, $off{n2}) =~ /another server, at "[^"]+", tried to register as node "node2"; the control plane refused it/ }),
	'node2 logs that another server tried to take its name');
for my $node ($n1, $n2)
{
	ok( FelixCluster::poll(10,
			sub { $node->safe_psql('postgres', "SELECT reason FROM felix_nodes WHERE name = 'node2'")
				  =~ /another server, at "[^"]+", felix data directory incarnation [0-9a-f-]{36}, was refused this node's name/ }),
		"felix_nodes on $node->{felix_name} shows the attempt on node2's row");
}

# a few seconds of both servers trying: nothing moves
sleep 3;
unlike(log_from($n1->logfile, $off{n1}), qr/node "node2" has a new felix data directory/,
	'the control plane never took the twin for node2');
is($n1->safe_psql('postgres', "SELECT count(*) || ':' || bool_and(alive) FROM felix_nodes WHERE name = 'node2'"),
	'1:true', 'node1 lists node2 once, alive');
my ($who, $g) = $c->leader_of($stream, 0, 1);
is("$who/$g", "node2/$gen", 'the shard keeps its leader and generation');
is($n2->safe_psql('postgres', "SELECT seq FROM felix_publish('$stream', '{}'::jsonb, shard => 0)"),
	'0', 'node2 still takes publishes');
$twin->stop('fast');

# ---------------------------------------------------------------------
# Part 1b: a follower its leader cannot log in to is not "shipping"
# ---------------------------------------------------------------------
$n1->safe_psql('postgres', 'ALTER ROLE felix_node_node2 NOLOGIN');
$n1->safe_psql('postgres',
	"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'felix_node_node2'");
ok( FelixCluster::poll(15,
		sub { ($row = $n2->safe_psql('postgres',
				"SELECT state || ': ' || coalesce(last_error, '') FROM felix_replication WHERE stream = '$stream' AND follower = 'node1'"))
			  =~ /^unreachable: .*not permitted to log in/s }),
	"felix_replication on node2 shows node1 unreachable while node2 cannot log in to it") or diag($row);
$n1->safe_psql('postgres', 'ALTER ROLE felix_node_node2 LOGIN');
$c->wait_shipping($n2, $stream, 0, 1);
pass('... and shipping once it can again');

# ---------------------------------------------------------------------
# Part 2: the control plane stopped
# ---------------------------------------------------------------------
my @members;
if ($c->store eq 'embedded')
{
	$c->stop_node(1);
}
else
{
	for my $k (1 .. 2) { $c->etcd->kill_member($k) }
}
ok( FelixCluster::poll(15,
		sub { ($row = $n2->safe_psql('postgres',
				"SELECT state || '/' || alive FROM felix_nodes WHERE name = 'node2'")) eq 'cut off/false' }),
	'node2 says it is cut off, not alive, once its lease has lapsed') or diag($row);
like($n2->safe_psql('postgres', "SELECT reason FROM felix_nodes WHERE name = 'node2'"),
	qr/has not taken a heartbeat of this node since .* its leases have lapsed/s,
	'... with the time since and what it cannot do');
is($n2->safe_psql('postgres', "SELECT state FROM felix_nodes WHERE name = 'node1'"),
	'unknown', "node1's row on node2 says what node2 knows of it: nothing current");
like($n2->safe_psql('postgres', "SELECT error FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
	qr/lease on the shard has lapsed/, "felix_shards says node2's lease lapsed");

if ($c->store eq 'embedded')
{
	$c->start_node(1);
}
else
{
	for my $k (1 .. 2) { $c->etcd->start_member($k) }
}
ok( FelixCluster::poll(30,
		sub { $n2->safe_psql('postgres',
				"SELECT string_agg(name || ':' || state, ',' ORDER BY name) FROM felix_nodes") eq 'node1:alive,node2:alive' }),
	'once the control plane is back, both nodes are alive again');
$c->wait_leader($stream, 0);
ok( FelixCluster::poll(10,
		sub { $c->try_psql(2, "SELECT count(*) FROM felix_shards WHERE error IS NOT NULL AND role = 'leader'") eq '0' }),
	'and no leader shows a lapsed lease');

$c->teardown;
felix_done_testing();
