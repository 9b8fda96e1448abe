# Shipments reach the node they name.  Three nodes; node3's
# felix.node_conninfo is changed to node2's address (as if pasted from
# node2's configuration) and node3 restarted:
#
# - Registration: node3's heartbeat worker finds that its own conninfo
#   reaches a server answering as node2, logs the WARNING
#   'felix.node_conninfo of node "node3" reaches node "node2" ...' and does
#   not heartbeat: felix_nodes on node1 shows it not alive after the
#   expiry and for a while after (past one re-check of the address), and
#   felix.nodes keeps the conninfo it registered before.  A heartbeat
#   made by hand on node1 (as superuser) for node3 with node2's registered
#   conninfo is refused with 42710 while node2 is alive, and changes
#   nothing.
# - The data path: a felix.replicate call on node2 that names node3 (and
#   node3's incarnation) -- a shipment meant for node3 delivered to node2
#   -- is refused with 55F05 and stores nothing, whether the leader's role
#   or a superuser makes it, for a new record as for one node2 already
#   holds (addressed to node2 itself, the latter is accepted).  End to end,
#   the control plane's address of node3 is then made node2's (what a
#   registration the checks above refuse would have done): the leader's
#   shipments for node3 land on node2, which refuses them (felix_replication
#   on the leader shows the 55F05 refusal); on a replication factor 3
#   quorum stream publishes are acknowledged by the leader and node2 --
#   real copies, each holding every acknowledged record once -- and on a
#   replication factor 2 quorum stream whose replica set is {node1, node3}
#   no publish is acknowledged (55F01), and node2 stores nothing of it.
# - Repair: node3's conninfo restored and node3 restarted, it registers
#   its own address again, and both streams converge: every node of each
#   replica set serves every acknowledged record, with the same records
#   and byte-identical record batches.
# The leader of both streams is node1 (the control plane's node), so that
# nothing here moves leadership.
#
# tap-etcd: skip.  Its subject is where shipments go; the control-plane
# store plays the same part in it as in the scripts that run on both
# stores (FELIX_STORE=etcd runs it on etcd by hand).
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
my ($n1, $n2, $n3) = map { $c->node($_) } 1 .. 3;
my $cp = $n1;

sub cpq { my ($sql) = @_; return $c->state_query($sql); }
sub log_off { my ($node) = @_; return -s $node->logfile; }
sub log_since { my ($node, $off) = @_; return substr(read_file($node->logfile), $off); }

sub next_seq
{
	my ($node, $stream) = @_;
	return $node->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

sub incarnation_of
{
	my ($node) = @_;
	return $node->safe_psql('postgres', 'SELECT incarnation FROM felix.node_identity()');
}

# Acknowledged records not readable on $node at their seq with their
# payload, and seqs it serves more than once.
sub missing_acks
{
	my ($node, $stream, $acks) = @_;
	my %have;
	my $dups = 0;
	for (split /\n/, $c->records($node, $stream, 0))
	{
		my ($s, $k, $p) = split /\|/, $_, 3;
		$dups++ if exists $have{$s};
		$have{$s} = $p;
	}
	my @miss = grep { !defined $have{$_} || $have{$_} ne $acks->{$_} } sort { $a <=> $b } keys %$acks;
	return (scalar(@miss), $dups);
}

sub batch_bytes
{
	my ($node, $stream) = @_;
	my $out = '';
	for my $f (segment_files(shard_dir($node, $stream, 0)))
	{
		my $data = read_file($f);
		$out .= substr($data, $_->{offset}, $_->{size}) for record_batches($f);
	}
	return $out;
}

sub wait_identical
{
	my ($stream, $leader, $secs, @nodes) = @_;
	my $seen = '';
	my $took = FelixCluster::poll($secs, sub {
		my $end = next_seq($leader, $stream);
		my $want = $c->records($leader, $stream, 0);
		my $wbytes = batch_bytes($leader, $stream);
		$seen = "$leader->{felix_name} next_seq $end";
		my $ok = 1;
		for my $n (@nodes)
		{
			my $ns = next_seq($n, $stream);
			$seen .= "; $n->{felix_name} next_seq $ns";
			$ok &&= $ns eq $end && $c->records($n, $stream, 0) eq $want
			  && batch_bytes($n, $stream) eq $wbytes;
		}
		return $ok;
	}, 0.2);
	diag("$stream not identical after $secs s: $seen") unless defined $took;
	return defined $took;
}

sub alive_in_cp
{
	my ($name) = @_;
	return cpq("SELECT alive FROM felix_nodes WHERE name = '$name'");
}

# felix.replicate on $node, as $role (undef: the test's superuser);
# returns (rc, stderr, stdout).
sub replicate_as
{
	my ($node, $role, $stream, $gen, $from, $hex, %opt) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres',
		"\\set VERBOSITY verbose\n" . replicate_call($node, $stream, 0, $gen, $from, $hex, %opt),
		stdout => \$out, stderr => \$err,
		extra_params => [ defined $role ? ('-U', "felix_node_$role") : () ]);
	return ($rc, $err, $out);
}

