# kill -9 while four sessions publish: after the restart every
# acknowledged record is readable at its (shard, seq) with its payload,
# every shard's seqs are contiguous from 0, nothing is duplicated, and
# publishing continues where the log ends.
#
# Round 1 kills only the postmaster (its children notice and exit); round 2
# kills the postmaster and every child at the same instant, so publishers
# die wherever they are.  A record counts as acknowledged once its session
# printed a NOTICE after felix_publish / felix_publish_batch returned, or
# after the COMMIT of its INSERT returned.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = felix_node('crash');
$node->safe_psql('postgres',
	"SELECT felix_create_stream('crash', shards => 3);"
	  . "CREATE TABLE acks (round int, w int, i int, shard int, seq bigint);");

# The SQL each worker runs: a bounded loop that says "ack" for every
# record once it is acknowledged.
sub worker_sql
{
	my ($round, $w) = @_;
	my $payload = "jsonb_build_object('r', $round, 'w', $w, 'i', i)";
	my $key     = "'r$round-w$w-' || i";
	if ($w == 1)
	{
		# felix_publish routed by key
		return qq{DO \$\$ DECLARE p felix_position; BEGIN
			FOR i IN 1..200000 LOOP
				p := felix_publish('crash', $payload, key => $key);
				RAISE NOTICE 'ack % % % %', $w, i, p.shard, p.seq;
			END LOOP; END \$\$;};
	}
	elsif ($w == 2)
	{
		# felix_publish to an explicit shard
		return qq{DO \$\$ DECLARE p felix_position; BEGIN
			FOR i IN 1..200000 LOOP
				p := felix_publish('crash', $payload, key => $key, shard => i % 3);
				RAISE NOTICE 'ack % % % %', $w, i, p.shard, p.seq;
			END LOOP; END \$\$;};
	}
	elsif ($w == 3)
	{
		# felix_publish_batch of 10 records, keyed
		return qq{DO \$\$ DECLARE r record; BEGIN
			FOR b IN 0..20000 LOOP
				FOR r IN SELECT o.shard, o.seq, b * 10 + o.n AS i
				           FROM felix_publish_batch('crash',
				                  ARRAY(SELECT jsonb_build_object('r', $round, 'w', $w, 'i', b * 10 + n)
				                          FROM generate_series(1, 10) n ORDER BY n),
				                  ARRAY(SELECT 'r$round-w$w-' || (b * 10 + n)
				                          FROM generate_series(1, 10) n ORDER BY n))
				                WITH ORDINALITY AS o(shard, seq, n)
				LOOP
					RAISE NOTICE 'ack % % % %', $w, r.i, r.shard, r.seq;
				END LOOP;
			END LOOP; END \$\$;};
	}
	else
	{
		# INSERT, one transaction each: acknowledged when COMMIT returns
		return qq{DO \$\$ BEGIN
			FOR i IN 1..200000 LOOP
				INSERT INTO crash (key, payload) VALUES ($key, $payload);
				COMMIT;
				RAISE NOTICE 'ack % % -1 -1', $w, i;
			END LOOP; END \$\$;};
	}
}

sub count_acks
{
	my ($file) = @_;
	return 0 unless -e $file;
	my $n = () = read_file($file) =~ /NOTICE:\s+ack /g;
	return $n;
}

sub run_round
{
	my ($round, %crash) = @_;
	my (@handles, @files);
	for my $w (1 .. 4)
	{
		my $file = "$PostgreSQL::Test::Utils::tmp_check/crash_r${round}_w$w.txt";
		unlink $file;
		push @files, $file;
		push @handles,
		  IPC::Run::start(
			[
				'psql', '-X', '-q', '-h', $node->host, '-p', $node->port,
				'-d', 'postgres', '-c', worker_sql($round, $w)
			],
			'<', \undef, '>', '/dev/null', '2>', $file,
			IPC::Run::timeout(300));
	}

	# Let every worker get going: at least 200 acknowledgements each, or
	# 60 seconds.
	my $deadline = time + 60;
	while (time < $deadline)
	{
		last unless grep { count_acks($_) < 200 } @files;
		usleep(50_000);
	}
	my @before = map { count_acks($_) } @files;
	note("round $round: acknowledgements per worker when killed: @before");
	ok(!(grep { $_ < 200 } @before), "round $round: every worker published before the crash");

	my $took = crash_node($node, %crash);
	note(sprintf("round %d: old processes gone %.2fs after kill -9", $round, $took));

	for my $h (@handles)
	{
		eval { $h->finish; 1 } or diag("worker: $@");
	}

	# Collect what was acknowledged.
	my @rows;
	for my $f (@files)
	{
		for my $line (split /\n/, read_file($f))
		{
			push @rows, "$round\t$1\t$2\t$3\t$4"
			  if $line =~ /NOTICE:\s+ack (\d+) (\d+) (-?\d+) (-?\d+)/;
		}
	}
	note("round $round: " . scalar(@rows) . " acknowledged records in all");

	my $t0 = time;
	$node->start;
	note(sprintf("round %d: restart took %.2fs", $round, time - $t0));

	$node->safe_psql('postgres',
		"COPY acks FROM STDIN;\n" . join("\n", @rows) . "\n\\.\n");
	return scalar @rows;
}

