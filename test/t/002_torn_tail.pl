# A torn tail -- the end of the last segment left half-written by a crash
# -- is cut back to the last whole batch when the shard is recovered at
# startup, and the shard serves: every record before the tear is intact,
# and the next publish takes the seq after them.  The zero bytes the
# active segment is preallocated with after its last batch are the clean
# end of the data: nothing is cut or reported for them.
#
# Tails written by hand while the server is down: the last batch cut in
# its body, the last batch cut in its header, half of a new batch written
# into the preallocated zeros, garbage written there, zeros appended, the
# preallocated tail alone.  The stream rolls small segments so the tear is
# in the newest of several segment files.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = felix_node('torn', "felix.segment_bytes = '64kB'");
$node->safe_psql('postgres',
	"SELECT felix_create_stream('torn', payload_type => 'text')");
# 200 records of about 1 kB, one batch each: several 64 kB segments.
$node->safe_psql('postgres',
	"SELECT count(felix_publish('torn', format('rec-%s-', i) || repeat('x', 1000))) FROM generate_series(0, 199) i");
my $dir = shard_dir($node, 'torn', 0);

my $total = 200;    # records durable and expected after each repair

sub check_shard
{
	my ($label, $expect) = @_;
	my $rows = $node->safe_psql('postgres',
		q{SELECT count(*), min(seq), max(seq),
		         bool_and(payload = format('rec-%s-', seq) || repeat('x', 1000))
		    FROM torn});
	is($rows, sprintf('%d|0|%d|t', $expect, $expect - 1),
		"$label: records 0..@{[$expect - 1]} are intact");
	is( $node->safe_psql('postgres',
			"SELECT state || ' ' || next_seq FROM felix_shards WHERE stream = 'torn'"),
		"open $expect",
		"$label: the shard serves with next_seq $expect");
	# The shard takes new records right after the repaired end.
	is( $node->safe_psql('postgres',
			"SELECT seq FROM felix_publish('torn', format('rec-%s-', $expect) || repeat('x', 1000))"),
		$expect,
		"$label: the next publish gets seq $expect");
	return $expect + 1;
}

# Stop, change the newest segment with $mutate, start, and check that the
# recovered segment ends right after its last whole batch ($lost: records
# the change destroyed, 0 or 1).  With $clean the change left only zeros
# after the data: nothing may be cut (the file keeps its size) and nothing
# is counted as repaired.
sub tear
{
	my ($label, $mutate, $lost, $clean) = @_;
	$node->stop;
	my @segs = segment_files($dir);
	my $seg  = $segs[-1];
	my @b    = record_batches($seg);
	note(sprintf("%s: %d segment files; newest %s holds %d batches, data ends at %d, file %d bytes",
		$label, scalar @segs, $seg =~ s{.*/}{}r, scalar @b, data_end($seg), -s $seg));
	my $cut_to = $lost ? $b[-1]{offset} : $b[-1]{offset} + $b[-1]{size};
	$mutate->($seg, \@b);
	my $size = -s $seg;
	note("$label: newest segment now $size bytes; whole batches end at $cut_to");

	$node->start;
	# Reading opens (and recovers) the shard even if the node worker has
	# not reached it yet.
	$node->safe_psql('postgres', 'SELECT count(*) FROM torn');
	my $repaired = metric($node, 'torn_tails_repaired');
	note("$label: torn_tails_repaired = $repaired, segment " . (-s $seg) . " bytes");
	if ($clean)
	{
		is(-s $seg, $size, "$label: nothing was cut");
		is(data_end($seg), $cut_to, "$label: the data still ends after the last batch");
		is($repaired, 0, "$label: nothing counted as repaired");
		is(metric($node, 'corruptions_detected'), 0, "$label: nothing reported as corrupt");
	}
	else
	{
		is(-s $seg, $cut_to, "$label: the tail was cut back to the last whole batch");
		cmp_ok($repaired, '>=', 1, "$label: torn_tails_repaired counted it");
	}
	$total -= $lost;
	$total = check_shard($label, $total);
	return;
}

tear(
	'last batch cut inside its body',
	sub {
		my ($seg, $b) = @_;
		my $last = $b->[-1];
		truncate($seg, $last->{offset} + 48 + int($last->{body_len} / 2))
		  or die "truncate: $!";
	},
	1);

tear(
	'last batch cut inside its header',
	sub {
		my ($seg, $b) = @_;
		truncate($seg, $b->[-1]{offset} + 20) or die "truncate: $!";
	},
	1);

# A new batch, with the next seq and a correct header, whose body was
# only half written.  Its header is built here (CRC-32C in Perl), checked
# first against a header felix wrote.
{
	my @segs = segment_files($dir);
	my @b    = record_batches($segs[-1]);
	my $data = read_file($segs[-1]);
	my $hdr  = substr($data, $b[-1]{offset}, 48);
	my $again = batch_header(
		count      => $b[-1]{count},
		base_seq   => $b[-1]{base_seq},
		generation => $b[-1]{generation},
		timestamp  => unpack('q<', substr($hdr, 32, 8)),
		body_len   => $b[-1]{body_len},
		body_crc   => unpack('V', substr($hdr, 44, 4)));
	is(unpack('H*', $again), unpack('H*', $hdr),
		'the test builds batch headers exactly as felix does');
	is( unpack('H*', batch_trailer($hdr)),
		unpack('H*', substr($data, $b[-1]{offset} + 48 + $b[-1]{body_len}, 8)),
		'and batch trailers');
}

# The newest segment is the active one: after its last batch it holds the
# zeros it was preallocated with.
{
	my $seg = (segment_files($dir))[-1];
	my $end = data_end($seg);
	cmp_ok(-s $seg, '>', $end,
		'the active segment is preallocated past its last batch');
	my $tail = substr(read_file($seg), $end);
	is($tail =~ tr/\0//c, 0, 'and the preallocated tail is all zeros');
}

# A restart with nothing but the zero tail after the last batch: the clean
# end of the data.
tear('zero-filled preallocated tail', sub { }, 0, 1);

# A new batch, with the next seq and a correct header, written only part
# way into the preallocated zeros (the file keeps its size): the write
# stopped, its trailer was never written.
tear(
	'half of a new batch written into the preallocated tail',
	sub {
		my ($seg, $b) = @_;
		my $last = $b->[-1];
		my $body = substr(read_file($seg), $last->{offset} + 48, $last->{body_len});
		my $hdr  = batch_header(
			count      => $last->{count},
			base_seq   => $last->{base_seq} + $last->{count},
			generation => $last->{generation},
			timestamp  => 0,
			body_len   => length $body,
			body_crc   => crc32c($body));
		write_at($seg, data_end($seg), $hdr . substr($body, 0, int(length($body) / 2)));
	},
	0);

tear(
	'garbage written into the preallocated tail',
	sub {
		my ($seg, $b) = @_;
		write_at($seg, data_end($seg), 'this is not a felix batch ' x 20);
	},
	0);

tear(
	'garbage appended after the preallocated tail',
	sub {
		my ($seg, $b) = @_;
		write_file($seg, 'this is not a felix batch ' x 20, 1);
	},
	0);

tear(
	'zeros appended',
	sub {
		my ($seg, $b) = @_;
		write_file($seg, "\0" x 8192, 1);
	},
	0, 1);

# Everything is still there after a clean restart.
$node->restart;
is( $node->safe_psql('postgres', 'SELECT count(*), max(seq) FROM torn'),
	"$total|" . ($total - 1),
	'a clean restart keeps every record');

$node->stop;
felix_done_testing();
