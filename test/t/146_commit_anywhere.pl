# Transactional INSERT and COPY on any node (issue 18, part 1).
#
# A transaction on a node that does not lead every shard it writes to is
# staged at every leader and published only once all of them staged
# (api/forward_commit.c).  On three nodes:
#
#   1. on every node, one transaction of INSERTs and a COPY into every
#      shard of a quorum stream commits, and every node reads all of it;
#   2. all or nothing: when one leader refuses its part (the inserting
#      role has no INSERT there), the commit fails naming that leader and
#      no shard shows any of it -- those staged on other leaders, and
#      those of this node, were cut back; the same commit then goes
#      through once the grant is back;
#   3. the committing backend stopped (SIGSTOP) between the stages: the
#      leaders' staged sessions end after felix.quorum_timeout idle,
#      their parts are cut back, a publish that waited behind them goes
#      through, and the staging leader kept its leases meanwhile (the
#      heartbeat never waits for a staged part); the committing backend,
#      resumed, fails saying nothing was published.  The committing
#      backend terminated between the stages: the same, at once;
#   4. a series of two-shard transactions from node1 while the leader of
#      one shard is killed (kill -9): every committed transaction has both
#      rows exactly once on the new leaders, every transaction refused
#      with "Nothing of the transaction was published" has none, and no
#      row is there twice;
#   5. felix.forward_stage refuses callers outside felix_replication and
#      forged batches.
#   6. a single-row INSERT on a node that does not lead its shard commits
#      through the leader in one call, and through a kill -9 of the leader
#      nothing committed is lost.
#
# tap-etcd: skip.  Its subject is transactions staged at every leader;
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
use Time::HiRes qw(usleep);

my $c = FelixCluster->new(nodes => 3, conf => ["felix.forward_publishes = on"]);
my @n = map { $c->node($_) } 1 .. 3;

for my $node (@n)
{
	$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
}
my $stream = 'txn';
$c->create_stream(1, $stream, shards => 6, replication_factor => 2, consistency => 'quorum');
for my $node (@n)
{
	$node->safe_psql('postgres', "GRANT INSERT, SELECT ON $stream TO app");
}
for my $sh (0 .. 5) { $c->wait_leader($stream, $sh) }
my %leader_of = map { $_ => ($c->leader_of($stream, $_))[0] } 0 .. 5;
note('leaders: ' . join(', ', map { "$_=$leader_of{$_}" } 0 .. 5));

sub rows_of
{
	my ($sql_where) = @_;
	my $total = 0;
	for my $sh (0 .. 5)
	{
		$total += $c->node($leader_of{$sh})->safe_psql('postgres',
			"SELECT count(*) FROM $stream WHERE shard = $sh AND $sql_where");
	}
	return $total;
}

# 1. every node commits into every shard
for my $k (1 .. 3)
{
	my $values = join(', ', map { "($_, 'n$k', '{\"from\": $k, \"how\": \"insert\"}')" } 0 .. 5);
	my $file = "$PostgreSQL::Test::Utils::tmp_check/copy_$k.txt";
	write_file($file, join('', map { "$_\tn$k\t{\"from\": $k, \"how\": \"copy\"}\n" } 0 .. 5));
	# the INSERT as app, the COPY (from a server file) as the superuser:
	# each leader checks the role that inserted each row
	$n[ $k - 1 ]->safe_psql('postgres',
		"BEGIN; SET LOCAL ROLE app; INSERT INTO $stream (shard, key, payload) VALUES $values; RESET ROLE; "
		  . "COPY $stream (shard, key, payload) FROM '$file'; COMMIT");
}
for my $node (@n)
{
	ok(FelixCluster::poll(10, sub { $node->safe_psql('postgres', "SELECT count(*) FROM $stream") == 36 }),
		"$node->{felix_name} reads the 36 rows committed on the three nodes");
	is($node->safe_psql('postgres',
			"SELECT count(DISTINCT (shard, key, payload::text)) FROM $stream"),
		'36', "$node->{felix_name}: each shard holds each node's INSERT and COPY row once");
}
my $forwarded = 0;
$forwarded += $c->metric_of($_, 'publishes_forwarded') for 1 .. 3;
ok($forwarded >= 6, "felix_metrics counts $forwarded commit parts forwarded");

