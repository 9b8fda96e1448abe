# A follower's last record is compared before a leader appends after it,
# also when the leader's first shipment of a generation begins exactly at
# the follower's tail (found in CI by 132_rolling_upgrade: node2 kept its
# own unacknowledged record and took the next generation's records after
# it).
#
# An old leader A holds a record R at seq N that nobody adopted (written
# at generation 1, not acknowledged, then A died).  Generation 2 (B)
# writes two records of its own, N and N + 1, one batch each.  Generation
# 3 (C) takes over after B, so generation 3 begins at N + 2 and its leader
# ships to each follower from the batch holding N + 1 (one record below
# the generation's start).  A, started again, has its tail at exactly
# N + 1: nothing of that shipment overlaps A's log.  A used to append
# B's record N + 1 straight after R, and serve R as the acknowledged
# record at N -- and C's first, empty shipment of the generation carried
# a mark that already let A show R to its readers.  Now A refuses to
# append after a last record of another generation than the shipment's
# first without comparing it (it answers with a gap at its tail), and the
# first shipment of a generation moves no follower's mark.
#
# Part 2: when the record to compare is older than all the leader still
# holds (its retention trimmed it), the leader offers a copy instead of
# resending the same shipment for ever; the follower, holding records,
# halts needs_bootstrap and is rebuilt.
#
# Part 3: the rebuilt copy began again in the same server start, and
# leadership is handed to the third replica: its claim records the rebuilt
# copy's token as it is now (the other nodes' log ends are read for a
# take, not at every heartbeat).
#
# tap-etcd: skip.  Its subject is the follower's check of a shipment; the
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

my $c = FelixCluster->new(nodes => 4, conf => ["felix.segment_bytes = '64kB'"]);
my ($stream, @set) = $c->pick_stream_name('edge', 3, sub { !grep { $_ eq 'node1' } @_ });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
sub next_seq { return $c->next_seq($_[0], $stream); }

# R: written on A at seq 50, shipped nowhere, not acknowledged.
my ($a, $g1, $failed, $end) = $c->unadopted_record($stream, 50, @set);
my $an = $a->{felix_name};
ok($failed, "R at seq 50 on $an is not acknowledged");
is($end, '51', "$an held R at seq 50");

# Generation 2: B writes seqs 50 and 51, one batch each.
my ($b, $g2) = $c->wait_leader($stream, 0, min_generation => $g1 + 1, timeout => 30);
my $bn = $b->{felix_name};
my ($cn) = grep { $_ ne $an && $_ ne $bn } @set;
for my $i (1, 2)
{
	$b->safe_psql('postgres', "SELECT felix_publish('$stream', '{\"g2\": $i}'::jsonb, shard => 0)");
}
FelixCluster::poll(30, sub { next_seq($cn) eq '52' }, 0.1) or die "$cn not at 52";

# Generation 3: C, after B; it begins at 52 and ships from the batch at 51.
$c->kill_node($b);
my ($cc, $g3) = $c->wait_leader($stream, 0, min_generation => $g2 + 1, timeout => 30);
is($cc->{felix_name}, $cn, "$cn leads generation $g3");

