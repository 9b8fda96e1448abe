# Joining a cluster, as the README says: three PostgreSQL servers (here on
# 127.0.0.1, ports of their own) and three etcd members, set up only with
# the README's steps -- scripts/felix-node-config for each node's settings,
# the pg_hba.conf line it prints, CREATE EXTENSION, one credentials file
# and scripts/felix-node-credentials on every server.  Every node is then
# alive and reachable, one runs the duties, and a quorum stream replicated
# three times takes a publish.  Then what a new user gets wrong: one
# server's copy of node1's password differs.  node1 cannot log in to it,
# and felix_nodes shows that server unreachable, with the reason naming
# the password (not alive and well); the server logs name it too.  The
# credentials script run again mends it.  No server log holds a password.
# The README's SQL, read from README.md, runs on that cluster.
# Run before CREATE EXTENSION, the credentials script says to create the
# extension first.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixEtcd;
use FelixCluster;

use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $scripts = "$FindBin::RealBin/../../scripts";
my $etcd = FelixEtcd->new(members => 3);
my $dir = PostgreSQL::Test::Utils::tempdir('join');

# The cluster's credentials file: one name:password line per node.
my %pw = map { ("node$_" => "join-pw-$_-" . int(rand(1e9))) } 1 .. 3;
my $creds = "$dir/cluster-credentials";
write_file($creds, join('', map { "$_:$pw{$_}\n" } sort keys %pw));
chmod 0600, $creds or die "chmod: $!";

sub run_script
{
	my (@cmd) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(\@cmd, '>', \$out, '2>', \$err);
	return ($ok, $out, $err);
}

my @nodes;
for my $k (1 .. 3)
{
	my $node = PostgreSQL::Test::Cluster->new("join$k");
	FelixCluster::init_node($node);
	# 1. the node's settings, as felix-node-config prints them
	my ($ok, $conf, $err) = run_script("$scripts/felix-node-config", '--node', "node$k",
		'--host', '127.0.0.1', '--port', $node->port, '--passfile', "$dir/pgpass_node$k",
		'--etcd', $etcd->endpoints);
	ok($ok, "felix-node-config prints node${k}'s settings") or diag($err);
	$node->append_conf('postgresql.conf',
		$conf . "listen_addresses = '127.0.0.1'\nlc_messages = 'C'\nlog_min_messages = info\n");
	# and the pg_hba.conf line it names, above the others
	my ($line) = $conf =~ /^#\s+(host\s+postgres\s+\+felix_replication\s.*)$/m;
	ok(defined $line, 'it names the pg_hba.conf line');
	$line =~ s/<the nodes' network>/127.0.0.1\/32/;
	my $hba = read_file($node->data_dir . '/pg_hba.conf');
	write_file($node->data_dir . '/pg_hba.conf', "$line\n$hba");
	$node->start;
	$node->{felix_name} = "node$k";
	push @nodes, $node;
}

# The newcomer's slip: the credentials before the extension.  The script
# says what to do instead of passing on psql's "function does not exist".
{
	my ($ok, $out, $err) = run_script("$scripts/felix-node-credentials", '-h', $nodes[0]->host,
		'-p', $nodes[0]->port, 'node1', $creds, "$dir/pgpass_node1");
	ok(!$ok, 'felix-node-credentials before CREATE EXTENSION fails');
	like($err, qr/felix is not installed in database postgres here: run CREATE EXTENSION felix there first/,
		'... saying to create the extension first');
	unlike($err, qr/does not exist/, '... not with a missing function');
}

# 2. the extension, 3. the credentials, on every server.
for my $node (@nodes)
{
	$node->safe_psql('postgres', 'CREATE EXTENSION felix');
	my ($ok, $out, $err) = run_script("$scripts/felix-node-credentials", '-h', $node->host,
		'-p', $node->port, $node->{felix_name}, $creds, "$dir/pgpass_$node->{felix_name}");
	ok($ok, "felix-node-credentials on $node->{felix_name}") or diag($err);
	like($out, qr/3 node roles have their passwords/, 'it sets the three roles\' passwords');
}
is(sprintf('%o', (stat "$dir/pgpass_node1")[2] & 07777), '600', 'the password file is mode 0600');

