# felix needs shared_preload_libraries: without it, CREATE EXTENSION felix
# fails with a hint saying how to fix it, and nothing is left behind.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('nopreload');
$node->init;
$node->append_conf('postgresql.conf', "lc_messages = 'C'\n");
$node->start;

my ($rc, $err) = psql_error($node, 'CREATE EXTENSION felix');
isnt($rc, 0, 'CREATE EXTENSION felix fails without shared_preload_libraries');
like($err, qr/ERROR:\s+[0-9A-Z]{5}:/, 'with a SQLSTATE');
like($err, qr/HINT:.*shared_preload_libraries/, 'and a hint naming shared_preload_libraries');
note("the error was:\n$err");
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_extension WHERE extname = 'felix'"),
	'0', 'the extension is not installed');
is($node->safe_psql('postgres', "SELECT count(*) FROM pg_namespace WHERE nspname = 'felix'"),
	'0', 'nothing of it is left behind');

# Preloaded, it installs.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'felix'\n");
$node->restart;
$node->safe_psql('postgres', 'CREATE EXTENSION felix');
is($node->safe_psql('postgres', "SELECT felix_create_stream('ok')::text"),
	'ok', 'with felix preloaded, streams can be created');

$node->stop;
felix_done_testing();
