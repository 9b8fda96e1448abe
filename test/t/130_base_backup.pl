# Nodes restored from a base backup (pg_basebackup of the node's data
# directory, taken while it served) rejoin as what they are: copies older
# than what they last reported.  Three nodes, a replication factor 3
# quorum stream; the felix data directory is inside PGDATA (the default),
# so the backup carries it, copied while records were being appended.
#
# A. A follower is backed up while publishes go on, 10,000 more records
#    are acknowledged, and the follower is stopped and its data directory
#    replaced by the backup, with one batch in the middle of its copy torn
#    (as a hot copy can).  Started again, it discards the damaged copy
#    rather than refusing to serve, catches up from the leader, serves
#    every acknowledged record and ends with the leader's record batches,
#    byte for byte.
# B. The leader is backed up the same way, 10,000 more records are
#    acknowledged (the third node stopped meanwhile, so the leader and one
#    follower complete every quorum), the leader is killed and restored
#    from its backup.  The control plane promotes the follower that holds
#    every acknowledged record, never the restored node, which was the
#    last leader but now holds 10,000 records less than it reported.  The
#    restored node catches up and ends byte-identical; only then does a
#    leadership transfer to it succeed, and it leads with nothing lost.
#    The restored server knows it starts from a base backup (its
#    backup_label) and takes a new incarnation: its copies are rebuilt.
# C. B again with a crash-consistent file-system snapshot of the leader
#    (taken while every process of it is stopped) instead of
#    pg_basebackup: nothing tells the node it is a copy, and only the log
#    end it gives with its heartbeats keeps the leadership from it.
#
# tap-etcd: skip.  Its subject is nodes restored from base backups; the
# control-plane store plays the same part in it as in the scripts that
# run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::RecursiveCopy;
use File::Path qw(rmtree);
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

# pg_basebackup needs a WAL sender (the test nodes are set up without).
my $c = FelixCluster->new(nodes => 3, conf => [ 'wal_level = replica', 'max_wal_senders = 4' ]);

# node1 hosts the embedded control plane, whose own backup is another
# matter (docs/operations.md): restore node2 and node3 only.  node2 leads.
my ($stream) = $c->pick_stream_name('bb', 3, sub { $_[0] eq 'node2' && $_[1] eq 'node1' });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
is($leader->{felix_name}, 'node2', 'node2 leads the stream');
$c->wait_shipping($leader, $stream, 0, 2);
my ($node1, $node2, $node3) = $c->nodes;

# Every acknowledged record so far, seq => payload.
my %acked;
sub note_acks
{
	$acked{ $_->{seq} } = $_->{payload} for map { $c->acks($_) } @_;
	return;
}