# ---------------------------------------------------------------------
# Two quorum streams led by node1: one replicated on all three nodes, one
# on node1 and node3 only.
# ---------------------------------------------------------------------
my ($s3) = $c->pick_stream_name('addr', 3, sub { $_[0] eq 'node1' });
$c->create_stream(1, $s3, replication_factor => 3, consistency => 'quorum');
my ($s2) = $c->pick_stream_name('addr2', 2, sub { $_[0] eq 'node1' && $_[1] eq 'node3' });
$c->create_stream(1, $s2, replication_factor => 2, consistency => 'quorum');
is(cpq("SELECT replicas::text FROM felix.assignments WHERE stream = '$s2' AND shard = 0"),
	'{node1,node3}', "$s2 is replicated on node1 and node3 only");
my %g;
for my $s ($s3, $s2)
{
	my ($leader, $g) = $c->wait_leader($s, 0);
	is($leader->{felix_name}, 'node1', "node1 leads $s");
	$g{$s} = $g;
	$c->wait_shipping($n1, $s, 0, $s eq $s3 ? 2 : 1);
}
my (%acks3, %acks2);
publish_acked($n1, $s3, 'before', 20, \%acks3);
publish_acked($n1, $s2, 'before', 20, \%acks2);
ok(defined FelixCluster::poll(30, sub {
	next_seq($n2, $s3) == 20 && next_seq($n3, $s3) == 20 && next_seq($n3, $s2) == 20 }),
	'the followers hold the first 20 records of each stream');
is(next_seq($n2, $s2), '0', "node2, outside ${s2}'s replica set, holds none of it");

my $addr2 = cpq("SELECT conninfo FROM felix.nodes WHERE name = 'node2'");
my $addr3 = cpq("SELECT conninfo FROM felix.nodes WHERE name = 'node3'");
isnt($addr3, $addr2, 'node2 and node3 registered different addresses');
note("node2 registered '$addr2', node3 '$addr3'");
my $inc3 = incarnation_of($n3);

# ---------------------------------------------------------------------
# node3's felix.node_conninfo becomes node2's address
# ---------------------------------------------------------------------
my $conf_file = $n3->data_dir . '/postgresql.conf';
my $conf = read_file($conf_file);
$c->stop_node($n3);
write_file($conf_file, $conf . "felix.node_conninfo = '" . $c->conninfo(2) . "'\n");
my $off3 = log_off($n3);
my $off1 = log_off($n1);
$c->start_node($n3);
is($n3->safe_psql('postgres', 'SHOW felix.node_conninfo'), $c->conninfo(2),
	"node3's felix.node_conninfo is node2's address");

ok(defined FelixCluster::poll(30, sub {
	log_since($n3, $off3) =~ /WARNING:\s+felix\.node_conninfo of node "node3" reaches node "node2" \(incarnation \S+\), not this node \(incarnation \Q$inc3\E\)/ }),
	'node3 logs that its felix.node_conninfo reaches node2, not itself');
ok(defined FelixCluster::poll(30, sub { alive_in_cp('node3') eq 'f' }, 0.1),
	'felix_nodes on node1 shows node3 not alive once its last heartbeat expires');
