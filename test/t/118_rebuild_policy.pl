# The rebuild policy on a leader: felix.rebuild_max_concurrent and
# felix.rebuild_bytes_per_sec.
#
# Why: a rebuild is a full transfer of a shard, and rebuilding every halted
# follower at once -- across every shard a failed node led -- is how a
# recovery becomes an outage (replication-design.txt, "Rebuilding a halted
# follower").  So a leader rebuilds at most rebuild_max_concurrent
# followers at a time, node-wide, each shipped at no more than
# rebuild_bytes_per_sec; a rebuild asked for by hand (felix_rebuild,
# felix_rebuild_halted) runs under the same cap, but at least one at a
# time.
#
# Setup, for real: three streams (replication factor 3) all led by the
# same node L (node2 or node3); F is the other of the two.  F takes records
# of each, is stopped, the streams grow ~10 MB past their retention (8 MB)
# and L trims them, F starts again: each stream's leader offers F a
# bootstrap, F refuses (it holds records of its own) and is halted
# needs_bootstrap -- three halted followers of shards led by L.
# felix.rebuild_max_concurrent is 0 until then, so they stay halted
# (checked).
#
# 1. Automatic: on L, felix.rebuild_bytes_per_sec = 3MB and
#    felix.rebuild_max_concurrent = 1, reloaded.
# 2. The same halts again (F stopped, ~10 MB more, trimmed, F started) with
#    rebuild_max_concurrent = 0 and rebuild_bytes_per_sec = 2MB: by hand,
#    felix_rebuild of the first stream answers 'started', of the second
#    'queued: ...' (the first is still in flight), and
#    felix_rebuild_halted() asks for the one left (returns 1).
#
# In both, a session on L samples felix_replication and felix_metrics
# every ~20 ms throughout, and:
# - no sample shows two of F's followers in state 'rebuilding' at once, and
#   the rebuilds L logs (start ... rebuilt) do not overlap in time;
# - all three are rebuilt (rebuilds_completed + 3, felix_halted empty, F
#   ends with byte-identical record batches for each stream);
# - each rebuild (~8 MB) is shipped at the cap within 20%: its bytes over
#   its wall time (from L's log) and its steady-state rate (from the
#   samples' rebuild_bytes_shipped) are between 0.8x and 1.2x the cap.
#
# tap-etcd: skip.  Its subject is the rebuild of halted followers; the
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
use IPC::Run;
use Time::Local qw(timegm);
use Time::HiRes qw(time usleep);

my $RETAIN = 8 * 1024 * 1024;    # retention_bytes of each stream

my $c = FelixCluster->new(nodes => 3,
	conf => [ "felix.segment_bytes = '1MB'", "felix.rebuild_max_concurrent = 0" ]);

# Three streams led by the same node, not node1 (the control plane).
my ($s1, @set) = $c->pick_stream_name('pola', 3, sub { $_[0] ne 'node1' });
my $lname = $set[0];
my ($s2) = $c->pick_stream_name('polb', 3, sub { $_[0] eq $lname });
my ($s3) = $c->pick_stream_name('polc', 3, sub { $_[0] eq $lname });
my @streams = ($s1, $s2, $s3);
my $in = join(',', map { "'$_'" } @streams);
my ($fname) = grep { $_ ne 'node1' && $_ ne $lname } map { $_->{felix_name} } $c->nodes;
my $f = $c->node($fname);
my $leader = $c->node($lname);
note("streams @streams led by $lname; follower under test $fname");

for my $s (@streams)
{
	$c->create_stream(1, $s, replication_factor => 3, consistency => 'quorum',
		payload_type => 'text', retention_bytes => $RETAIN);
	my ($l) = $c->wait_leader($s, 0);
	is($l->{felix_name}, $lname, "$s is led by $lname");
	$c->wait_shipping($leader, $s, 0, 2, 30);
}

sub span
{
	my ($node, $s) = @_;
	return $node->safe_psql('postgres',
		"SELECT start_seq || ' ' || next_seq FROM felix_shards WHERE stream = '$s' AND shard = 0");
}

sub set_policy
{
	my ($max, $rate) = @_;
	$leader->safe_psql('postgres', "ALTER SYSTEM SET felix.rebuild_bytes_per_sec = '$rate'");
	$leader->safe_psql('postgres', "ALTER SYSTEM SET felix.rebuild_max_concurrent = $max");
	$leader->safe_psql('postgres', 'SELECT pg_reload_conf()');
	ok(defined FelixCluster::poll(10, sub {
		$leader->safe_psql('postgres',
			"SELECT current_setting('felix.rebuild_max_concurrent') || ' ' || current_setting('felix.rebuild_bytes_per_sec')")
		  eq "$max $rate" }, 0.1),
		"$lname runs with rebuild_max_concurrent = $max, rebuild_bytes_per_sec = $rate");
	return $leader->safe_psql('postgres',
		"SELECT setting::bigint * CASE unit WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576 ELSE 1 END "
		  . "FROM pg_settings WHERE name = 'felix.rebuild_bytes_per_sec'");
}

