# A follower whose log differs from the leader's at or below its
# high-water mark halts diverged, is listed by felix_halted, and is rebuilt
# byte-identical to the leader.
#
# Why: a record at or below a follower's mark is on a majority; no leader
# may make the follower drop it, and the follower must not repair it itself
# (replication-design.txt, "Divergence and truncation": a truncation point
# below the mark is a bug, not a repair).  Only the leader may discard the
# follower's copy and ship it the log again ("Rebuilding a halted
# follower").
#
# Two quorum streams, A and B, both led by L (node2 or node3), with
# followers F (the other of the two) and node1 (the control plane).  Each
# gets 25 records, the last five in one batch [20, 25), on every node and
# below every mark.  Then two differences F cannot justify:
#
# A  silent corruption: with F stopped, the record at seq 22 is rewritten on
#    F's disk with valid body and header checksums (same length, so recovery
#    and the index accept it).  The leader's batch and F's are both of
#    generation 1: no generation-map rule excuses a difference there.
# B  a record F believes acknowledged that the cluster never adopted: F
#    takes a crafted generation-1 record at seq 25 with leader_hwm_end 26
#    (superuser felix.replicate, as from a leader that lied), so its
#    durable mark (hwm file) is 26.  The new leader writes its own seq 25
#    at generation 2.  Here the generation-map rule alone WOULD drop F's
#    record (a newer generation's batch, after where generation 1 began);
#    only the mark forbids it.
#
# F and then L are stopped: node1 is promoted at generation 2, which
# begins at seq 25, so its fresh cursor is seq 24 and its first shipment to
# F is the batch [20, 25) (and, for B, node1's own seq 25).  L and F come
# back; F answers 'conflict' for both.  felix.rebuild_max_concurrent = 0
# everywhere, so the halts stay until asked.
#
# Asserted: node1 logs each halt (diverged) at generation 2 with its
# position, felix_replication shows halted_diverged, felix_halted on all
# three nodes lists both with position and an action naming felix_rebuild;
# F serves nothing from the differing seq on (neither its rewritten record
# nor its phantom); the control plane has F halted, not caught up; F
# completes no quorum (with L paused a quorum publish times out).
# felix_rebuild on a non-leader refuses; on node1 it answers 'started';
# after each rebuild F's record batches are byte-identical to node1's,
# segment by segment, felix_halted is empty, rebuilds_completed counted
# them, F counted copies_rebuilt, and every acknowledged record is at its
# seq on node1 and F.  F then completes quorums again.
#
# tap-etcd: skip.  Its subject is repair of diverged copies; the
# control-plane store plays the same part in it as in the scripts that
# run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3, conf => ["felix.rebuild_max_concurrent = 0"]);

# L and F are node2 and node3 (both get stopped); node1 is the third
# replica and becomes the leader.
my ($sa, @set) = $c->pick_stream_name('diverged', 3, sub { $_[0] ne 'node1' });
my $lname = $set[0];
my ($sb) = $c->pick_stream_name('phantom', 3, sub { $_[0] eq $lname });
my @streams = ($sa, $sb);
my $leader = $c->node($lname);
my ($fname) = grep { $_ ne 'node1' && $_ ne $lname } map { $_->{felix_name} } $c->nodes;
my $f = $c->node($fname);
my $n1 = $c->node(1);
for my $s (@streams)
{
	$c->create_stream(1, $s, replication_factor => 3, consistency => 'quorum',
		payload_type => 'text');
	my ($l, $g) = $c->wait_leader($s, 0);
	is("$l->{felix_name} $g", "$lname 1", "$s is led by $lname at generation 1");
	$c->wait_shipping($leader, $s, 0, 2, 30);
}
note("streams A = $sa, B = $sb; leader $lname, follower under test $fname");

# Every record acknowledged to a client: $acked{stream}{seq} = payload.
my %acked;

sub publish_one
{
	my ($node, $s, $payload) = @_;
	my $seq = $node->safe_psql('postgres',
		"SELECT (felix_publish('$s', '$payload', shard => 0)).seq");
	$acked{$s}{$seq} = $payload;
	return $seq;
}

sub shard_state
{
	my ($node, $s) = @_;
	return $c->try_psql($node,
		"SELECT next_seq || ' ' || coalesce(hwm::text, '-') FROM felix_shards "
		  . "WHERE stream = '$s' AND shard = 0", 5) // 'no answer';
}

sub follower_state
{
	my ($s, $who) = @_;
	return $n1->safe_psql('postgres',
		"SELECT state || ': ' || coalesce(last_error, '') FROM felix_replication "
		  . "WHERE stream = '$s' AND shard = 0 AND follower = '$who'");
}

