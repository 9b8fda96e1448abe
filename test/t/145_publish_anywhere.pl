# Publishing on any node (issue 18, part 1).
#
# A client connected to a node that does not lead a shard publishes to it
# anyway: felix_publish and felix_publish_batch forward the records to the
# shard's leader over the node's own connection, and return the leader's
# (shard, seq) once acknowledged there.  On three nodes, with a quorum
# stream of four shards (replication factor 2, so some node holds no copy
# of some shard), from an ordinary role with INSERT:
#
#   1. publishes on every node reach every shard; the seqs they return are
#      the records' seqs on the leader; felix_metrics counts the forwarded
#      ones; every node reads every record;
#   2. the privileges are checked again on the leader: a role granted
#      INSERT only on the node it connects to is refused there (42501), and
#      a role created only there does not exist on the leader (42704);
#   3. with felix.forward_publishes off the refusal (55F02, naming the
#      leader) stays, for applications that route themselves;
#   4. a publisher on node1 keeps publishing to a shard (replication
#      factor 3) led by another node while that node is killed (kill -9):
#      its publishes follow the failover to the new leader; every
#      acknowledged record is on the new leader at the seq it was
#      acknowledged with, and no record is there twice;
#   5. a forged batch sent straight to felix.forward_publish by a node's
#      role is refused (its checksum; a payload that is not jsonb).
#
# tap-etcd: skip.  Its subject is publishes forwarded to the leader; the
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

my $c = FelixCluster->new(nodes => 3, conf => ["felix.forward_publishes = on"]);
my @n = map { $c->node($_) } 1 .. 3;

for my $node (@n)
{
	$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
}
my $stream = 'anywhere';
$c->create_stream(1, $stream, shards => 4, replication_factor => 2, consistency => 'quorum');
for my $node (@n)
{
	$node->safe_psql('postgres', "GRANT INSERT, SELECT ON $stream TO app");
}
for my $sh (0 .. 3) { $c->wait_leader($stream, $sh) }

# 1. every node publishes to every shard
my %leader_of = map { $_ => ($c->leader_of($stream, $_))[0] } 0 .. 3;
my %want;
for my $k (1 .. 3)
{
	for my $sh (0 .. 3)
	{
		my $out = $n[ $k - 1 ]->safe_psql('postgres',
			"SET ROLE app; SELECT shard || ':' || seq FROM felix_publish('$stream', "
			  . "jsonb_build_object('from', $k, 'shard', $sh), shard => $sh)");
		my ($shard, $seq) = split /:/, $out;
		is($shard, $sh, "node$k publishes to shard $sh (led by $leader_of{$sh})");
		$want{"$sh:$seq"} = "{\"from\": $k, \"shard\": $sh}";
	}
	my $batch = $n[ $k - 1 ]->safe_psql('postgres',
		"SET ROLE app; SELECT string_agg(shard || ':' || seq, ',' ORDER BY shard, seq) FROM felix_publish_batch('$stream', "
		  . "ARRAY(SELECT jsonb_build_object('batch', $k, 'i', i) FROM generate_series(1, 8) i))");
	my @pos = split /,/, $batch;
	is(scalar(@pos), 8, "node$k publishes a batch of 8 over the shards");
}
for my $node (@n)
{
	# (a follower shows what its leader's mark, shipped after the
	# acknowledgement, lets it)
	ok(FelixCluster::poll(10, sub { $node->safe_psql('postgres', "SELECT count(*) FROM $stream") == 36 }),
		"$node->{felix_name} reads all 36 records");
	my $got = $node->safe_psql('postgres',
		"SELECT string_agg(shard || ':' || seq || '=' || payload::text, ';' ORDER BY shard, seq) "
		  . "FROM $stream WHERE payload ? 'from'");
	my %got = map { split /=/, $_, 2 } split /;/, $got;
	is_deeply(\%got, \%want, "$node->{felix_name} reads every forwarded record at the seq its publish returned");
}
my $forwarded = 0;
$forwarded += metric($_, 'publishes_forwarded') for @n;
ok($forwarded > 0, "felix_metrics counts $forwarded forwarded publishes");