# F stopped, ~10 MB more on each stream (batches of 64 records of ~1 kB),
# L's retention trims past F's position, F started: halted needs_bootstrap
# on all three (L must not rebuild automatically: rebuild_max_concurrent 0).
sub halt_all
{
	my ($tag) = @_;
	my %ftail = map { $_ => (split / /, span($f, $_))[1] } @streams;
	$c->stop_node($f);
	for my $s (@streams)
	{
		$leader->safe_psql('postgres',
			"SELECT count(*) FROM generate_series(1, 160) b, LATERAL felix_publish_batch('$s', "
			  . "ARRAY(SELECT '$tag-' || b || '-' || i || '-' || repeat('z', 1000) FROM generate_series(1, 64) i))",
			timeout => 120);
		$leader->safe_psql('postgres', "SELECT felix_enforce_retention('$s')");
		my ($start, $next) = split / /, span($leader, $s);
		cmp_ok($start, '>', $ftail{$s},
			"$tag: $lname trimmed $s past ${fname}'s tail $ftail{$s} (its log is [$start, $next))");
	}
	$c->start_node($f);
	my $states = '';
	ok(defined FelixCluster::poll(60, sub {
		$states = $leader->safe_psql('postgres',
			"SELECT string_agg(state, ',' ORDER BY stream) FROM felix_replication "
			  . "WHERE follower = '$fname' AND stream IN ($in)");
		$states eq 'halted_needs_bootstrap,halted_needs_bootstrap,halted_needs_bootstrap' }, 0.1),
		"$tag: $lname halted $fname needs_bootstrap on all three streams ($states)")
	  or do { $c->diag_shard($_, 0) for @streams };
	ok(defined FelixCluster::poll(20, sub {
		$c->cp->safe_psql('postgres',
			"SELECT count(*) FROM felix_halted WHERE node = '$fname' AND reason = 'needs_bootstrap' AND stream IN ($in)")
		  eq '3' }, 0.1),
		"$tag: felix_halted lists the three halts");
	return;
}

# A session on L that samples, every ~20 ms until rebuilds_completed
# reaches $target: time, followers of F rebuilding, rebuild_bytes_shipped,
# rebuilds_completed, each stream's state.
sub start_sampler
{
	my ($target, $file) = @_;
	unlink $file;
	my $h = IPC::Run::start(
		[
			'psql', '-X', '-q', '-h', $leader->host, '-p', $leader->port, '-d', 'postgres',
			'-c', qq{DO \$\$ DECLARE t0 timestamptz := clock_timestamp(); n bigint; st text;
				bytes double precision; done double precision;
			BEGIN
				LOOP
					SELECT count(*) FILTER (WHERE state = 'rebuilding'),
					       string_agg(stream || '=' || state, ',' ORDER BY stream)
					  INTO n, st FROM felix_replication
					 WHERE follower = '$fname' AND stream IN ($in);
					SELECT value INTO bytes FROM felix_metrics WHERE name = 'rebuild_bytes_shipped';
					SELECT value INTO done FROM felix_metrics WHERE name = 'rebuilds_completed';
					RAISE NOTICE 'sample % % % % %', extract(epoch FROM clock_timestamp()), n,
						coalesce(bytes, 0)::bigint, coalesce(done, 0)::bigint, st;
					EXIT WHEN coalesce(done, 0) >= $target
					       OR clock_timestamp() > t0 + interval '90 seconds';
					PERFORM pg_sleep(0.02);
				END LOOP;
			END \$\$;}
		],
		'<', \undef, '>', '/dev/null', '2>', $file, IPC::Run::timeout(150));
	usleep(300_000);
	return $h;
}

sub log_epoch
{
	my ($ts) = @_;
	$ts =~ /^(\d+)-(\d+)-(\d+) (\d+):(\d+):(\d+)\.(\d+)/ or die "bad timestamp $ts";
	return timegm($6, $5, $4, $3, $2 - 1, $1) + "0.$7";
}