my @five = map { "d-$_-" . ('y' x 40) } 1 .. 5;
for my $s (@streams)
{
	publish_one($leader, $s, "a-$_-" . ('x' x 40)) for 0 .. 19;
	is($leader->safe_psql('postgres',
			"SELECT string_agg(seq::text, ',' ORDER BY seq) FROM felix_publish_batch('$s', ARRAY["
			  . join(',', map { "'$_'" } @five) . "]::text[])"),
		'20,21,22,23,24', "$s: one felix_publish_batch call stored seqs 20..24");
	@{ $acked{$s} }{ 20 .. 24 } = @five;
	for my $node ($f, $n1)
	{
		my $st;
		ok(defined FelixCluster::poll(30, sub { ($st = shard_state($node, $s)) eq '25 24' }, 0.1),
			"$s: $node->{felix_name} holds all 25 records, all of them below its mark ($st)");
	}
}
my %fdir = map { $_ => shard_dir($f, $_, 0) } @streams;

# ---------------------------------------------------------------------
# B: F takes a generation-1 record at seq 25 as acknowledged
# ---------------------------------------------------------------------
is($f->safe_psql('postgres',
		replicate_call($f, $sb, 0, 1, 25, shipment_hex(25, 1, [ undef, 'phantom-25' ]), hwm => 26)),
	'stored 26', "B: $fname stores a crafted generation-1 record at seq 25, told the mark is 26");
is(shard_state($f, $sb), '26 25', "B: $fname counts seq 25 as acknowledged");
is($f->safe_psql('postgres', "SELECT payload FROM \"$sb\" WHERE seq = 25"), 'phantom-25',
	"B: $fname serves it to its readers");
