# Peers are checked, not believed.
#
# - felix.replicate, called as a node's role, stores nothing that is not a
#   valid value of the stream's payload type (jsonb bytes that are not a
#   jsonb value, a key that is not valid text), takes nothing from a node
#   that does not lead the shipment's generation, nothing at a generation
#   the follower has not heard of, nothing meant for another node (or
#   another incarnation of this one), and nothing at all on the shard's
#   leader -- which, shipped a newer generation, steps down at once and
#   leads again only when the control plane says so; each is refused with
#   its SQLSTATE and the follower's log is unchanged.
# - A follower that answers past what it was sent (here: its felix.replicate
#   replaced by one that adds 5 to every 'stored' end) is halted with
#   halted_protocol; it completes no quorum, so with the other follower
#   paused a quorum publish times out (55F01) rather than being
#   acknowledged on its word.
#
# tap-etcd: skip.  Its subject is what a follower takes from its peers;
# the control-plane store plays the same part in it as in the scripts
# that run on both stores (FELIX_STORE=etcd runs it on etcd by hand).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 3);

my ($stream, @set) = $c->pick_stream_name('peers', 3, sub { 1 });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($leader, $g) = $c->wait_leader($stream, 0);
my $lname = $leader->{felix_name};
my @followers = grep { $_ ne $leader } $c->nodes;
my ($f, $other) = @followers;
my ($fname, $oname) = map { $_->{felix_name} } @followers;
$c->wait_shipping($leader, $stream, 0, 2);
$leader->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', jsonb_build_object('i', i), shard => 0)) "
	  . "FROM generate_series(0, 2) i");
ok(defined FelixCluster::poll(20, sub { next_seq($f) eq '3' && next_seq($other) eq '3' }),
	'both followers hold the three records');

sub next_seq
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

# felix.replicate on $node as role $role; returns (rc, stderr, stdout).
sub replicate_as
{
	my ($node, $role, $gen, $from, $hex, %opt) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql('postgres',
		"\\set VERBOSITY verbose\n" . replicate_call($node, $stream, 0, $gen, $from, $hex, %opt),
		stdout => \$out, stderr => \$err,
		extra_params => [ '-U', "felix_node_$role" ]);
	return ($rc, $err, $out);
}

# A genuine jsonb value's stored bytes, taken from the leader's own log:
# the payload of record 0 (no key).
my $seg = (segment_files(shard_dir($leader, $stream, 0)))[0];
my ($b0) = record_batches($seg);
my $raw = substr(read_file($seg), $b0->{offset} + 48 + 8, $b0->{body_len} - 8);
note('a genuine jsonb payload is ' . length($raw) . ' bytes');

my $before = join(',', map { next_seq($_) } @followers);

# 1. jsonb bytes that are not a jsonb value, shipped by the leader's role.
my @bad = (
	[ 'garbage header', "\xff\xff\xff\xff" ],
	[ 'truncated value', substr($raw, 0, length($raw) - 1) ],
	[ 'trailing bytes', $raw . "\0\0\0\0" ],
	[ 'entry past the end', pack('V', 0x20000001) . pack('V', 0x00000fff) ],
	[ 'empty', '' ],);
for my $case (@bad)
{
	my ($what, $bytes) = @$case;
	my ($rc, $err) = replicate_as($f, $lname, $g, 3, shipment_hex(3, $g, [ undef, $bytes ]));
	isnt($rc, 0, "a record whose payload is jsonb with $what is refused");
	like($err, qr/ERROR:\s+22P03:.*not a valid jsonb value/, "$what: 22P03, not a valid jsonb value");
}
# 2. A key that is not valid text.
{
	my ($rc, $err) = replicate_as($f, $lname, $g, 3, shipment_hex(3, $g, [ "\xc3\x28", $raw ]));
	like($err, qr/ERROR:\s+22021:.*invalid key/, 'a key that is not valid UTF-8 is refused (22021)');
	($rc, $err) = replicate_as($f, $lname, $g, 3, shipment_hex(3, $g, [ "a\0b", $raw ]));
	like($err, qr/ERROR:\s+22021:.*invalid key/, 'a key with a NUL byte is refused (22021)');
}
# 3. A valid record from a node that does not lead the generation.
{
	my ($rc, $err) = replicate_as($f, $oname, $g, 3, shipment_hex(3, $g, [ undef, $raw ]));
	like($err, qr/ERROR:\s+42501:.*may not ship generation $g, which node "$lname" leads/,
		"${oname}'s role may not ship to $fname at generation $g (42501)");
}
# 4. A generation the follower has not heard of.
{
	my $next = $g + 1;
	my ($rc, $err) = replicate_as($f, $oname, $next, 3, shipment_hex(3, $next, [ undef, $raw ]));
	like($err, qr/ERROR:\s+55F04:.*not learned who leads generation $next/,
		"a shipment at unknown generation $next is refused (55F04)");
}
# 5. Anything at all to the shard's leader.  Its own generation: refused.
#    A newer one: it learns that it was deposed and steps down at once
#    (refusing the shipment, whose leader it does not know yet); the
#    control plane still says it leads, so its next heartbeat makes it
#    the leader again.
{
	my ($rc, $err) = replicate_as($leader, $fname, $g, 3, shipment_hex(3, $g, [ undef, $raw ]));
	like($err, qr/ERROR:\s+55F02:.*leads the shard at generation $g and takes no shipment/,
		'the leader takes no shipment of its own generation (55F02)');
	my $downs = metric($leader, 'step_downs');
	($rc, $err) = replicate_as($leader, $fname, $g + 1, 3, shipment_hex(3, $g + 1, [ undef, $raw ]));
	like($err, qr/ERROR:\s+55F04:.*not learned who leads generation @{[$g + 1]}/,
		'shipped a newer generation, the leader stores nothing (55F04)');
	is(metric($leader, 'step_downs'), $downs + 1, 'and steps down first');
	like(read_file($leader->logfile),
		qr/this node stops leading generation $g: a shipment of generation @{[$g + 1]} arrived/,
		'saying so in its log');
	ok(defined FelixCluster::poll(20, sub {
		$leader->safe_psql('postgres',
			"SELECT role || ' ' || generation FROM felix_shards WHERE stream = '$stream' AND shard = 0")
		  eq "leader $g" }),
		'its next heartbeat makes it the leader of generation $g again');
}
# 6. Meant for another node: a conninfo pointing at the wrong server, or a
#    server whose felix data directory was replaced, must not take it.
{
	my ($rc, $err) = replicate_as($f, $lname, $g, 3, shipment_hex(3, $g, [ undef, $raw ]),
		name => $oname);
	like($err, qr/ERROR:\s+55F05:.*this shipment is for node "$oname".*but this is node "$fname"/,
		"a shipment for $oname that reaches $fname is refused (55F05)");
	($rc, $err) = replicate_as($f, $lname, $g, 3, shipment_hex(3, $g, [ undef, $raw ]),
		incarnation => '00000000-0000-4000-8000-000000000000');
	like($err, qr/ERROR:\s+55F05:/, 'so is one for another incarnation of this node');
}
# 7. A role that is no node's.
{
	$f->safe_psql('postgres', 'CREATE ROLE regress_peer_member LOGIN IN ROLE felix_replication');
	my ($out, $err) = ('', '');
	$f->psql('postgres',
		"\\set VERBOSITY verbose\n"
		  . replicate_call($f, $stream, 0, $g, 3, shipment_hex(3, $g, [ undef, $raw ])),
		stdout => \$out, stderr => \$err, extra_params => [ '-U', 'regress_peer_member' ]);
	like($err, qr/ERROR:\s+42501:/, 'a member of felix_replication that is no node may not ship (42501)');
}