# 4. check.
my $seen = '';
ok(defined FelixCluster::poll(60, sub {
	$seen = $nodes[2]->safe_psql('postgres',
		"SELECT string_agg(name || ' ' || alive || ' ' || state, ', ' ORDER BY name) FROM felix_nodes");
	$seen eq 'node1 true alive, node2 true alive, node3 true alive' }, 0.2),
	'every node is alive and reachable') or diag("felix_nodes: $seen");
is($nodes[0]->safe_psql('postgres', 'SELECT count(*) FROM felix_nodes WHERE duty'), '1',
	'one node runs the control-plane duties');
like($nodes[0]->safe_psql('postgres', "SELECT store FROM felix_nodes WHERE name = 'node1'"),
	qr/^etcd http:\/\/127\.0\.0\.1:\d+/, 'node1 says its store is etcd and which endpoint answers');

$nodes[0]->safe_psql('postgres',
	"SELECT felix_create_stream('joined', shards => 1, replication_factor => 3, consistency => 'quorum')");
my $leader;
ok(defined FelixCluster::poll(30, sub {
	for my $n (@nodes)
	{
		my $r = $n->safe_psql('postgres',
			"SELECT role || ' ' || coalesce(lease_remaining_ms, 0) FROM felix_shards WHERE stream = 'joined'");
		if ($r =~ /^leader (\d+)/ && $1 > 0) { $leader = $n; return 1; }
	}
	0 }, 0.1), 'the stream has a leader');
my $pos = $leader->safe_psql('postgres',
	"SET felix.quorum_timeout = '20s'; SELECT seq FROM felix_publish('joined', '{\"joined\": true}'::jsonb)");
is($pos, '0', 'a quorum publish is acknowledged (a majority of three holds it)');
ok(defined FelixCluster::poll(30, sub {
	!grep { $_->safe_psql('postgres', "SELECT count(*) FROM felix_shards WHERE stream = 'joined' AND next_seq = 1") ne '1' } @nodes }, 0.2),
	'all three replicas hold it');

