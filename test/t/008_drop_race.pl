# A dropped stream stays dropped.  A drop tells the control plane first
# and commits its table's removal second, so the node agent can hold
# control-plane rows that still list a stream whose table is already gone
# here.  It must not create the stream again from such rows: streams are
# created and dropped back to back, from one session and from two, while
# the agent heartbeats every 10 ms, and afterwards no stream is left and the
# agent never created one (it only creates streams another node defined).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = felix_node('droprace', 'felix.heartbeat_interval = 10ms');
my $rounds = 40;

# One session: create then drop, each its own transaction.
$node->safe_psql('postgres', join("\n",
	map { "SELECT felix_create_stream('churn', shards => 64);\n"
		. "SELECT felix_drop_stream('churn');" } 1 .. $rounds));

# Two sessions: one creates, the other drops as soon as it can.
my $creator = $node->background_psql('postgres');
my $dropper = $node->background_psql('postgres');
for my $i (1 .. $rounds)
{
	$creator->query_safe("SELECT felix_create_stream('churn2', shards => 64)");
	$dropper->query_safe("SELECT felix_drop_stream('churn2')");
}
$creator->quit;
$dropper->quit;

# Give the agent many heartbeats to bring anything back.
usleep(500_000);
is($node->safe_psql('postgres',
		"SELECT count(*) FROM felix_streams WHERE stream IN ('churn', 'churn2')"),
	'0', 'no dropped stream came back');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM pg_class WHERE relname IN ('churn', 'churn2')"),
	'0', 'and no table of one');
my $log = slurp_file($node->logfile);
unlike($log, qr/felix heartbeat: created stream/,
	'the node agent never created a stream this node created itself');
like($node->safe_psql('postgres', "SELECT count(*) FROM felix_nodes WHERE alive"),
	qr/^1$/, 'the node kept heartbeating throughout');

# The name is free again and works.
$node->safe_psql('postgres', "SELECT felix_create_stream('churn')");
is($node->safe_psql('postgres', "SELECT felix_publish('churn', '{}'::jsonb)"),
	'(0,0)', 'a stream created under a dropped name starts empty');

$node->stop;
felix_done_testing();