is(join(',', map { next_seq($_) } @followers), $before, 'no forged shipment stored anything on a follower');
is(next_seq($leader), '3', 'nor on the leader');
is($f->safe_psql('postgres', "SELECT string_agg(payload->>'i', ',' ORDER BY seq) FROM $stream"),
	'0,1,2', "$fname reads only the leader's records");

# A valid record, shipped by the leader's role where it belongs, is stored:
# the checks refuse forgeries, not records.
{
	my ($rc, $err, $out) = replicate_as($f, $lname, $g, 0,
		unpack('H*', substr(read_file($seg), $b0->{offset}, $b0->{size})));
	is($out, 'stored 1', "the leader's own batch, re-shipped by its role, is accepted as what $fname holds")
	  or diag($err);
}

# ---------------------------------------------------------------------
# A follower that answers past what it was sent
# ---------------------------------------------------------------------
$f->safe_psql('postgres', q{
	ALTER FUNCTION felix.replicate(text, integer, bigint, text, text, text, bigint, bigint, bytea)
	    RENAME TO replicate_honest;
	CREATE FUNCTION felix.replicate(stream text, shard integer, generation bigint, node text,
	                                incarnation text, op text, from_seq bigint,
	                                leader_hwm_end bigint, batches bytea)
	RETURNS TABLE (status text, seq bigint) LANGUAGE sql AS $$
	    SELECT r.status, CASE WHEN r.status = 'stored' THEN r.seq + 5 ELSE r.seq END
	      FROM felix.replicate_honest($1, $2, $3, $4, $5, $6, $7, $8, $9) r
	$$;
	GRANT EXECUTE ON FUNCTION felix.replicate(text, integer, bigint, text, text, text, bigint, bigint, bytea)
	    TO felix_replication;
});
# The leader's shipping session prepared the honest function: make it
# reconnect and prepare the liar.
$f->safe_psql('postgres',
	"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
	  . "WHERE backend_type = 'client backend' AND application_name = 'felix ship'");
$c->pause_node($other);
my ($rc, $err) = psql_error($leader,
	"SET felix.quorum_timeout = '3s'; SELECT felix_publish('$stream', '{\"lie\": 1}'::jsonb, shard => 0)");
isnt($rc, 0, "with $oname paused, a publish is not acknowledged on ${fname}'s word alone");
like($err, qr/ERROR:\s+55F01:/, 'it times out waiting for a quorum (55F01)');
my $state = $leader->safe_psql('postgres',
	"SELECT state || ': ' || coalesce(last_error, '') FROM felix_replication "
	  . "WHERE stream = '$stream' AND shard = 0 AND follower = '$fname'");
like($state, qr/^halted_protocol: it answered stored \d+ to a shipment of seqs/,
	"the leader halted $fname: $state");
like(read_file($leader->logfile),
	qr/follower "$fname" halted \(protocol\) at generation $g: it answered stored/,
	'and said so in its log');

is($leader->safe_psql('postgres',
		"SELECT hwm FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
	'2', 'the high-water mark did not move past the acknowledged records');
$c->resume_node($other);
for my $node ($c->nodes)
{
	ok(defined FelixCluster::poll(20, sub {
		$node->safe_psql('postgres',
			"SELECT reason || ' ' || generation || ' ' || (action ~ 'felix_rebuild') FROM felix_halted "
			  . "WHERE stream = '$stream' AND shard = 0 AND node = '$fname'") eq "protocol $g true" }),
		"felix_halted on $node->{felix_name} lists the halt, with what to run")
	  or diag($node->safe_psql('postgres', 'SELECT * FROM felix_halted'));
}

$c->teardown;
felix_done_testing();
