# felix 1.0 -> 1.1 on a replicated cluster, one node at a time, while
# publishing.  Three nodes run the felix 1.0 release (FelixOld.pm), set up
# as 1.0 set nodes up (node1 hosts the embedded control plane; nodes log
# in as felix_replication), with a replication factor 3 quorum stream.
# Publishers run on every node that is up, throughout.  Each node in turn
# (node3, node2, then the control-plane host node1) is stopped, restarted
# on the felix under test with its conninfo settings in 1.1's form, and
# updated (ALTER EXTENSION felix UPDATE, then the node roles 1.1 logs in
# as).  A 1.0 node and a 1.1 node refuse each other's calls, so writes
# pause while a shard's quorum spans both; after the last node, the shard
# is led again and takes writes.  No acknowledged record is lost: every
# one is readable, at its seq, on every node, and the three copies end
# identical.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixCluster;
use FelixOld;
use FelixTest;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $old = felix_1_0_install();
my @nodes;
for my $k (1 .. 3)
{
	my $node = PostgreSQL::Test::Cluster->new("roll$k", install_path => $old);
	$node->init;
	$node->{felix_name} = "node$k";
	push @nodes, $node;
}
sub address { my ($n) = @_; return 'host=' . $n->host . ' port=' . $n->port . ' dbname=postgres'; }
for my $k (1 .. 3)
{
	my $node = $nodes[ $k - 1 ];
	$node->append_conf('postgresql.conf',
		join("\n", felix_base_conf(),
			"felix.node_name = 'node$k'",
			"felix.node_conninfo = '" . address($node) . " user=felix_replication'",
			"felix.control_conninfo = '" . ($k == 1 ? '' : address($nodes[0]) . ' user=felix_replication') . "'",
			'max_connections = 40', 'log_min_messages = info')
		  . "\n");
}
$_->start for @nodes;
$_->safe_psql('postgres', 'CREATE EXTENSION felix') for @nodes;
ok($nodes[0]->poll_query_until('postgres', 'SELECT count(*) = 3 FROM felix_nodes WHERE alive'),
	'three felix 1.0 nodes are alive');
$nodes[0]->safe_psql('postgres',
	"SELECT felix_create_stream('roll', replication_factor => 3, consistency => 'quorum')");

# The node that leads the shard (as its own felix_shards says), or undef.
sub leader_now
{
	for my $n (@nodes)
	{
		next unless $n->{up};
		my $r = $n->psql('postgres',
			"SELECT role FROM felix_shards WHERE stream = 'roll' AND shard = 0",
			stdout => \my $out, timeout => 5);
		return $n if defined $out && $out eq 'leader';
	}
	return undef;
}
$_->{up} = 1 for @nodes;
ok(defined FelixCluster::poll(30, sub { leader_now() }, 0.1), 'felix 1.0 leads the stream');

# Publishers: one psql session per node that is up, each publishing in a
# loop and logging every acknowledgement and every refusal.
my @pubs;
my $round = 0;
sub start_publishing
{
	$round++;
	for my $n (grep { $_->{up} } @nodes)
	{
		my $tag = "r${round}_$n->{felix_name}";
		my $file = "$PostgreSQL::Test::Utils::tmp_check/pub_$tag.txt";
		my $sql = FelixCluster::publisher_sql(stream => 'roll', shard => 0, w => 1, tag => $tag,
			count => 1000000, seconds => 120, catch => 1, err_sleep => 0.05, settings => '', pause => '');
		push @pubs, {
			tag => $tag, files => [$file],
			handles => [ IPC::Run::start(
				[ 'psql', '-X', '-q', '-v', 'VERBOSITY=verbose', '-h', $n->host, '-p', $n->port,
				  '-d', 'postgres', '-c', $sql ],
				'<', \undef, '>', '/dev/null', '2>', $file, IPC::Run::timeout(300)) ] };
	}
	return;
}
sub stop_publishing
{
	FelixCluster::stop_publishers(undef, $_, 0) for @pubs;
	return;
}
sub ack_total { my $t = 0; $t += scalar(my @a = FelixCluster::acks(undef, $_)) for @pubs; return $t; }