# 2. privileges on the leader too
my ($far) = grep { $leader_of{$_} ne 'node3' } 0 .. 3;
my $leader = $c->node($leader_of{$far});
$leader->safe_psql('postgres', "REVOKE INSERT ON $stream FROM app");
my ($rc, $err) = psql_error($n[2], "SET ROLE app; SELECT felix_publish('$stream', '{}'::jsonb, shard => $far)");
isnt($rc, 0, "a role granted INSERT on node3 but not on the leader is refused");
like($err, qr/42501/, '... with 42501');
like($err, qr/has no INSERT privilege on the stream's table on leader "$leader_of{$far}"/, '... naming the leader');
$leader->safe_psql('postgres', "GRANT INSERT ON $stream TO app");
$n[2]->safe_psql('postgres', "CREATE ROLE only_here LOGIN; GRANT INSERT ON $stream TO only_here");
($rc, $err) = psql_error($n[2], "SET ROLE only_here; SELECT felix_publish('$stream', '{}'::jsonb, shard => $far)");
like($err, qr/42704.*role "only_here" does not exist on leader/s, 'a role that exists only where it connected is refused by the leader');

# 3. routing themselves
($rc, $err) = psql_error($n[2],
	"SET felix.forward_publishes = off; SET ROLE app; SELECT felix_publish('$stream', '{}'::jsonb, shard => $far)");
like($err, qr/55F02/, 'with felix.forward_publishes off the publish is refused with 55F02');

# 4. a publisher on node1 (the control plane's host, never killed here)
# through a kill -9 of the leader of its shard, on a quorum stream of
# replication factor 3
{
	my ($fo) = $c->pick_stream_name('anywhere_fo', 3, sub { $_[0] ne 'node1' && $_[1] ne 'node1' });
	$c->create_stream(1, $fo, replication_factor => 3, consistency => 'quorum');
	my ($old, $g0) = $c->wait_leader($fo, 0);
	$c->wait_shipping($old, $fo, 0, 2);
	my $pub = $c->start_publishers(
		node      => $n[0],
		stream    => $fo,
		shard     => 0,
		sessions  => 2,
		count     => 100000,
		seconds   => 12,
		catch     => 1,
		err_sleep => 0.05,
		tag       => 'fo');
	ok($c->wait_acks($pub, 50), "node1 publishes through the leader, $old->{felix_name}");
	$c->kill_node($old->{felix_name});
	my ($new) = $c->wait_leader($fo, 0, min_generation => $g0 + 1);
	my $before = $c->ack_count($pub);
	ok(FelixCluster::poll(20, sub { $c->ack_count($pub) > $before + 50 }),
		"publishes from node1 follow the failover to $new->{felix_name}");
	$c->stop_publishers($pub);
	my @acks = $c->acks($pub);
	my %on_leader = map { split /\|/, $_, 2 } split /\n/, $new->safe_psql('postgres',
		"SELECT seq || '|' || (payload->>'w') || ':' || (payload->>'i') FROM $fo WHERE shard = 0");
	my $bad = grep { ($on_leader{ $_->{seq} } // '') ne "$_->{w}:$_->{i}" } @acks;
	is($bad, 0, scalar(@acks) . ' acknowledged records are on the new leader at their seqs');
	is($new->safe_psql('postgres',
			"SELECT count(*) FROM (SELECT payload->>'w', payload->>'i' FROM $fo WHERE shard = 0 "
			  . "GROUP BY 1, 2 HAVING count(*) > 1) d"), '0', 'no record is there twice');
	my @errs = $c->errors($pub);
	note(scalar(@errs) . ' publishes were refused or left unknown during the failover: '
		  . join(', ', map { $_->{sqlstate} } @errs[ 0 .. ($#errs < 9 ? $#errs : 9) ]));
	$c->start_node($old->{felix_name});
}

# 5. forged batches, as a node's role
my $id = $n[1]->safe_psql('postgres', "SELECT creation_id FROM felix.streams WHERE name = '$stream'");
($rc, $err) = psql_error($n[1],
	"SET ROLE felix_node_node3; SELECT * FROM felix.forward_publish('$stream', '$id', 0, 'app', '\\x00112233'::bytea)");
like($err, qr/22P03.*shorter than a batch/s, 'a forged short batch is refused');
($rc, $err) = psql_error($n[1],
	"SET ROLE felix_node_node3; SELECT * FROM felix.forward_publish('$stream', '$id', 0, 'app', "
	  . "decode(repeat('00', 56), 'hex'))");
like($err, qr/22P03/, 'a batch that does not match its checksum is refused');
($rc, $err) = psql_error($n[1],
	"SELECT * FROM felix.forward_publish('$stream', '$id', 0, 'app', '\\x00'::bytea)");
isnt($rc, 0, 'a short batch is refused from a superuser too');
# and a role outside felix_replication may not call it at all
($rc, $err) = psql_error($n[1],
	"SET ROLE app; SELECT * FROM felix.forward_publish('$stream', '$id', 0, 'app', '\\x00'::bytea)");
like($err, qr/42501/, 'app, outside felix_replication, is refused with 42501');

$c->teardown;
felix_done_testing();
