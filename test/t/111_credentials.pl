# Nodes log in with passwords (scram-sha-256), and no secret shows.
#
# - Every node's role (felix_node_<name>) gets a password, every server's
#   pg_hba.conf asks felix's roles for scram-sha-256, and each node's
#   felix.node_conninfo names the password file holding its password.
#   After a restart the cluster forms and replicates: each node logs in to
#   the control plane and to its peers as itself, with its own password
#   (which it never sends anywhere but in the scram exchange).
# - The password shows nowhere: not in SHOW or pg_settings, not in
#   felix_nodes or the control plane's tables, not in any server log
#   (felix_done_testing greps them all).
# - A node whose password is wrong fails to heartbeat, and its log says
#   authentication failed, without the password.
# - A password written into felix.node_conninfo, or credentials in
#   felix.control_conninfo, are refused at start with a message naming the
#   setting and the keyword, not the value.
#
# tap-etcd: skip.  Its subject is how nodes log in to each other; the
# control-plane store plays the same part in it as in the scripts that
# run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3);
my @names = map { $_->{felix_name} } $c->nodes;
my $secret = FELIX_TEST_SECRET;

# Passwords: set with statement logging off, so the test's own ALTER ROLE
# does not put them in the log.
{
	local $ENV{PGOPTIONS} = '-c log_statement=none';
	for my $node ($c->nodes)
	{
		$node->safe_psql('postgres',
			join('', map { "ALTER ROLE felix_node_$_ PASSWORD '$secret-$_';" } @names));
	}
}
for my $node ($c->nodes)
{
	my $hba = $node->data_dir . '/pg_hba.conf';
	my $rest = read_file($hba);
	write_file($hba, "local all +felix_replication scram-sha-256\n"
		  . "host all +felix_replication 127.0.0.1/32 scram-sha-256\n" . $rest);
}
$c->stop_node($_) for reverse 1 .. 3;
$c->start_node($_) for 1 .. 3;
$c->wait_alive(\@names, 60);
pass('after a restart with scram-sha-256 for felix roles, every node is alive');

# A node's role cannot log in without its password any more.
{
	my ($out, $err) = ('', '');
	$c->cp->psql('postgres', 'SELECT 1', stdout => \$out, stderr => \$err,
		extra_params => [ '-U', 'felix_node_node2', '-w' ]);
	like($err, qr/password/, 'felix_node_node2 needs its password to log in');
}

# Replication works with password logins.
my ($stream, @set) = $c->pick_stream_name('creds', 3, sub { 1 });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
my $seq = $leader->safe_psql('postgres',
	"SELECT (felix_publish('$stream', '{\"n\": 1}'::jsonb, shard => 0)).seq");
is($seq, '0', 'a quorum publish is acknowledged: the followers stored it (peers logged in)');

# No secret anywhere a setting or a view shows.
for my $node ($c->nodes)
{
	my $name = $node->{felix_name};
	my $shown = $node->safe_psql('postgres', 'SHOW felix.node_conninfo');
	like($shown, qr/passfile=/, "$name: felix.node_conninfo names a password file");
	unlike($shown, qr/\Q$secret\E|password=/, "$name: and holds no password");
	my $settings = $node->safe_psql('postgres',
		"SELECT string_agg(setting || ' ' || coalesce(reset_val, '') || ' ' || coalesce(boot_val, ''), ' ') "
		  . "FROM pg_settings WHERE name LIKE 'felix.%'");
	unlike($settings, qr/\Q$secret\E/, "$name: pg_settings shows no secret");
	my $nodes = $node->safe_psql('postgres', 'SELECT string_agg(conninfo, \' \') FROM felix_nodes');
	unlike($nodes, qr/\Q$secret\E|password/, "$name: felix_nodes shows addresses only");
}
# (the secret is spelled in two halves so that this statement's own log
# line does not hold it)
my ($s1, $s2) = (substr($secret, 0, 5), substr($secret, 5));
is($c->state_query(
		"SELECT count(*) FROM felix.nodes WHERE strpos(conninfo, '$s1' || '$s2') > 0 "
		  . "OR conninfo ~ '(pass|user|sslkey|sslcert)'"),
	'0', 'the control plane stores no credential of any node, nor its password file');

# A wrong password: node1 no longer accepts node3's.  node3 cannot log in
# to it -- to heartbeat, with the embedded store there; to ship to it or
# probe it, whatever the store -- and says why, not what.
{
	local $ENV{PGOPTIONS} = '-c log_statement=none';
	$c->cp->safe_psql('postgres', "ALTER ROLE felix_node_node3 PASSWORD 'not-the-one'");
}
my $n3 = $c->node(3);
my $off = -s $n3->logfile;
# its sessions at the control plane end: it must log in again
$c->cp->safe_psql('postgres',
	"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'felix_node_node3'");
ok(defined FelixCluster::poll(20, sub {
			substr(read_file($n3->logfile), $off) =~ /password authentication failed for user "felix_node_node3"/ }),
	'node3, whose password node1 no longer accepts, logs that authentication failed');
{
	local $ENV{PGOPTIONS} = '-c log_statement=none';
	$c->cp->safe_psql('postgres', "ALTER ROLE felix_node_node3 PASSWORD '$secret-node3'");
}

# A password in a conninfo setting, or credentials in
# felix.control_conninfo, are refused at start.
$c->stop_node(3);
my $conf = read_file($n3->data_dir . '/postgresql.conf');
for my $case (
	[ 'felix.node_conninfo', FelixCluster::_conninfo($n3) . " password=$secret-x", 'password',
		qr/felix.node_conninfo must not contain "password"/ ],
	[ 'felix.node_conninfo', FelixCluster::_conninfo($n3) . " sslpassword=$secret-x", 'sslpassword',
		qr/felix.node_conninfo must not contain "sslpassword"/ ],
	[ 'felix.control_conninfo', FelixCluster::_conninfo($c->cp) . ' user=felix_node_node1', 'user',
		qr/felix.control_conninfo sets "user"; it must say only where the control plane is/ ],
	[ 'felix.control_conninfo', FelixCluster::_conninfo($c->cp) . " password=$secret-x", 'password',
		qr/felix.control_conninfo must not contain "password"/ ],
	[ 'felix.node_conninfo', "host='unterminated", 'nothing parseable',
		qr/felix.node_conninfo is not a valid libpq connection string/ ])
{
	my ($setting, $value, $what, $want) = @$case;
	write_file($n3->data_dir . '/postgresql.conf', $conf . "$setting = '" . ($value =~ s/'/''/gr) . "'\n");
	my $log_off = -s $n3->logfile;
	my $started = $n3->start(fail_ok => 1);
	ok(!$started, "a node whose $setting holds $what does not start");
	$n3->stop if $started;
	my $log = substr(read_file($n3->logfile), $log_off);
	like($log, qr/FATAL:\s+$want/, "and its log says why ($setting, $what)");
}
write_file($n3->data_dir . '/postgresql.conf', $conf);
# (that no log line repeats a value is checked by felix_done_testing)

$c->teardown;
felix_done_testing();