# 2. all or nothing across leaders
my ($far) = grep { $leader_of{$_} ne 'node3' } 0 .. 5;
my $far_leader = $c->node($leader_of{$far});
my $all_shards = join(', ', map { "($_, 'refused', '{}')" } 0 .. 5);
$far_leader->safe_psql('postgres', "REVOKE INSERT ON $stream FROM app");
my ($rc, $err) = psql_error($n[2],
	"BEGIN; SET LOCAL ROLE app; INSERT INTO $stream (shard, key, payload) VALUES $all_shards; COMMIT");
isnt($rc, 0, "a commit whose part on $leader_of{$far} is refused there fails");
like($err, qr/42501/, '... with the leader\'s 42501');
like($err, qr/leader "$leader_of{$far}"/, '... naming that leader');
sleep 1;
is(rows_of("key = 'refused'"), 0, 'no shard shows any row of the refused commit');
$far_leader->safe_psql('postgres', "GRANT INSERT ON $stream TO app");
$n[2]->safe_psql('postgres',
	"BEGIN; SET LOCAL ROLE app; INSERT INTO $stream (shard, key, payload) VALUES $all_shards; COMMIT");
ok(FelixCluster::poll(10, sub { rows_of("key = 'refused'") == 6 }),
	'the same commit goes through once the grant is back: nothing stayed staged');

# 3. the committing backend stopped, then terminated, between the stages.
# Streams a (shard 0 led by node1) and b (shard 0 led by node2), committed
# from node3: node1 stages first; node2's stage waits for a lock a session
# there holds on b.
my ($sa) = $c->pick_stream_name('stage_a', 2, sub { $_[0] eq 'node1' });
my ($sb) = $c->pick_stream_name('stage_b', 2, sub { $_[0] eq 'node2' });
$c->create_stream(1, $sa, replication_factor => 2, consistency => 'quorum');
$c->create_stream(1, $sb, replication_factor => 2, consistency => 'quorum');
my (undef, $ga) = $c->wait_leader($sa, 0);
$c->wait_leader($sb, 0);
my $qt_ms = $n[0]->safe_psql('postgres', "SELECT setting FROM pg_settings WHERE name = 'felix.quorum_timeout'");

sub start_psql
{
	my ($node, $sql, $file, $appname) = @_;
	local $ENV{PGAPPNAME} = $appname;
	return IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'VERBOSITY=verbose', '-h', $node->host, '-p', $node->port,
			'-d', 'postgres', '-c', $sql ],
		'<', \undef, '>', '/dev/null', '2>', $file, IPC::Run::timeout(180));
}

sub staged_on
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
		  . "AND query LIKE '%forward_stage%'");
}