my $bmark;
ok(defined FelixCluster::poll(20, sub { ($bmark = durable_mark($fdir{$sb}) // -1) == 26 }, 0.1),
	"B: ${fname}'s durable mark is 26 ($bmark)");

# ---------------------------------------------------------------------
# A: F stopped, the record at seq 22 rewritten on its disk
# ---------------------------------------------------------------------
$c->stop_node($f);
my $amark = durable_mark($fdir{$sa});
cmp_ok($amark // -1, '>=', 25, "A: ${fname}'s durable mark covers every record (hwm_end $amark)");
is(scalar durable_mark($fdir{$sb}), 26, "B: ${fname}'s durable mark is still 26 after it stopped");

my ($seg) = segment_files($fdir{$sa});
my ($batch) = grep { $_->{base_seq} == 20 } record_batches($seg);
ok($batch && $batch->{count} == 5, "A: ${fname}'s segment holds the batch [20, 25) as one batch");
my $data = read_file($seg);
my $body = substr($data, $batch->{offset} + 48, $batch->{body_len});
my $was = $five[2];
(my $now = $was) =~ s/^d-3-y/d-3-Z/;
my $at = index($body, $was);
ok($at >= 0, "A: the record at seq 22 is in that batch's body");
substr($body, $at, length $now) = $now;
# The same header with the new body CRC, a new header CRC, and a trailer
# carrying that header CRC: a batch recovery cannot tell from a real one.
my $hdr = substr($data, $batch->{offset}, 48);
substr($hdr, 44, 4) = pack('V', crc32c($body));
substr($hdr, 4, 4) = pack('V', crc32c(substr($hdr, 8)));
write_at($seg, $batch->{offset}, $hdr . $body . batch_trailer($hdr));
my ($check) = grep { $_->{base_seq} == 20 } record_batches($seg);
is($check->{body_crc}, crc32c($body), 'A: the rewritten batch carries a valid body checksum');

# ---------------------------------------------------------------------
# L stopped too: node1 leads generation 2 of both, beginning at seq 25
# ---------------------------------------------------------------------
$c->stop_node($leader);
my $g2;
for my $s (@streams)
{
	my ($new, $g) = $c->wait_leader($s, 0, min_generation => 2, timeout => 60);
	is("$new->{felix_name} $g", 'node1 2', "$s: node1, the only replica left, leads generation 2");
	$g2 = $g;
}
my %base = map { $_ => $c->metric_of($n1, $_) // 0 } qw(rebuilds_started rebuilds_completed);
$c->start_node($leader);
for my $s (@streams)
{
	my $st = '';
	ok(defined FelixCluster::poll(30, sub { ($st = follower_state($s, $lname)) =~ /^shipping: $/ }, 0.1),
		"$s: $lname, back, is shipped to by node1 ($st)");
}
is(publish_one($n1, $sb, 'real-25'), 25,
	"B: node1 writes its own seq 25 at generation 2 (acknowledged with $lname)");
$c->start_node($f);

# node1 ships to F: conflict, halted diverged.
my %pos = ($sa => 20, $sb => 25);
for my $s (@streams)
{
	my $rep = '';
	ok(defined FelixCluster::poll(60, sub { ($rep = follower_state($s, $fname)) =~ /^halted_/ }, 0.1),
		"$s: node1 halted $fname") or $c->diag_shard($s, 0);
	is($rep, "halted_diverged: its log differs from this leader's at the batch starting at seq $pos{$s}",
		"$s: felix_replication on node1 says halted_diverged at seq $pos{$s}");
	like(read_file($n1->logfile),
		qr/stream "$s" shard 0: follower "$fname" halted \(diverged\) at generation $g2: its log differs from this leader's at the batch starting at seq $pos{$s}/,
		"$s: node1's log: WARNING follower \"$fname\" halted (diverged) at generation $g2");
}

# felix_halted, the same on every node (fed by the control plane).
for my $node ($c->nodes)
{
	my $rows = '';
	my $want = join(';', map { "$_ $fname $g2 $pos{$_} diverged t" } sort @streams);
	ok(defined FelixCluster::poll(20, sub {
		$rows = $node->safe_psql('postgres',
			"SELECT string_agg(format('%s %s %s %s %s %s', stream, node, generation, \"position\", reason, since IS NOT NULL), ';' ORDER BY stream) "
			  . "FROM felix_halted WHERE stream IN ('$sa', '$sb')");
		return $rows eq $want;
	}, 0.1), "felix_halted on $node->{felix_name}: $fname halted diverged at generation $g2 in both, at 20 and 25")
	  or diag("felix_halted on $node->{felix_name}: '$rows'; want '$want'");
	for my $s (@streams)
	{
		like($node->safe_psql('postgres',
				"SELECT action FROM felix_halted WHERE stream = '$s' AND node = '$fname'"),
			qr/node1.*SELECT felix_rebuild\('$s', 0, '$fname'\)/,
			"$s: felix_halted on $node->{felix_name}: the action names felix_rebuild on node1");
	}
}

# F serves nothing from the difference on.
is($f->safe_psql('postgres', "SELECT count(*) || ' ' || max(seq) FROM \"$sa\""),
	'20 19', "A: $fname serves seqs 0..19 only");
is($f->safe_psql('postgres', "SELECT count(*) FROM \"$sa\" WHERE payload LIKE 'd-3-Z%'"),
	'0', "A: $fname does not serve its rewritten record");
is($f->safe_psql('postgres', "SELECT count(*) || ' ' || max(seq) FROM \"$sb\""),
	'25 24', "B: $fname serves seqs 0..24 only");
is($f->safe_psql('postgres', "SELECT count(*) FROM \"$sb\" WHERE payload = 'phantom-25'"),
	'0', "B: $fname no longer serves its phantom");
is(shard_state($f, $sb), '26 25', "B: $fname dropped nothing at or below its mark (its log still ends at 26)");

# ... across a restart too: where it differs is kept with its durable mark,
# and its leader ships nothing to a halted follower to say it again.
$c->stop_node($f);
$c->start_node($f);
is($f->safe_psql('postgres', "SELECT count(*) || ' ' || max(seq) FROM \"$sa\""),
	'20 19', "A: restarted, $fname still serves seqs 0..19 only");
is($f->safe_psql('postgres', "SELECT count(*) FROM \"$sb\" WHERE payload = 'phantom-25'"),
	'0', "B: restarted, $fname still does not serve its phantom");

# Not caught up, out of every quorum.
for my $s (@streams)
{
	is($c->state_query(
			"SELECT caught_up || ' ' || coalesce(halted, '-') FROM felix.replica_reports "
			  . "WHERE stream = '$s' AND shard = 0 AND follower = '$fname'"),
		'false diverged', "$s: the control plane has $fname halted diverged, not caught up");
}
is(publish_one($n1, $sa, 'q-1'), 25, "A: a quorum publish on node1 is acknowledged with node1 and $lname");
$c->pause_node($leader);
for my $s (@streams)
{
	my ($rc, $err) = psql_error($n1,
		"SET felix.quorum_timeout = '2s'; SELECT felix_publish('$s', 'q-unacked', shard => 0)");
	like($err, qr/ERROR:\s+55F01:/,
		"$s: with $lname paused, a quorum publish times out ($fname, halted, completes no quorum)");
}
$c->resume_node($leader);

like(follower_state($sa, $fname), qr/^halted_diverged/,
	'felix.rebuild_max_concurrent = 0: nothing rebuilt it on its own');
is($c->metric_of($n1, 'rebuilds_started') // 0, $base{rebuilds_started}, 'no rebuild was started');

# ---------------------------------------------------------------------
# The rebuilds, asked for by hand on the leader
# ---------------------------------------------------------------------
my ($frc, $ferr) = psql_error($f, "SELECT felix_rebuild('$sa', 0, '$fname')");
like($ferr, qr/ERROR:\s+55F02:.*not led by this node.*node1/s,
	'felix_rebuild on a node that does not lead the shard refuses, naming the leader');

my $k = 0;
for my $s (@streams)
{
	$k++;
	is($n1->safe_psql('postgres', "SELECT felix_rebuild('$s', 0, '$fname')"),
		'started', "$s: felix_rebuild('$s', 0, '$fname') on node1: started");
	my $done = FelixCluster::poll(60, sub {
		($c->metric_of($n1, 'rebuilds_completed') // 0) >= $base{rebuilds_completed} + $k }, 0.1);
	ok(defined $done, "$s: node1 completed the rebuild of $fname") or $c->diag_shard($s, 0);
	is($c->metric_of($n1, 'rebuilds_started'), $base{rebuilds_started} + $k, "$s: rebuilds_started counted it");
	is($c->metric_of($n1, 'rebuilds_completed'), $base{rebuilds_completed} + $k, "$s: rebuilds_completed counted it");
	cmp_ok($c->metric_of($f, 'copies_rebuilt') // 0, '>=', $k, "$s: $fname discarded its copy (copies_rebuilt)");

	my $want = $c->records($n1, $s, 0);
	ok(defined FelixCluster::poll(60, sub { $c->records($f, $s, 0) eq $want }, 0.2),
		"$s: $fname serves exactly the leader's records again")
	  or diag("node1:\n$want\n$fname:\n" . $c->records($f, $s, 0));
	my $same = FelixCluster::poll(30, sub { segment_digest($f, $s, 0) eq segment_digest($n1, $s, 0) }, 0.2);
	ok(defined $same, "$s: ${fname}'s segments hold byte-identical record batches to node1's")
	  or diag("node1:\n" . segment_digest($n1, $s, 0) . "$fname:\n" . segment_digest($f, $s, 0));
	is(join(',', map { "$_->[0]+$_->[1]g$_->[2]" } $c->batch_generations($f, $s, 0)),
		join(',', map { "$_->[0]+$_->[1]g$_->[2]" } $c->batch_generations($n1, $s, 0)),
		"$s: batch by batch, the same seqs, counts and generations");
}
like(read_file($f->logfile), qr/stream "$sb" shard 0: discarded its copy; the log now begins, empty, at seq 0/,
	"${fname}'s log says it discarded its copy");

ok(defined FelixCluster::poll(20, sub {
	!grep { $_->safe_psql('postgres', "SELECT count(*) FROM felix_halted") ne '0' } $c->nodes }, 0.1),
	'felix_halted is empty again on every node');

# No acknowledged record lost, on the leader or on F.
for my $s (@streams)
{
	for my $node ($n1, $f)
	{
		my %have = map { my ($q, $key, $p) = split /\|/, $_, 3; ($q => $p) }
		  split /\n/, $c->records($node, $s, 0);
		my @lost = grep { !defined $have{$_} || $have{$_} ne $acked{$s}{$_} }
		  sort { $a <=> $b } keys %{ $acked{$s} };
		is(scalar(@lost), 0,
			"$s: the " . scalar(keys %{ $acked{$s} }) . " acknowledged records are all at their seqs on $node->{felix_name}")
		  or diag("missing or different: @lost");
	}
}

# F counts towards quorums again: with L paused, node1 + F make a majority.
$c->pause_node($leader);
for my $s (@streams)
{
	my $seq = eval { publish_one($n1, $s, 'q-after') };
	ok(defined $seq, "$s: with $lname paused, a quorum publish is acknowledged with $fname") or diag($@);
}
$c->resume_node($leader);
for my $s (@streams)
{
	ok(defined FelixCluster::poll(30, sub {
		$f->safe_psql('postgres', "SELECT count(*) FROM \"$s\" WHERE payload = 'q-after'") eq '1' }, 0.1),
		"$s: $fname serves it");
}

$c->teardown;
felix_done_testing();
