# pg_dump and restore of streams (issue 9).  A database holding jsonb, text
# and bytea streams of several shards -- with an owner, grants, retention
# settings and a transactional history (committed, rolled back and
# partly rolled back transactions, COPY, batches) -- is dumped with pg_dump
# in plain and custom format and restored into fresh servers with psql and
# pg_restore.  Every stream comes back as a stream: the same name, schema,
# shards, replication factor, consistency, payload type, storage,
# retention, owner and grants, and every record with the same (shard, seq,
# key, payload, published_at) -- a stream whose oldest records retention
# removed begins, restored, at the seq its dump begins at.  A restore into
# a stream that already holds
# records is refused, and so are rows whose seqs are not contiguous in
# their shard: nothing is renumbered.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Small segments, so that retention removes the oldest records of 'old'.
my $src = felix_node('dsrc', "felix.segment_bytes = '64kB'");
my $roles = q{
	CREATE ROLE app LOGIN;
	CREATE ROLE reader;
	GRANT CREATE ON SCHEMA public TO app;
	CREATE SCHEMA ops AUTHORIZATION app;
};
$src->safe_psql('postgres', $roles);
$src->safe_psql('postgres', q{
	SET ROLE app;
	SELECT felix_create_stream('j', shards => 3, retention_bytes => 1000000000);
	SELECT felix_create_stream('t', shards => 2, payload_type => 'text', retention => '30 days');
	SELECT felix_create_stream('b', shards => 2, payload_type => 'bytea');
	SELECT felix_create_stream('old', retention_bytes => 150000);
	SET search_path = ops, public;
	SELECT felix_create_stream('audit', shards => 1);
	RESET search_path;
	GRANT SELECT ON j, t TO reader;
	SELECT count(felix_publish('j', jsonb_build_object('i', i), key => 'k' || (i % 7))) FROM generate_series(1, 300) i;
	SELECT count(*) FROM felix_publish_batch('j', ARRAY(SELECT jsonb_build_object('batch', i) FROM generate_series(1, 100) i));
	SELECT count(felix_publish('t', repeat(chr(65 + i % 26), i))) FROM generate_series(1, 200) i;
	SELECT count(felix_publish('b', decode(md5(i::text), 'hex'), shard => i % 2)) FROM generate_series(1, 100) i;
	INSERT INTO ops.audit (key, payload) SELECT NULL, to_jsonb(i) FROM generate_series(1, 20) i;
	SELECT count(felix_publish('old', jsonb_build_object('i', i, 'pad', repeat('x', 1000)))) FROM generate_series(1, 400) i;
	SET ROLE app;
	SELECT felix_enforce_retention('old');
});
my $old_start = $src->safe_psql('postgres', "SELECT start_seq FROM felix_shards WHERE stream = 'old'");
cmp_ok($old_start, '>', 0, "retention removed the oldest records of stream old (it begins at seq $old_start)");
# a transactional history: a rolled-back transaction, a rolled-back
# savepoint, rows of several shards in one commit
$src->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO j (shard, key, payload) VALUES (0, 'never', '{"rolled": "back"}');
	ROLLBACK;
	BEGIN;
	INSERT INTO j (shard, key, payload) SELECT i % 3, 'tx', jsonb_build_object('tx', i) FROM generate_series(1, 30) i;
	SAVEPOINT s;
	INSERT INTO j (shard, key, payload) VALUES (1, 'never', '{"savepoint": "rolled back"}');
	ROLLBACK TO SAVEPOINT s;
	INSERT INTO t (key, payload) VALUES ('tx', 'after the savepoint');
	COMMIT;
});
$src->safe_psql('postgres',
	"COPY t (key, payload) FROM STDIN;\ncopied\tfirst line\n\\N\tsecond line\n\\.\n");

# What must come back, as one string.
sub streams_of
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
		SELECT s.stream, s.relation, s.shards, s.replication_factor, s.consistency,
		       s.payload_type, s.storage, s.retention_bytes, s.retention,
		       pg_get_userbyid(c.relowner), c.relacl
		  FROM felix_streams s JOIN pg_class c ON c.oid = s.relation
		 ORDER BY 1});
}

sub records_of
{
	my ($node) = @_;
	my $out = '';
	for my $rel (split /\n/, $node->safe_psql('postgres',
		'SELECT relation FROM felix_streams ORDER BY stream'))
	{
		$out .= "$rel:\n" . $node->safe_psql('postgres',
			"SELECT shard, seq, coalesce(key, '<null>'), payload, published_at FROM $rel ORDER BY shard, seq")
		  . "\n";
	}
	return $out;
}