for my $how ('stop', 'terminate')
{
	my $tmp = $PostgreSQL::Test::Utils::tmp_check;
	my $locker = start_psql($n[1], "BEGIN; LOCK TABLE $sb IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(120); COMMIT",
		"$tmp/locker_$how.txt", 'locker');
	ok(FelixCluster::poll(20, sub {
		$n[1]->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'locker' "
			  . "AND wait_event = 'PgSleep'") == 1 }), "$how: a session on node2 holds a lock on $sb");
	my $coord = start_psql($n[2],
		"BEGIN; INSERT INTO $sa (shard, key, payload) VALUES (0, '$how', '{}'); "
		  . "INSERT INTO $sb (shard, key, payload) VALUES (0, '$how', '{}'); COMMIT",
		"$tmp/coord_$how.txt", 'coord');
	ok(FelixCluster::poll(20, sub { staged_on($n[0]) == 1 }),
		"$how: node1 staged its part and waits, idle in the transaction");
	my $pid = $n[2]->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE application_name = 'coord'");
	if ($how eq 'stop')
	{
		kill 'STOP', $pid;
		$n[1]->safe_psql('postgres', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'locker'");
		ok(FelixCluster::poll(20, sub { staged_on($n[1]) == 1 }), 'stop: node2 staged its part too');
		# a publish on node1 waits behind the staged part until node1 ends
		# the idle session and cuts its part back
		my $t0 = time;
		my $out = $c->try_psql(1, "SELECT seq FROM felix_publish('$sa', '{\"probe\": 1}'::jsonb, shard => 0)", 60);
		ok(defined $out && $out =~ /^\d+$/, 'stop: a publish on node1 goes through once the staged session ended');
		note(sprintf('it waited %.1f s (felix.quorum_timeout %d ms)', time - $t0, $qt_ms));
		is(staged_on($n[0]), 0, 'stop: node1 ended the idle staged session');
		ok(FelixCluster::poll(20, sub { staged_on($n[1]) == 0 }), 'stop: so did node2');
		my ($lead, $g) = $c->leader_of($sa, 0);
		is("$lead g$g", "node1 g$ga", 'stop: node1 kept its lease and generation while its part was staged');
		kill 'CONT', $pid;
	}
	else
	{
		$n[2]->safe_psql('postgres', "SELECT pg_terminate_backend($pid)");
		ok(FelixCluster::poll(20, sub { staged_on($n[0]) == 0 }), 'terminate: node1 ended the staged session at once');
		$n[1]->safe_psql('postgres', "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'locker'");
		my $out = $c->try_psql(1, "SELECT seq FROM felix_publish('$sa', '{\"probe\": 2}'::jsonb, shard => 0)", 30);
		ok(defined $out && $out =~ /^\d+$/, 'terminate: a publish on node1 goes through');
		$out = $c->try_psql(2, "SELECT seq FROM felix_publish('$sb', '{\"probe\": 2}'::jsonb, shard => 0)", 30);
		ok(defined $out && $out =~ /^\d+$/, 'terminate: and one on node2');
	}
	eval { $coord->finish; 1 };
	eval { $locker->kill_kill; $locker->finish; 1 };
	my $said = slurp_file("$tmp/coord_$how.txt");
	if ($how eq 'stop')
	{
		# its leaders ended their sessions, which the committing node cannot
		# tell from a crash that kept the part: it fails saying so
		like($said, qr/55F01.*went away while it held its part of the commit/s,
			'stop: the resumed commit fails with 55F01, naming a leader whose part it cannot vouch for')
		  or diag($said);
	}
	for my $s ($sa, $sb)
	{
		my $leader = $s eq $sa ? $n[0] : $n[1];
		is($leader->safe_psql('postgres', "SELECT count(*) FROM $s WHERE key = '$how'"), '0',
			"$how: $s shows nothing of the commit");
	}
}

