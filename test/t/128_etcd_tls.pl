# etcd over TLS with client certificates: the etcd member serves https and
# accepts only clients whose certificate its CA signed.  A felix node with
# felix.etcd_cacert, felix.etcd_cert and felix.etcd_key set reaches it:
# the node is alive, felix_nodes says which https endpoint answers, and a
# stream is created and takes a publish.  The same node started with a CA
# that did not sign the server's certificate reaches nothing: felix_nodes
# shows the certificate failure as the store's error, and the node does
# not serve.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = PostgreSQL::Test::Utils::tempdir('tls');

sub openssl
{
	my @args = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'openssl', @args ], '<', \undef, '>', \$out, '2>', \$err)
	  or die "openssl @args: $err";
	return $out;
}

# A CA, a server certificate for 127.0.0.1 (also good for clients: etcd's
# JSON gateway connects to its own gRPC port with it), a client
# certificate, and a second CA that signed neither.
sub make_ca
{
	my ($name) = @_;
	openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2',
		'-subj', "/CN=$name", '-keyout', "$dir/$name.key", '-out', "$dir/$name.crt");
}
sub make_cert
{
	my ($name, $ca, $ext) = @_;
	openssl('req', '-newkey', 'rsa:2048', '-nodes', '-subj', "/CN=$name",
		'-keyout', "$dir/$name.key", '-out', "$dir/$name.csr");
	write_file("$dir/$name.ext", $ext);
	openssl('x509', '-req', '-in', "$dir/$name.csr", '-CA', "$dir/$ca.crt", '-CAkey', "$dir/$ca.key",
		'-CAcreateserial', '-days', '2', '-extfile', "$dir/$name.ext", '-out', "$dir/$name.crt");
	chmod 0600, "$dir/$name.key";
}
make_ca('ca');
make_ca('otherca');
make_cert('server', 'ca', "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth, clientAuth\n");
make_cert('client', 'ca', "extendedKeyUsage = clientAuth\n");

my $c = FelixCluster->new(nodes => 1, store => 'etcd',
	etcd_tls => { ca => "$dir/ca.crt", cert => "$dir/server.crt", key => "$dir/server.key",
		client_cert => "$dir/client.crt", client_key => "$dir/client.key" });
my $n1 = $c->node(1);
pass('the node is alive with its store reached over TLS with a client certificate');
like($n1->safe_psql('postgres', "SELECT store FROM felix_nodes WHERE name = 'node1'"),
	qr{^etcd https://127\.0\.0\.1:\d+}, 'felix_nodes names the https endpoint that answers');
is($n1->safe_psql('postgres', "SELECT coalesce(store_error, '') FROM felix_nodes WHERE name = 'node1'"),
	'', 'and no store error');
$c->create_stream(1, 'tls_stream', shards => 1);
my ($leader) = $c->wait_leader('tls_stream', 0);
is($n1->safe_psql('postgres', "SELECT seq FROM felix_publish('tls_stream', '{\"tls\": true}'::jsonb)"),
	'0', 'a stream is created and takes a publish');

# The wrong CA: the server's certificate does not verify.
my $conf = read_file($n1->data_dir . '/postgresql.conf');
$c->stop_node(1);
write_file($n1->data_dir . '/postgresql.conf',
	$conf . "felix.etcd_cacert = '$dir/otherca.crt'\n");
$c->start_node(1);
my $err = '';
ok(defined FelixCluster::poll(30, sub {
	$err = $n1->safe_psql('postgres', "SELECT coalesce(store_error, '') FROM felix_nodes WHERE name = 'node1'");
	$err =~ /certificate|SSL/i }, 0.2),
	'with a CA that did not sign the server, felix_nodes shows the certificate failure')
  or diag("store_error: $err");
note("store_error: $err");
my ($rc, $perr) = psql_error($n1, "SELECT felix_publish('tls_stream', '{\"tls\": false}'::jsonb)");
isnt($rc, 0, 'and the node does not serve the stream');

$c->teardown;
$c->etcd->stop_all;
felix_done_testing();
