# A follower whose log differs from the leader's at or below its
# high-water mark halts diverged, is listed by felix_halted, and is rebuilt.
#
# Why: a record at or below a follower's mark is on a majority; no leader
# may make the follower drop it, and the follower must not repair it
# itself (replication-design.txt, "Divergence and truncation").  Such a
# difference -- here silent corruption that keeps every checksum valid --
# can only be repaired by the leader discarding the follower's copy and
# shipping it the log again ("Rebuilding a halted follower").
#
# How it is provoked, for real: a quorum stream led by L (node2 or node3),
# followers F (the other of the two) and node1 (the control plane).  The
# last batch, five records [20, 25), reaches all three and every mark.  F
# is stopped and the third record of that batch is rewritten on its disk
# with valid body and header checksums (same length, so its index still
# holds); F's durable mark (its hwm file) is 25, above the edit.  L is then
# stopped too: node1 is promoted at generation 2, which begins at seq 25,
# so its fresh cursor for each follower is seq 24 and its first shipment is
# the batch [20, 25).  F compares it with what it holds, finds a
# difference below its mark that its generation map cannot excuse (same
# generation 1 on both sides), and answers 'conflict'.
#
# Asserted: the leader (node1) logs the halt with reason diverged at
# generation 2, felix_replication shows halted_diverged, felix_halted on all
# three nodes lists F with its position and an action naming felix_rebuild
# (felix.rebuild_max_concurrent = 0, so nothing rebuilds it on its own for
# a while); F serves nothing from seq 20 on, the control plane does not
# report it caught up, and it completes no quorum (with L paused a quorum
# publish times out).  felix_rebuild on the leader answers 'started'; after
# it F's record batches are byte-identical to the leader's, segment by
# segment, felix_halted is empty, rebuilds_completed counted it, F counted
# copies_rebuilt, and no acknowledged record is missing.  F then takes part
# in quorums again.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Digest::MD5 ();

my $c = FelixCluster->new(nodes => 3, conf => ["felix.rebuild_max_concurrent = 0"]);

