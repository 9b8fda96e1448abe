# pg_dump and restore of replicated streams (issue 9).  A three-node
# cluster holds streams of replication factor 3 (quorum), 2 and 1, so that
# every node lacks some shards.  A read on any node returns every shard --
# the shards it holds no copy of are read from a replica -- so a pg_dump
# taken on one node holds every record.  The dump (custom and plain
# format) is restored with pg_restore on one node of a fresh three-node
# cluster: every stream comes back with its settings, the restoring node
# leads every shard (it writes them all), the records reach the other
# replicas, every node reads the same records as the source, and the
# replicas' segment files are byte-identical.  A dump whose streams ask for
# three replicas is refused by a single server with an error that says
# why.  A read of a shard none of whose replicas answers fails; it never
# returns part of the stream.
#
# tap-etcd: skip.  Its subject is pg_dump and pg_restore; the control-
# plane store plays the same part in it as in the scripts that run on
# both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $src = FelixCluster->new(nodes => 3, prefix => 'dsrc');
# a stream's schema and the roles its grants name exist on every node
$src->node($_)->safe_psql('postgres', 'CREATE SCHEMA ops; CREATE ROLE reader') for 1 .. 3;
$src->create_stream(1, 'q3', shards => 3, replication_factor => 3, consistency => 'quorum');
$src->create_stream(1, 'l2', shards => 3, replication_factor => 2, payload_type => 'text');
$src->create_stream(1, 'one', shards => 3, replication_factor => 1, payload_type => 'bytea');
$src->node(1)->safe_psql('postgres', q{
	SET search_path = ops, public;
	SELECT felix_create_stream('audit', shards => 2, replication_factor => 2)});
$src->wait_stream('audit', 2);
$src->node(1)->safe_psql('postgres', 'GRANT SELECT ON q3, ops.audit TO reader');

# Every shard is written on its leader: publishes, a transaction with a
# rolled-back savepoint.  One shard of l2 that node1 holds no copy of gets
# more records than one remote read fetches at a time.
my $big = $src->node(1)->safe_psql('postgres', q{
	SELECT min(shard) FROM felix_shards WHERE stream = 'l2' AND NOT 'node1' = ANY (replicas)});
isnt($big, '', "node1 holds no copy of l2 shard $big");
my %payload = (q3 => q{jsonb_build_object('i', i)}, l2 => q{repeat(chr(65 + i % 26), i % 50)},
	one => q{decode(md5(i::text), 'hex')}, audit => q{to_jsonb(i)});
for my $stream (qw(q3 l2 one audit))
{
	my $rel = $stream eq 'audit' ? 'ops.audit' : $stream;
	for my $shard (0 .. ($stream eq 'audit' ? 1 : 2))
	{
		my ($leader) = $src->wait_leader($stream, $shard);
		my $n = $stream eq 'l2' && $shard == $big ? 4500 : 200;
		$src->node($leader)->safe_psql('postgres', qq{
			SELECT count(felix_publish('$stream', $payload{$stream}, key => 'k' || (i % 5), shard => $shard))
			  FROM generate_series(1, $n) i;
			BEGIN;
			INSERT INTO $rel (shard, key, payload) SELECT $shard, 'tx', $payload{$stream} FROM generate_series(1, 20) i;
			SAVEPOINT s;
			INSERT INTO $rel (shard, key, payload) SELECT $shard, 'never', $payload{$stream} FROM generate_series(1, 3) i;
			ROLLBACK TO SAVEPOINT s;
			COMMIT;});
	}
}
my %want = (q3 => 3 * 220, l2 => 4520 + 2 * 220, one => 3 * 220, audit => 2 * 220);

sub streams_of
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
		SELECT s.stream, s.relation, s.shards, s.replication_factor, s.consistency,
		       s.payload_type, s.storage, s.retention_bytes, s.retention, c.relacl
		  FROM felix_streams s JOIN pg_class c ON c.oid = s.relation
		 ORDER BY 1});
}

# Every record of every stream as node $node reads it, as one string.
sub records_of
{
	my ($node) = @_;
	my $out = '';
	for my $rel (qw(audit l2 one q3))
	{
		my $table = $rel eq 'audit' ? 'ops.audit' : $rel;
		$out .= "$rel:\n" . $node->safe_psql('postgres',
			"SELECT shard, seq, coalesce(key, '<null>'), payload, published_at FROM $table ORDER BY shard, seq",
			timeout => 120) . "\n";
	}
	return $out;
}

# Wait until every node reads the same records; returns what they read.
sub wait_same_records
{
	my ($c, $what) = @_;
	my ($first, @differ);
	my $took = FelixCluster::poll(
		60,
		sub {
			my @got = map { records_of($_) } $c->nodes;
			$first = $got[0];
			@differ = grep { $got[$_] ne $first } 0 .. $#got;
			return !@differ;
		},
		0.5);
	ok(defined $took, "$what: every node reads the same records")
	  or diag('nodes ' . join(', ', map { $_ + 1 } @differ) . ' differ from node1');
	return $first;
}

# The shards node1 holds no copy of: a read there goes to a replica.
my $elsewhere = $src->node(1)->safe_psql('postgres', q{
	SELECT count(*) FROM felix_shards WHERE NOT 'node1' = ANY (replicas)});
cmp_ok($elsewhere, '>=', 3, "node1 holds no copy of $elsewhere shards");

