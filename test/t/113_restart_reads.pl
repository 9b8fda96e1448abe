# A restarted follower answers reads of acknowledged records at once.
#
# Every replica makes its shard's high-water mark durable (file "hwm" in
# the shard directory) every felix.heartbeat_interval (200 ms) and as its
# node worker exits cleanly; after a restart a follower serves reads up to
# that mark immediately.  (Before, a restarted follower showed nothing
# until the leader's next write -- 15 s or more on a quiet shard.)
#
# Two streams with replication factor 3 led by node1 (which also hosts the
# control plane), one with quorum and one with leader acknowledgement;
# the follower under test is node2.  For each way of going down:
#
#   - a clean stop (pg_ctl stop -m fast) and start;
#   - kill -9 of every process of the node at once, then start -- the mark
#     on disk may then be one heartbeat interval old, so the test waits
#     more than that (0.6 s) after the follower's mark reached the last
#     record before crashing it;
#
# the first query after the start (retried only while the server does not
# accept connections) must return every acknowledged record 0..N-1, with
# its payload, and felix_shards must show hwm N-1 -- with no publish in
# between.  The leader is kept from reaching the restarted follower
# (ALTER ROLE felix_node_node1 NOLOGIN on node2) until those reads are
# done, so the leader cannot re-send its mark first: what the follower
# serves comes from its own disk.  The test also reads the hwm file (two
# 16-byte slots {hwm_end, count, crc32c}; the valid one with the highest
# count wins) and checks that it holds N.
#
# Then the control and the other half of the fix: a follower whose hwm
# file is gone (removed while it was stopped) and that the leader cannot
# reach does not show the N records after the start (so the reads above
# came from the file); once the leader may log in again it re-sends its
# mark on reconnecting, with no new publish, and the follower shows all N.
# Throughout, a follower never shows more than the leader acknowledged,
# and what it shows is the leader's records.
#
# tap-etcd: skip.  Its subject is reads on a restarted follower; the
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
use Time::HiRes qw(time usleep);

my $c = FelixCluster->new(nodes => 3);

my ($sq) = $c->pick_stream_name('rr_q', 3, sub { $_[0] eq 'node1' });
my ($sl) = $c->pick_stream_name('rr_l', 3, sub { $_[0] eq 'node1' });
$c->create_stream(1, $sq, replication_factor => 3, consistency => 'quorum');
$c->create_stream(1, $sl, replication_factor => 3, consistency => 'leader');
my @streams = ($sq, $sl);
my %cons = ($sq => 'quorum', $sl => 'leader');

my $leader = $c->node(1);
for my $s (@streams)
{
	my ($who) = $c->wait_leader($s, 0);
	is($who->{felix_name}, 'node1', "$s ($cons{$s}): node1 leads");
	$c->wait_shipping($leader, $s, 0, 2);
}
my $f = $c->node(2);
my $fname = $f->{felix_name};
my %dir = map { $_ => shard_dir($f, $_, 0) } @streams;

# Publish $n records on shard 0 of every stream (acknowledged at the
# stream's consistency), tagged with $tag.
sub publish
{
	my ($tag, $n) = @_;
	for my $s (@streams)
	{
		$leader->safe_psql('postgres',
			"SELECT count(felix_publish('$s', jsonb_build_object('tag', '$tag', 'i', i), shard => 0)) "
			  . "FROM generate_series(1, $n) i");
	}
	return;
}

sub hwm_on
{
	my ($node, $s) = @_;
	my $r = $c->shard_row($node, $s, 0) or return undef;
	return $r->{hwm};
}

