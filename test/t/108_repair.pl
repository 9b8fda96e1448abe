# The follower's append rule, driven by hand with crafted shipments:
#
# - records a follower holds above its high-water mark from generation G
#   are dropped when a batch of a newer generation finds them different
#   (the earlier leader's unadopted tail), and the follower answers 'gap'
#   with its new tail;
# - a difference found by a batch of the follower's own newest generation
#   (a leader disagreeing with itself) halts: 'conflict', nothing dropped,
#   and the follower serves nothing from the difference on;
# - a difference reaching back before the newest generation began halts;
# - the earlier leader's proposals are dropped the same way when they begin
#   at seq 0, the log's first record (a failover in a stream's first
#   moments): found by model-checking (docs/formal, finding 2), where the
#   follower halted diverged and was rebuilt whole instead;
# - a batch shipped exactly at the follower's tail, after a last record
#   of another generation, is answered 'gap' until that record has been
#   compared (TAP 154 shows why).
#
# The control plane and the stream's leader are stopped first, so nothing
# but these calls touches the follower's log.
#
# tap-etcd: skip.  Its subject is divergence repair between replicas;
# the control-plane store plays the same part in it as in the scripts
# that run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3);

# A stream led by node2 or node3 whose follower is the other of the two.
my ($stream, @set) = $c->pick_stream_name('repair', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, payload_type => 'text');
my ($leader, $g) = $c->wait_leader($stream, 0);
my ($fname) = grep { $_ ne 'node1' && $_ ne $leader->{felix_name} } @set;
my $f = $c->node($fname);
is($g, 1, 'the stream starts at generation 1');

# A second stream with the same leader, empty: the follower knows its
# generation 1 and holds nothing.
my ($empty) = $c->pick_stream_name('repairz', 3, sub { $_[0] eq $leader->{felix_name} });
$c->create_stream(1, $empty, replication_factor => 3, payload_type => 'text');
my ($leader0) = $c->wait_leader($empty, 0);
is($leader0->{felix_name}, $leader->{felix_name}, "$empty has the same leader");
ok(defined FelixCluster::poll(20, sub {
	$f->safe_psql('postgres',
		"SELECT role || ' ' || generation FROM felix_shards WHERE stream = '$empty' AND shard = 0") eq 'follower 1' }, 0.1),
	"$fname follows $empty at generation 1");

$leader->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', 'r' || i, shard => 0)) FROM generate_series(0, 2) i");
my $have = FelixCluster::poll(20, sub {
	return $f->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") eq '3';
}, 0.1);
ok(defined $have, "$fname holds the leader's three records");

# Nothing may move the follower's shard from here on.  With etcd the
# control plane outlives node1: a majority of its members is stopped too,
# or the duties promote the follower (generation 2) while these calls
# drive it -- which CI saw once, 2.2 s after the stop.
$c->stop_node($leader->{felix_name});
$c->stop_node(1);
if ($c->store ne 'embedded')
{
	$c->etcd->kill_member($_) for 1 .. 2;
}

# One shipment: [base, base + n) of generation $gen, text payloads, no keys.
sub shipment
{
	my ($base, $gen, @payloads) = @_;
	return shipment_hex($base, $gen, map { [ undef, $_ ] } @payloads);
}