my $records = wait_same_records($src, 'source');
for my $rel (sort keys %want)
{
	my $table = $rel eq 'audit' ? 'ops.audit' : $rel;
	is($src->node(1)->safe_psql('postgres', "SELECT count(*) FROM $table"), $want{$rel},
		"node1 reads all $want{$rel} records of $rel, of every shard");
}
is($src->node(1)->safe_psql('postgres', qq{SELECT count(*) FROM l2 WHERE shard = $big AND seq >= 4400}),
	120, 'a seek into a shard read from a replica returns just the records asked for');
my $streams = streams_of($src->node(1));

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $bindir = $src->node(1)->config_data('--bindir');
$src->node(1)->command_ok(
	[ "$bindir/pg_dump", '-Fc', '-d', $src->node(1)->connstr('postgres'), '-f', "$tmp/cluster.dump" ],
	'pg_dump, custom format, on node1');
$src->node(1)->command_ok(
	[ "$bindir/pg_dump", '-d', $src->node(1)->connstr('postgres'), '-f', "$tmp/cluster.sql" ],
	'pg_dump, plain format, on node1');

# Restore with pg_restore on node2 of a fresh cluster.  The other nodes
# need the schema and the role first; node2 gets them from the dump.
my $dst = FelixCluster->new(nodes => 3, prefix => 'dtgt');
$dst->node($_)->safe_psql('postgres', 'CREATE ROLE reader') for 1 .. 3;
$dst->node($_)->safe_psql('postgres', 'CREATE SCHEMA ops') for 1, 3;
$dst->node(2)->command_ok(
	[ "$bindir/pg_restore", '-d', $dst->node(2)->connstr('postgres'), '--exit-on-error', "$tmp/cluster.dump" ],
	'pg_restore of the custom dump on node2 of a fresh cluster');
is(streams_of($dst->node(2)), $streams, 'every stream is back with its settings and grants');
is($dst->node(2)->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT leader, ',') FROM felix_shards}), 'node2',
	'the restoring node leads every shard');
is(wait_same_records($dst, 'restored cluster'), $records,
	'every node of the restored cluster reads every record of the source, same (shard, seq, key, payload, published_at)');

# The replicas of every replicated shard hold the same bytes.
for my $stream (qw(q3 l2))
{
	for my $shard (0 .. 2)
	{
		my @replicas = split /,/, $dst->node(2)->safe_psql('postgres',
			"SELECT array_to_string(replicas, ',') FROM felix_shards WHERE stream = '$stream' AND shard = $shard");
		my @bytes;
		FelixCluster::poll(
			30,
			sub {
				@bytes = map {
					join('', map { $_->[0] . $_->[1] } $dst->segment_bytes($_, $stream, $shard))
				} @replicas;
				return !grep { $_ ne $bytes[0] } @bytes;
			},
			0.5);
		ok(!grep({ $_ ne $bytes[0] } @bytes) && length($bytes[0]) > 0,
			"$stream shard $shard: its replicas (@replicas) hold byte-identical segments");
	}
}

# New records follow the restored ones.
my $last = $dst->node(2)->safe_psql('postgres', 'SELECT max(seq) FROM q3 WHERE shard = 1');
is($dst->node(2)->safe_psql('postgres',
		q{SELECT (felix_publish('q3', '{"after": "restore"}'::jsonb, shard => 1)).seq}),
	$last + 1, 'a restored quorum stream publishes after its restored records');

# One server cannot hold a dump of streams that ask for three replicas.
my $single = felix_node('dsingle');
$single->safe_psql('postgres', 'CREATE ROLE reader');
my ($rc, $out, $err) = $single->psql('postgres', undef,
	extra_params => [ '-v', 'ON_ERROR_STOP=1', '-f', "$tmp/cluster.sql" ]);
isnt($rc, 0, 'a single server refuses the restore of replicated streams');
like($err, qr/replication_factor \d needs \d alive nodes/, 'the error says how many nodes the stream needs');
like($err, qr/SECURITY LABEL FOR felix/, 'and the hint says how to restore it');
$single->stop;

# A read of a shard no replica of which answers fails; it never returns
# part of the stream.  l2's shards live on two nodes; stop both replicas
# of one that node1 holds no copy of.
my ($shard, $reps) = split /\|/, $src->node(1)->safe_psql('postgres', q{
	SELECT shard, array_to_string(replicas, ',') FROM felix_shards
	 WHERE stream = 'l2' AND NOT 'node1' = ANY (replicas) ORDER BY shard LIMIT 1});
my @reps = split /,/, $reps;
my $count = $src->node(1)->safe_psql('postgres', "SELECT count(*) FROM l2 WHERE shard = $shard");
$src->stop_node($reps[0]);
is($src->node(1)->safe_psql('postgres', "SELECT count(*) FROM l2 WHERE shard = $shard"), $count,
	"l2 shard $shard with $reps[0] stopped: all $count records read from $reps[1]");
$src->stop_node($reps[1]);
($rc, $out, $err) = $src->node(1)->psql('postgres', 'SELECT count(*) FROM l2');
isnt($rc, 0, 'with both replicas of a shard stopped, reading the stream fails rather than returning part of it');
like($err, qr/stream "l2" shard $shard: this node holds no copy of the shard, and no replica of it could be read/,
	'the error names the stream and the shard');

$src->teardown;
$dst->teardown;
felix_done_testing();