# 4 and 6: transactions from node1, into $nsh shards (each one row), through
# a kill -9 of the leader of shard 0
sub through_failover
{
	my ($prefix, $nsh) = @_;
	my ($fo) = $c->pick_stream_name($prefix, 3, sub { $_[0] ne 'node1' });
	$c->create_stream(1, $fo, shards => $nsh, replication_factor => 3, consistency => 'quorum');
	my ($old, $g0) = $c->wait_leader($fo, 0);
	$c->wait_leader($fo, $_) for 1 .. $nsh - 1;
	$c->wait_shipping($old, $fo, 0, 2);
	my $tmp = $PostgreSQL::Test::Utils::tmp_check;
	my $script = "$tmp/$prefix.sql";
	my $count = 400;
	write_file($script, join('', map {
		my $t = $_;
		"INSERT INTO $fo (shard, key, payload) VALUES "
		  . join(', ', map { "($_, 't', '{\"t\": $t}')" } 0 .. $nsh - 1) . ";\n"
		  . "\\warn res $t :SQLSTATE\nSELECT pg_sleep(0.02);\n" } 1 .. $count));
	my $log = "$tmp/$prefix.txt";
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'VERBOSITY=verbose', '-h', $n[0]->host, '-p', $n[0]->port,
			'-d', 'postgres', '-f', $script ],
		'<', \undef, '>', '/dev/null', '2>', $log, IPC::Run::timeout(300));
	my $done = sub { my $t = -e $log ? slurp_file($log) : ''; my @r = $t =~ /res \d+ 00000/g; scalar @r };
	ok(FelixCluster::poll(60, sub { $done->() >= 50 }), "$nsh-shard: node1 commits through $old->{felix_name}");
	$c->kill_node($old->{felix_name});
	my ($new) = $c->wait_leader($fo, 0, min_generation => $g0 + 1);
	eval { $h->finish; 1 };

	# what each transaction got: the lines since the previous marker
	my (%state, %clean);
	my @pending;
	for my $line (split /\n/, slurp_file($log))
	{
		if ($line =~ /^res (\d+) (\w+)/)
		{
			$state{$1} = $2;
			$clean{$1} = 1 if grep { /Nothing of the transaction was published/ } @pending;
			@pending = ();
		}
		else { push @pending, $line }
	}
	is(scalar(keys %state), $count, "$nsh-shard: all $count transactions ran");
	my %rows;
	for my $sh (0 .. $nsh - 1)
	{
		my ($leader) = $sh == 0 ? ($new) : $c->wait_leader($fo, $sh);
		for my $t (split /\n/, $leader->safe_psql('postgres',
				"SELECT payload->>'t' FROM $fo WHERE shard = $sh"))
		{
			$rows{$t}[$sh]++;
		}
	}
	my ($committed, $refused, $unknown, $lost, $leaked, $twice, $partial) = (0) x 7;
	for my $t (1 .. $count)
	{
		my @got = map { $rows{$t}[$_] // 0 } 0 .. $nsh - 1;
		my $present = grep { $_ > 0 } @got;
		$twice++ if grep { $_ > 1 } @got;
		if (($state{$t} // '') eq '00000')
		{
			$committed++;
			$lost++ unless $present == $nsh;
		}
		elsif ($clean{$t})
		{
			$refused++;
			$leaked++ if $present > 0;
		}
		else
		{
			$unknown++;
			$partial++ if $present > 0 && $present < $nsh;
		}
	}
	note("$nsh-shard: $committed committed, $refused refused with nothing published, $unknown left unknown ($partial of them partly published)");
	ok($committed > 50, "$nsh-shard: $committed transactions committed");
	is($lost, 0, "$nsh-shard: every committed transaction has all of its rows on the leaders");
	is($leaked, 0, "$nsh-shard: no transaction refused with \"nothing published\" left a row");
	is($twice, 0, "$nsh-shard: no row is there twice");
	$c->start_node($old->{felix_name});
	$c->wait_alive([ map { "node$_" } 1 .. 3 ]);
}
through_failover('commit_fo', 2);

# 5. the answering side, called by hand
my $id = $n[1]->safe_psql('postgres', "SELECT creation_id FROM felix.streams WHERE name = '$stream'");
my $call = "SELECT felix.forward_stage(ARRAY[['$stream', 'app']], ARRAY['$stream'], ARRAY['$id'], ARRAY[0], '\\x00112233'::bytea)";
($rc, $err) = psql_error($n[1], "SET ROLE app; BEGIN; $call; COMMIT");
like($err, qr/42501/, 'a role outside felix_replication may not call felix.forward_stage');
($rc, $err) = psql_error($n[1], "SET ROLE felix_node_node3; BEGIN; $call; COMMIT");
like($err, qr/22P03.*shorter than a batch/s, 'a forged short batch is refused');
($rc, $err) = psql_error($n[1],
	"SET ROLE felix_node_node3; BEGIN; SELECT felix.forward_stage(ARRAY[['$stream', 'app']], ARRAY['$stream'], ARRAY['$id'], "
	  . "ARRAY[0], decode(repeat('00', 56), 'hex')); COMMIT");
like($err, qr/22P03/, 'a batch that does not match its checksum is refused');
($rc, $err) = psql_error($n[1],
	"SET ROLE felix_node_node3; BEGIN; SELECT felix.forward_stage(ARRAY[['$stream', 'app']], ARRAY['$stream', '$stream'], ARRAY['$id'], "
	  . "ARRAY[0], '\\x00'::bytea); COMMIT");
like($err, qr/22023.*same number of batches/s, 'arrays of different lengths are refused');
($rc, $err) = psql_error($n[1],
	"SET ROLE felix_node_node3; BEGIN; SELECT felix.forward_stage(ARRAY['$stream', 'app'], ARRAY['$stream'], ARRAY['$id'], "
	  . "ARRAY[0], '\\x00'::bytea); COMMIT");
like($err, qr/22023.*pairs/s, 'inserters that are not {stream, role} pairs are refused');

# 6. single-row INSERTs: the one call of a single leader (commit_one_leader)
{
	my $before = $c->metric_of(1, 'publishes_forwarded');
	through_failover('commit_one', 1);
	ok($c->metric_of(1, 'publishes_forwarded') > $before + 50, 'node1 counted its single-leader commits forwarded');
}

$c->teardown;
felix_done_testing();