# The README's own SQL, read from README.md, on node3: the quick tour
# (every statement must succeed, and the publish it shows must answer
# what it shows), the cluster's check and stream, and the operators'
# calls, which must at least name functions that exist and take those
# arguments (they name nodes and states for illustration).
{
	my $readme = read_file("$FindBin::RealBin/../../README.md");
	my @blocks = $readme =~ /^```sql\n(.*?)^```/msg;
	ok(@blocks >= 4, 'README.md has its SQL blocks: ' . scalar(@blocks));
	my ($tour, $check, $stream, $ops) = @blocks;
	# the tour begins with CREATE EXTENSION, which step 2 ran already
	like($tour, qr/^CREATE EXTENSION felix;/, 'the tour begins by creating the extension');
	$tour =~ s/^CREATE EXTENSION felix;.*$//m;
	my ($shown) = $tour =~ /key => 'cust-7'\);\n--\s+shard \| seq\n-- -+\+-+\n--\s+(\d+ \|\s+\d+)/;
	ok(defined $shown, 'the tour shows what its publish answers');
	my $file = "$dir/readme_tour.sql";
	write_file($file, $tour);
	my ($out, $err) = ('', '');
	my $rc = $nodes[2]->psql('postgres', undef, extra_params => [ '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose', '-f', $file ],
		stdout => \$out, stderr => \$err, timeout => 120);
	is($rc, 0, "the README's quick tour runs on node3, a node of the cluster") or diag($err);
	($shown // '') =~ /(\d+) \|\s+(\d+)/;
	like($out, qr/^$1\|$2$/m, "its keyed publish answers shard $1, seq $2, as the README shows");

	for my $block ([ 'check', $check ], [ 'stream', $stream ])
	{
		write_file("$dir/readme_$block->[0].sql", $block->[1]);
		$rc = $nodes[2]->psql('postgres', undef, extra_params => [ '-v', 'ON_ERROR_STOP=1', '-f', "$dir/readme_$block->[0].sql" ],
			stdout => \$out, stderr => \$err, timeout => 60);
		is($rc, 0, "the README's cluster $block->[0] block runs") or diag($err);
	}
	like($stream, qr/felix_create_stream\('orders'/, 'the README creates stream orders in the cluster');
	# the tour dropped its orders on node3 and the cluster block made
	# another: every node drops its old one and creates the new one
	my $id = $nodes[2]->safe_psql('postgres', "SELECT creation_id FROM felix.streams WHERE name = 'orders'");
	ok(defined FelixCluster::poll(30, sub {
		!grep { $_->safe_psql('postgres', "SELECT creation_id FROM felix.streams WHERE name = 'orders'") ne $id } @nodes }, 0.2),
		'every node replaced its table of the dropped orders with the new stream');
	ok(defined FelixCluster::poll(30, sub {
		$nodes[0]->safe_psql('postgres',
			"SELECT count(*) FROM felix_shards WHERE stream = 'orders' AND leader IS NOT NULL") == 4 }, 0.2),
		"the README's stream has a leader for each of its shards");
	# the tour's INSERT, on every node: any node commits
	for my $node (@nodes)
	{
		my ($insert) = $readme =~ /^(INSERT INTO orders .*;)$/m;
		$rc = $node->psql('postgres', $insert, stderr => \$err, timeout => 60);
		is($rc, 0, "the README's INSERT commits on $node->{felix_name}") or diag($err);
	}
	for my $stmt (grep { /\S/ } map { s/--.*$//mgr } split /;\s*(?:--[^\n]*)?\n/, $ops)
	{
		$rc = $nodes[2]->psql('postgres', $stmt, stderr => \$err, timeout => 60,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		my ($state) = $err =~ /ERROR:\s+(\w{5}):/;
		ok($rc == 0 || ($state && $state !~ /^(42601|42883|42P01|42703|42725)$/),
			"README: $stmt -- " . ($rc == 0 ? 'ran' : "refused with $state")) or diag($err);
	}
}

# What a new user gets wrong: node2's server has another password for node1.
my $off1 = -s $nodes[0]->logfile;
$nodes[1]->safe_psql('postgres',
	"SET log_statement = 'none'; ALTER ROLE felix_node_node1 PASSWORD 'not-the-one-node1-has'");
my $why = '';
ok(defined FelixCluster::poll(30, sub {
	$why = $nodes[2]->safe_psql('postgres',
		"SELECT state || ': ' || coalesce(reason, '') FROM felix_nodes WHERE name = 'node2'");
	$why =~ /^unreachable: .*node1: .*password authentication failed for user "felix_node_node1"/ }, 0.2),
	'felix_nodes shows node2 unreachable: node1 cannot log in to it, and says why')
  or diag("node2 in felix_nodes: $why");
note("node2 in felix_nodes: $why");
ok(defined FelixCluster::poll(30, sub {
	my $log = substr(read_file($nodes[0]->logfile), $off1);
	$log =~ /cannot log in to node "node2": .*password authentication failed for user "felix_node_node1"/
	  && $log =~ /HINT:\s+The server refused the password/ }, 0.2),
	"node1's log names the refused password and what to do");

# Mend it the documented way.
my ($ok2, $out2, $err2) = run_script("$scripts/felix-node-credentials", '-h', $nodes[1]->host,
	'-p', $nodes[1]->port, 'node2', $creds, "$dir/pgpass_node2");
ok($ok2, 'felix-node-credentials again on node2') or diag($err2);
ok(defined FelixCluster::poll(30, sub {
	$nodes[2]->safe_psql('postgres', "SELECT state FROM felix_nodes WHERE name = 'node2'") eq 'alive' }, 0.2),
	'node2 is reachable again');

# No password reached a server log.
my @hits;
for my $log (glob("$PostgreSQL::Test::Utils::log_path/*join*.log"))
{
	next if $log =~ m{/regress_log_};
	my $text = read_file($log);
	push @hits, "$log: $_" for grep { index($text, $pw{$_}) >= 0 } sort keys %pw;
}
ok(!@hits, 'no server log holds a node password') or diag(join("\n", @hits));

$_->stop('immediate') for @nodes;
$etcd->stop_all;
done_testing();
