# Log shipping: records published on a shard's leader of a replication
# factor 3 quorum stream end up byte-identical on both followers -- the
# same rows from SELECT * on every node (publication times included), and the same segment bytes (every
# batch, header to trailer; only the 64-byte file header and the seal batch
# closing a full segment differ, each node writes those itself) -- across
# segment rolls, and felix_replication on the leader shows
# both followers acknowledged to the end with lag 0.
#
# tap-etcd: skip.  Its subject is log shipping between replicas; the
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
use Time::HiRes qw(time);

# Small segments, so shipping crosses segment rolls (a follower's reads
# resume where the last one stopped, across a seal into the next segment).
my $c = FelixCluster->new(nodes => 3, conf => ["felix.segment_bytes = '64kB'"]);
my $stream = $c->create_stream(1, 'ship', shards => 2, replication_factor => 3,
	consistency => 'quorum');

for my $shard (0, 1)
{
	my ($leader, $gen) = $c->wait_leader($stream, $shard);
	my $lname = $leader->{felix_name};
	note("shard $shard: leader $lname at generation $gen");
	my @followers = grep { $_ != $leader } $c->nodes;

	# Single publishes from 2 sessions, then one batch of 50 and a few
	# keyed records, all on the leader.
	my $t0  = time;
	my $pub = $c->start_publishers(
		node     => $leader,
		stream   => $stream,
		shard    => $shard,
		sessions => 2,
		count    => 150,
		seconds  => 60,
		tag      => "s$shard");
	$c->stop_publishers($pub, 90);
	my @acks = $c->acks($pub);
	is(scalar @acks, 300, "shard $shard: 300 quorum publishes acknowledged");
	note(sprintf("shard %d: 300 quorum publishes from 2 sessions in %.2fs",
		$shard, time - $t0));
	my @errs = $c->errors($pub);
	diag("publisher error: $_->{sqlstate} $_->{message}") for @errs;

	# A batch of 50 with keys that route to this shard (CRC-32C of the key
	# modulo the shard count), then 5 records sent to the shard explicitly.
	my @keys;
	for (my $n = 0; @keys < 50 && $n < 10000; $n++)
	{
		push @keys, "k$n" if crc32c("k$n") % 2 == $shard;
	}
	my $keys = join(',', map { "'$_'" } @keys);
	my $batch = $leader->safe_psql('postgres',
		    "SELECT count(*) FILTER (WHERE shard = $shard) || '/' || count(*) FROM felix_publish_batch('$stream', "
		  . "ARRAY(SELECT jsonb_build_object('batch', n, 'shard', $shard) FROM generate_series(1, 50) n), "
		  . "ARRAY[$keys])");
	is($batch, '50/50', "shard $shard: a batch of 50 keyed records acknowledged on the shard");
	$leader->safe_psql('postgres',
		"SELECT felix_publish('$stream', jsonb_build_object('last', n), key => 'last' || n, shard => $shard) FROM generate_series(1, 5) n"
	);
	# 150 more, 600 bytes each, one quorum publish at a time: past a roll.
	$leader->safe_psql('postgres',
		"SELECT felix_publish('$stream', jsonb_build_object('pad', repeat('p', 600), 'n', n), shard => $shard) FROM generate_series(1, 150) n"
	);
	cmp_ok(scalar(my @segs = $c->segment_bytes($leader, $stream, $shard)), '>=', 2,
		"shard $shard: the leader's log spans more than one segment");

	my $lrow = $c->shard_row($leader, $stream, $shard);
	note("shard $shard on $lname: next_seq $lrow->{next_seq}, hwm $lrow->{hwm}");
	cmp_ok($lrow->{next_seq}, '>=', 455, "shard $shard: leader holds the records");
	is($lrow->{hwm}, $lrow->{next_seq} - 1,
		"shard $shard: leader's hwm covers every quorum-acknowledged record");

	my $want = $c->records($leader, $stream, $shard, 1);
	for my $f (@followers)
	{
		my $fname = $f->{felix_name};
		my $got   = '';
		my $took  = FelixCluster::poll(20, sub {
			$got = $c->records($f, $stream, $shard, 1);
			return $got eq $want;
		}, 0.1);
		ok(defined $took, "shard $shard: $fname serves the same records as the leader");
		if (defined $took)
		{
			note(sprintf("shard %d: %s served every record %.2fs after the last publish",
				$shard, $fname, $took));
		}
		else
		{
			my $frow = $c->shard_row($f, $stream, $shard);
			diag("shard $shard: $fname serves "
				  . scalar(split /\n/, $got) . " records, leader "
				  . scalar(split /\n/, $want)
				  . "; $fname felix_shards: role $frow->{role} g$frow->{generation} next_seq $frow->{next_seq} hwm $frow->{hwm}");
		}

		my $frow = $c->shard_row($f, $stream, $shard);
		is($frow->{role}, 'follower', "shard $shard: $fname is a follower");
		is($frow->{next_seq}, $lrow->{next_seq}, "shard $shard: $fname stored up to the leader's end");

		# Segment bytes, file by file.
		my @lseg = $c->segment_bytes($leader, $stream, $shard);
		my @fseg = $c->segment_bytes($f, $stream, $shard);
		is(join(',', map { $_->[0] } @fseg), join(',', map { $_->[0] } @lseg),
			"shard $shard: $fname has the same segment files");
		# A sealed segment ends in a seal batch (48-byte header, 4-byte body:
		# the file's CRC, 8-byte trailer) that each node writes itself when
		# it rolls, with its own timestamp and file header: the shipped
		# batches before it must match.
		for my $i (0 .. $#lseg - 1)
		{
			$_->[1] = substr($_->[1], 0, -60) for grep { defined } $lseg[$i], $fseg[$i];
		}
		my $same = @lseg == @fseg;
		for my $i (0 .. $#lseg)
		{
			next unless $fseg[$i];
			next if $lseg[$i][1] eq $fseg[$i][1];
			$same = 0;
			my ($a, $b) = ($lseg[$i][1], $fseg[$i][1]);
			my $off = 0;
			$off++ while $off < length($a) && $off < length($b)
			  && substr($a, $off, 1) eq substr($b, $off, 1);
			diag("shard $shard: $fname $lseg[$i][0] differs at byte "
				  . ($off + 64) . " (leader "
				  . (length($a) + 64) . " bytes of data, $fname "
				  . (length($b) + 64) . ")");
		}
		ok($same, "shard $shard: $fname segment bytes are identical to the leader's up to the end of the log");
		my $bytes = 0;
		$bytes += length($_->[1]) for @lseg;
		note("shard $shard: $bytes bytes of batches compared on $fname");
	}

	# felix_replication on the leader: both followers at the end, lag 0.
	my $rep = '';
	my $took = FelixCluster::poll(10, sub {
		$rep = $leader->safe_psql('postgres',
			"SELECT string_agg(format('%s:%s:%s:%s', follower, acked_seq, lag_records, state), ' ' ORDER BY follower) "
			  . "FROM felix_replication WHERE stream = '$stream' AND shard = $shard");
		my @f = split / /, $rep;
		return @f == 2 && !grep { !/^node\d:\Q@{[$lrow->{next_seq} - 1]}\E:0:/ } @f;
	}, 0.1);
	my $expect = join(' ', map { "$_->{felix_name}:" . ($lrow->{next_seq} - 1) . ':0:shipping' }
		sort { $a->{felix_name} cmp $b->{felix_name} } @followers);
	is($rep, $expect, "shard $shard: felix_replication on $lname shows both followers acknowledged to the end with lag 0");
}

my %lag = map { $_->{felix_name} => $c->metric_of($_, 'replication_lag_records') } $c->nodes;
note('replication_lag_records: ' . join(', ', map { "$_ " . ($lag{$_} // 'missing') } sort keys %lag));
is(join(',', map { $lag{$_} // 'missing' } sort keys %lag), '0,0,0',
	'felix_metrics replication_lag_records is 0 on every node');
note('replica_reports_per_request on node1..3: '
	  . join(', ', map { $c->metric_of($_, 'replica_reports_per_request') // 'missing' } $c->nodes));

$c->teardown;
felix_done_testing();
