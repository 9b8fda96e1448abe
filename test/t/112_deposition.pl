# Deposition: a leader that learns of a newer generation stops leading at
# once, and a publish waiting at the old generation fails (55F02) -- it
# never succeeds because another leadership's records moved the mark.
#
# The interleaving, built for real on a replication factor 3 quorum stream
# led by L (not node1, which hosts the control plane); its followers are
# node1 and X:
#
#  1. Four sessions publish on L, each every 0.2 s (catch mode,
#     felix.quorum_timeout 30 s).  X is paused (SIGSTOP): L's quorum is
#     L + node1 from now on.
#  2. L is cut off from node1 -- the control plane and the only follower
#     it can reach -- by ALTER ROLE felix_node_<L> NOLOGIN on node1 and
#     terminating that role's sessions there (with etcd as the store, L's
#     etcd user also loses its role, so L cannot reach the store either).  Each session's next publish
#     (within 0.2 s) is admitted under L's still-live lease, stored on L
#     alone, and waits for a quorum that cannot come.  The four waiting
#     backends are stopped (SIGSTOP of those processes only) while L
#     still leads G.
#  3. L's lease lapses; the control plane promotes node1 (the follower
#     last reported caught up) at G+1.  node1 ships G+1 to L, which is
#     still reachable by its peers: L steps down (step_downs, its log says
#     "this node stops leading generation G").
#  4. X is woken and node1 publishes records at G+1 (quorum node1 + X) at
#     the very seqs L's waiting records occupy; LOGIN is restored, L
#     follows G+1, drops its unadopted records and stores node1's in their
#     place, and its high-water mark moves past the end of every waiting
#     publish.  The test checks that all of this happened (the
#     preconditions of step 5).
#  5. Only then are the waiting backends continued (SIGCONT).
#
# Why the waiters are stopped, and why the test fails if the waiter rule
# is broken: the deposition wakes every waiter at once, so a waiter that
# runs promptly sees that L no longer leads before any G+1 record can move
# L's mark.  The bug lives in the window between the step-down and the
# waiter running -- a waiter descheduled (the failure model admits process
# suspension) while the new leader's records move the mark past the seqs
# it waits for.  Stopping the waiters holds that window open until the
# mark has moved.  A waiter that looked at the high-water mark before its
# role and generation (or at the mark alone) then returns success with the
# seq of a record that is not its own: the held publishes would be
# reported acknowledged, with seqs whose records on the new leader carry
# node1's payloads, and the checks "each held publish failed with 55F02"
# and "every acknowledged record is on the new leader at its seq with its
# payload" fail.  A waiter that goes by its own leadership's word
# (acknowledged at G up to its end) fails with 55F02.
#
# Then: nothing was acknowledged after the waiters were stopped; every
# record L acknowledged is on node1 at its seq, with its payload, below
# where G+1 begins; the G+1 records node1 acknowledged are there too; and
# once LOGIN is back the three nodes converge on identical records and
# byte-identical segments.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# Backends this test stopped: continued whatever happens, before the
# servers are stopped (a stopped process cannot act on a signal).
my @stopped;
END { kill 'CONT', @stopped if @stopped; }

# A lease of 3 s: steps 1-2 (the cut, the four waiters found and stopped)
# must fit in L's last lease, and on a loaded 2-core machine with etcd
# they took 1.03 s once -- past the default 1 s lease and margin, so that
# node1 had been promoted and L had stepped down by the time the test
# read L's row.
my $c = FelixCluster->new(nodes => 3, etcd_auth => 1, conf => ["felix.lease_duration = '3s'"]);
my $cp = $c->cp;