# Wait for the three rebuilds, then check what the samples and L's log
# (from byte $log_from on) show of them.
sub check_rebuilds
{
	my ($tag, $base, $sampler, $samples, $log_from, $cap) = @_;
	my $t0 = time;
	my $all = FelixCluster::poll(90, sub {
		($c->metric_of($leader, 'rebuilds_completed') // 0) >= $base->{rebuilds_completed} + 3 }, 0.2);
	ok(defined $all, sprintf('%s: all three rebuilt (rebuilds_completed + 3) in %.1f s', $tag, time - $t0))
	  or do { $c->diag_shard($_, 0) for @streams };
	eval { $sampler->finish; 1 } or eval { $sampler->kill_kill; };
	is($c->metric_of($leader, 'rebuilds_started'), $base->{rebuilds_started} + 3,
		"$tag: rebuilds_started + 3");

	# never two at once, by the samples
	my @rows;
	for my $line (split /\n/, read_file($samples))
	{
		next unless $line =~ /NOTICE:\s+sample ([\d.]+) (\d+) (\d+) (\d+) (\S*)/;
		push @rows, { t => $1, n => $2, bytes => $3, done => $4, states => $5 };
	}
	cmp_ok(scalar(@rows), '>', 100, "$tag: " . scalar(@rows) . " samples of felix_replication on $lname");
	my $maxgap = 0;
	for my $i (1 .. $#rows)
	{
		my $gap = $rows[$i]{t} - $rows[ $i - 1 ]{t};
		$maxgap = $gap if $gap > $maxgap;
	}
	note(sprintf('%s: samples %.3f s apart on average, %.3f s at most', $tag,
		@rows > 1 ? ($rows[-1]{t} - $rows[0]{t}) / $#rows : 0, $maxgap));
	my @two = grep { $_->{n} > 1 } @rows;
	is(scalar(@two), 0, "$tag: no sample shows two followers rebuilding at once")
	  or diag(join("\n", map { "$_->{t}: $_->{states}" } @two[ 0 .. ($#two < 5 ? $#two : 5) ]));
	my %seen;
	for my $r (@rows)
	{
		$seen{$1} = 1 while $r->{states} =~ /(\w+)=rebuilding/g;
	}
	is(join(',', sort keys %seen), join(',', sort @streams), "$tag: each stream was seen rebuilding");

	# never two at once, by L's log
	my (%start, %end, %bytes);
	my $log = substr(read_file($leader->logfile), $log_from);
	for my $line (split /\n/, $log)
	{
		next unless $line =~ /^(\S+ \S+) \S+ .*felix ship: stream "(\w+)" shard 0: (.*)/;
		my ($ts, $s, $rest) = ($1, $2, $3);
		next unless grep { $_ eq $s } @streams;
		if ($rest =~ /^rebuilding follower "$fname"/)
		{
			$start{$s} = log_epoch($ts);
		}
		elsif ($rest =~ /^follower "$fname" rebuilt: it holds seqs \[\d+, \d+\) after (\d+) bytes/)
		{
			$end{$s} = log_epoch($ts);
			$bytes{$s} = $1;
		}
	}
	is(scalar(grep { defined $start{$_} && defined $end{$_} } @streams), 3,
		"$tag: $lname logged the start and the end of each rebuild");
	my @order = sort { ($start{$a} // 0) <=> ($start{$b} // 0) } @streams;
	for my $i (1 .. $#order)
	{
		my ($p, $n) = @order[ $i - 1, $i ];
		cmp_ok($start{$n} // 0, '>=', $end{$p} // 9e9,
			"$tag: the rebuild of $n began after the rebuild of $p ended");
	}

	# the rate
	my $total = 0;
	for my $s (@order)
	{
		next unless defined $start{$s} && defined $end{$s};
		$total += $bytes{$s};
		my $secs = $end{$s} - $start{$s};
		my $rate = $secs > 0 ? $bytes{$s} / $secs : 9e18;
		note(sprintf('%s: %s: %d bytes in %.3f s: %.0f B/s (cap %d)', $tag, $s, $bytes{$s}, $secs, $rate, $cap));
		cmp_ok($bytes{$s}, '>', 6 * 1024 * 1024, "$tag: the rebuild of $s shipped over 6 MB");
		cmp_ok($rate, '<=', 1.2 * $cap, "$tag: $s was rebuilt at no more than 1.2x the cap");
		cmp_ok($rate, '>=', 0.8 * $cap, "$tag: $s was rebuilt at no less than 0.8x the cap");

		# steady state, by the samples: rebuild_bytes_shipped from 0.5 s
		# after the start to 0.2 s before the end
		my @win = grep { $_->{t} >= $start{$s} + 0.5 && $_->{t} <= $end{$s} - 0.2 } @rows;
		if (@win >= 2 && $win[-1]{t} - $win[0]{t} > 1)
		{
			my $steady = ($win[-1]{bytes} - $win[0]{bytes}) / ($win[-1]{t} - $win[0]{t});
			note(sprintf('%s: %s steady: %.0f B/s over %.2f s', $tag, $s, $steady, $win[-1]{t} - $win[0]{t}));
			cmp_ok($steady, '<=', 1.2 * $cap, "$tag: $s steady-state rate at most 1.2x the cap");
			cmp_ok($steady, '>=', 0.8 * $cap, "$tag: $s steady-state rate at least 0.8x the cap");
		}
		else
		{
			fail("$tag: too few samples inside the rebuild of $s to measure a steady rate");
		}
	}
	is(($c->metric_of($leader, 'rebuild_bytes_shipped') // 0) - $base->{rebuild_bytes_shipped}, $total,
		"$tag: rebuild_bytes_shipped grew by the bytes the three rebuilds logged");

	# the outcome
	for my $s (@streams)
	{
		is(span($f, $s), span($leader, $s), "$tag: $fname holds exactly ${lname}'s span of $s");
		is(segment_digest($f, $s, 0), segment_digest($leader, $s, 0),
			"$tag: ${fname}'s segments of $s hold byte-identical record batches to ${lname}'s");
		is($leader->safe_psql('postgres',
				"SELECT state FROM felix_replication WHERE stream = '$s' AND follower = '$fname'"),
			'shipping', "$tag: $fname is an ordinary follower of $s again");
	}
	ok(defined FelixCluster::poll(20, sub {
		$c->cp->safe_psql('postgres', "SELECT count(*) FROM felix_halted WHERE stream IN ($in)") eq '0' }, 0.1),
		"$tag: felix_halted is empty again");
	return;
}

sub metrics_now
{
	return { map { $_ => $c->metric_of($leader, $_) // 0 }
		  qw(rebuilds_started rebuilds_completed rebuild_bytes_shipped) };
}

# F holds ten records of each stream.
for my $s (@streams)
{
	$leader->safe_psql('postgres',
		"SELECT count(felix_publish('$s', 'first-' || i, shard => 0)) FROM generate_series(1, 10) i");
	ok(defined FelixCluster::poll(30, sub { span($f, $s) eq '0 10' }, 0.1),
		"$fname holds the first 10 records of $s");
}

# ---------------------------------------------------------------------
# 1. Automatic: one at a time, at 3 MB/s
# ---------------------------------------------------------------------
halt_all('auto');
my $base = metrics_now();
sleep 2;
is($c->metric_of($leader, 'rebuilds_started') // 0, $base->{rebuilds_started},
	'auto: with felix.rebuild_max_concurrent = 0 none is rebuilt');

my $samples = "$PostgreSQL::Test::Utils::tmp_check/118_samples_auto.txt";
my $log_from = -s $leader->logfile;
my $sampler = start_sampler($base->{rebuilds_completed} + 3, $samples);
my $cap = set_policy(1, '3MB');
check_rebuilds('auto', $base, $sampler, $samples, $log_from, $cap);

# ---------------------------------------------------------------------
# 2. By hand, with automatic rebuilds off: still one at a time, at 2 MB/s
# ---------------------------------------------------------------------
$cap = set_policy(0, '2MB');
halt_all('asked');
$base = metrics_now();
$samples = "$PostgreSQL::Test::Utils::tmp_check/118_samples_asked.txt";
$log_from = -s $leader->logfile;
$sampler = start_sampler($base->{rebuilds_completed} + 3, $samples);
is($leader->safe_psql('postgres', "SELECT felix_rebuild('$s1', 0, '$fname')"), 'started',
	"asked: felix_rebuild of $s1 started");
like($leader->safe_psql('postgres', "SELECT felix_rebuild('$s2', 0, '$fname')"),
	qr/^queued: .*felix\.rebuild_max_concurrent/,
	"asked: felix_rebuild of $s2 is queued while $s1 is rebuilt");
is($leader->safe_psql('postgres', 'SELECT felix_rebuild_halted()'), '1',
	"asked: felix_rebuild_halted() asks for the one left ($s3)");
check_rebuilds('asked', $base, $sampler, $samples, $log_from, $cap);
my $asked = () = substr(read_file($leader->logfile), $log_from) =~ /rebuilding follower "$fname" \(halted needs_bootstrap\) from seq \d+, as asked/g;
is($asked, 3, 'asked: the log says each of the three was rebuilt as asked');

$c->teardown;
felix_done_testing();