# node3's own felix_nodes says why it is out, not only that it is
my $own = '';
ok( FelixCluster::poll(10,
		sub { ($own = $n3->safe_psql('postgres', "SELECT state || ': ' || coalesce(reason, '') FROM felix_nodes WHERE name = 'node3'"))
			  =~ /felix\.node_conninfo reaches another felix node, not this server/ }),
	"node3's own felix_nodes row says its conninfo reaches another node") or diag($own);
# and it stays so, past one re-check of its address (every 10 s)
my $woke = FelixCluster::poll(12, sub { alive_in_cp('node3') eq 't' }, 0.2);
ok(!defined $woke, 'node3 stays not alive for 12 s: it does not heartbeat');
is(cpq("SELECT conninfo FROM felix.nodes WHERE name = 'node3'"), $addr3,
	'felix.nodes keeps the address node3 registered before');
is(alive_in_cp('node2'), 't', 'node2 is alive');
unlike(log_since($n1, $off1), qr/ERROR:.*node "node3": conninfo .* is already the address of node "node2"/,
	'node3 did not even try to register node2\'s address (its self-check stopped it first)');

# A hand-made heartbeat for node3 with node2's address (the SQL entry
# point exists where the embedded store is).
if ($c->store eq 'embedded')
{
	my $starts = cpq("SELECT starts FROM felix.nodes WHERE name = 'node3'") + 1;
	my $before = cpq("SELECT conninfo || ' ' || incarnation || ' ' || starts || ' ' || last_heartbeat FROM felix.nodes WHERE name = 'node3'");
	my ($rc, $err) = psql_error($n1,
		"SELECT count(*) FROM felix.cp_heartbeat('node3', '$addr2', '$inc3', $starts, gen_random_uuid()::text)");
	isnt($rc, 0, 'felix.cp_heartbeat for node3 with node2\'s conninfo fails');
	like($err, qr/ERROR:\s+42710:.*node "node3": conninfo ".*" is already the address of node "node2"/,
		'it is refused with 42710: the address is already node2\'s');
	is(cpq("SELECT conninfo || ' ' || incarnation || ' ' || starts || ' ' || last_heartbeat FROM felix.nodes WHERE name = 'node3'"),
		$before, 'and changes nothing of node3 in felix.nodes');
	is(alive_in_cp('node3'), 'f', 'node3 is still not alive');
	# The same address written as the test's conninfo helper writes it
	# (keywords in another order): not the string node2 registered.
	my ($rc2, $err2) = psql_error($n1,
		"BEGIN; SELECT count(*) FROM felix.cp_heartbeat('node3', '" . $c->conninfo(2) . "', '$inc3', $starts, gen_random_uuid()::text); ROLLBACK");
	note('the same address spelled "' . $c->conninfo(2) . '": '
		  . ($rc2 == 0 ? 'accepted (the control plane compares conninfo strings, not addresses)' : "refused: $err2"));
}

# ---------------------------------------------------------------------
# Shipments meant for node3, delivered to node2
# ---------------------------------------------------------------------
# A genuine batch of the leader's: record 0 of each stream, and its
# payload bytes for a new record.
my %batch0;
for my $s ($s3, $s2)
{
	my $seg = (segment_files(shard_dir($n1, $s, 0)))[0];
	my ($b0) = record_batches($seg);
	my $data = read_file($seg);
	$batch0{$s} = {
		hex => unpack('H*', substr($data, $b0->{offset}, $b0->{size})),
		raw => substr($data, $b0->{offset} + 48 + 8, $b0->{body_len} - 8),
	};
}
for my $s ($s3, $s2)
{
	my $g = $g{$s};
	my $before = next_seq($n2, $s);
	my $records_before = $c->records($n2, $s, 0);
	my $next = next_seq($n1, $s);
	for my $case (
		[ "node1's role", 'node1' ],
		[ 'a superuser', undef ])
	{
		my ($who, $role) = @$case;
		my ($rc, $err) = replicate_as($n2, $role, $s, $g, $next,
			shipment_hex($next, $g, [ undef, $batch0{$s}{raw} ]),
			name => 'node3', incarnation => $inc3);
		like($err, qr/ERROR:\s+55F05:.*this shipment is for node "node3" \(incarnation \Q$inc3\E\), but this is node "node2"/,
			"$s: a new record shipped by $who for node3 to node2 is refused (55F05)");
		($rc, $err) = replicate_as($n2, $role, $s, $g, 0, $batch0{$s}{hex},
			name => 'node3', incarnation => $inc3);
		like($err, qr/ERROR:\s+55F05:/, "$s: so is record 0 re-shipped by $who for node3 to node2");
	}
	is(next_seq($n2, $s), $before, "$s: node2 stored nothing (next_seq $before)");
	is($c->records($n2, $s, 0), $records_before, "$s: node2 serves the same records as before");
}
{
	# Addressed to node2 itself, the same re-shipment is what node2 holds.
	my ($rc, $err, $out) = replicate_as($n2, 'node1', $s3, $g{$s3}, 0, $batch0{$s3}{hex});
	is($out, 'stored 1', "$s3: record 0 re-shipped by node1's role to node2 as node2 is accepted (it holds it)")
	  or diag($err);
}

