# What an idle cluster looks at (issue 20): the duty holder walks every
# shard only when a lapse may be due or something changed, and the node's
# own passes over its slots follow the changes too -- and nothing of what
# they did is lost.
#
# Three nodes, a stream of 6 shards (replication factor 3, quorum), on
# either store (FELIX_STORE=etcd):
#   1. Idle for a few seconds: the holder's walks (felix_metrics
#      duty_walks) are fewer than half its ticks (one per heartbeat
#      interval), yet there are some: it walks at the earliest lapse its
#      last walk found.  It walked at every tick before.
#   2. A stream created while the holder waits between walks: its shards
#      are led and take publishes.  (A creation places its leaders itself;
#      this part guards against a walk state that stalls the cluster, not
#      against a missed walk.)
#   3. After the idle window, a publish made while the leader's ship
#      worker is stopped: appended at once, its mark moves only when the
#      worker ships again, a second later.  The mark is then made durable
#      (the node worker's pass over its marks follows the slots' changes,
#      and a mark that moves is one: without that, it stayed behind --
#      checked), and the leader's log end at the control plane reaches it
#      (the heartbeat gives its ends again only when a slot changed).
#   4. kill -9 of a node leading shards: each of them gets a new leader
#      at a later generation and takes publishes -- the holder, which had
#      waited between walks, still dated the dead leader's last claim by
#      when it first read it, and walks at every tick while a shard it
#      walked has lapsed.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time usleep);

my $c = FelixCluster->new(nodes => 3);
my $stream = 'walked';
my $SHARDS = 6;

my $duty;
ok(defined FelixCluster::poll(30, sub { $duty = $c->duty_node_name; defined $duty }, 0.1),
	'one node runs the control-plane duties') or BAIL_OUT('no duty holder');
note("$duty runs the duties");

