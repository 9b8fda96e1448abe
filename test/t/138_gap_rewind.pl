# A follower that answers a shipment with a gap has its last record
# compared before the leader ships on (found by the fault harness,
# test/fault: seed 2005 of the long profile, embedded store).
#
# An old leader A holds a record R at seq N that nobody adopted: written
# there at generation 1, not acknowledged (its quorum wait timed out, its
# ship worker stopped), then A died.  Generation 2 (B) wrote its own
# records from N, and generation 3 (C) took over after B.  A, started
# again, is behind generation 3's start, so it answers C's first shipment
# with a gap at its tail N + 1.  The leader used to resume exactly there:
# R at N was never compared, stayed in A's log below the mark, and A
# served it as the acknowledged record at N.  Now the leader resumes one
# record below the tail, so R is compared with generation 2's record at N,
# found to be an unadopted proposal and dropped, and A ends with exactly
# the leader's records.
#
# tap-etcd: skip.  Its subject is a shipment answered with a gap; the
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

my $c = FelixCluster->new(nodes => 4);
my ($stream, @set) = $c->pick_stream_name('gap', 3, sub { !grep { $_ eq 'node1' } @_ });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
sub next_seq { return $c->next_seq($_[0], $stream); }

# R: written on A at seq 50, shipped nowhere, not acknowledged.
my ($a, $g1, $failed, $end) = $c->unadopted_record($stream, 50, @set);
my $an = $a->{felix_name};
ok($failed, "R at seq 50 on $an is not acknowledged");
is($end, '51', "$an held R at seq 50");

# Generation 2: B writes its own records from 50.
my ($b, $g2) = $c->wait_leader($stream, 0, min_generation => $g1 + 1, timeout => 30);
my $bn = $b->{felix_name};
my ($cn) = grep { $_ ne $an && $_ ne $bn } @set;
$b->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', jsonb_build_object('g2', i), shard => 0)) FROM generate_series(1, 20) i");
FelixCluster::poll(30, sub { next_seq($cn) eq '70' }, 0.1) or die "$cn not at 70";

# Generation 3: C, after B.
$c->kill_node($b);
my ($cc, $g3) = $c->wait_leader($stream, 0, min_generation => $g2 + 1, timeout => 30);
is($cc->{felix_name}, $cn, "$cn leads generation $g3");

# A returns, behind generation 3's start: it answers with a gap at 51.
$c->start_node($an);
# (what the new leader serves is read each time too: it may still be
# establishing its mark when A starts)
my ($want, $got);
ok(defined FelixCluster::poll(30, sub {
	$want = $cc->safe_psql('postgres', "SELECT seq, payload FROM \"$stream\" WHERE shard = 0 ORDER BY seq");
	$got = $a->safe_psql('postgres', "SELECT seq, payload FROM \"$stream\" WHERE shard = 0 ORDER BY seq");
	$got eq $want && ($want =~ tr/\n//) == 69 }, 0.2),
	"$an ends with exactly ${cn}'s records")
  or diag("$an serves:\n$got\n$cn serves:\n$want\n") || $c->diag_shard($stream, 0);
is($a->safe_psql('postgres', "SELECT count(*) FROM \"$stream\" WHERE shard = 0 AND payload ? 'R'"), '0',
	"$an serves no trace of R");

$c->teardown;
felix_done_testing();