# End to end: the control plane's address of node3 made node2's.
$c->store_edit('nodes/node3', "jsonb_set(v, '{conninfo}', to_jsonb('$addr2'::text))");
note("felix.nodes now gives node3 node2's address");
my $refused = '';
ok(defined FelixCluster::poll(60, sub {
	$refused = $n1->safe_psql('postgres',
		"SELECT coalesce(string_agg(stream || ': ' || coalesce(last_error, ''), '; '), '') FROM felix_replication "
		  . "WHERE follower = 'node3' AND stream IN ('$s3', '$s2')");
	return ($refused =~ /\Q$s3\E: [^;]*this shipment is for node "node3"[^;]*but this is node "node2"/
		  && $refused =~ /\Q$s2\E: [^;]*this shipment is for node "node3"[^;]*but this is node "node2"/);
}, 0.2), "the leader's shipments for node3 reach node2 and are refused there (felix_replication)")
  or diag("felix_replication for node3 on node1: $refused");
note("felix_replication for node3 on node1: $refused");

publish_acked($n1, $s3, 'misaddressed', 20, \%acks3);
pass("$s3: 20 more publishes are acknowledged (node1 and node2 hold them)");
{
	# (a follower serves up to the high-water mark the next shipment tells it)
	my ($miss, $dups);
	FelixCluster::poll(20, sub { ($miss, $dups) = missing_acks($n2, $s3, \%acks3); $miss == 0 }, 0.1);
	is($miss, 0, "$s3: node2 serves every acknowledged record (" . scalar(keys %acks3) . ')');
	is($dups, 0, "$s3: once each");
	is(next_seq($n2, $s3), next_seq($n1, $s3), "$s3: node2's log ends where the leader's does");
	is(next_seq($n3, $s3), '20', "$s3: node3 got none of the new records");
}
{
	my $before2 = next_seq($n2, $s2);
	my ($rc, $err) = psql_error($n1,
		"SET felix.quorum_timeout = '3s'; SELECT felix_publish('$s2', '{\"misaddressed\": 1}'::jsonb, shard => 0)");
	isnt($rc, 0, "$s2: with node3's shipments landing on node2, a publish is not acknowledged");
	like($err, qr/ERROR:\s+55F01:/, "$s2: it times out waiting for a quorum (55F01)");
	is(next_seq($n2, $s2), $before2, "$s2: node2, outside the replica set, stored nothing");
	my $hwm = $n1->safe_psql('postgres', "SELECT hwm FROM felix_shards WHERE stream = '$s2' AND shard = 0");
	is($hwm, '19', "$s2: the leader's high-water mark stays at the last acknowledged record");
}

# ---------------------------------------------------------------------
# Repair: node3's own address again
# ---------------------------------------------------------------------
$c->stop_node($n3);
write_file($conf_file, $conf);
$c->start_node($n3);
$c->wait_alive([ 'node1', 'node2', 'node3' ], 60);
ok(defined FelixCluster::poll(30, sub { cpq("SELECT conninfo FROM felix.nodes WHERE name = 'node3'") eq $addr3 }, 0.1),
	'node3 registers its own address again');
