# A segment file changed outside felix, with checksums that match, never
# crashes a reader (issue 17: "every path that turns bytes into a Datum
# validates them ... segment files read at recovery").
#
# A jsonb stream gets three records; the server stops; the middle record's
# payload is overwritten, in the segment file, with bytes of the same
# length that are not jsonb (a container header claiming 0x0fffffff
# entries), and the batch's body CRC, header CRC and trailer are written
# again to match, so recovery finds nothing wrong with the file.  Before
# the check, the first read of that record handed the bytes to jsonb_out
# and the server crashed.  Now, after the start:
#   - the node worker's check of what the files held when the shard opened
#     reports the record (WARNING naming the stream, shard and seq), and
#     felix_metrics counts it;
#   - every read of it fails with XX001, naming stream, shard and seq; no
#     backend crashes (the postmaster's start time does not change);
#   - the records before it read, and a record published after the start
#     is read too.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = felix_node('forged');
$node->safe_psql('postgres', "SELECT felix_create_stream('f', payload_type => 'jsonb')");
for my $i (0 .. 2)
{
	$node->safe_psql('postgres', "SELECT felix_publish('f', '{\"n\": $i}'::jsonb)");
}
my $dir = shard_dir($node, 'f', 0);
$node->stop;

# the batch holding seq 1: one record, no key
my ($file) = segment_files($dir);
my ($b) = grep { $_->{base_seq} == 1 } read_batches($file);
ok($b && $b->{count} == 1, 'the record at seq 1 is a batch of its own');
my $data = read_file($file);
my $hdr  = substr($data, $b->{offset}, FelixTest::BATCH_HEADER_BYTES);
my $ts   = unpack('q<', substr($hdr, 32, 8));
my $body = substr($data, $b->{offset} + FelixTest::BATCH_HEADER_BYTES, $b->{body_len});
my ($klen, $plen) = unpack('V V', substr($body, 0, 8));
is($klen, 0xFFFFFFFF, 'it has no key');
# the payload's first 4 bytes: a container header with an impossible count
substr($body, 8, 4) = pack('V', 0x4fffffff);
my $new_hdr = batch_header(
	kind       => FelixTest::BATCH_RECORDS,
	count      => 1,
	base_seq   => $b->{base_seq},
	generation => $b->{generation},
	timestamp  => $ts,
	body_len   => $b->{body_len},
	body_crc   => crc32c($body));
substr($data, $b->{offset}, $b->{size}) = $new_hdr . $body . batch_trailer($new_hdr);
write_file($file, $data);

$node->start;
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
ok( $node->poll_query_until('postgres',
		"SELECT value > 0 FROM felix_metrics WHERE name = 'corruptions_detected'"),
	"the node worker's check of the files finds the record");
like(slurp_file($node->logfile),
	qr/stream "f" shard 0: the record at seq 1 in this node's segment files is not a valid jsonb/,
	'... and logs it, naming the stream, shard and seq');

my ($rc, $err) = psql_error($node, "SELECT seq, payload::text FROM f");
isnt($rc, 0, 'a read of the record fails');
like($err, qr/XX001/, '... with XX001');
like($err, qr/the record at seq 1 in this node's segment files is not a valid jsonb/, '... naming it');
($rc, $err) = psql_error($node, "SELECT payload->'n' FROM f WHERE shard = 0 AND seq >= 1");
like($err, qr/XX001/, '... through a seek and an operator too');
is($node->safe_psql('postgres', "SELECT payload->>'n' FROM f WHERE shard = 0 AND seq < 1"), '0',
	'the record before it reads');
is($node->safe_psql('postgres', "SELECT seq FROM felix_publish('f', '{\"n\": 3}'::jsonb)"), '3',
	'a publish after the start is taken');
is($node->safe_psql('postgres', "SELECT payload->>'n' FROM f WHERE shard = 0 AND seq >= 3"), '3',
	'and read');
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'no backend crashed');

$node->stop;
felix_done_testing();