start_publishing();
ok(defined FelixCluster::poll(30, sub { ack_total() >= 200 }, 0.1), 'felix 1.0 acknowledges quorum publishes');

for my $k (3, 2, 1)
{
	my $node = $nodes[ $k - 1 ];
	my $before = ack_total();
	$node->stop('fast');
	$node->{up} = 0;
	use_install($node, system_install());
	$node->adjust_conf('postgresql.conf', 'felix.node_conninfo', "'" . address($node) . "'");
	$node->adjust_conf('postgresql.conf', 'felix.control_conninfo',
		"'" . ($k == 1 ? '' : address($nodes[0])) . "'");
	$node->start;
	$node->safe_psql('postgres', 'ALTER EXTENSION felix UPDATE');
	$node->safe_psql('postgres', "SELECT felix_create_node_role('node$_')") for 1 .. 3;
	$node->{up} = 1;
	is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'felix'"), '1.1',
		"node$k runs felix 1.1");
	# its own publisher session ended with the restart: start one again
	stop_publishing();
	start_publishing();
	# a while with the cluster in this mixed state, under load
	my $mixed = ack_total();
	FelixCluster::poll(3, sub { 0 }, 0.5);
	note(sprintf('node%d updated; %d acknowledgements so far (%d before it stopped, %d in 3 s since)',
		$k, ack_total(), $before, ack_total() - $mixed));
	ok(ack_total() > $mixed, 'with one node on 1.1, the two 1.0 nodes still acknowledge quorum publishes')
	  if $k == 3 && leader_now() != $node;
}

# Every node runs 1.1: the shard is led again and takes writes.
my $acks_then = ack_total();
ok(defined FelixCluster::poll(60, sub { ack_total() >= $acks_then + 200 }, 0.2),
	'after the last node, quorum publishes are acknowledged again')
  or diag('leader: ' . ((leader_now() // {})->{felix_name} // 'none'));
stop_publishing();

# No acknowledged record is lost, and the copies converge.
my %acked;
for my $p (@pubs)
{
	$acked{ $_->{seq} } = $_->{payload} for FelixCluster::acks(undef, $p);
}
my $leader = leader_now();
ok(defined $leader, 'a node leads the stream');
my $want = $leader->safe_psql('postgres', q{SELECT seq || '|' || payload::text FROM roll WHERE shard = 0 ORDER BY seq});
for my $n (@nodes)
{
	ok(defined FelixCluster::poll(60, sub {
		$n->safe_psql('postgres', q{SELECT seq || '|' || payload::text FROM roll WHERE shard = 0 ORDER BY seq}) eq $want }, 0.2),
		"$n->{felix_name} serves the leader's records");
	my %have = map { my ($s, $p) = split /\|/, $_, 2; ($s => $p) } split /\n/,
	  $n->safe_psql('postgres', q{SELECT seq || '|' || payload::text FROM roll WHERE shard = 0 ORDER BY seq});
	my @lost = grep { ($have{$_} // '') ne $acked{$_} } sort { $a <=> $b } keys %acked;
	is(scalar(@lost), 0, "$n->{felix_name}: every one of " . scalar(keys %acked) . ' acknowledged records is there, at its seq')
	  or diag("missing @lost[0 .. ($#lost < 9 ? $#lost : 9)]");
}

# A call between versions is refused, never misread: no server crashed
# (the 1.0 felix.replicate declaration, bound to the 1.1 library in the
# moments before each node's update, is refused before its arguments are
# read).
for my $n (@nodes)
{
	unlike(slurp_file($n->logfile), qr/terminated by signal|was terminated/,
		"no process of $n->{felix_name} crashed");
}

$_->stop('immediate') for @nodes;
felix_done_testing();