# A returns with its tail at 51, where C's first shipment begins.  No
# publish happens meanwhile: what A serves must come from the overlap.
$c->start_node($an);
my ($want, $got);
ok(defined FelixCluster::poll(30, sub {
	$want = $cc->safe_psql('postgres', "SELECT seq, payload FROM \"$stream\" WHERE shard = 0 ORDER BY seq");
	$got = $a->safe_psql('postgres', "SELECT seq, payload FROM \"$stream\" WHERE shard = 0 ORDER BY seq");
	$got eq $want && ($want =~ tr/\n//) == 51 }, 0.2),
	"$an ends with exactly ${cn}'s records")
  or diag("$an serves:\n$got\n$cn serves:\n$want\n") || $c->diag_shard($stream, 0);
is($a->safe_psql('postgres', "SELECT count(*) FROM \"$stream\" WHERE shard = 0 AND payload ? 'R'"), '0',
	"$an serves no trace of R");
# the generation of every batch, as "base+count@generation"
sub generations { return join(' ', map { "$_->[0]+$_->[1]\@$_->[2]" } $c->batch_generations($_[0], $stream, 0)); }
is(generations($an), generations($cn), "$an holds the generations ${cn} holds, at the same seqs");
# repaired by the rule, not by a rebuild after a halt: a probe that let A
# show R to its readers made R sit below A's mark, where the comparison
# could only halt A as diverged
is($c->metric_of($an, 'copies_rebuilt') // 0, 0, "$an was not rebuilt");
like(slurp_file($a->logfile), qr/dropped records from seq 50 written at generation $g1/,
	"$an dropped R as an unadopted proposal");
like($cc->safe_psql('postgres',
	"SELECT state FROM felix_replication WHERE stream = '$stream' AND shard = 0 AND follower = '$an'"),
	qr/^shipping/, "$an is shipped to, not halted");

# Part 2: the record to compare is older than all the leader holds.  A2
# holds R at seq 3 (small records, one segment); generation 2 (B2) writes
# seq 3 and then, after its retention age, 4 and 5, each larger than a
# segment, and trims seqs 0-3 away: its log begins at 4, A2's tail.  A2
# asks for its record at 3 to be compared, which B2 no longer has: B2
# offers a copy beginning at 4, A2 (holding records) refuses and halts,
# and it is rebuilt.  Before, B2 shipped the same batch again for ever.
$c->start_node($bn);
# the placement below assumes every node alive, as the creation will see it
$c->wait_alive([ map { $c->name_of($_) } $c->nodes ]);
my ($s2, @set2) = $c->pick_stream_name('edgeold', 3, sub { !grep { $_ eq 'node1' } @_ });
$c->create_stream(1, $s2, replication_factor => 3, consistency => 'quorum',
	retention => '3 seconds');
my ($a2, $h1, $failed2, $end2) = $c->unadopted_record($s2, 3, @set2);
my $a2n = $a2->{felix_name};
ok($failed2, "$s2: R at seq 3 on $a2n is not acknowledged");
is($end2, '4', "$s2: $a2n held R at seq 3");
my ($b2, $h2) = $c->wait_leader($s2, 0, min_generation => $h1 + 1, timeout => 30);
sub big { my ($n, $i) = @_; $n->safe_psql('postgres',
	"SELECT felix_publish('$s2', jsonb_build_object('big', $i, 'pad', repeat('x', 70000)), shard => 0)"); }
big($b2, 3);
sleep 4;
big($b2, $_) for 4, 5;
$b2->safe_psql('postgres', "SELECT felix_enforce_retention('$s2')");
is($b2->safe_psql('postgres', "SELECT start_seq FROM felix_shards WHERE stream = '$s2' AND shard = 0"),
	'4', "$s2: the leader's log begins at seq 4, ${a2n}'s tail");
$c->start_node($a2n);
ok(defined FelixCluster::poll(60, sub {
	$want = $b2->safe_psql('postgres', "SELECT seq, payload->>'big' FROM \"$s2\" WHERE shard = 0 ORDER BY seq");
	$got = $a2->safe_psql('postgres', "SELECT seq, payload->>'big' FROM \"$s2\" WHERE shard = 0 ORDER BY seq");
	$got eq $want && $want eq "4|4\n5|5" }, 0.2),
	"$s2: $a2n ends with exactly the leader's records")
  or diag("$a2n serves:\n$got\nthe leader serves:\n$want\n") || $c->diag_shard($s2, 0);
is($a2->safe_psql('postgres', "SELECT count(*) FROM \"$s2\" WHERE shard = 0 AND payload ? 'R'"), '0',
	"$s2: $a2n serves no trace of R");
ok(($c->metric_of($a2n, 'copies_rebuilt') // 0) >= 1, "$s2: $a2n was rebuilt");
like(slurp_file($b2->logfile), qr/follower "$a2n" halted \(needs_bootstrap\).*its log ends at seq 4 and this leader's begins at seq 4/,
	"$s2: the leader says why $a2n halted");

# Part 3: the claim that takes a generation records each replica's copy as
# it is then.  A2's copy began again in its boot (the rebuild discarded
# it), so its token is its boot and that copy's epoch, no longer the
# boot's first.  The heartbeats of the node that takes read the other
# nodes' log ends only for a take (cp_heartbeat.c, takes_due): without
# that read its claim recorded what its session saw of A2 before.
my ($c2n) = grep { $_ ne $a2n && $_ ne $b2->{felix_name} } @set2;
my $a2_copy = sub {
	return $c->state_query("SELECT boot || '#' || split_part(split_part(e, '=', 2), ':', 3) "
		  . "FROM felix.nodes, unnest(ends) e WHERE name = '$a2n' AND e ~ '^$s2/0=[0-9]+:[0-9]+:[0-9]+:0\$'");
};
ok(defined FelixCluster::poll(30, sub { $a2_copy->() ne '' }, 0.2),
	"$s2: $a2n gives its log with a copy that is not its boot's first");
$c->wait_shipping($b2, $s2, 0, 2, 30);
$b2->safe_psql('postgres', "SELECT felix_transfer_leadership('$s2', 0, '$c2n')");
my ($l3, $h3) = $c->wait_leader($s2, 0, min_generation => $h2 + 1, timeout => 30);
is($l3->{felix_name}, $c2n, "$s2: $c2n takes generation $h3");
my $key = sprintf('shards/%s/%06d', $s2, 0);
my $recorded = '';
FelixCluster::poll(10, sub {
	$recorded = $c->state_query("SELECT t FROM felix.store_read('$key') s, "
		  . "jsonb_array_elements_text(s.value::jsonb->'taken_copy_nodes') WITH ORDINALITY n(node, i), "
		  . "jsonb_array_elements_text(s.value::jsonb->'taken_copy_tokens') WITH ORDINALITY t(t, j) "
		  . "WHERE s.key = '$key' AND (s.value::jsonb->>'taken_generation')::bigint = $h3 "
		  . "AND n.node = '$a2n' AND i = j");
	$recorded ne '' }, 0.2);
is($recorded, $a2_copy->(), "$s2: the claim of generation $h3 recorded ${a2n}'s copy as it is now");

$c->teardown;
felix_done_testing();
