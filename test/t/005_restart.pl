# A restart keeps everything: after a clean stop and after an immediate
# stop, every stream reads back identical -- positions, keys, payloads and
# published_at of every record, in the same order -- felix_shards shows the
# same positions, and the node leads its shards again and publishing
# continues from next_seq.  Streams live in felix.database only: another
# database refuses to create one.  A stream dropped before the restart
# stays dropped and its files are gone.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = felix_node('restart');
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other',    'CREATE EXTENSION felix');

$node->safe_psql('postgres', q{
	SELECT felix_create_stream('j', shards => 3);
	SELECT felix_create_stream('t', payload_type => 'text');
	SELECT felix_create_stream('b', shards => 2, payload_type => 'bytea');
	SELECT felix_create_stream('Quoted Name', shards => 2);
	SELECT felix_create_stream('gone');
	SELECT count(felix_publish('j', jsonb_build_object('i', i), key => 'k' || (i % 7))) FROM generate_series(1, 300) i;
	SELECT count(*) FROM felix_publish_batch('j', ARRAY(SELECT jsonb_build_object('batch', i) FROM generate_series(1, 100) i));
	INSERT INTO j (shard, key, payload) SELECT i % 3, NULL, jsonb_build_object('ins', i) FROM generate_series(1, 50) i;
	SELECT count(felix_publish('t', repeat(chr(65 + i % 26), i))) FROM generate_series(1, 200) i;
	SELECT count(felix_publish('b', decode(md5(i::text), 'hex'), shard => i % 2)) FROM generate_series(1, 100) i;
	INSERT INTO "Quoted Name" (key, payload) SELECT 'q' || i, to_jsonb(i) FROM generate_series(1, 20) i;
	SELECT count(felix_publish('gone', '{}'::jsonb)) FROM generate_series(1, 5);
});
$node->safe_psql('postgres',
	"COPY t (key, payload) FROM STDIN;\ncopied\tfirst line\ncopied\tsecond line\n\\.\n");
my ($rc, $out, $err) = $node->psql('other', "SELECT felix_create_stream('elsewhere')");
like($err, qr/cannot create stream "elsewhere" in database "other"/,
	'a database other than felix.database refuses to create a stream');
my $gone_dir = shard_dir($node, 'gone', 0) =~ s{/0$}{}r;
ok(-d $gone_dir, "the stream to drop has its directory");
$node->safe_psql('postgres', "SELECT felix_drop_stream('gone')");
ok(!-e $gone_dir, 'felix_drop_stream removed its directory');

# Everything a reader can see, as one string per database.
sub snapshot
{
	my ($db) = @_;
	my $streams = $node->safe_psql($db,
		'SELECT stream, relation FROM felix_streams ORDER BY stream');
	my $out = "streams:\n$streams\n";
	$out .= "shards:\n"
	  . $node->safe_psql($db,
		'SELECT stream, shard, role, generation, start_seq, next_seq, hwm, bytes, state FROM felix_shards');
	for my $line (split /\n/, $streams)
	{
		my ($stream, $rel) = split /\|/, $line;
		# Scan order as the access method returns it (no ORDER BY).
		$out .= "\n$stream:\n"
		  . $node->safe_psql($db,
			"SELECT md5(string_agg(format('%s|%s|%s|%s|%s', shard, seq, key, payload, published_at), E'\\n')), count(*) FROM $rel");
	}
	return $out;
}

# Leadership comes back from the control plane with the first heartbeat
# after a start; wait for it (bounded) before comparing.
sub wait_leading
{
	for (1 .. 100)
	{
		return if $node->safe_psql('postgres',
			"SELECT count(*) FROM felix_shards WHERE role IS DISTINCT FROM 'leader'") eq '0';
		usleep(100_000);
	}
	fail('every shard is led again within 10 s');
}

my %before = map { $_ => snapshot($_) } qw(postgres);
note("before:\n$before{postgres}");
like($before{postgres}, qr/^j\|0\|/m, 'snapshot lists the shards');

for my $mode (qw(fast immediate))
{
	$node->stop($mode);
	$node->start;
	wait_leading();
	for my $db (qw(postgres))
	{
		is(snapshot($db), $before{$db}, "after a $mode stop and start, $db reads back identical");
	}
}

# Order check: the scan order is (shard, seq).
is( $node->safe_psql('postgres', q{
		SELECT count(*) FROM (
		  SELECT shard, seq, lag(shard) OVER () AS pshard, lag(seq) OVER () AS pseq
		    FROM (SELECT shard, seq FROM j) s) x
		 WHERE (shard, seq) <= (pshard, pseq)}),
	'0', 'a scan returns (shard, seq) in order');

# Publishing continues from next_seq on every shard.
is( $node->safe_psql('postgres', q{
		SELECT count(*)
		  FROM (SELECT * FROM felix_shards WHERE stream = 'j' OFFSET 0) f
		 WHERE (felix_publish('j', '{"after": "restart"}'::jsonb, shard => f.shard)).seq <> f.next_seq}),
	'0', 'the next publish on each shard gets next_seq');
is($node->safe_psql('postgres', "SELECT count(*) FROM felix_streams WHERE stream = 'gone'"),
	'0', 'the dropped stream stays dropped');
ok(!-e $gone_dir, 'and its files stay gone');

$node->stop;
felix_done_testing();
