# The guard against control-plane keys changed outside felix (issue 20).
#
# Every process that runs the rules keeps a copy of the state and reads
# only what changed, found through the marks each felix transaction
# writes.  A key written or deleted by hand, without its mark, does not
# show in such a read.  Only the duty holder guards against that: every
# felix.store_guard_interval (2 s here) it reads the whole state again, a
# page of keys per tick, and compares each page with its copy; when the
# copy missed something it logs a WARNING and writes the deletions key,
# and every other process reads the whole state again.  No process reads
# the whole state on a timer: each one doing so once a minute was most of
# an idle cluster's control-plane traffic at thousands of shards.
#
# Checked here, on either store (FELIX_STORE=etcd):
#   1. idle, over six guard intervals: no drift is reported, and no
#      process reads the whole state (felix_metrics store_whole_reads);
#   2. a key put by hand without its mark: the holder reports it, and
#      every node reads the whole state again;
#   3. reported once, not at every guard;
#   4. the same key deleted by hand, without the deletions key: reported;
#   5. a stream dropped through felix (a deletion with its key) is not
#      taken for drift, and the cluster serves publishes throughout.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $GUARD_S = 2;
my $c = FelixCluster->new(nodes => 3, conf => ["felix.store_guard_interval = '${GUARD_S}s'"]);
my $etcd = $c->store eq 'etcd';

my $duty;
ok(defined FelixCluster::poll(30, sub { $duty = $c->duty_node_name; defined $duty }, 0.1),
	'one node runs the control-plane duties') or BAIL_OUT('no duty holder');
note("$duty runs the duties");

my $stream = 'guarded';
$c->create_stream(1, $stream, shards => 2, replication_factor => 3, consistency => 'quorum');
my ($leader) = $c->wait_leader($stream, 0);
$c->wait_shipping($leader, $stream, 0, 2);
is($leader->safe_psql('postgres', "SELECT count(*) FROM felix_publish('$stream', '{\"n\":1}'::jsonb, shard => 0)"),
	'1', 'a publish is acknowledged');

# Whole reads by node (with the embedded store, node1 counts every
# session's, since they all run there).
sub whole_reads
{
	my %r;
	for my $node ($c->nodes)
	{
		$r{ $node->{felix_name} } = $node->safe_psql('postgres',
			"SELECT value FROM felix_metrics WHERE name = 'store_whole_reads'");
	}
	return \%r;
}
sub total { my ($r) = @_; my $t = 0; $t += $_ for values %$r; return $t; }

# WARNINGs of drift in every node's log since the offsets in %$off.
my $DRIFT = qr/control-plane keys were changed outside felix/;
sub log_offsets { return { map { $_->{felix_name} => -s $_->logfile } $c->nodes }; }
sub drift_lines
{
	my ($off) = @_;
	my @l;
	for my $node ($c->nodes)
	{
		my $log = slurp_file($node->logfile, $off->{ $node->{felix_name} });
		push @l, grep { /$DRIFT/ } split /\n/, $log;
	}
	return @l;
}

# 1. Idle: guard passes, and no whole read anywhere.
usleep(int($GUARD_S * 1.5e6));    # past the first guard, which only starts the clock
my $off = log_offsets();
my $r0 = whole_reads();
my $t0 = time;
sleep(6 * $GUARD_S);
my $r1 = whole_reads();
my $guards = int((time - $t0) / $GUARD_S);
my @d = drift_lines($off);
is(scalar @d, 0, 'idle: no drift reported') or diag(join("\n", @d));
my @grew = map { $r1->{$_} - $r0->{$_} } sort keys %$r1;
is("@grew", join(' ', map { 0 } @grew),
	sprintf('idle for %.1f s (%d guard passes): no node read the whole state', time - $t0, $guards))
  or diag(explain($r0), explain($r1));

# 2. A key put by hand, without its mark.
my $key = 'guard-test';
sub hand_put
{
	if ($etcd)
	{
		$c->etcd->put($c->{etcd_prefix} . $key, '{}');
		return;
	}
	$c->cp->safe_psql('postgres',
		"BEGIN; LOCK TABLE felix.cp_store IN SHARE ROW EXCLUSIVE MODE;"
		  . "INSERT INTO felix.cp_store (key, value, mod_revision) "
		  . "VALUES ('$key', '{}', nextval('felix.cp_store_revision')); COMMIT");
}
sub hand_delete
{
	if ($etcd)
	{
		$c->etcd->delete_key($c->{etcd_prefix} . $key);
		return;
	}
	$c->cp->safe_psql('postgres',
		"BEGIN; LOCK TABLE felix.cp_store IN SHARE ROW EXCLUSIVE MODE;"
		  . "DELETE FROM felix.cp_store WHERE key = '$key'; COMMIT");
}

$off = log_offsets();
my $r2 = whole_reads();
hand_put();
my $t_put = time;
ok(defined FelixCluster::poll(8 * $GUARD_S, sub { scalar drift_lines($off) }, 0.2),
	'a key put by hand without its mark is reported')
  or diag('no drift WARNING within ' . 8 * $GUARD_S . ' s');
note(sprintf('reported %.1f s after the put', time - $t_put));
my ($line) = drift_lines($off);
like($line // '', qr/WARNING:\s+felix: \d+ control-plane keys were changed outside felix/,
	'as a WARNING that counts the keys');
my $r3;
ok(defined FelixCluster::poll(10, sub {
			$r3 = whole_reads();
			$etcd ? !grep { $r3->{$_} <= $r2->{$_} } keys %$r3 : total($r3) - total($r2) >= 4;
		}, 0.2),
	$etcd ? 'every node reads the whole state again' : 'the nodes\' sessions read the whole state again')
  or diag(explain($r2), explain($r3));

# 3. Once: the copies hold the key now.
usleep(int(3 * $GUARD_S * 1e6));
is(scalar(my @x = drift_lines($off)), 1, 'the drift is reported once, not at every guard');

# 4. The key deleted by hand, without the deletions key.
$off = log_offsets();
hand_delete();
ok(defined FelixCluster::poll(8 * $GUARD_S, sub { scalar drift_lines($off) }, 0.2),
	'a key deleted by hand without the deletions key is reported');

# 5. A deletion through felix is no drift.
usleep(int(2 * $GUARD_S * 1e6));
$off = log_offsets();
$c->node(1)->safe_psql('postgres', "SELECT felix_drop_stream('$stream')");
usleep(int(4 * $GUARD_S * 1e6));
@d = drift_lines($off);
is(scalar @d, 0, 'a stream dropped through felix is not taken for drift') or diag(join("\n", @d));

my $s2 = 'guarded2';
$c->create_stream(1, $s2, replication_factor => 3, consistency => 'quorum');
my ($l2) = $c->wait_leader($s2, 0);
is($l2->safe_psql('postgres', "SELECT count(*) FROM felix_publish('$s2', '{\"n\":2}'::jsonb, shard => 0)"),
	'1', 'the cluster serves publishes after all of it');

done_testing();