my ($stream, @set) = $c->pick_stream_name('depose', 3, sub { $_[0] ne 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
my $lname = $leader->{felix_name};
is($lname, $set[0], "the leader is the placement's first node ($set[0]), not node1");
my ($x) = grep { $_->{felix_name} ne $lname && $_->{felix_name} ne 'node1' } $c->nodes;
my $xname = $x->{felix_name};
my $n1 = $c->node(1);
note("stream $stream: $lname leads generation $g; followers node1 and $xname");
$c->wait_shipping($leader, $stream, 0, 2);

sub row { my ($k) = @_; return $c->shard_row($k, $stream, 0); }

# Give up on the rest (an assertion has already failed the script).
my $pub;
sub finish_early
{
	$c->diag_shard($stream, 0);
	kill 'CONT', @stopped if @stopped;
	@stopped = ();
	$c->stop_publishers($pub, 0) if $pub;
	$c->teardown;
	felix_done_testing();
	exit;
}

sub lead_role
{
	my ($k) = @_;
	my $r = row($k) or return '?';
	return "$r->{role} g$r->{generation}";
}

# 1. Publishers on L; X paused.
$pub = $c->start_publishers(
	node      => $leader,
	stream    => $stream,
	shard     => 0,
	sessions  => 4,
	count     => 1000000,
	seconds   => 120,
	catch     => 1,
	err_sleep => 0.05,
	sleep     => 0.2,
	settings  => "SET felix.quorum_timeout = '30s'; SET application_name = 'depose_pub';",
	tag       => 'dep');
ok($c->wait_acks($pub, 40, 30), "$lname acknowledged quorum publishes");
$c->pause_node($x);
my $acked_at_pause = $c->ack_count($pub);
ok($c->wait_acks($pub, $acked_at_pause + 20, 30),
	"with $xname paused, $lname still acknowledges (quorum $lname + node1)");

# 2. Cut L off from node1 (a follower, and with the embedded store the
# control plane) and from the control-plane store (etcd: its etcd user
# loses its role).
my $downs_before = $c->metric_of($leader, 'step_downs') // 0;
my $role = "felix_node_$lname";
$cp->safe_psql('postgres', "ALTER ROLE $role NOLOGIN");
$c->cut_from_store($leader) if $c->store eq 'etcd';
my $t_cut = time;
$cp->safe_psql('postgres',
	"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = '$role'");
note("cut $lname off from node1 after " . $c->ack_count($pub) . ' acknowledgements');

# The four sessions waiting for a quorum on L: all four in an Extension
# wait, twice 0.15 s apart, with nothing appended in between.
sub waiters
{
	return $leader->safe_psql('postgres',
		"SELECT (SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity "
		  . "WHERE application_name = 'depose_pub' AND wait_event_type = 'Extension') "
		  . "|| ' ' || (SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0)");
}
my $waiting = '';
my $took = FelixCluster::poll(10, sub {
	my $w1 = waiters();
	return 0 unless $w1 =~ /^(\d+,){3}\d+ \d+$/;
	usleep(150_000);
	$waiting = waiters();
	return $waiting eq $w1;
}, 0.02);
$waiting =~ s/ .*//;
ok(defined $took, "all four publishing sessions on $lname wait (pids $waiting)")
  or finish_early();
my @pids = split /,/, $waiting;
kill 'STOP', @pids;
push @stopped, @pids;
my $t_stop = time;
# The step-down count first, then the row: a step-down after the count
# shows in the row, so "leader" there means none happened before either.
my $downs_at_stop = $c->metric_of($leader, 'step_downs') // 0;
my $r_stop = row($leader);
is("$r_stop->{role} g$r_stop->{generation}", "leader g$g",
	"$lname still led generation $g when its waiters were stopped (they saw no step-down)");
is($downs_at_stop, $downs_before, 'no step-down yet');
my $l_hwm  = $r_stop->{hwm};
my $l_next = $r_stop->{next_seq};
note(sprintf('stopped %d waiters %.3f s after the cut; %s holds seqs up to %d, acknowledged up to %s',
	scalar(@pids), $t_stop - $t_cut, $lname, $l_next - 1, $l_hwm));
cmp_ok($l_next - 1, '>', $l_hwm, "$lname holds records above its mark (the waiters' records)");

# 3. The control plane promotes node1 at G+1; L steps down.
my ($new, $g2);
eval { ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30); 1 }
  or diag($@);
ok(defined $new && $new->{felix_name} eq 'node1', "node1 leads generation G+1 = " . ($g + 1));
finish_early() unless defined $new;
is($g2, $g + 1, 'at G+1');
my $down = FelixCluster::poll(20, sub {
	($c->metric_of($leader, 'step_downs') // 0) > $downs_before && row($leader)->{role} eq 'follower';
}, 0.05);
ok(defined $down, "$lname stepped down on learning of generation G+1 (step_downs, felix_shards role)")
  or $c->diag_shard($stream, 0);
like(read_file($leader->logfile),
	qr/this node stops leading generation $g: a shipment of generation @{[$g + 1]} arrived/,
	"$lname logged that it stops leading generation $g");

# 4. X back; node1 publishes at G+1 over the seqs of L's waiting records.
$c->resume_node($x);
my $g1_start = row($n1)->{next_seq};
note("generation G+1 begins at seq $g1_start on node1; ${lname}'s waiting records are at seqs "
	  . ($l_hwm + 1) . '..' . ($l_next - 1));
my $first;
ok(defined FelixCluster::poll(30, sub {
	$first = $c->try_psql($n1,
		"SELECT (felix_publish('$stream', jsonb_build_object('tag', 'g1', 'i', 0), shard => 0)).seq", 10);
	return defined $first && $first ne '';
}, 0.2), "node1 acknowledges a quorum publish at G+1 (with $xname)")
  or finish_early();
my $k = ($l_next - $g1_start) + 5;
$k = 10 if $k < 10;
my $seqs = $n1->safe_psql('postgres',
	"SELECT string_agg((felix_publish('$stream', jsonb_build_object('tag', 'g1', 'i', i), shard => 0)).seq::text, ',') "
	  . "FROM generate_series(1, $k) i");
my %g1_acked = ($first => '{"i": 0, "tag": "g1"}');
my @s = split /,/, $seqs;
$g1_acked{ $s[ $_ - 1 ] } = qq({"i": $_, "tag": "g1"}) for 1 .. $k;
note("node1 acknowledged " . scalar(keys %g1_acked) . " records at G+1, seqs $first.." . $s[-1]);

# LOGIN back: L follows G+1 and its mark passes every waiting record.
$cp->safe_psql('postgres', "ALTER ROLE $role LOGIN");
$c->mend_store($leader) if $c->store eq 'etcd';
my $r;
$took = FelixCluster::poll(30, sub {
	$r = row($leader);
	return $r->{role} eq 'follower' && $r->{generation} == $g + 1 && $r->{hwm} ne ''
	  && $r->{hwm} >= $l_next - 1;
}, 0.05);
ok(defined $took, "$lname follows G+1 and its mark passed the end of every waiting publish (hwm >= "
	  . ($l_next - 1) . ')')
  or do { diag("$lname: role $r->{role} g$r->{generation} hwm '$r->{hwm}' next_seq $r->{next_seq}"); $c->diag_shard($stream, 0); };

# The precondition that makes this a test: some waiting record's seq now
# holds a G+1 record on node1 (and on L, whose mark passed it: L's copy is
# compared with node1's below).
my %gen_of;
for my $b ($c->batch_generations($n1, $stream, 0))
{
	$gen_of{$_} = $b->[2] for $b->[0] .. $b->[0] + $b->[1] - 1;
}
my @replaced = grep { ($gen_of{$_} // 0) == $g + 1 } $l_hwm + 1 .. $l_next - 1;
ok(scalar(@replaced) > 0,
	'seqs of waiting records now hold G+1 records on node1: ' . join(',', @replaced));
like(read_file($leader->logfile),
	qr/dropped records from seq \d+ written at generation $g, which generation @{[$g + 1]} did not adopt/,
	"$lname dropped its unadopted records of generation $g");

# 5. Continue the waiters.
my $t_cont = time;
kill 'CONT', @pids;
@stopped = ();
my %held;    # w -> the outcome of the publish that was waiting
$took = FelixCluster::poll(30, sub {
	%held = ();
	for my $o ($c->acks($pub), $c->errors($pub))
	{
		next unless defined $o->{t} && defined $o->{t_start};
		$held{ $o->{w} } = $o if $o->{t_start} < $t_stop && $o->{t} > $t_stop;
	}
	return keys(%held) == 4;
}, 0.05);
ok(defined $took, 'each of the four waiting publishes returned after SIGCONT');
usleep(300_000);
$c->stop_publishers($pub, 0);

for my $w (sort keys %held)
{
	my $o = $held{$w};
	my $what = defined $o->{seq} ? "acknowledged at seq $o->{seq}" : "$o->{sqlstate}: $o->{message}";
	ok(!defined $o->{seq} && $o->{sqlstate} eq '55F02'
		  && $o->{message} =~ /no longer leads generation $g\b/,
		"session $w: the publish waiting at generation $g failed with 55F02 'no longer leads generation $g' ($what)");
	cmp_ok($o->{t}, '>=', $t_cont, "session $w: and returned only after SIGCONT");
}

my @acks = $c->acks($pub);
my @late = grep { $_->{t} > $t_stop } @acks;
is(scalar(@late), 0, 'nothing was acknowledged on the old leader after its waiters were stopped');
diag("late ack: seq $_->{seq} (w $_->{w} i $_->{i}) at $_->{t}") for @late[ 0 .. ($#late < 4 ? $#late : 4) ];
note(scalar(@acks) . " records acknowledged by $lname at generation $g");

# Every acknowledged record is on node1, at its seq, with its payload.
my $recs = $c->records($n1, $stream, 0);
my %have = map { my ($seq, $key, $p) = split /\|/, $_, 3; ($seq => $p) } split /\n/, $recs;
my @missing = grep { ($have{ $_->{seq} } // '') ne $_->{payload} } @acks;
is(scalar(@missing), 0, "every record $lname acknowledged is on node1 at its seq with its payload");
diag("seq $_->{seq}: acknowledged $_->{payload}, node1 has " . ($have{ $_->{seq} } // 'nothing'))
  for @missing[ 0 .. ($#missing < 4 ? $#missing : 4) ];
my @at_g1 = grep { $_->{seq} >= $g1_start } @acks;
is(scalar(@at_g1), 0, "every record $lname acknowledged lies below where G+1 begins ($g1_start)");
my @g1_missing = grep { ($have{$_} // '') ne $g1_acked{$_} } keys %g1_acked;
is(scalar(@g1_missing), 0, 'every record node1 acknowledged at G+1 is there with its payload');

# Convergence: the three nodes hold the same records, byte for byte.
my $want = '';
$took = FelixCluster::poll(30, sub {
	my $r1 = row($n1);
	$want = "$r1->{next_seq}/$r1->{hwm}";
	return 0 unless $r1->{hwm} ne '' && $r1->{hwm} == $r1->{next_seq} - 1;
	for my $node ($leader, $x)
	{
		my $rn = row($node);
		return 0 unless "$rn->{next_seq}/$rn->{hwm}" eq $want && $rn->{generation} == $g + 1;
	}
	return 1;
}, 0.1);
ok(defined $took, "$lname and $xname caught up with node1 at G+1 (next_seq/hwm $want)")
  or $c->diag_shard($stream, 0);
is($c->records($leader, $stream, 0), $recs, "${lname} serves exactly node1's records");
is($c->records($x, $stream, 0), $recs, "$xname serves exactly node1's records");
my @ref = $c->segment_bytes($n1, $stream, 0);
for my $node ($leader, $x)
{
	my @got = $c->segment_bytes($node, $stream, 0);
	ok(@got == @ref
		  && !grep({ $got[$_][0] ne $ref[$_][0] || $got[$_][1] ne $ref[$_][1] } 0 .. $#ref),
		"$node->{felix_name}'s segments are byte-identical to node1's ("
		  . join(', ', map { "$_->[0]: " . length($_->[1]) . ' bytes' } @got) . ')');
}
is(lead_role($leader), 'follower g' . ($g + 1), "$lname is a follower at G+1");

$c->teardown;
felix_done_testing();
