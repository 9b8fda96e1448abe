# Retention trims whole segments from the front and advances the shard's
# start_seq; reads from the new start work, the newest records are never
# touched, the active segment is never removed, and a restart keeps the
# trimmed state.  By bytes (felix_enforce_retention), by age, and by the
# node worker on its own schedule.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# The worker's schedule is an hour at first, so that only our own calls
# trim; the last part shortens it.
my $node = felix_node('retention', "felix.segment_bytes = '64kB'",
	"felix.retention_check_interval = '1h'");

sub shard_row
{
	my ($stream) = @_;
	my ($start, $next, $bytes) = split /\|/,
	  $node->safe_psql('postgres',
		"SELECT start_seq, next_seq, bytes FROM felix_shards WHERE stream = '$stream' AND shard = 0");
	return ($start, $next, $bytes);
}

sub base_of { return ($_[0] =~ m{/(\d+)\.seg$})[0] + 0; }

sub publish
{
	my ($stream, $from, $to) = @_;
	$node->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', format('rec-%s-', i) || repeat('z', 1000))) FROM generate_series($from, $to) i");
	return;
}

sub reads_from
{
	my ($label, $stream, $start, $next) = @_;
	is( $node->safe_psql('postgres',
			"SELECT count(*), min(seq), max(seq), bool_and(payload = format('rec-%s-', seq) || repeat('z', 1000)) FROM $stream"),
		sprintf('%d|%d|%d|t', $next - $start, $start, $next - 1),
		"$label: a scan returns exactly [start_seq, next_seq), intact");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(seq::text, ',') FROM (SELECT seq FROM $stream WHERE shard = 0 AND seq >= 0 LIMIT 3) s"),
		join(',', $start, $start + 1, $start + 2),
		"$label: a seek from seq 0 starts at start_seq");
	is( $node->safe_psql('postgres',
			"SELECT string_agg(seq::text, ',') FROM (SELECT seq FROM $stream WHERE shard = 0 AND seq >= @{[$start + 10]} LIMIT 2) s"),
		join(',', $start + 10, $start + 11),
		"$label: a seek past start_seq works");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM $stream WHERE shard = 0 AND seq = @{[$start - 1]}"),
		'0', "$label: the record before start_seq is gone");
	return;
}

# ---- by bytes, on demand ----
$node->safe_psql('postgres',
	"SELECT felix_create_stream('ret', payload_type => 'text', retention_bytes => 200000)");
publish('ret', 0, 999);
my $dir = shard_dir($node, 'ret', 0);
my @before = segment_files($dir);
my %size_before = map { $_ => -s $_ } @before;
my ($start0, $next0, $bytes0) = shard_row('ret');
note("before: " . scalar(@before) . " segments, start_seq $start0, next_seq $next0, bytes $bytes0");
is($start0, 0, 'nothing trimmed before retention runs');
cmp_ok(scalar @before, '>=', 10, 'the shard rolled into many segments');
my $trimmed0 = metric($node, 'segments_trimmed');

my $removed = $node->safe_psql('postgres', "SELECT felix_enforce_retention('ret')");
my @after = segment_files($dir);
my ($start1, $next1, $bytes1) = shard_row('ret');
note("after: removed $removed, " . scalar(@after) . " segments, start_seq $start1, next_seq $next1, bytes $bytes1");
cmp_ok($removed, '>', 0, 'felix_enforce_retention removed segments');
is(scalar(@before) - scalar(@after), $removed, 'as many segment files are gone as it reported');
is_deeply([ @before[ $removed .. $#before ] ], \@after, 'the oldest segments went, in order');
cmp_ok($start1, '>', 0, 'start_seq advanced');
is($start1, base_of($after[0]), 'start_seq is the first seq of the oldest remaining segment');
is($next1, $next0, 'next_seq did not move');
cmp_ok($bytes1, '<=', 200000, 'the shard now holds at most retention_bytes');
cmp_ok($bytes1 + $size_before{ $before[ $removed - 1 ] }, '>', 200000,
	'and no more was trimmed than needed');
ok(-e $before[-1], 'the active segment is kept');
is(metric($node, 'segments_trimmed') - $trimmed0, $removed, 'segments_trimmed counted them');
ok(!(grep { -e } map { s/\.seg$/.idx/r } @before[ 0 .. $removed - 1 ]),
	"the trimmed segments' index files are gone too");
reads_from('after trimming by bytes', 'ret', $start1, $next1);
is($node->safe_psql('postgres', "SELECT felix_enforce_retention('ret')"),
	'0', 'enforcing again removes nothing');

# Publishing goes on; a restart keeps the trimmed state.
publish('ret', 1000, 1009);
$node->restart;
my ($start2, $next2) = shard_row('ret');
is("$start2|$next2", "$start1|" . ($next1 + 10), 'a restart keeps start_seq and next_seq');
reads_from('after a restart', 'ret', $start2, $next2);

# ---- by age ----
$node->safe_psql('postgres',
	"SELECT felix_create_stream('aged', payload_type => 'text', retention => '2 seconds')");
publish('aged', 0, 299);
my $adir = shard_dir($node, 'aged', 0);
my @aseg = segment_files($adir);
cmp_ok(scalar @aseg, '>=', 3, 'the aged stream rolled into several segments');
is($node->safe_psql('postgres', "SELECT felix_enforce_retention('aged')"),
	'0', 'nothing is old enough yet');
sleep 3;
my $aremoved = $node->safe_psql('postgres', "SELECT felix_enforce_retention('aged')");
my ($astart, $anext) = shard_row('aged');
note("aged: removed $aremoved of " . scalar(@aseg) . " segments; start_seq $astart, next_seq $anext");
is($aremoved, scalar(@aseg) - 1, 'every sealed segment older than the retention went');
is_deeply([ segment_files($adir) ], [ $aseg[-1] ], 'only the active segment is left');
is($astart, base_of($aseg[-1]), 'start_seq is the active segment\'s first seq');
reads_from('after trimming by age', 'aged', $astart, $anext);

# ---- by the node worker ----
$node->safe_psql('postgres',
	"SELECT felix_create_stream('auto', payload_type => 'text', retention_bytes => 150000)");
publish('auto', 0, 599);
$node->safe_psql('postgres',
	"ALTER SYSTEM SET felix.retention_check_interval = '200ms'; SELECT pg_reload_conf()");
my $t0 = time;
ok( $node->poll_query_until('postgres',
		"SELECT start_seq > 0 FROM felix_shards WHERE stream = 'auto'"),
	'the node worker applies retention on its own');
my ($wstart, $wnext, $wbytes) = shard_row('auto');
note(sprintf("worker trimmed 'auto' within %.1fs: start_seq %d, next_seq %d, bytes %d",
	time - $t0, $wstart, $wnext, $wbytes));
ok($node->poll_query_until('postgres',
		"SELECT bytes <= 150000 FROM felix_shards WHERE stream = 'auto'"),
	'down to retention_bytes');
($wstart, $wnext) = shard_row('auto');
reads_from('after the worker trimmed', 'auto', $wstart, $wnext);

$node->stop;
felix_done_testing();