# Wait until node2's felix_shards shows hwm $want for every stream.
sub wait_follower_hwm
{
	my ($want, $what) = @_;
	for my $s (@streams)
	{
		my $seen;
		my $took = FelixCluster::poll(30, sub { ($seen = hwm_on($f, $s) // '') eq $want }, 0.05);
		ok(defined $took, "$s: $fname knows the mark is at seq $want ($what)")
		  or do { diag("$s: $fname shows hwm '$seen'"); $c->diag_shard($s, 0); };
	}
	return;
}

# The leader's records of a stream, "seq|key|payload" lines.
my %leader_records;

# Every record $fname serves of stream $s, on its first answer after a
# start: the query is retried only while the server does not accept
# connections; any other error is the answer (and fails the checks).
sub first_read
{
	my ($s) = @_;
	my ($out, $err);
	my $took = FelixCluster::poll(30,
		sub {
			($out, $err) = ('', '');
			my $rc = $f->psql('postgres',
				"SELECT seq || '|' || coalesce(key, '') || '|' || payload::text FROM \"$s\" WHERE shard = 0 ORDER BY seq",
				stdout => \$out, stderr => \$err, timeout => 10);
			return 1 if defined $rc && $rc == 0;
			return 0 if $err =~ /could not connect|connection to server|starting up|No such file or directory/;
			diag("$s: the first read on $fname failed: $err");
			$out = undef;
			return 1;
		},
		0.05);
	return defined $took ? $out : undef;
}

# Check one restart: what node2 served first, against the N records the
# leader acknowledged.
sub check_first_reads
{
	my ($how, $n, %first) = @_;
	for my $s (@streams)
	{
		my $got = $first{$s}{records};
		my @lines = defined $got && $got ne '' ? split(/\n/, $got) : ();
		my @want = (split /\n/, $leader_records{$s})[ 0 .. $n - 1 ];
		is(scalar(@lines), $n,
			"$s ($cons{$s}): after $how, ${fname}'s first read returns all $n acknowledged records");
		is_deeply(\@lines, \@want, "$s: they are seqs 0..@{[$n - 1]} with the leader's payloads")
		  or diag("first lines: @lines[0 .. ($#lines < 2 ? $#lines : 2)]");
		is($first{$s}{hwm}, $n - 1, "$s: felix_shards on $fname shows hwm @{[$n - 1]} at once");
	}
	return;
}

# The leader may not log in to node2 (so it cannot re-send its mark), or
# may again.
sub leader_may_ship
{
	my ($yes) = @_;
	$f->safe_psql('postgres',
		'ALTER ROLE felix_node_node1 ' . ($yes ? 'LOGIN' : 'NOLOGIN'));
	return;
}

# ---------------------------------------------------------------------
# Clean stop and start
# ---------------------------------------------------------------------
my $n = 50;
publish('a', $n);
$leader_records{$_} = $c->records($leader, $_, 0) for @streams;
is(hwm_on($leader, $_), $n - 1, "$_: the leader acknowledged seqs 0..@{[$n - 1]}") for @streams;
wait_follower_hwm($n - 1, 'before the clean stop');
is(scalar(split /\n/, $c->records($f, $_, 0)), $n, "$_: $fname serves $n records before the stop")
  for @streams;
usleep(600_000);	# > felix.heartbeat_interval: the mark is on disk
for my $s (@streams)
{
	ok(-e "$dir{$s}/hwm", "$s: the shard directory on $fname has an hwm file");
	is(scalar durable_mark($dir{$s}), $n, "$s: it holds the mark $n (records 0..@{[$n - 1]})");
}

leader_may_ship(0);
$c->stop_node($f);
my %next_before = map { $_ => $c->shard_row($leader, $_, 0)->{next_seq} } @streams;
$c->start_node($f);
my %first;
for my $s (@streams)
{
	$first{$s}{records} = first_read($s);
	$first{$s}{hwm} = hwm_on($f, $s);
}
check_first_reads('a clean stop and start', $n, %first);
is($c->shard_row($leader, $_, 0)->{next_seq}, $next_before{$_}, "$_: nothing was published meanwhile")
  for @streams;
leader_may_ship(1);

# ---------------------------------------------------------------------
# kill -9 and start
# ---------------------------------------------------------------------
# More records, so the mark on disk must be the periodic one (the clean
# stop's exit wrote the old one).
my $m = 30;
publish('b', $m);
$n += $m;
$leader_records{$_} = $c->records($leader, $_, 0) for @streams;
is(hwm_on($leader, $_), $n - 1, "$_: the leader acknowledged seqs 0..@{[$n - 1]}") for @streams;
wait_follower_hwm($n - 1, 'before the crash');
usleep(600_000);	# > felix.heartbeat_interval
is(scalar durable_mark($dir{$_}), $n, "$_: the hwm file on $fname holds $n before the crash") for @streams;

leader_may_ship(0);
$c->kill_node($f);
$c->start_node($f);
%first = ();
for my $s (@streams)
{
	$first{$s}{records} = first_read($s);
	$first{$s}{hwm} = hwm_on($f, $s);
}
check_first_reads('kill -9 and start', $n, %first);
is($c->shard_row($leader, $_, 0)->{next_seq}, $next_before{$_} + $m, "$_: nothing was published meanwhile")
  for @streams;
leader_may_ship(1);

# ---------------------------------------------------------------------
# The leader re-sends its mark on reconnecting
# ---------------------------------------------------------------------
# A follower that lost its hwm file (removed while it was stopped) knows
# no mark after the start: while the leader cannot reach it, it does not
# show the acknowledged records (the control for the first reads above);
# once the leader can, the leader re-sends its mark on reconnecting, with
# no new publish, and the follower shows them all.
leader_may_ship(0);
$c->stop_node($f);
unlink "$dir{$_}/hwm" or die "unlink $dir{$_}/hwm: $!" for @streams;
$c->start_node($f);
for my $s (@streams)
{
	# The control for the checks above: with neither the file nor the
	# leader, the follower cannot know what was acknowledged, and must
	# not show it all -- so those first reads came from the file.
	my $got = first_read($s);
	my $k = defined $got && $got ne '' ? scalar(my @l = split /\n/, $got) : 0;
	cmp_ok($k, '<', $n, "$s: without its hwm file and unreachable by the leader, $fname does not show the $n records ($k)");
}
leader_may_ship(1);
for my $s (@streams)
{
	my ($got, $seen_more) = ('', 0);
	my $took = FelixCluster::poll(30,
		sub {
			$got = $c->records($f, $s, 0);
			my $k = scalar(my @l = split /\n/, $got);
			$seen_more = 1 if $k > $n;
			return $k == $n;
		},
		0.05);
	ok(defined $took, "$s: without its hwm file, $fname shows all $n records once the leader reconnects")
	  or diag("$s: $fname shows " . scalar(my @l = split /\n/, $got) . ' records');
	note(sprintf('%s: %.2f s after the start', $s, $took)) if defined $took;
	is($got, $leader_records{$s}, "$s: the leader's records");
	ok(!$seen_more, "$s: $fname never showed more than the leader acknowledged");
}
is($c->shard_row($leader, $_, 0)->{next_seq}, $next_before{$_} + $m, "$_: still nothing published")
  for @streams;

# The follower takes new records as before.
publish('c', 5);
$n += 5;
wait_follower_hwm($n - 1, 'after new publishes');
is($c->records($f, $_, 0), $c->records($leader, $_, 0), "$_: $fname serves exactly the leader's records")
  for @streams;

$c->teardown;
felix_done_testing();
