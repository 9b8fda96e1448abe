# felix 1.0 -> 1.1 on one node: the felix 1.0 release (built from
# test/upgrade/felix-1.0.tar.gz, FelixOld.pm) creates the extension and
# streams of every payload type and writes records; the binaries are
# replaced by the felix under test and the server restarted.  Until
# ALTER EXTENSION felix UPDATE, the library refuses to work on 1.0's SQL
# objects (clearly, with a hint) and its worker waits.  After it, every
# record reads back identical, the streams publish on from where they
# were, each stream carries its label FOR felix, and the extension's
# objects are exactly those a fresh CREATE EXTENSION felix gives.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixOld;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old = felix_1_0_install();
ok(-x "$old/bin/postgres", 'felix 1.0 is built and installed into a copy of PostgreSQL');

my $node = PostgreSQL::Test::Cluster->new('v10', install_path => $old);
$node->init;
$node->append_conf('postgresql.conf', join("\n", felix_base_conf(), "felix.node_name = 'v10'") . "\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION felix');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'felix'"),
	'1.0', 'the extension is created at version 1.0');

# Streams of each payload type, records by every 1.0 route.
$node->safe_psql('postgres', q{
	SELECT felix_create_stream('j', shards => 3);
	SELECT felix_create_stream('t', shards => 2, payload_type => 'text',
	                           retention_bytes => 1000000000, retention => '7 days');
	SELECT felix_create_stream('b', payload_type => 'bytea');
});
$node->poll_query_until('postgres',
	"SELECT count(*) = 6 FROM felix_shards WHERE role = 'leader'")
  or die 'felix 1.0 never led its shards';
$node->safe_psql('postgres', q{
	SELECT felix_publish('j', jsonb_build_object('i', i), key => 'k' || (i % 7)) FROM generate_series(1, 300) i;
	SELECT * FROM felix_publish_batch('t', ARRAY(SELECT 'line ' || i FROM generate_series(1, 200) i));
	SELECT felix_publish('b', decode(md5(i::text), 'hex'), shard => 0) FROM generate_series(1, 100) i;
	INSERT INTO j (shard, key, payload) SELECT i % 3, NULL, jsonb_build_object('insert', i) FROM generate_series(1, 50) i;
});
my %query = map { $_ => "SELECT shard, seq, coalesce(key, '<null>'), payload::text, published_at FROM $_ ORDER BY shard, seq" } qw(j t b);
my %before = map { $_ => $node->safe_psql('postgres', $query{$_}) } keys %query;
is(scalar(split /\n/, $before{j}), 350, 'felix 1.0 holds 350 records in j');

# The binaries are replaced; the SQL objects are still 1.0's.
$node->stop;
use_install($node, system_install());
my $log_off = -s $node->logfile;
$node->start;
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT felix_publish('j', '{}'::jsonb)});
like($err, qr/felix 1\.0 is installed in this database, and the felix library loaded is 1\.1/,
	'before the update, the new library refuses 1.0 SQL objects');
like($err, qr/HINT:\s+Run ALTER EXTENSION felix UPDATE/, '... and says what to run');
($rc, $out, $err) = $node->psql('postgres', 'SELECT count(*) FROM j');
isnt($rc, 0, 'before the update, reads are refused too (not served from objects of another version)');
ok($node->poll_query_until('postgres', 'SELECT true', 't'), 'the server runs');
ok(wait_for(sub { substr(slurp_file($node->logfile), $log_off) =~ /waiting for ALTER EXTENSION felix UPDATE/ }),
	'the node worker waits for the update, and says so');

$node->safe_psql('postgres', 'ALTER EXTENSION felix UPDATE');
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'felix'"),
	'1.1', 'ALTER EXTENSION felix UPDATE moves it to 1.1');
for my $s (sort keys %query)
{
	is($node->safe_psql('postgres', $query{$s}), $before{$s},
		"stream $s: every record reads back with the same (shard, seq, key, payload, published_at)");
}

# The shards are led again (a 1.0 generation is not resumed: the next one
# is granted once a lease has passed) and publishing goes on from where
# it was.
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 6 FROM felix_shards WHERE role = 'leader' AND lease_remaining_ms > 0"),
	'every shard is led again after the update');
is($node->safe_psql('postgres', q{SELECT (felix_publish('j', '{"after": 1}'::jsonb, shard => 0)).seq}),
	scalar(grep { /^0\|/ } split /\n/, $before{j}), 'j shard 0 publishes at the seq after its last 1.0 record');
is($node->safe_psql('postgres', q{SELECT (felix_publish('b', '\xff'::bytea, shard => 0)).seq}), '100',
	'b publishes at seq 100');

# Labels, as felix 1.1 writes them for a stream it creates.
is($node->safe_psql('postgres', q{SELECT label FROM pg_seclabel WHERE objoid = 't'::regclass AND provider = 'felix'}),
	'{"shards":2,"replication_factor":1,"consistency":"leader","storage":"local","retention_bytes":1000000000,"retention":"P7D"}',
	'each 1.0 stream carries its label FOR felix');
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_seclabel WHERE provider = 'felix'}), '3',
	'every stream is labelled');

# The control plane's state came along (the embedded store).
is($node->safe_psql('postgres', q{SELECT string_agg(name || ':' || shards || ':' || payload_type, ',' ORDER BY name) FROM felix.cluster_streams}),
	'b:1:bytea,j:3:jsonb,t:2:text', 'the control plane knows the three streams');
is($node->safe_psql('postgres', q{SELECT count(*) FROM felix.streams s JOIN felix.cluster_streams c USING (name, creation_id)}),
	'3', 'with the creation ids the node has');

# Exactly the objects a fresh installation has.
my $fresh = PostgreSQL::Test::Cluster->new('fresh');
$fresh->init;
$fresh->append_conf('postgresql.conf', join("\n", felix_base_conf(), "felix.node_name = 'fresh'") . "\n");
$fresh->start;
$fresh->safe_psql('postgres', 'CREATE EXTENSION felix');
my $objects = read_file("$FindBin::RealBin/../upgrade/extension_objects.sql");
my $got = $node->safe_psql('postgres', $objects);
my $want = $fresh->safe_psql('postgres', $objects);
cmp_ok(scalar(split /\n/, $want), '>', 50, 'a fresh installation has its objects listed');
is($got, $want, 'the updated extension has exactly the objects of a fresh CREATE EXTENSION felix')
  or diag(diff_lines($want, $got));

$node->stop;
$fresh->stop;
felix_done_testing();

# Poll (bounded, 30 s) until $cond is true.
sub wait_for
{
	my ($cond) = @_;
	for (1 .. 300)
	{
		return 1 if $cond->();
		select(undef, undef, undef, 0.1);
	}
	return 0;
}

# Lines only in one of two texts, for a diagnosis.
sub diff_lines
{
	my ($a, $b) = @_;
	my %in_a = map { $_ => 1 } split /\n/, $a;
	my %in_b = map { $_ => 1 } split /\n/, $b;
	return join("\n",
		(map { "fresh only: $_" } grep { !$in_b{$_} } split /\n/, $a),
		(map { "updated only: $_" } grep { !$in_a{$_} } split /\n/, $b));
}