# Acknowledged records that $node does not serve at their seq.
sub missing_on
{
	my ($node) = @_;
	my %have;
	for (split /\n/, $c->records($node, $stream, 0))
	{
		my ($seq, $k, $p) = split /\|/, $_, 3;
		$have{$seq} = $p;
	}
	return grep { ($have{$_} // '') ne $acked{$_} } sort { $a <=> $b } keys %acked;
}

sub next_seq
{
	my ($node) = @_;
	my $r = $c->shard_row($node, $stream, 0) or return -1;
	return $r->{next_seq};
}

# Wait (bounded) until $node serves the leader's records up to the
# leader's end and holds the same segment bytes.
sub wait_identical
{
	my ($node, $lead, $secs) = @_;
	my $seen = '';
	my $took = FelixCluster::poll($secs, sub {
		my ($ne, $le) = (next_seq($node), next_seq($lead));
		$seen = "$node->{felix_name} next_seq $ne, $lead->{felix_name} next_seq $le";
		return 0 unless $ne == $le && $le > 0;
		my @a = $c->segment_bytes($node, $stream, 0);
		my @b = $c->segment_bytes($lead, $stream, 0);
		return 0 unless @a == @b;
		for my $i (0 .. $#a)
		{
			return 0 unless $a[$i][0] eq $b[$i][0] && $a[$i][1] eq $b[$i][1];
		}
		return 1;
	}, 0.2);
	diag("not identical after $secs s: $seen") unless defined $took;
	return defined $took;
}

# A base backup of $node taken while $pub publishes; returns its path.
sub backup_while_serving
{
	my ($node, $name, $pub) = @_;
	my $before = $c->ack_count($pub);
	$node->backup($name);
	my $after = $c->ack_count($pub);
	ok($after > $before, "$node->{felix_name}'s base backup was taken while records were acknowledged ($before -> $after)");
	return $node->backup_dir . "/$name";
}

# The end of the log a shard directory holds: after the last whole batch.
sub copy_end
{
	my ($dir) = @_;
	my $end = 0;
	for my $f (segment_files($dir))
	{
		my @b = read_batches($f);
		$end = $b[-1]{base_seq} + $b[-1]{count} if @b;
	}
	return $end;
}

# Replace $node's data directory by the backup at $dir (the server is
# stopped; $shard_dir is where the shard's copy lives in it) and start
# it.  Returns where the restored copy's log ends.
# With $tear, one batch in the middle of the copy is damaged first, as a
# hot copy can tear a batch that was being written while the ones after
# it were copied whole.
sub restore_and_start
{
	my ($node, $dir, $shard_dir, $tear) = @_;
	my $pgdata = $node->data_dir;
	rmtree($pgdata);
	PostgreSQL::Test::RecursiveCopy::copypath($dir, $pgdata);
	chmod 0700, $pgdata;
	ok(-d $shard_dir, "$node->{felix_name}'s backup holds its copy of the shard");
	my $end = copy_end($shard_dir);
	if ($tear)
	{
		my ($seg) = segment_files($shard_dir);
		my @b = read_batches($seg);
		die "too few batches in $seg to tear one" if @b < 3;
		my $mid = $b[ int(@b / 2) ];
		flip_byte($seg, $mid->{offset} + FelixTest::BATCH_HEADER_BYTES + int($mid->{body_len} / 2));
		note("tore the batch at seq $mid->{base_seq} of $seg; " . scalar(@b) . ' batches in it');
	}
	$c->start_node($node);
	return $end;
}

# Publish until $n more records than now are acknowledged (bounded).
sub publish_more
{
	my ($on, $n, $tag) = @_;
	my $pub = $c->start_publishers(node => $on, stream => $stream, shard => 0,
		sessions => 4, count => 1000000, seconds => 120, tag => $tag);
	ok($c->wait_acks($pub, $n, 120), "$n more records acknowledged ($tag)");
	$c->stop_publishers($pub, 0);
	note_acks($pub);
	return;
}

# --- A. A follower restored from a base backup ---------------------------

my $pub = $c->start_publishers(node => $node2, stream => $stream, shard => 0,
	sessions => 2, count => 1000000, seconds => 120, tag => 'a0');
ok($c->wait_acks($pub, 500, 30), 'records are acknowledged before the backup');
my $b3 = backup_while_serving($node3, 'follower', $pub);
$c->stop_publishers($pub, 0);
note_acks($pub);
publish_more($node2, 10_000, 'a1');

my $dir3 = shard_dir($node3, $stream, 0);
$c->stop_node($node3, 'immediate');
my $lead_end = next_seq($node2);
my $log3 = -s $node3->logfile;
my $end3 = restore_and_start($node3, $b3, $dir3, 1);
note("node3 restarted from a backup whose log ends at $end3; the leader's at $lead_end");
ok($end3 < $lead_end - 10_000, 'the restored follower starts more than 10,000 records behind the leader');

# It catches up while publishes go on.
$pub = $c->start_publishers(node => $node2, stream => $stream, shard => 0,
	sessions => 2, count => 1000000, seconds => 120, tag => 'a2');
ok($c->wait_acks($pub, 500, 60), 'publishes go on while the restored follower rejoins');
$c->stop_publishers($pub, 0);
note_acks($pub);
ok(wait_identical($node3, $node2, 90), 'the restored follower ends byte-identical to the leader');
like(substr(read_file($node3->logfile), $log3),
	qr/its copy, made under an older incarnation of this node, is damaged; it is discarded/,
	'the torn copy was discarded, not served');
my @miss = missing_on($node3);
is(scalar(@miss), 0, 'the restored follower serves every one of ' . scalar(keys %acked) . ' acknowledged records')
  or diag("missing seqs @miss[0 .. ($#miss < 9 ? $#miss : 9)]");

# --- B and C. The leader restored from a copy --------------------------

# A crash-consistent copy of $node's data directory, as a file-system
# snapshot gives: every process of the server stopped (SIGSTOP) while the
# files are copied, then woken.  No backup_label: to the server, starting
# from it looks like a restart after a crash.
sub snapshot_while_paused
{
	my ($node, $name, $pub) = @_;
	my $dir = $node->backup_dir . "/$name";
	$c->pause_node($node);
	PostgreSQL::Test::RecursiveCopy::copypath($node->data_dir, $dir);
	$c->resume_node($node);
	unlink "$dir/postmaster.pid";
	ok($c->wait_acks($pub, $c->ack_count($pub) + 100, 30),
		"records are acknowledged after $node->{felix_name}'s snapshot");
	return $dir;
}

# node2 leads and node3 is up.  Copy node2 ($take), stop node3 (node2 and
# node1 complete every quorum from here on, so node1 is the one node
# besides node2 with every acknowledged record), acknowledge 10,000 more
# records, kill node2 and start it from the copy.
sub restore_leader
{
	my ($kind, $take) = @_;
	my ($l0, $g0) = $c->leader_of($stream, 0, $node1);
	is($l0, 'node2', "$kind: node2 leads at generation $g0");
	my $pub = $c->start_publishers(node => $node2, stream => $stream, shard => 0,
		sessions => 2, count => 1000000, seconds => 120, tag => "$kind-0");
	ok($c->wait_acks($pub, 500, 30), "$kind: records are acknowledged before the copy");
	my $copy = $take->($pub);
	$c->stop_publishers($pub, 0);
	note_acks($pub);

	$c->stop_node($node3, 'immediate');
	publish_more($node2, 10_000, "$kind-1");
	my $reported = next_seq($node2);
	my $dir2 = shard_dir($node2, $stream, 0);

	$c->kill_node($node2);
	my %log_off = map { $_->{felix_name} => -s $_->logfile } ($node1, $node2);
	my $end2 = restore_and_start($node2, $copy, $dir2);
	note("$kind: node2 restarted from a copy whose log ends at $end2; it reported $reported");
	ok($end2 < $reported - 10_000, "$kind: the restored leader holds more than 10,000 records less than it reported");

	# The control plane promotes node1; the restored node2 never leads.
	my ($new, $g2);
	eval { ($new, $g2) = $c->wait_leader($stream, 0, min_generation => $g0 + 1, timeout => 60); 1 }
	  or diag($@);
	ok(defined $new && $new == $node1, "$kind: node1, which holds every acknowledged record, is promoted")
	  or $c->diag_shard($stream, 0);
	ok(wait_identical($node2, $node1, 90), "$kind: the restored leader catches up and ends byte-identical to node1");
	my %since = map { $_->{felix_name} => substr(read_file($_->logfile), $log_off{ $_->{felix_name} }) } ($node1, $node2);
	unlike($since{node1} . $since{node2}, qr/stream "\Q$stream\E" shard 0: node2 leads generation/,
		"$kind: the control plane never granted the restored node leadership");
	my ($l_now, $g_now) = $c->leader_of($stream, 0, $node1);
	is($l_now, 'node1', "$kind: node1 still leads after the restored node caught up");
	my @miss = missing_on($node2);
	is(scalar(@miss), 0, "$kind: the restored leader serves every one of " . scalar(keys %acked) . ' acknowledged records')
	  or diag("missing seqs @miss[0 .. ($#miss < 9 ? $#miss : 9)]");

	# Caught up, it can lead again (the transfer needs a record
	# acknowledged at node1's generation).
	$c->start_node($node3);
	publish_more($node1, 200, "$kind-2");
	ok(wait_identical($node2, $node1, 60), "$kind: node2 holds what node1 acknowledged since");
	my $t = $node1->safe_psql('postgres', "SELECT felix_transfer_leadership('$stream', 0, 'node2')");
	like($t, qr/node "node2" leads generation/, "$kind: a leadership transfer to the caught-up node succeeds");
	my ($l3) = $c->wait_leader($stream, 0, min_generation => $g_now + 1, timeout => 30);
	is($l3, $node2, "$kind: node2 leads again");
	publish_more($node2, 200, "$kind-3");
	@miss = missing_on($node2);
	is(scalar(@miss), 0, "$kind: node2, leading again, serves every acknowledged record");
	ok(wait_identical($node3, $node2, 90), "$kind: node3, back too, ends byte-identical to node2");
	return $since{node2};
}

# B. pg_basebackup: the restored node knows it (backup_label) and gives
# up its identity, so every copy it holds is rebuilt.
my $log = restore_leader('base backup', sub { backup_while_serving($node2, 'leader', $_[0]) });
like($log, qr/this server starts from a base backup; incarnation \S+ ends here/,
	'base backup: the restored node says it starts from a base backup');

# C. A file-system snapshot: nothing tells the node it is a copy (same
# identity, a start count above what the control plane saw); its log end,
# given with its heartbeats, is below what it reported its followers to
# hold, and that alone keeps the leadership from it.
$log = restore_leader('snapshot', sub { snapshot_while_paused($node2, 'snap', $_[0]) });
unlike($log, qr/starts from a base backup/, 'snapshot: the restored node does not take itself for a base backup');

$c->teardown;
felix_done_testing();