sub replicate
{
	my ($gen, $from, $hwm, $hex, $s) = @_;
	return $f->safe_psql('postgres',
		replicate_call($f, $s // $stream, 0, $gen, $from, $hex, hwm => $hwm));
}

sub state
{
	my ($s) = @_;
	$s //= $stream;
	return $f->safe_psql('postgres',
		"SELECT next_seq || ' ' || coalesce(hwm::text, '-') FROM felix_shards "
		  . "WHERE stream = '$s' AND shard = 0");
}

my $hwm_before = (split / /, state())[1];
my $hwm_end = $hwm_before eq '-' ? 0 : $hwm_before + 1;
note("$fname before: next_seq/hwm " . state());

# Generation 1 proposals above the mark: stored, not visible.
is(replicate(1, 3, $hwm_end, shipment(3, 1, 'a', 'b')), 'stored 5', 'generation 1 proposals 3..4 are stored');
is(state(), "5 $hwm_before", 'they sit above the high-water mark');

# A newer generation differs at seq 3: the proposals are dropped.
is(replicate(2, 3, $hwm_end, shipment(3, 2, 'X')), 'gap 3',
	"a generation 2 batch that differs at seq 3 makes $fname drop 3..4 and answer gap 3");
is(state(), "3 $hwm_before", 'the log ends at seq 2 again; the mark did not move');
# Shipped at the tail alone, the new leader's record would follow a record
# of generation 1 that nothing compared: the follower asks for it first.
is(replicate(2, 3, 4, shipment(3, 2, 'X')), 'gap 3',
	'a generation 2 batch at the tail, after a generation 1 record: gap 3, to compare that record first');
is(state(), "3 $hwm_before", 'nothing appended');
# The leader resends from the batch holding seq 2 (r2, as stored).
my ($r2) = grep { $_->{base_seq} <= 2 && 2 < $_->{base_seq} + $_->{count} }
  map { my $file = $_; map { { %$_, file => $file } } record_batches($file) }
  segment_files(shard_dir($f, $stream, 0));
my $r2hex = unpack('H*', substr(read_file($r2->{file}), $r2->{offset}, $r2->{size}));
is(replicate(2, $r2->{base_seq}, 4, $r2hex . shipment(3, 2, 'X')), 'stored 4',
	'with r2 compared, the new leader\'s record is stored at seq 3');
is($f->safe_psql('postgres', "SELECT string_agg(payload, ',' ORDER BY seq) FROM $stream"),
	'r0,r1,r2,X', 'readers see the adopted history only');

# The same generation disagreeing with itself halts, dropping nothing;
# the follower stops serving what the leader says differs.
is(replicate(2, 3, 4, shipment(3, 2, 'Y')), 'conflict 3', 'generation 2 contradicting itself: conflict');
is(state(), '4 3', 'nothing was dropped, the mark did not move');
is($f->safe_psql('postgres', "SELECT string_agg(payload, ',' ORDER BY seq) FROM $stream"),
	'r0,r1,r2', 'readers no longer see seq 3, where the copy differs from the leader');

# A difference before the newest generation began (seq 1 < 3) halts too.
is(replicate(3, 1, 4, shipment(1, 3, 'Z')), 'conflict 1',
	'a difference reaching back before generation 2 began: conflict');
is(state(), '4 3', 'still nothing dropped');
is($f->safe_psql('postgres', "SELECT string_agg(payload, ',' ORDER BY seq) FROM $stream"),
	'r0', 'readers see only what precedes the difference');

# The earlier leader's proposals from seq 0 on: dropped as well.
is(replicate(1, 0, 0, shipment(0, 1, 'a', 'b'), $empty), 'stored 2',
	"$empty: generation 1 proposals 0..1 are stored");
is(state($empty), '2 -', "$empty: no mark, nothing visible");
is(replicate(2, 0, 0, shipment(0, 2, 'X'), $empty), 'gap 0',
	"$empty: a generation 2 batch that differs at seq 0 makes $fname drop 0..1 and answer gap 0");
is(state($empty), '0 -', "$empty: the log is empty again");
is(replicate(2, 0, 1, shipment(0, 2, 'X'), $empty), 'stored 1',
	"$empty: the new leader's record is stored at seq 0");
is($f->safe_psql('postgres', "SELECT string_agg(payload, ',' ORDER BY seq) FROM $empty"),
	'X', "$empty: readers see the adopted history only");
is(replicate(3, 0, 1, shipment(0, 3, 'Z'), $empty), 'conflict 0',
	"$empty: a newer generation differing at seq 0, now at the mark, halts: nothing at or below the mark is cut");
is(state($empty), '1 0', "$empty: seq 0 is still there, under the mark");
is(replicate(2, 0, 1, shipment(0, 2, 'Y'), $empty), 'conflict 0',
	"$empty: generation 2 contradicting itself at seq 0 halts too");

# The follower knows generation 1 from the control plane: an older
# shipment would be fenced; generation 0 is not a generation.
my ($rc, $err) = psql_error($f, replicate_call($f, $stream, 0, 0, 4, '', hwm => 4));
like($err, qr/generation must be positive/, 'generation 0 is refused');

$c->teardown;
felix_done_testing();
