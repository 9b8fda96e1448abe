# Stored checksums are CRC-32C as anyone computes it.  felix computes the
# CRC of long buffers three stripes at a time (src/storage/crc.c); here
# batches of many sizes -- a few bytes to about 40 kB, lengths that are and
# are not multiples of 8 and of the 3 kB rounds -- are published into small
# segments that seal, and every stored body CRC, and every seal's CRC of
# the whole file before it, is recomputed byte by byte in Perl.  The
# server then restarts and serves everything (startup checks the sealed
# segments' CRCs with the same code).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = felix_node('crc', "felix.segment_bytes = '64kB'");
$node->safe_psql('postgres', "SELECT felix_create_stream('c', payload_type => 'bytea')");

# One batch per call: sizes around the round length (3 * 1024 bytes) and
# well past it; payload bytes vary with the position.
my @sizes = (1, 7, 8, 100, 3071, 3072, 3073, 3080, 6143, 6144, 9217, 12288,
	20000, 40001, 3, 3072 * 4 + 5);
my $n = 0;
for my $len (@sizes)
{
	$node->safe_psql('postgres',
		    "SELECT felix_publish_batch('c', ARRAY[decode(repeat(lpad(to_hex($len % 251), 2, '0') || 'a5c3', "
		  . int($len / 3 + 1)
		  . "), 'hex'), 'x'::bytea, substring(decode(repeat('0123456789abcdef', "
		  . int($len / 8 + 1)
		  . "), 'hex') from 1 for $len)], NULL)");
	$n += 3;
}
is($node->safe_psql('postgres', 'SELECT count(*) FROM c'), $n, "$n records published");

my $dir  = shard_dir($node, 'c', 0);
my @segs = segment_files($dir);
cmp_ok(scalar @segs, '>=', 2, 'the log spans several segments (some sealed)');

my ($bodies, $bad_bodies, $seals, $bad_seals, $long) = (0, 0, 0, 0, 0);
for my $file (@segs)
{
	my $data = read_file($file);
	for my $b (read_batches($file))
	{
		my $body = substr($data, $b->{offset} + FelixTest::BATCH_HEADER_BYTES, $b->{body_len});
		if ($b->{kind} == FelixTest::BATCH_RECORDS)
		{
			$bodies++;
			$long++ if $b->{body_len} >= 3 * 1024;
			$bad_bodies++ if crc32c($body) != $b->{body_crc};
		}
		else
		{
			$seals++;
			my $want = crc32c(substr($data, 0, $b->{offset}));
			$bad_seals++ if unpack('V', $body) != $want;
		}
	}
}
cmp_ok($long, '>=', 8, "$long of the $bodies batch bodies are 3 kB or longer");
is($bad_bodies, 0, "every batch body's stored CRC is the CRC-32C of its bytes ($bodies batches)");
cmp_ok($seals, '>=', 1, "$seals sealed segments");
is($bad_seals, 0, "every seal holds the CRC-32C of its whole file before it");

$node->restart;
is($node->safe_psql('postgres', 'SELECT count(*), sum(length(payload)) > 0 FROM c'),
	"$n|t", 'after a restart (sealed segments checked whole) every record is served');
is($node->safe_psql('postgres',
		"SELECT value FROM felix_metrics WHERE name = 'corruptions_detected'"),
	'0', 'and nothing was taken for damage');
unlike(slurp_file($node->logfile), qr/three-way CRC-32C disagrees/,
	'the three-way CRC passed its own check');

$node->stop;
felix_done_testing();
