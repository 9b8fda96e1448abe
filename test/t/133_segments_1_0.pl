# Segment files felix 1.0 wrote are read by this felix.  The fixture
# (test/upgrade/segments-1.0.tar.gz, see test/upgrade/README.md) is one
# shard as felix 1.0 left it with 64 kB segments: a sealed segment, the
# active one with its preallocated tail, their indexes and the generation
# map, and no file 1.0 did not have (hwm, copy_of).  Put in place of a new
# stream's shard, every record reads back as 1.0 served it, and the shard
# publishes on after them.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use File::Copy qw(copy);
use File::Path qw(make_path rmtree);
use PostgreSQL::Test::Utils;
use Test::More;

my $node = felix_node('seg10');
$node->safe_psql('postgres', "SELECT felix_create_stream('fx')");
ok($node->poll_query_until('postgres',
	"SELECT role = 'leader' FROM felix_shards WHERE stream = 'fx' AND shard = 0"), 'stream fx is led');
my $dir = shard_dir($node, 'fx', 0);
$node->stop;

my $tmp = PostgreSQL::Test::Utils::tempdir;
my $tarball = ($ENV{TESTDIR} // '.') . '/test/upgrade/segments-1.0.tar.gz';
system('tar', '-xzf', $tarball, '-C', $tmp) == 0 or die "tar -xzf $tarball failed";
my @files = glob("$tmp/segments-1.0/shard/*");
ok(scalar(grep { /\.seg$/ } @files) >= 2, 'the fixture holds a sealed and an active segment');
rmtree($dir);
make_path($dir);
for my $f (@files)
{
	(my $base = $f) =~ s{.*/}{};
	copy($f, "$dir/$base") or die "copy $f: $!";
	chmod 0600, "$dir/$base";
}
$node->start;

my $want = slurp_file("$tmp/segments-1.0/records.txt");
chomp $want;
is($node->safe_psql('postgres',
	q{SELECT seq || '|' || coalesce(key, '<null>') || '|' || payload::text || '|' || extract(epoch FROM published_at) FROM fx WHERE shard = 0 ORDER BY seq}),
	$want, 'every record felix 1.0 wrote reads back: seq, key, payload, published_at');
is($node->safe_psql('postgres', "SELECT state || ' ' || start_seq || ' ' || next_seq FROM felix_shards WHERE stream = 'fx'"),
	'open 0 130', 'the shard opens on the 1.0 files at seqs 0 to 130');
ok($node->poll_query_until('postgres',
	"SELECT role = 'leader' AND lease_remaining_ms > 0 FROM felix_shards WHERE stream = 'fx' AND shard = 0"),
	'and is led');
is($node->safe_psql('postgres', q{SELECT (felix_publish('fx', '{"after": "1.0"}'::jsonb)).seq}), '130',
	'it publishes after the 1.0 records');

$node->stop;
felix_done_testing();
