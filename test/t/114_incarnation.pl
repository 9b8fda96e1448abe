# A node restarted with an empty (or an older) felix data directory is a
# new, empty replica: it is not granted leadership, it is rebuilt from the
# leader, and what its old copy held is never counted -- no acknowledged
# record is lost.  Each felix data directory has an incarnation; the
# control plane records it, voids the replica reports of an incarnation
# that is gone, grants no lease to a leader's new incarnation, and refuses
# (55F06) a directory restored from an older copy of itself, which then
# takes a new incarnation and has its shard copies rebuilt.  Three nodes,
# replication factor 3 quorum streams, default lease settings.
#
# A. The leader's directory wiped.  The leader (node2) leads a stream whose
#    follower node3 ranks above node1 in placement; node3 is stopped and
#    falls behind (node1 alone completes quorums), then the leader is
#    stopped, its felix directory removed, and it is restarted together
#    with node3.  The control plane's tick (node1's duty worker) is
#    held (SIGSTOP, taken while it waits between ticks) until the wiped
#    leader has heartbeated after its lease lapsed: it is exactly "the last
#    leader alive again", except that its data is gone.  Then: it is not
#    granted leadership (the promotion names node1, the one follower that
#    holds every acknowledged record; the control plane never logs node2
#    leading), no replica report counts a follower caught up while it lacks
#    an acknowledged record (the wiped node, still named as generation G's
#    leader, must not speak for followers of a log it no longer has), every
#    acknowledged record is readable on the new leader, the wiped node is
#    shipped the whole log again and ends with the same records and
#    byte-identical record batches, and reads on it never returned anything
#    that is not a prefix of the shard's log.
# B. A follower's directory wiped.  The control plane logs the new data
#    directory, no report of the follower is counted (incarnation and
#    caught_up) until it holds what the report says, and it ends identical.
# C. A follower's directory restored from an older copy (copied aside
#    while stopped, the server started once, more records published, the
#    server stopped, the copy put back and started: the copy's start count
#    is then the one the control plane last saw) while its leader crashes,
#    the control plane's tick held as in A: its heartbeat is refused
#    55F06, it takes a new incarnation and says so, it is not promoted in
#    place of the follower that holds every acknowledged record, no report
#    counts it caught up beyond what it holds, its copy is rebuilt, and all
#    three nodes end identical with every acknowledged record.
# D. The same restore with two starts in between (a start count strictly
#    lower than the control plane saw), the leader alive: 55F06, a new
#    incarnation, needs_bootstrap, an automatic rebuild, identical.
#
# tap-etcd: skip.  Its subject is the incarnation rules of the heartbeat
# and the duty holder; the control-plane store plays the same part in it
# as in the scripts that run on both stores (FELIX_STORE=etcd runs it on
# etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use File::Path ();
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# Only node1 runs the control-plane duties, so that stopping its duty
# worker holds every promotion (FelixCluster::hold_duties; node1's heartbeats go on).
my $c = FelixCluster->new(nodes => 3,
	node_conf => { 2 => ['felix.control_plane_duties = off'], 3 => ['felix.control_plane_duties = off'] });
my $cp = $c->cp;

# ---------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------

sub cpq { my ($sql) = @_; return $c->state_query($sql); }

sub log_off { my ($node) = @_; return -s $node->logfile; }

# Whose log has what the control plane's rules log about node $node: the
# control plane's server (embedded), or the node itself, whose processes
# run the rules with etcd.
sub rule_log { my ($node) = @_; return $c->store eq 'etcd' ? $node : $cp; }
sub log_since { my ($node, $off) = @_; return substr(read_file($node->logfile), $off); }

sub felix_dir { my ($node) = @_; return $node->data_dir . '/felix'; }

sub identity
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		'SELECT name || \'|\' || incarnation FROM felix.node_identity()');
}

sub incarnation_file
{
	my ($node) = @_;
	my $txt = read_file(felix_dir($node) . '/incarnation');
	$txt =~ /incarnation (\S+)\nstarts (\d+)/ or die "bad incarnation file: $txt";
	return ($1, $2);
}