publish_acked($n1, $s3, 'after', 10, \%acks3);
publish_acked($n1, $s2, 'after', 10, \%acks2);
ok(wait_identical($s3, $n1, 90, $n2, $n3), "$s3: all three nodes end with the same records and record batches")
  or $c->diag_shard($s3, 0);
ok(wait_identical($s2, $n1, 90, $n3), "$s2: node3 ends with node1's records and record batches")
  or $c->diag_shard($s2, 0);
for my $case ([ $s3, \%acks3, $n1, $n2, $n3 ], [ $s2, \%acks2, $n1, $n3 ])
{
	my ($s, $acks, @nodes) = @$case;
	for my $node (@nodes)
	{
		my ($miss, $dups) = missing_acks($node, $s, $acks);
		is("$miss $dups", '0 0',
			"$s: $node->{felix_name} serves every acknowledged record (" . scalar(keys %$acks) . ') once');
	}
}
is(next_seq($n2, $s2), '0', "$s2: node2 never held a record of it");

# ---------------------------------------------------------------------
# The same misconfiguration while node2 is down: node3's conninfo then
# reaches no server at all, so it cannot confirm that it reaches itself.
# It must not take node2's address: when node2 comes back it is node2's.
# ---------------------------------------------------------------------
$c->stop_node($n2);
ok(defined FelixCluster::poll(30, sub { alive_in_cp('node2') eq 'f' }, 0.1), 'node2 stopped: not alive');
$c->stop_node($n3);
ok(defined FelixCluster::poll(30, sub { alive_in_cp('node3') eq 'f' }, 0.1),
	'node3 stopped: not alive (its last heartbeat aged out)');
write_file($conf_file, $conf . "felix.node_conninfo = '" . $c->conninfo(2) . "'\n");
$off3 = log_off($n3);
$off1 = log_off($n1);
$c->start_node($n3);
{
	my $seen = '';
	my $took = FelixCluster::poll(6, sub {
		$seen = cpq("SELECT conninfo || ' alive ' || (last_heartbeat >= clock_timestamp() - interval '1500 ms') "
			  . "FROM felix.nodes WHERE name = 'node3'");
		return $seen !~ /^\Q$addr3\E alive false$/;
	}, 0.1);
	ok(!defined $took, "node3, whose conninfo (node2's address) reaches no server, does not register for 6 s")
	  or diag("felix.nodes for node3: $seen");
}
$c->start_node($n2);
my $t_n2 = time;
ok(defined FelixCluster::poll(60, sub { alive_in_cp('node2') eq 't' }, 0.1), 'node2 is alive again')
  and note(sprintf('node2 alive %.1f s after its start', time - $t_n2));
unlike(log_since($n1, $off1), qr/node "node2": conninfo "[^"]*" is already the address of node "node3"/,
	'node2 was never refused its own address as node3\'s');
ok(defined FelixCluster::poll(30, sub {
	log_since($n3, $off3) =~ /WARNING:\s+felix\.node_conninfo of node "node3" reaches node "node2"/ }),
	'once node2 answers, node3 logs that its conninfo reaches node2');
$c->stop_node($n3);
write_file($conf_file, $conf);
$c->start_node($n3);
$c->wait_alive([ 'node1', 'node2', 'node3' ], 60);
is(cpq("SELECT string_agg(name || ' ' || conninfo, '; ' ORDER BY name) FROM felix.nodes WHERE name <> 'node1'"),
	"node2 $addr2; node3 $addr3", 'node2 and node3 are registered at their own addresses');
publish_acked($n1, $s3, 'end', 10, \%acks3);
ok(wait_identical($s3, $n1, 90, $n2, $n3), "$s3: all three nodes end identical")
  or $c->diag_shard($s3, 0);
for my $node ($n1, $n2, $n3)
{
	my ($miss, $dups) = missing_acks($node, $s3, \%acks3);
	is("$miss $dups", '0 0', "$s3: $node->{felix_name} serves every acknowledged record (" . scalar(keys %acks3) . ') once');
}

$c->teardown;
felix_done_testing();