# The leader and the follower under test are node2 and node3 (both get
# stopped); node1 (the control plane) is the third replica and becomes the
# leader.
my ($stream, @set) = $c->pick_stream_name('diverged', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text');
my ($leader, $g) = $c->wait_leader($stream, 0);
my $lname = $leader->{felix_name};
my ($fname) = grep { $_ ne 'node1' && $_ ne $lname } map { $_->{felix_name} } $c->nodes;
my $f = $c->node($fname);
my $n1 = $c->node(1);
note("stream $stream: leader $lname at generation $g, follower under test $fname");
is($g, 1, 'the stream starts at generation 1');
$c->wait_shipping($leader, $stream, 0, 2, 30);

# Every record acknowledged to a client, as seq => payload.
my %acked;

sub publish_one
{
	my ($node, $payload) = @_;
	my $seq = $node->safe_psql('postgres',
		"SELECT (felix_publish('$stream', '$payload', shard => 0)).seq");
	$acked{$seq} = $payload;
	return $seq;
}

for my $i (0 .. 19)
{
	publish_one($leader, "a-$i-" . ('x' x 40));
}
# One batch of five records: [20, 25).
my @five = map { "d-$_-" . ('y' x 40) } 1 .. 5;
my $out = $leader->safe_psql('postgres',
	"SELECT string_agg(seq::text, ',' ORDER BY seq) FROM felix_publish_batch('$stream', ARRAY["
	  . join(',', map { "'$_'" } @five) . "]::text[])");
is($out, '20,21,22,23,24', 'one felix_publish_batch call stored seqs 20..24');
@acked{ 20 .. 24 } = @five;

sub shard_state
{
	my ($node) = @_;
	return $c->try_psql($node,
		"SELECT next_seq || ' ' || coalesce(hwm::text, '-') FROM felix_shards "
		  . "WHERE stream = '$stream' AND shard = 0", 5) // 'no answer';
}

for my $node ($f, $n1)
{
	my $st;
	ok(defined FelixCluster::poll(30, sub { ($st = shard_state($node)) eq '25 24' }, 0.1),
		"$node->{felix_name} holds all 25 records, all of them below its mark ($st)");
}

# ---------------------------------------------------------------------
# F: stopped, and one record of the last batch rewritten on its disk
# ---------------------------------------------------------------------
my $fdir = shard_dir($f, $stream, 0);
$c->stop_node($f);

# The durable mark in F's hwm file: two 16-byte slots {hwm_end, count,
# crc}; the valid one with the highest count is the mark.
sub durable_mark
{
	my ($dir) = @_;
	my $data = read_file("$dir/hwm");
	my ($best_count, $mark) = (-1, undef);
	for my $i (0, 1)
	{
		last if length($data) < 16 * ($i + 1);
		my $slot = substr($data, 16 * $i, 16);
		my ($end, $count, $crc) = unpack('Q< V V', $slot);
		next unless crc32c(substr($slot, 0, 12)) == $crc;
		($best_count, $mark) = ($count, $end) if $count > $best_count;
	}
	return $mark;
}
my $mark = durable_mark($fdir);
cmp_ok($mark // -1, '>=', 25, "${fname}'s durable high-water mark covers every record (hwm_end $mark)");

my ($seg) = segment_files($fdir);
my ($batch) = grep { $_->{base_seq} == 20 } record_batches($seg);
ok($batch && $batch->{count} == 5, "${fname}'s segment holds the batch [20, 25) as one batch");
my $data = read_file($seg);
my $body_off = $batch->{offset} + 48;
my $body = substr($data, $body_off, $batch->{body_len});
my $was = $five[2];
(my $now = $was) =~ s/^d-3-y/d-3-Z/;
my $at = index($body, $was);
ok($at >= 0, "the record at seq 22 is in that batch's body");
substr($body, $at, length $now) = $now;
# The same header with the new body CRC, a new header CRC, and a trailer
# carrying that header CRC: a batch recovery cannot tell from a real one.
my $hdr = substr($data, $batch->{offset}, 48);
substr($hdr, 44, 4) = pack('V', crc32c($body));
substr($hdr, 4, 4) = pack('V', crc32c(substr($hdr, 8)));
write_at($seg, $batch->{offset}, $hdr . $body . batch_trailer($hdr));
my ($check) = grep { $_->{base_seq} == 20 } record_batches($seg);
is($check->{body_crc}, crc32c($body), 'the rewritten batch carries a valid body checksum');

# ---------------------------------------------------------------------
# L stopped too: node1 leads generation 2, beginning at seq 25
# ---------------------------------------------------------------------
$c->stop_node($leader);
my ($new, $g2) = $c->wait_leader($stream, 0, min_generation => 2, timeout => 60);
is($new->{felix_name}, 'node1', 'node1, the only replica left, leads the next generation');
my $gmap = join(' ', map { "$_->[2]\@$_->[0]" } $c->batch_generations($n1, $stream, 0));
note("node1 leads generation $g2; its batches (generation\@base): $gmap");

my $started   = $c->metric_of($n1, 'rebuilds_started')   // 0;
my $completed = $c->metric_of($n1, 'rebuilds_completed') // 0;
$c->start_node($leader);
$c->start_node($f);

# node1 ships the batch [20, 25) to F: conflict, halted diverged.
my $rep = '';
my $halted = FelixCluster::poll(60, sub {
	$rep = $n1->safe_psql('postgres',
		"SELECT state || ': ' || coalesce(last_error, '') FROM felix_replication "
		  . "WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'");
	return $rep =~ /^halted_/;
}, 0.1);
ok(defined $halted, "node1 halted $fname") or $c->diag_shard($stream, 0);
like($rep, qr/^halted_diverged: its log differs from this leader's at the batch starting at seq 20$/,
	"felix_replication on node1: $rep");
like(read_file($n1->logfile),
	qr/follower "$fname" halted \(diverged\) at generation $g2: its log differs from this leader's at the batch starting at seq 20/,
	"node1's log: WARNING follower \"$fname\" halted (diverged) at generation $g2");

# felix_halted, the same on every node (fed by the control plane).
for my $node ($c->nodes)
{
	my $row = '';
	ok(defined FelixCluster::poll(20, sub {
		$row = $node->safe_psql('postgres',
			"SELECT format('%s %s %s %s', generation, \"position\", reason, since IS NOT NULL) "
			  . "FROM felix_halted WHERE stream = '$stream' AND shard = 0 AND node = '$fname'");
		return $row eq "$g2 20 diverged t";
	}, 0.1), "felix_halted on $node->{felix_name}: $fname halted diverged at generation $g2, position 20")
	  or diag("felix_halted on $node->{felix_name}: '$row'; all: "
		  . $node->safe_psql('postgres', 'SELECT * FROM felix_halted'));
	like($node->safe_psql('postgres',
			"SELECT action FROM felix_halted WHERE stream = '$stream' AND node = '$fname'"),
		qr/node1.*SELECT felix_rebuild\('$stream', 0, '$fname'\)/,
		"felix_halted on $node->{felix_name}: the action names felix_rebuild on node1");
	is($node->safe_psql('postgres', "SELECT count(*) FROM felix_halted WHERE stream = '$stream'"),
		'1', "felix_halted on $node->{felix_name} lists nothing else of the stream");
}

# F serves nothing from the difference on.
is($f->safe_psql('postgres', "SELECT count(*) || ' ' || max(seq) FROM \"$stream\""),
	'20 19', "$fname serves seqs 0..19 only while halted");
is($f->safe_psql('postgres',
		"SELECT count(*) FROM \"$stream\" WHERE payload LIKE 'd-3-Z%' OR seq >= 20"),
	'0', "$fname does not serve its differing record");

# Not caught up, and out of every quorum.
is($n1->safe_psql('postgres',
		"SELECT caught_up || ' ' || coalesce(halted, '-') FROM felix.replica_reports "
		  . "WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'"),
	'false diverged', "the control plane has $fname reported halted diverged, not caught up");
my $lrow = '';
ok(defined FelixCluster::poll(30, sub {
	$lrow = $n1->safe_psql('postgres',
		"SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$lname'");
	$lrow eq 'shipping' }, 0.1), "$lname, back, is shipped to ($lrow)");
is(publish_one($n1, 'q-1'), 25, 'a quorum publish on node1 is acknowledged with node1 and ' . $lname);
$c->pause_node($leader);
my ($rc, $err) = psql_error($n1,
	"SET felix.quorum_timeout = '2s'; SELECT felix_publish('$stream', 'q-unacked', shard => 0)");
$c->resume_node($leader);
like($err, qr/ERROR:\s+55F01:/,
	"with $lname paused, a quorum publish times out: $fname, halted, completes no quorum");

sleep 2;
like($n1->safe_psql('postgres',
		"SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'"),
	qr/^halted_diverged$/, 'felix.rebuild_max_concurrent = 0: nothing rebuilt it on its own');
is($c->metric_of($n1, 'rebuilds_started') // 0, $started, 'no rebuild was started');

# ---------------------------------------------------------------------
# The rebuild, asked for by hand on the leader
# ---------------------------------------------------------------------
my ($frc, $ferr) = psql_error($f,
	"SELECT felix_rebuild('$stream', 0, '$fname')");
like($ferr, qr/ERROR:\s+55F02:.*not led by this node.*node1/s,
	'felix_rebuild on a node that does not lead the shard refuses, naming the leader');
is($n1->safe_psql('postgres', "SELECT felix_rebuild('$stream', 0, '$fname')"),
	'started', "felix_rebuild('$stream', 0, '$fname') on node1: started");
my $done = FelixCluster::poll(60, sub {
	($c->metric_of($n1, 'rebuilds_completed') // 0) > $completed }, 0.1);
ok(defined $done, "node1 completed the rebuild of $fname") or $c->diag_shard($stream, 0);
is($c->metric_of($n1, 'rebuilds_completed'), $completed + 1, 'rebuilds_completed counted it once');
is($c->metric_of($n1, 'rebuilds_started'), $started + 1, 'rebuilds_started counted it once');
cmp_ok($c->metric_of($f, 'copies_rebuilt') // 0, '>=', 1, "$fname discarded its copy (copies_rebuilt)");
like(read_file($f->logfile), qr/discarded its copy; the log now begins, empty, at seq 0/,
	"${fname}'s log says it discarded its copy");

# Same records, byte for byte.
sub segment_digest
{
	my ($node) = @_;
	my $out = '';
	for my $file (segment_files(shard_dir($node, $stream, 0)))
	{
		my $d = read_file($file);
		(my $name = $file) =~ s{.*/}{};
		$out .= "$name " . Digest::MD5::md5_hex(join('',
			map { substr($d, $_->{offset}, $_->{size}) } record_batches($file))) . "\n";
	}
	return $out;
}

my $want = $c->records($n1, $stream, 0);
ok(defined FelixCluster::poll(60, sub { $c->records($f, $stream, 0) eq $want }, 0.2),
	"$fname serves exactly the leader's records again")
  or diag("leader:\n$want\n$fname:\n" . $c->records($f, $stream, 0));
my $same = FelixCluster::poll(30, sub { segment_digest($f) eq segment_digest($n1) }, 0.2);
ok(defined $same, "${fname}'s segments hold byte-identical record batches to node1's")
  or diag("node1:\n" . segment_digest($n1) . "$fname:\n" . segment_digest($f));
is(join(',', map { "$_->[0]+$_->[1]g$_->[2]" } $c->batch_generations($f, $stream, 0)),
	join(',', map { "$_->[0]+$_->[1]g$_->[2]" } $c->batch_generations($n1, $stream, 0)),
	'batch by batch: same seqs, counts and generations');

ok(defined FelixCluster::poll(20, sub {
	!grep { $_->safe_psql('postgres', "SELECT count(*) FROM felix_halted WHERE stream = '$stream'") ne '0' }
	  $c->nodes }, 0.1),
	'felix_halted is empty again on every node');

# No acknowledged record lost, on the leader or on F.
for my $node ($n1, $f)
{
	my %have = map { my ($s, $k, $p) = split /\|/, $_, 3; ($s => $p) }
	  split /\n/, $c->records($node, $stream, 0);
	my @lost = grep { !defined $have{$_} || $have{$_} ne $acked{$_} } sort { $a <=> $b } keys %acked;
	is(scalar(@lost), 0,
		scalar(keys %acked) . " acknowledged records all at their seqs on $node->{felix_name}")
	  or diag("missing or different: @lost");
}

# F counts towards quorums again: with L paused, node1 + F make a majority.
$c->pause_node($leader);
my $seq = eval { publish_one($n1, 'q-after') };
$c->resume_node($leader);
ok(defined $seq, "with $lname paused, a quorum publish is acknowledged with $fname")
  or diag($@);
ok(defined FelixCluster::poll(30, sub {
	$f->safe_psql('postgres', "SELECT count(*) FROM \"$stream\" WHERE payload = 'q-after'") eq '1' }, 0.1),
	"$fname serves it");

$c->teardown;
felix_done_testing();