$c->create_stream(1, $stream, shards => $SHARDS, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text');
for my $sh (0 .. $SHARDS - 1)
{
	my ($leader) = $c->wait_leader($stream, $sh);
	$c->wait_shipping($leader, $stream, $sh, 2);
}


# The holder's walks, summed over the nodes up (with the embedded store
# the duties run in a session on node1, which counts them).
sub walks
{
	my $t = 0;
	for my $node ($c->up_nodes)
	{
		$t += $node->safe_psql('postgres', "SELECT value FROM felix_metrics WHERE name = 'duty_walks'");
	}
	return $t;
}

my $hb_ms = $c->node(1)->safe_psql('postgres', "SELECT setting FROM pg_settings WHERE name = 'felix.heartbeat_interval'");
my $lease_ms = $c->node(1)->safe_psql('postgres', "SELECT setting FROM pg_settings WHERE name = 'felix.lease_duration'");

# ---------------------------------------------------------------------
# 1. Idle.
# ---------------------------------------------------------------------
sleep 2;		# the publishes' reports and marks have settled
my ($w0, $t0) = (walks(), time);
sleep 6;
my ($w1, $t1) = (walks(), time);
my $ticks = ($t1 - $t0) * 1000 / $hb_ms;
my $walked = $w1 - $w0;
cmp_ok($walked, '<', $ticks / 2,
	sprintf('idle: the holder walked the shards %d times in %.1f s, against %.0f ticks (heartbeat %d ms, lease %d ms)',
		$walked, $t1 - $t0, $ticks, $hb_ms, $lease_ms));
cmp_ok($walked, '>=', 1, 'idle: it still walks, at the earliest lapse its last walk found');

# ---------------------------------------------------------------------
# 2. A stream created while the holder waits between walks.
# ---------------------------------------------------------------------
$c->create_stream(2, 'walked_new', shards => 2, replication_factor => 3, consistency => 'quorum',
	payload_type => 'text');
for my $sh (0, 1)
{
	my ($leader) = $c->wait_leader('walked_new', $sh, timeout => 30);
	ok($c->publish_ok($leader->{felix_name} =~ s/^node//r, 'walked_new', $sh),
		"walked_new/$sh, created while idle, is led by $leader->{felix_name} and takes a publish");
}

# ---------------------------------------------------------------------
# 3. A publish after the idle window: mark and log end follow.
# ---------------------------------------------------------------------
sleep 2;
my ($l0) = $c->wait_leader($stream, 0);
my $k0 = $l0->{felix_name} =~ s/^node//r;
ok($c->publish_ok($k0, $stream, 0), "$stream/0 takes a publish at $l0->{felix_name}");

# The leader's ship worker stopped: a publish is appended, and the node
# worker's passes see the new log end with no mark to make durable; the
# mark moves only once the followers have it, with nothing else changing
# on the node.  Unless that move counts as a change of the slot, no pass
# looks at the mark again.
my $ship = $l0->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'felix ship'");
my $next0 = $l0->safe_psql('postgres', "SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
kill 'STOP', $ship;
my $perr = '';
my $pub = IPC::Run::start(
	[ 'psql', '-X', '-q', '-h', $l0->host, '-p', $l0->port, '-d', 'postgres',
		'-c', "SELECT felix_publish('$stream', 'held'::text, shard => 0)" ],
	'<', \undef, '>', '/dev/null', '2>', \$perr, IPC::Run::timeout(60));
my $appended = FelixCluster::poll(20, sub {
	$l0->safe_psql('postgres', "SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0") > $next0 }, 0.05);
sleep 1;		# passes of the node worker, one per heartbeat interval
kill 'CONT', $ship;
my $acked = $pub->finish;
ok(defined $appended && $acked, 'a publish made while the leader shipped nothing is acknowledged once it ships again')
  or diag($perr);
my $end = 1 + $l0->safe_psql('postgres',
	"SELECT hwm FROM felix_shards WHERE stream = '$stream' AND shard = 0");
my $dir = shard_dir($l0, $stream, 0);
ok(defined FelixCluster::poll(20, sub { (durable_mark($dir) // 0) >= $end }, 0.1),
	"the leader's high-water mark (end $end) is made durable after an idle spell")
  or diag('hwm file: ' . (durable_mark($dir) // 'none'));
my $given;
ok(defined FelixCluster::poll(20, sub {
	$given = $c->state_query("SELECT e FROM felix.nodes, unnest(ends) e WHERE name = '$l0->{felix_name}' "
		  . "AND e LIKE '$stream/0=%'");
	return $given =~ m{=(\d+)} && $1 >= $end;
}, 0.1), "the leader's log end at the control plane reaches $end ($given)");

# ---------------------------------------------------------------------
# 4. kill -9 of a leader after an idle spell.
# ---------------------------------------------------------------------
# a node that is neither the holder nor (embedded) the control plane's host
my ($victim) = grep { $_ ne $duty && $_ ne 'node1' } map { $c->name_of($_) } 1 .. 3;
my $kv = $victim =~ s/^node//r;
my %gen_of;
for my $sh (0 .. $SHARDS - 1)
{
	my ($who, $gen) = $c->leader_of($stream, $sh);
	$gen_of{$sh} = $gen if $who eq $victim;
}
if (!%gen_of)
{
	# placement put no lead on it: hand it one
	note("$victim leads no shard of $stream; it is given shard 0");
	$c->node($kv)->safe_psql('postgres', "SELECT felix_transfer_leadership('$stream', 0, '$victim')");
	my ($who, $gen) = $c->wait_leader($stream, 0, timeout => 30);
	$gen_of{0} = $gen if $who->{felix_name} eq $victim;
}
ok(%gen_of, "$victim leads shards " . join(',', sort keys %gen_of) . " of $stream");
sleep 3;
my $wk = walks();
$c->kill_node($kv);
for my $sh (sort keys %gen_of)
{
	my ($who, $gen) = $c->wait_leader($stream, $sh, min_generation => $gen_of{$sh} + 1, timeout => 30);
	ok($c->publish_ok($who->{felix_name} =~ s/^node//r, $stream, $sh),
		"$stream/$sh: led by $who->{felix_name} at generation $gen after $victim was killed, and takes a publish");
}
cmp_ok(walks(), '>', $wk, 'the holder walked the shards again for the failover');

$c->teardown;
felix_done_testing();