sub verify
{
	my ($round, $label) = @_;

	# Contiguous from 0, per shard, with no duplicate seq.
	my $bad = $node->safe_psql('postgres', q{
		SELECT string_agg(format('shard %s: %s records, seqs %s..%s, %s distinct',
		                         shard, n, lo, hi, d), '; ')
		  FROM (SELECT shard, count(*) n, min(seq) lo, max(seq) hi,
		               count(DISTINCT seq) d
		          FROM crash GROUP BY shard) s
		 WHERE lo <> 0 OR hi <> n - 1 OR d <> n});
	is($bad, '', "$label: every shard's seqs are contiguous from 0");

	my $shards = $node->safe_psql('postgres',
		"SELECT string_agg(format('%s:%s', shard, next_seq), ' ' ORDER BY shard) FROM felix_shards WHERE stream = 'crash'");
	my $counts = $node->safe_psql('postgres',
		"SELECT string_agg(format('%s:%s', shard, n), ' ' ORDER BY shard) FROM (SELECT shard, count(*) n FROM crash GROUP BY shard) s");
	is($shards, $counts, "$label: felix_shards next_seq equals the records each shard holds");
	note("$label: records per shard $counts");

	# Every acknowledged (shard, seq) holds its payload and key.
	my $missing = $node->safe_psql('postgres', q{
		SELECT count(*) FROM acks a
		 WHERE a.seq >= 0
		   AND NOT EXISTS (SELECT 1 FROM crash c
		                    WHERE c.shard = a.shard AND c.seq = a.seq
		                      AND c.payload = jsonb_build_object('r', a.round, 'w', a.w, 'i', a.i)
		                      AND c.key = format('r%s-w%s-%s', a.round, a.w, a.i))});
	is($missing, '0', "$label: every acknowledged (shard, seq) is readable with its payload");

	# Every acknowledged INSERT is there exactly once.
	my $ins = $node->safe_psql('postgres', q{
		SELECT count(*) FROM acks a
		  LEFT JOIN (SELECT key, count(*) n FROM crash GROUP BY key) c
		    ON c.key = format('r%s-w%s-%s', a.round, a.w, a.i)
		 WHERE a.seq < 0 AND coalesce(c.n, 0) <> 1});
	is($ins, '0', "$label: every acknowledged INSERT is readable exactly once");

	# Nothing published twice (no record is ever written again by recovery).
	my $dups = $node->safe_psql('postgres',
		'SELECT count(*) FROM (SELECT payload FROM crash GROUP BY payload HAVING count(*) > 1) d');
	is($dups, '0', "$label: no record appears twice");

	my $states = $node->safe_psql('postgres',
		"SELECT string_agg(DISTINCT state, ',') FROM felix_shards WHERE stream = 'crash'");
	is($states, 'open', "$label: every shard serves");

	# Publishing continues right after the end of each shard.
	my $next = $node->safe_psql('postgres', qq{
		SELECT count(*)
		  FROM (SELECT * FROM felix_shards WHERE stream = 'crash' OFFSET 0) f
		 WHERE (felix_publish('crash', jsonb_build_object('after', $round, 'shard', f.shard),
		                      shard => f.shard)).seq <> f.next_seq});
	is($next, '0', "$label: the next publish on each shard gets the next seq");
	return;
}

my $n1 = run_round(1);
cmp_ok($n1, '>', 0, 'round 1 acknowledged records');
verify(1, 'after kill -9 of the postmaster');

my $n2 = run_round(2, all => 1);
cmp_ok($n2, '>', 0, 'round 2 acknowledged records');
verify(2, 'after kill -9 of every server process');

note('torn tails repaired: ' . metric($node, 'torn_tails_repaired'));
$node->stop;
felix_done_testing();
