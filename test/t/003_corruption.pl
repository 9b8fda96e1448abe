# A flipped byte inside acknowledged data -- not at the tail -- is
# corruption, not a torn write: recovery must report it and refuse to
# serve the shard (SQLSTATE XX001, data_corrupted, naming the segment
# file), show the shard as failed in felix_shards, leave every byte on
# disk (nothing truncated), and keep serving the stream's other shards.
# Putting the byte back and restarting serves every record again, which
# shows nothing was dropped.
#
# Places: a batch body in the middle of the active segment, a batch header
# in the middle of the active segment, the body of the last (acknowledged)
# batch of the active segment, and a sealed segment.  Finally a flipped
# byte in the last batch's trailer: its header and body still check out,
# so its records are served (the trailer is rewritten) and nothing is cut.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use Digest::MD5 qw(md5_hex);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = felix_node('corrupt', "felix.segment_bytes = '64kB'");
$node->safe_psql('postgres',
	"SELECT felix_create_stream('bad', shards => 2, payload_type => 'text')");
# Shard 0: 150 records of about 1 kB, one batch each (three segments);
# shard 1: 10 records.
$node->safe_psql('postgres',
	"SELECT count(felix_publish('bad', format('r-%s-', i) || repeat('y', 1000), shard => 0)) FROM generate_series(0, 149) i");
$node->safe_psql('postgres',
	"SELECT count(felix_publish('bad', format('r-%s-', i), shard => 1)) FROM generate_series(0, 9) i");
my $dir = shard_dir($node, 'bad', 0);
my $shard1 = 10;    # records on shard 1

sub all_intact
{
	my ($label) = @_;
	is( $node->safe_psql('postgres',
			q{SELECT count(*), min(seq), max(seq),
			         bool_and(payload = format('r-%s-', seq) || repeat('y', 1000))
			    FROM bad WHERE shard = 0}),
		'150|0|149|t',
		"$label: shard 0 serves all 150 records intact");
	return;
}

all_intact('before any damage');

# Stop, flip the byte at $offset of $file, start, check the refusal, then
# put the byte back and check that everything is served again.
sub damage
{
	my ($label, $file, $offset) = @_;
	my $name = $file =~ s{.*/}{}r;
	$node->stop;
	my $orig = flip_byte($file, $offset);
	my $size = -s $file;
	my $md5  = md5_hex(read_file($file));
	note("$label: flipped the byte at offset $offset of $name ($size bytes)");

	$node->start;
	my ($rc, $err) = psql_error($node, 'SELECT count(*) FROM bad WHERE shard = 0');
	isnt($rc, 0, "$label: reading the shard fails");
	like($err, qr/ERROR:\s+XX001:/, "$label: with SQLSTATE XX001 (data_corrupted)");
	like($err, qr/\Q$name\E/, "$label: and the error names the segment file");
	like($err, qr/stream "bad" shard 0/, "$label: and the stream and shard");
	note("$label: the error was:\n$err");

	($rc, $err) = psql_error($node, "SELECT * FROM felix_publish('bad', 'more'::text, shard => 0)");
	like($err, qr/ERROR:\s+XX001:/, "$label: publishing to the shard fails with XX001 too");

	($rc, $err) = psql_error($node, 'SELECT count(*) FROM bad');
	like($err, qr/ERROR:\s+XX001:/, "$label: a scan of the whole stream fails too");

	is( $node->safe_psql('postgres',
			"SELECT shard || ':' || state FROM felix_shards WHERE stream = 'bad' ORDER BY shard"),
		"0:failed\n1:open",
		"$label: felix_shards shows shard 0 failed and shard 1 open");
	like(
		$node->safe_psql('postgres',
			"SELECT error FROM felix_shards WHERE stream = 'bad' AND shard = 0"),
		qr/\Q$name\E/,
		"$label: felix_shards gives the reason, naming the file");
	my ($out, $perr) = ('', '');
	$node->psql('postgres', 'SELECT count(*) FROM bad WHERE shard = 1',
		stdout => \$out, stderr => \$perr);
	is($out, $shard1, "$label: the other shard still serves")
	  or diag("reading shard 1: $perr");
	$out = '';
	$node->psql('postgres', "SELECT seq FROM felix_publish('bad', 'on shard 1'::text, shard => 1)",
		stdout => \$out, stderr => \$perr);
	is($out, $shard1, "$label: and takes new records")
	  or diag("publishing to shard 1: $perr");
	$shard1++;
	cmp_ok(metric($node, 'corruptions_detected'), '>=', 1,
		"$label: corruptions_detected counted it");

	# Nothing was cut or rewritten.
	$node->stop;
	is(-s $file, $size, "$label: the damaged file was not truncated");
	is(md5_hex(read_file($file)), $md5, "$label: the damaged file was not rewritten");

	# Put the byte back: everything is there.
	flip_byte($file, $offset);
	$node->start;
	all_intact("$label, byte restored");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(state, ',' ORDER BY shard) FROM felix_shards WHERE stream = 'bad'"),
		'open,open',
		"$label, byte restored: both shards serve");
	return;
}

my @segs = segment_files($dir);
note('shard 0 has ' . scalar(@segs) . ' segment files');
cmp_ok(scalar @segs, '>=', 3, 'shard 0 rolled into several segments');
my $active = $segs[-1];
my @b      = record_batches($active);
cmp_ok(scalar @b, '>=', 5, 'the active segment holds several batches');
my $mid = $b[ int(@b / 2) ];

damage('flipped byte in a batch body',
	$active, $mid->{offset} + 48 + int($mid->{body_len} / 2));
damage('flipped byte in a batch header',
	$active, $mid->{offset} + 16);    # base_seq
# The last batch is complete, trailer and all: a bad body there is damage
# to an acknowledged batch, not an unfinished write.
damage('flipped byte in the last batch body',
	$active, $b[-1]{offset} + 48 + int($b[-1]{body_len} / 2));

my $sealed = $segs[0];
my @sb     = record_batches($sealed);
my $smid   = $sb[ int(@sb / 2) ];
damage('flipped byte in a sealed segment',
	$sealed, $smid->{offset} + 48 + int($smid->{body_len} / 2));

# A flipped byte in the last batch's trailer (its magic, then its copy of
# the header CRC): never a cut of that acknowledged batch.
for my $part ([ 'trailer magic', 1 ], [ 'trailer header-CRC copy', 6 ])
{
	my ($what, $at) = @$part;
	my $label = "flipped byte in the last batch's $what";
	my @lb    = record_batches($active);
	my $last  = $lb[-1];
	my $end   = $last->{offset} + $last->{size};
	$node->stop;
	my $before = read_file($active);
	flip_byte($active, $last->{offset} + 48 + $last->{body_len} + $at);
	$node->start;
	all_intact($label);
	is(metric($node, 'corruptions_detected'), 0, "$label: the batch's records are whole: no corruption");
	$node->stop;
	my $after = read_file($active);
	cmp_ok(length $after, '>=', $end, "$label: the last batch was not cut");
	is(data_end($active), $end, "$label: the data still ends after the last batch");
	is(md5_hex(substr($after, 0, $end)), md5_hex(substr($before, 0, $end)),
		"$label: the trailer was restored, every other byte is unchanged");
	$node->start;
}

$node->stop;
felix_done_testing();