my $streams = streams_of($src);
my $records = records_of($src);
like($streams, qr/^j\|j\|3\|1\|leader\|jsonb\|local\|1000000000\|\|app\|/m, 'the source lists stream j');
like($records, qr/^\d+\|\d+\|<null>\|second line\|/m, 'the source has the COPY row with a NULL key')
  or note($records);

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $bindir = $src->config_data('--bindir');
$src->command_ok([ "$bindir/pg_dump", '-d', $src->connstr('postgres'), '-f', "$tmp/plain.sql" ],
	'pg_dump, plain format');
$src->command_ok([ "$bindir/pg_dump", '-Fc', '-d', $src->connstr('postgres'), '-f', "$tmp/custom.dump" ],
	'pg_dump, custom format');

# A fresh server: felix preloaded, the extension not yet created (the dump
# creates it), the roles made first (pg_dumpall --globals-only would).
sub fresh_node
{
	my ($name) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		join("\n", FelixTest::felix_base_conf(),
			"felix.node_conninfo = '" . FelixTest::felix_node_conninfo($node, $name) . "'")
		  . "\n");
	$node->start;
	$node->safe_psql('postgres', $roles =~ s/CREATE SCHEMA ops AUTHORIZATION app;//r);
	return $node;
}

my $plain = fresh_node('dplain');
my ($rc, $out, $err) = $plain->psql('postgres', undef,
	extra_params => [ '-v', 'ON_ERROR_STOP=1', '-f', "$tmp/plain.sql" ]);
is($rc, 0, 'psql -f restores the plain dump') or diag($err);
is(streams_of($plain), $streams, 'plain restore: every stream, with its settings, owner and grants');
is(records_of($plain), $records, 'plain restore: every record, same (shard, seq, key, payload, published_at)');
is($plain->safe_psql('postgres', "SELECT start_seq FROM felix_shards WHERE stream = 'old'"), $old_start,
	'plain restore: the trimmed stream begins where its dump does');

my $custom = fresh_node('dcustom');
$custom->command_ok([ "$bindir/pg_restore", '-d', $custom->connstr('postgres'), '--exit-on-error', "$tmp/custom.dump" ],
	'pg_restore restores the custom dump');
is(streams_of($custom), $streams, 'custom restore: every stream, with its settings, owner and grants');
is(records_of($custom), $records, 'custom restore: every record, same (shard, seq, key, payload, published_at)');
is($custom->safe_psql('postgres', "SELECT start_seq FROM felix_shards WHERE stream = 'old'"), $old_start,
	'custom restore: the trimmed stream begins where its dump does');
is($custom->safe_psql('postgres', q{SELECT (felix_publish('old', '{"after": "restore"}'::jsonb)).seq}),
	$src->safe_psql('postgres', q{SELECT max(seq) + 1 FROM old}), 'and publishes after its restored records');

# The restored streams take new records after the restored ones.
my $last = $custom->safe_psql('postgres', 'SELECT max(seq) FROM j WHERE shard = 0');
is($custom->safe_psql('postgres',
		q{SELECT (felix_publish('j', '{"after": "restore"}'::jsonb, shard => 0)).seq}),
	$last + 1, 'a restored stream publishes after its restored records');

# Into a stream that already holds records: refused, nothing changed.
$src->safe_psql('postgres', "COPY (SELECT shard, seq, key, payload, published_at FROM j) TO '$tmp/j.copy'");
chmod 0644, "$tmp/j.copy";
($rc, $out, $err) = $plain->psql('postgres',
	"COPY j (shard, seq, key, payload, published_at) FROM '$tmp/j.copy'");
isnt($rc, 0, 'restoring records into a stream that holds records is refused');
like($err, qr/stream "j" shard \d+/, 'the error names the stream and the shard');
is(records_of($plain), $records, 'and the stream is unchanged');

# Rows whose seqs are not contiguous: refused, not renumbered.
$plain->safe_psql('postgres', "SELECT felix_create_stream('gap', shards => 1)");
($rc, $out, $err) = $plain->psql('postgres',
	"COPY gap (shard, seq, key, payload, published_at) FROM STDIN;\n"
	  . "0\t0\ta\t{}\t2026-01-01 00:00:00+00\n0\t2\tb\t{}\t2026-01-01 00:00:00+00\n\\.\n");
isnt($rc, 0, 'rows with a gap in their seqs are refused');
like($err, qr/stream "gap" shard 0/, 'the error names the stream and the shard');
is($plain->safe_psql('postgres', 'SELECT count(*) FROM gap'), '0', 'and nothing of them was stored');

$src->stop;
$plain->stop;
$custom->stop;
felix_done_testing();