sub cp_node
{
	my ($name) = @_;
	return cpq("SELECT incarnation || '|' || starts || '|' || "
		  . "(last_heartbeat >= clock_timestamp() - interval '1500 ms') "
		  . "FROM felix.nodes WHERE name = '$name'");
}

sub next_seq
{
	my ($node, $stream) = @_;
	return $node->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

# seq => payload of what $node serves.
sub served
{
	my ($node, $stream) = @_;
	my %h;
	for (split /\n/, $c->records($node, $stream, 0))
	{
		my ($s, $k, $p) = split /\|/, $_, 3;
		$h{$s} = $p;
	}
	return \%h;
}

# Acknowledged records not readable on $node at their seq with their payload.
sub missing_acks
{
	my ($node, $stream, $acks) = @_;
	my $have = served($node, $stream);
	return grep { !defined $have->{$_} || $have->{$_} ne $acks->{$_} } sort { $a <=> $b } keys %$acks;
}

# The raw bytes of every record batch of shard 0 on $node, in log order
# (headers carry the leader's generation and timestamp: shipped unchanged).
sub batch_bytes
{
	my ($node, $stream) = @_;
	my $dir = shard_dir($node, $stream, 0);
	my $out = '';
	for my $f (segment_files($dir))
	{
		my $data = read_file($f);
		$out .= substr($data, $_->{offset}, $_->{size}) for record_batches($f);
	}
	return $out;
}

# Does every node serve the leader's records (up to the leader's end) and
# hold the same record batches?  Returns (bool, what was seen).
sub identical_now
{
	my ($stream, $leader, @nodes) = @_;
	my $end = next_seq($leader, $stream);
	my $want = $c->records($leader, $stream, 0);
	my $wbytes = batch_bytes($leader, $stream);
	my $seen = "$leader->{felix_name} next_seq $end";
	my $ok = 1;
	for my $n (@nodes)
	{
		my $ns = next_seq($n, $stream);
		$seen .= "; $n->{felix_name} next_seq $ns";
		$ok &&= $ns eq $end && $c->records($n, $stream, 0) eq $want
		  && batch_bytes($n, $stream) eq $wbytes;
	}
	return ($ok, $seen);
}

# Wait (bounded) until identical_now; $each runs at every poll.
sub wait_identical
{
	my ($stream, $leader, $secs, $each, @nodes) = @_;
	my $seen = '';
	my $took = FelixCluster::poll($secs, sub {
		$each->() if $each;
		(my $ok, $seen) = identical_now($stream, $leader, @nodes);
		return $ok;
	}, 0.2);
	diag("not identical after $secs s: $seen") unless defined $took;
	return defined $took;
}

# Every read sampled on a node must be a prefix of the shard's final log.
sub check_samples
{
	my ($what, $final, @samples) = @_;
	my @bad = grep { substr($final, 0, length $_) ne $_ || ($_ ne '' && length $_ < length $final && substr($final, length $_, 1) ne "\n") } @samples;
	ok(!@bad, "$what: every one of " . scalar(@samples) . " reads was a prefix of the shard's log")
	  or diag("first bad read:\n" . substr($bad[0], 0, 2000));
}

sub wipe
{
	my ($node) = @_;
	File::Path::rmtree(felix_dir($node));
	die 'felix directory still there' if -e felix_dir($node);
}

sub reports
{
	my ($stream) = @_;
	return cpq("SELECT coalesce(string_agg(format('%s inc %s g%s acked_end %s caught_up %s halted %s', "
		  . "follower, left(follower_incarnation, 8), generation, acked_end, caught_up, coalesce(halted, '-')), '; ' "
		  . "ORDER BY follower), '') FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0");
}

sub assignment
{
	my ($stream) = @_;
	return split /\|/, cpq("SELECT generation || '|' || leader || '|' || coalesce(leader_incarnation, '') "
		  . "FROM felix.assignments WHERE stream = '$stream' AND shard = 0");
}

# The final log of a shard on $node as reads show it ("seq||payload").
sub final_log
{
	my ($node, $stream) = @_;
	return join("\n", map { my ($s, $k, $p) = split /\|/, $_, 3; "$s||$p" }
		  split /\n/, $c->records($node, $stream, 0));
}

sub read_on
{
	my ($node, $stream) = @_;
	return $c->try_psql($node,
		"SELECT seq || '||' || payload::text FROM \"$stream\" WHERE shard = 0 ORDER BY seq", 5);
}

# A sampler of what the control plane would count of $fnode's copy: once
# the control plane has heard from the node's present start (felix.nodes
# holds the incarnation and start count its directory now has), a report
# naming that incarnation and saying caught_up must say no more than the
# node holds (its tail, read after the report) and at least $floor (every
# record acknowledged before).  Violations are pushed onto @$viol, reads
# of the node onto @$reads; %$seen counts the reports by incarnation.
sub report_sampler
{
	my ($stream, $fnode, $floor, $viol, $reads, $seen) = @_;
	my $fname = $fnode->{felix_name};
	return sub {
		my $row = eval { cpq(
			"SELECT rr.follower_incarnation || '|' || rr.acked_end || '|' || rr.caught_up || '|' "
			  . "|| n.incarnation || '|' || n.starts || '|' || rr.generation || '|' || rr.leader "
			  . "FROM felix.replica_reports rr JOIN felix.nodes n ON n.name = rr.follower "
			  . "WHERE rr.stream = '$stream' AND rr.shard = 0 AND rr.follower = '$fname'") } // '';
		my ($inc_now, $starts_now) = eval { incarnation_file($fnode) };
		my $tail = eval { next_seq($fnode, $stream) };
		my $r = read_on($fnode, $stream);
		push @$reads, $r if defined $r;
		return unless $row ne '' && defined $tail && $tail ne '' && defined $starts_now;
		my ($inc, $ae, $cu, $cp_inc, $cp_starts, $gen, $by) = split /\|/, $row;
		$seen->{"inc " . substr($inc, 0, 8) . " caught_up $cu"}++ if $seen;
		push @$viol, "report by $by at g$gen: acked_end $ae caught_up $cu for $fname incarnation $inc (start $cp_starts, as the node is), but it holds $tail records and $floor were acknowledged"
		  if $inc eq $cp_inc && $cp_inc eq $inc_now && $cp_starts == $starts_now
		  && $cu eq 'true' && ($ae > $tail || $ae < $floor);
	};
}

# ---------------------------------------------------------------------
# A. The leader's felix data directory wiped
# ---------------------------------------------------------------------
{
	my ($stream, @set) = $c->pick_stream_name('incl', 3,
		sub { $_[0] eq 'node2' && $_[1] eq 'node3' });
	note("A: stream $stream, placement @set");
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($leader, $g) = $c->wait_leader($stream, 0);
	is($leader->{felix_name}, 'node2', 'A: node2 leads');
	$c->wait_shipping($leader, $stream, 0, 2);
	my ($n1, $n2, $n3) = map { $c->node($_) } 1 .. 3;
	my %acks;
	publish_acked($n2, $stream, 'a1', 40, \%acks);
	ok(defined FelixCluster::poll(30, sub { next_seq($n1, $stream) == 40 && next_seq($n3, $stream) == 40 }),
		'A: both followers hold the first 40 records');

	# node3 falls behind: node1 alone completes the quorums.
	$c->stop_node($n3);
	publish_acked($n2, $stream, 'a2', 40, \%acks);
	my $rep = '';
	ok(defined FelixCluster::poll(30, sub {
		$rep = reports($stream);
		return $rep =~ /node1 inc \S+ g$g acked_end 80 caught_up t/ && $rep =~ /node3 \S+ \S+ g$g acked_end \d+ caught_up f/
		  && $c->shard_row($n1, $stream, 0)->{hwm} eq '79';
	}, 0.1), 'A: the control plane knows node1 holds all 80 records and node3 does not; node1 knows all are acknowledged')
	  or diag("reports: $rep");
	note("A: reports before the wipe: $rep");
	my ($old_inc) = split /\|/, cp_node('node2');
	my $cp_off = log_off($cp);
	my %cp_off = map { ($_ => log_off($_)) } $c->nodes;

	# Hold the tick; stop the leader, wipe its directory, restart it and node3.
	$c->hold_duties($cp);
	$c->stop_node($n2);
	# the stopped leader's last claim is older than now: its lease ends within a lease
	my $lapsed_at = time + 1.0;
	wipe($n2);
	$c->start_node($n2);
	$c->start_node($n3);
	my $new_inc = (split /\|/, identity($n2))[1];
	isnt($new_inc, $old_inc, 'A: the wiped node2 has a new incarnation');
	my (@reads, @viol, @other_reads);
	my @samplers = map { report_sampler($stream, $_, 80, \@viol, \@other_reads) } $n1, $n3;
	my $lead_seen = '';
	my $sample = sub {
		my $r = $c->shard_row($n2, $stream, 0);
		$lead_seen .= "g$r->{generation} lease $r->{lease_remaining_ms}; "
		  if $r && $r->{role} eq 'leader' && ($r->{lease_remaining_ms} || 0) > 0;
		my $out = read_on($n2, $stream);
		push @reads, $out if defined $out;
		$_->() for @samplers;
	};
	# Both up again, heartbeating after the lease lapsed, with the tick held.
	my $seen = '';
	ok(defined FelixCluster::poll(60, sub {
		$sample->();
		my ($inc2, undef, $alive2) = split /\|/, cp_node('node2');
		my (undef, undef, $alive3) = split /\|/, cp_node('node3');
		$seen = "node2 $inc2 alive $alive2, node3 alive $alive3";
		return $inc2 eq $new_inc && $alive2 eq 'true' && $alive3 eq 'true'
		  && time > $lapsed_at + 0.5;
	}, 0.1), 'A: the wiped leader and node3 heartbeat after the lease lapsed, with no tick')
	  or diag($seen);
	# What the wiped node does meanwhile, for a few beats.
	FelixCluster::poll(2, sub { $sample->(); 0 }, 0.1);
	my $rep_held = reports($stream);
	note("A: reports while the tick was held: $rep_held");
	note('A: node2 felix_shards while held: ' . join(' ', map { "$_" } %{ $c->shard_row($n2, $stream, 0) // {} }));
	note('A: node2 felix_replication while held: '
		  . ($c->try_psql($n2, "SELECT string_agg(format('%s acked %s %s %s', follower, acked_seq, state, last_error), '; ') FROM felix_replication WHERE stream = '$stream'", 5) // ''));
	my ($ag, $al, $ai) = assignment($stream);
	is("$ag $al", "$g node2", 'A: while held, generation G still names node2');
	isnt($ai, $new_inc, 'A: the generation belongs to the old incarnation');

	$c->release_duties;
	my ($g2, $l2);
	ok(defined FelixCluster::poll(30, sub { ($g2, $l2) = assignment($stream); $g2 > $g }, 0.1),
		'A: a new generation is published once the tick runs')
	  or $c->diag_shard($stream, 0);
	isnt($l2, 'node2', "A: the wiped node2 is not granted leadership again (generation $g2 leader $l2)");
	is($l2, 'node1', 'A: node1, which holds every acknowledged record, leads it');
	my $new = $c->node($l2);
	my ($who) = eval { $c->wait_leader($stream, 0, min_generation => $g2, timeout => 30) };
	ok(defined $who && $who->{felix_name} eq $l2, "A: $l2 leads generation $g2 with a live lease")
	  or $c->diag_shard($stream, 0);
	my @miss = missing_acks($new, $stream, \%acks);
	is(scalar(@miss), 0, "A: every acknowledged record (80) is readable on $l2")
	  or diag("missing seqs: @miss[0 .. ($#miss < 20 ? $#miss : 20)]");

	# More records, then everybody converges; the wiped node is shipped the
	# whole log again.
	my $pub_on = $who // $new;
	eval { publish_acked($pub_on, $stream, 'a3', 20, \%acks); 1 } or diag("A: publish after failover: $@");
	my $ok = wait_identical($stream, $pub_on, 90, $sample, grep { $_ != $pub_on } $c->nodes);
	ok($ok, 'A: all three nodes end with the same records and byte-identical record batches')
	  or $c->diag_shard($stream, 0);
	@miss = missing_acks($n2, $stream, \%acks);
	is(scalar(@miss), 0, 'A: the wiped node2 serves every acknowledged record (' . scalar(keys %acks) . ')');
	is(scalar(@viol), 0, 'A: no report counted a follower caught up that lacked an acknowledged record')
	  or diag(join("\n", @viol[0 .. ($#viol < 5 ? $#viol : 5)]));
	check_samples('A: reads on the wiped node2', final_log($pub_on, $stream), @reads);
	is($lead_seen, '', 'A: node2 never led the shard with a live lease after the wipe');
	unlike(log_since($cp, $cp_off), qr/stream "$stream" shard 0: node2 leads generation/,
		'A: the control plane never made node2 leader again');
	is($c->metric_of($n2, 'promotions'), 0, 'A: node2 counted no promotion');
	like(log_since(rule_log($n2), $cp_off{$n2}), qr/node "node2" has a new felix data directory \(incarnation \Q$new_inc\E replaces \Q$old_inc\E\)/,
		'A: the control plane logged node2\'s new data directory');
}

# ---------------------------------------------------------------------
# B. A follower's felix data directory wiped
# ---------------------------------------------------------------------
{
	my ($stream, @set) = $c->pick_stream_name('incf', 3, sub { $_[0] eq 'node1' });
	note("B: stream $stream, placement @set");
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($leader, $g) = $c->wait_leader($stream, 0);
	is($leader->{felix_name}, 'node1', 'B: node1 leads');
	$c->wait_shipping($leader, $stream, 0, 2);
	my ($n2, $n3) = map { $c->node($_) } 2, 3;
	my %acks;
	publish_acked($leader, $stream, 'b1', 50, \%acks);
	my $rep = '';
	ok(defined FelixCluster::poll(30, sub {
		$rep = reports($stream);
		return $rep =~ /node3 inc \S+ g$g acked_end 50 caught_up t/;
	}, 0.1), 'B: node3 holds the 50 records and is reported caught up') or diag($rep);
	my ($old_inc) = split /\|/, cp_node('node3');
	my ($cp_off, $l_off) = (log_off($cp), log_off($leader));
	my %cp_off = map { ($_ => log_off($_)) } $c->nodes;

	$c->stop_node($n3);
	wipe($n3);
	$c->start_node($n3);
	my $new_inc = (split /\|/, identity($n3))[1];
	isnt($new_inc, $old_inc, 'B: the wiped node3 has a new incarnation');
	my (@viol, @reads, %seen);
	my $each = report_sampler($stream, $n3, 50, \@viol, \@reads, \%seen);
	ok(defined FelixCluster::poll(30, sub { $each->(); (split /\|/, cp_node('node3'))[0] eq $new_inc }, 0.05),
		'B: the control plane records node3\'s new incarnation');
	# Right after, on every stream: a report the control plane would count
	# (node3's new incarnation, caught up) says no more than node3 holds.
	my @counted = split /\n/, cpq("SELECT rr.stream || '|' || rr.acked_end FROM felix.replica_reports rr "
		  . "JOIN felix.nodes n ON n.name = rr.follower "
		  . "WHERE rr.follower = 'node3' AND rr.follower_incarnation = n.incarnation AND rr.caught_up AND rr.shard = 0");
	my @false = grep { my ($s, $ae) = split /\|/; $ae > next_seq($n3, $s) } @counted;
	is(scalar(@false), 0, 'B: right after, no report counts node3 caught up beyond what its new directory holds (' . scalar(@counted) . ' counted)')
	  or diag("@false");
	publish_acked($leader, $stream, 'b2', 30, \%acks);
	ok(wait_identical($stream, $leader, 60, $each, $n2, $n3),
		'B: node3 is shipped the whole log again and ends identical (records and record batches)');
	ok(defined FelixCluster::poll(30, sub {
		$each->();
		$rep = reports($stream);
		return $rep =~ /node3 inc \Q@{[substr($new_inc, 0, 8)]}\E g$g acked_end 80 caught_up t/;
	}, 0.1), 'B: and is then reported caught up under its new incarnation') or diag($rep);
	is(scalar(@viol), 0, 'B: no report counted node3 caught up beyond what it held')
	  or diag(join("\n", @viol[0 .. ($#viol < 5 ? $#viol : 5)]));
	note('B: reports of node3 seen: ' . join(', ', map { "$_ x$seen{$_}" } sort keys %seen));
	is(scalar(missing_acks($n3, $stream, \%acks)), 0, 'B: node3 serves every acknowledged record');
	check_samples('B: reads on the wiped node3', final_log($leader, $stream), @reads);
	like(log_since(rule_log($n3), $cp_off{$n3}), qr/node "node3" has a new felix data directory \(incarnation \Q$new_inc\E replaces \Q$old_inc\E\)/,
		'B: the control plane logged node3\'s new data directory');
	like(log_since($leader, $l_off),
		qr/stream "$stream" shard 0: follower "node3" has a new felix data directory \(incarnation \Q$new_inc\E\); shipping to it starts over/,
		'B: the leader started shipping to node3 over');
}

# Copy $node's felix directory aside (server stopped); returns the path.
sub copy_aside
{
	my ($node, $tag) = @_;
	my $to = "$PostgreSQL::Test::Utils::tmp_check/felix_copy_$tag";
	File::Path::rmtree($to);
	system('cp', '-a', felix_dir($node), $to) == 0 or die "cp -a: $?";
	return $to;
}

sub restore_copy
{
	my ($node, $from) = @_;
	wipe($node);
	system('cp', '-a', $from, felix_dir($node)) == 0 or die "cp -a: $?";
}

sub wait_cp_starts
{
	my ($name, $inc, $starts) = @_;
	my $seen = '';
	my $ok = FelixCluster::poll(30, sub {
		$seen = cp_node($name);
		return $seen eq "$inc|$starts|true";
	}, 0.1);
	die "felix.nodes for $name: $seen, expected $inc|$starts|true" unless defined $ok;
}

# ---------------------------------------------------------------------
# C. A follower restored from an older copy of its directory (started
#    once since the copy), while its leader crashes
# ---------------------------------------------------------------------
{
	my ($stream, @set) = $c->pick_stream_name('incr', 3,
		sub { $_[0] eq 'node2' && $_[1] eq 'node3' });
	note("C: stream $stream, placement @set");
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($leader, $g) = $c->wait_leader($stream, 0);
	is($leader->{felix_name}, 'node2', 'C: node2 leads');
	$c->wait_shipping($leader, $stream, 0, 2);
	my ($n1, $n2, $n3) = map { $c->node($_) } 1 .. 3;
	my %acks;
	publish_acked($n2, $stream, 'c1', 40, \%acks);
	ok(defined FelixCluster::poll(30, sub { next_seq($n1, $stream) == 40 && next_seq($n3, $stream) == 40 }),
		'C: both followers hold the first 40 records');

	$c->stop_node($n3);
	my $copy = copy_aside($n3, 'c');
	my ($inc, $k) = incarnation_file($n3);
	note("C: copied node3's felix directory aside at incarnation $inc, start $k");
	$c->start_node($n3);
	wait_cp_starts('node3', $inc, $k + 1);
	publish_acked($n2, $stream, 'c2', 40, \%acks);
	my $rep = '';
	ok(defined FelixCluster::poll(30, sub {
		$rep = reports($stream);
		return $rep =~ /node1 inc \S+ g$g acked_end 80 caught_up t/ && $rep =~ /node3 inc \S+ g$g acked_end 80 caught_up t/
		  && $c->shard_row($n1, $stream, 0)->{hwm} eq '79' && $c->shard_row($n3, $stream, 0)->{hwm} eq '79';
	}, 0.1), 'C: both followers hold all 80 records, know them acknowledged, and are reported caught up') or diag($rep);
	$c->stop_node($n3);
	restore_copy($n3, $copy);
	note("C: node3's directory is the old copy again (start $k; the control plane saw start " . ($k + 1) . ')');

	$c->hold_duties($cp);
	my $l3 = log_off($n3);
	my $cp_off = log_off($cp);
	my %cp_off = map { ($_ => log_off($_)) } $c->nodes;
	$c->kill_node($n2);
	# the crashed leader's last claim is older than now: its lease ends within a lease
	my $lease_end = time + 1.0;
	$c->start_node($n3);
	my (@viol, @reads);
	my $each = report_sampler($stream, $n3, 80, \@viol, \@reads);
	my $seen = '';
	my $alive = FelixCluster::poll(30, sub {
		$each->();
		$seen = cp_node('node3');
		return $seen =~ /\|true$/ && time > $lease_end + 0.5;
	}, 0.1);
	ok(defined $alive, 'C: the restored node3 heartbeats after the lease of the crashed leader lapsed') or diag($seen);
	FelixCluster::poll(1.5, sub { $each->(); 0 }, 0.1);
	my $id = identity($n3);
	note("C: node3 is $id; felix.nodes says $seen; reports: " . reports($stream));
	like(log_since($n3, $l3), qr/is an older copy of incarnation \Q$inc\E; it is now incarnation/,
		'C: node3 logs that its directory is an older copy and takes a new incarnation');
	isnt((split /\|/, $id)[1], $inc, 'C: felix.node_identity() on node3 names a new incarnation');
	like(log_since(rule_log($n3), $cp_off{$n3}), qr/(ERROR|LOG):\s+(55F06: )?node "node3": its felix data directory is an older copy of incarnation \Q$inc\E/,
		'C: the control plane refused its heartbeat (55F06)');

	$c->release_duties;
	my ($g2, $l2);
	ok(defined FelixCluster::poll(30, sub { ($g2, $l2) = assignment($stream); $g2 > $g }, 0.1),
		'C: a new generation is published') or $c->diag_shard($stream, 0);
	is($l2, 'node1', "C: node1, which holds every acknowledged record, leads generation $g2, not the restored node3");
	my ($who) = eval { $c->wait_leader($stream, 0, min_generation => $g2, timeout => 30) };
	my $new = $who // $c->node($l2);
	my @miss = missing_acks($new, $stream, \%acks);
	is(scalar(@miss), 0, "C: every acknowledged record (80) is readable on $l2")
	  or diag("missing seqs: @miss[0 .. ($#miss < 20 ? $#miss : 20)]");

	# node2 comes back; everybody converges (the restored copy rebuilt).
	$c->start_node($n2);
	eval { publish_acked($new, $stream, 'c3', 20, \%acks); 1 } or diag("C: publish after failover: $@");
	ok(wait_identical($stream, $new, 120, $each, grep { $_ != $new } $c->nodes),
		'C: all three nodes end with the same records and byte-identical record batches')
	  or $c->diag_shard($stream, 0);
	for my $node ($c->nodes)
	{
		my @m = missing_acks($node, $stream, \%acks);
		is(scalar(@m), 0, "C: $node->{felix_name} serves every acknowledged record (" . scalar(keys %acks) . ')');
	}
	is(scalar(@viol), 0, 'C: no report counted the restored node3 caught up beyond what it held')
	  or diag(join("\n", @viol[0 .. ($#viol < 5 ? $#viol : 5)]));
	check_samples('C: reads on the restored node3', final_log($new, $stream), @reads);
}

# ---------------------------------------------------------------------
# D. A follower restored from an older copy with two starts since (its
#    start count is lower than the control plane saw), the leader alive
# ---------------------------------------------------------------------
{
	my ($stream, @set) = $c->pick_stream_name('incd', 3, sub { $_[0] eq 'node1' });
	note("D: stream $stream, placement @set");
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($leader, $g) = $c->wait_leader($stream, 0);
	is($leader->{felix_name}, 'node1', 'D: node1 leads');
	$c->wait_shipping($leader, $stream, 0, 2, 60);
	my ($n2, $n3) = map { $c->node($_) } 2, 3;
	my %acks;
	publish_acked($leader, $stream, 'd1', 30, \%acks);
	ok(defined FelixCluster::poll(30, sub { next_seq($n2, $stream) == 30 }), 'D: node2 holds the first 30 records');

	$c->stop_node($n2);
	my $copy = copy_aside($n2, 'd');
	my ($inc, $k) = incarnation_file($n2);
	note("D: copied node2's felix directory aside at incarnation $inc, start $k");
	for my $round (1, 2)
	{
		$c->start_node($n2);
		wait_cp_starts('node2', $inc, $k + $round);
		publish_acked($leader, $stream, "d2_$round", 30, \%acks);
		ok(defined FelixCluster::poll(30, sub { next_seq($n2, $stream) == 30 + 30 * $round }),
			"D: start " . ($k + $round) . ": node2 holds " . (30 + 30 * $round) . ' records');
		$c->stop_node($n2);
	}
	restore_copy($n2, $copy);
	my ($l_off, $n2_off, $cp_off) = (log_off($leader), log_off($n2), log_off($cp));
	my %cp_off = map { ($_ => log_off($_)) } $c->nodes;
	my %m0 = map { $_ => $c->metric_of($leader, $_) // 0 } qw(rebuilds_started rebuilds_completed);
	$c->start_node($n2);
	my (@viol, @reads);
	my $each = report_sampler($stream, $n2, 90, \@viol, \@reads);
	my $new_inc = '';
	ok(defined FelixCluster::poll(30, sub {
		$each->();
		my ($ci, $cs, $ca) = split /\|/, cp_node('node2');
		$new_inc = $ci;
		return $ci ne $inc && $ca eq 'true';
	}, 0.1), 'D: the restored node2 registers under a new incarnation');
	like(log_since(rule_log($n2), $cp_off{$n2}),
		qr/(ERROR|LOG):\s+(55F06: )?node "node2": its felix data directory is an older copy of incarnation \Q$inc\E \(start @{[$k + 1]} after start @{[$k + 2]}\)/,
		'D: the control plane refused its heartbeat (55F06), naming both start counts');
	like(log_since($n2, $n2_off), qr/is an older copy of incarnation \Q$inc\E; it is now incarnation \Q$new_inc\E/,
		'D: node2 logs that its directory is an older copy and takes the new incarnation');
	is((split /\|/, identity($n2))[1], $new_inc, 'D: felix.node_identity() on node2 names it');
	ok(defined FelixCluster::poll(60, sub { $each->(); log_since($leader, $l_off) =~ /follower "node2" halted \(needs_bootstrap\)/ }, 0.1),
		'D: the leader halts node2\'s copy needs_bootstrap');
	ok(wait_identical($stream, $leader, 120, $each, $n2, $n3),
		'D: node2 is rebuilt and ends identical (records and record batches)')
	  or $c->diag_shard($stream, 0);
	ok(($c->metric_of($n2, 'copies_rebuilt') // 0) >= 1, 'D: node2 counted its copy rebuilt');
	# the leader declares a rebuild complete at its next policy pass
	ok(defined FelixCluster::poll(10, sub {
		($c->metric_of($leader, 'rebuilds_completed') // 0) > $m0{rebuilds_completed} }, 0.1),
		'D: the leader counted a rebuild completed (automatic: felix.rebuild_max_concurrent = 1)');
	is(read_file(shard_dir($n2, $stream, 0) . '/copy_of'), "$new_inc\n",
		'D: the rebuilt copy is stamped with the new incarnation');
	is(scalar(missing_acks($n2, $stream, \%acks)), 0, 'D: node2 serves every acknowledged record (' . scalar(keys %acks) . ')');
	is(scalar(@viol), 0, 'D: no report counted the restored node2 caught up beyond what it held')
	  or diag(join("\n", @viol[0 .. ($#viol < 5 ? $#viol : 5)]));
	check_samples('D: reads on the restored node2', final_log($leader, $stream), @reads);
}

$c->teardown;
felix_done_testing();
