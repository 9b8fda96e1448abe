# A full disk under felix.data_directory: clear errors, no acknowledged
# record lost, a failed commit publishes nothing, and service resumes once
# space is freed.
#
# felix.data_directory lives on a small tmpfs (16 MB) that this script
# mounts itself.  An unprivileged user cannot mount, so the script first
# re-executes itself inside a new user and mount namespace (unshare --user
# --mount, mapping the caller's uid and gid to themselves so the server
# still runs as that user, not as root); a shell there mounts the tmpfs on
# tmp_check/disk_full_tmpfs, drops the capabilities the namespace gave it
# and runs this script again.  The servers the test starts inherit the
# namespace and see the mount; nothing outside the namespace ever does, and
# the mount goes away with the last process in it.  If the namespace or the
# mount is refused, the test fails (it never skips).
#
# Space is made scarce by a filler file next to felix's directory on the
# tmpfs, sized so that only a given number of bytes stay free, and freed
# again by removing it.  felix.segment_bytes is 256kB so segments roll on
# the small disk.
#
#   a. felix_publish of single records until the disk is full: the failing
#      publish gets SQLSTATE 53100 naming stream and shard, with a hint; the
#      server stays up; every acknowledged record reads back at its seq and
#      nothing else is there; a retry while still full fails the same way;
#      the heartbeat worker carries on and the lease stays live (it only
#      warns that it cannot keep what it saw of the control plane);
#      after the filler goes, publishing continues at the next seq, and an
#      immediate stop and start (recovery) keeps exactly the acknowledged
#      records.
#   b. a transactional INSERT over four shards whose COMMIT runs out of
#      space after some shards' batches fit: the COMMIT fails with 53100 and
#      no row of it is visible on any shard -- not right away, not once the
#      shards are written to again, not after a restart; with space freed
#      the same INSERT commits and is visible in full, right after what the
#      shards held.
#   c. a single-shard INSERT appended as several ~1 MB batches that runs out
#      of space after the first one: nothing of it visible, before and after
#      later writes and a restart; then a multi-batch commit goes through.
use strict;
use warnings;

# --- Into a user + mount namespace with a tmpfs (before any test module is
# loaded, so the first process writes no test log of its own). ---
BEGIN
{
	unless (defined $ENV{FELIX_DISK_FULL_TMPFS})
	{
		require File::Path;
		require Cwd;
		my $tmp_check = $ENV{TESTDIR} ? "$ENV{TESTDIR}/tmp_check" : 'tmp_check';
		my $mnt = "$tmp_check/disk_full_tmpfs";
		File::Path::make_path($mnt);
		$mnt = Cwd::abs_path($mnt);
		my $gid = (split ' ', $()[0];
		my @ns = ('unshare', '--user', "--map-user=$<", "--map-group=$gid",
			'--mount', '--keep-caps', '--');

		# Probe first, so that a refusal shows up as a failed test with the
		# reason rather than as a script that printed nothing.
		my $probe = `@ns true 2>&1`;
		if ($? != 0)
		{
			$probe =~ s/^/# /mg;
			print "1..1\nnot ok 1 - '@ns true' failed (exit status " . ($? >> 8) . "): an "
			  . "unprivileged user + mount namespace is needed to mount the tmpfs this test fills\n"
			  . $probe;
			exit 1;
		}

		$ENV{FELIX_DISK_FULL_TMPFS} = $mnt;
		$ENV{PERL5LIB} = join(':', grep { !ref } @INC);
		my $sh = q{
			mnt=$1; shift
			if ! err=$(mount -t tmpfs -o size=16m,mode=0700 felix_disk_full "$mnt" 2>&1); then
				FELIX_NS_ERROR="mount -t tmpfs on $mnt failed: $err"
				export FELIX_NS_ERROR
			fi
			# The test and its servers need no capabilities.
			if command -v setpriv >/dev/null 2>&1; then
				exec setpriv --inh-caps=-all --ambient-caps=-all -- "$@"
			fi
			exec "$@"
		};
		{
			no warnings 'exec';
			exec(@ns, 'sh', '-c', $sh, 'felix-disk-full', $mnt, $^X, $0, @ARGV);
		}
		print "1..1\nnot ok 1 - could not run unshare: $!\n";
		exit 1;
	}
}

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $t_start = time;
my $mnt     = $ENV{FELIX_DISK_FULL_TMPFS};
my $filler  = "$mnt/filler";
my $fdir    = "$mnt/felix";

# --- The tmpfs must really be there: otherwise the filler would fill
# whatever disk tmp_check is on. ---
{
	my $ns_error = $ENV{FELIX_NS_ERROR} // '';
	is($ns_error, '', 'the tmpfs was mounted inside the namespace');
	my ($type, $src) = ('', '');
	open my $fh, '<', '/proc/self/mountinfo' or die "mountinfo: $!";
	while (my $line = <$fh>)
	{
		my ($pre, $post) = split / - /, $line, 2;
		my @f = split ' ', $pre;
		next unless defined $f[4] && $f[4] eq $mnt;
		($type, $src) = split ' ', $post;
	}
	close $fh;
	my ($blocks, $bsize) = split ' ', `stat -f -c '%b %S' '$mnt'`;
	my $size = ($blocks // 0) * ($bsize // 0);
	note("mount on $mnt: type '$type' source '$src', $size bytes");
	unless (is("$type $size", 'tmpfs ' . 16 * 1024 * 1024,
			"a 16 MB tmpfs is mounted on $mnt"))
	{
		diag('not filling a disk that is not the test\'s own tmpfs; stopping');
		done_testing();
		exit 1;
	}
}

# Bytes the tmpfs has free.
sub free_bytes
{
	my ($avail, $bsize) = split ' ', `stat -f -c '%a %S' '$mnt'`;
	die "stat -f $mnt failed" unless defined $bsize;
	return $avail * $bsize;
}

# Write a filler file so that about $leave bytes stay free; returns the
# bytes actually free afterwards.
sub fill_leaving
{
	my ($leave) = @_;
	unlink $filler;
	my $want = free_bytes() - $leave;
	$want -= $want % 4096;
	open my $fh, '>:raw', $filler or die "open $filler: $!";
	my $chunk = "\0" x 65536;
	my $done  = 0;
	while ($done < $want)
	{
		my $n = $want - $done < 65536 ? $want - $done : 65536;
		my $w = syswrite($fh, $chunk, $n);
		die "writing $filler: $!" unless defined $w && $w > 0;
		$done += $w;
	}
	close $fh or die "close $filler: $!";
	my $free = free_bytes();
	note("filler of $done bytes written; $free bytes free on the tmpfs");
	return $free;
}

sub unfill
{
	unlink $filler or die "unlink $filler: $!";
	note('filler removed; ' . free_bytes() . ' bytes free on the tmpfs');
	return;
}

# SQLSTATE, message, detail and hint of the first ERROR/FATAL/PANIC in a
# verbose psql stderr.
sub parse_error
{
	my ($stderr) = @_;
	my %e;
	@e{qw(sqlstate message)} =
	  $stderr =~ /\b(?:ERROR|FATAL|PANIC):\s+([0-9A-Z]{5}):\s+([^\n]*)/;
	($e{detail}) = $stderr =~ /^DETAIL:\s+([^\n]*)/m;
	($e{hint})   = $stderr =~ /^HINT:\s+([^\n]*)/m;
	$e{$_} //= '' for qw(sqlstate message detail hint);
	return \%e;
}

# The error checks every disk-full failure must pass.
sub check_disk_full_error
{
	my ($label, $stderr, $stream, $shard_re) = @_;
	my $e = parse_error($stderr);
	note("$label: SQLSTATE $e->{sqlstate}: $e->{message}");
	note("$label: DETAIL: $e->{detail}") if $e->{detail} ne '';
	note("$label: HINT: $e->{hint}")     if $e->{hint} ne '';
	is($e->{sqlstate}, '53100', "$label: SQLSTATE 53100 (disk_full)")
	  or diag("stderr:\n$stderr");
	like($e->{message}, qr/stream "$stream" shard $shard_re\b/,
		"$label: the message names the stream and the shard");
	like($e->{message}, qr/no space left on device|disk (?:is )?full|out of (?:disk )?space/i,
		"$label: the message says the disk is full");
	isnt($e->{hint}, '', "$label: the error has a hint");
	return $e;
}

sub start_time
{
	my ($node) = @_;
	return $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');
}

# Nothing but "" when every shard of the stream holds seqs 0..n-1 once each.
sub contiguity
{
	my ($node, $stream) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(string_agg(format('shard %s: %s records, seqs %s..%s, %s distinct',
		                                  shard, n, lo, hi, d), '; '), '')
		  FROM (SELECT shard, count(*) n, min(seq) lo, max(seq) hi,
		               count(DISTINCT seq) d
		          FROM $stream GROUP BY shard) s
		 WHERE lo <> 0 OR hi <> n - 1 OR d <> n});
}

# "shard:records ..." as read, and "shard:next_seq ..." as felix_shards says.
sub counts
{
	my ($node, $stream, $nshards) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(format('%s:%s', g, (SELECT count(*) FROM $stream s WHERE s.shard = g)),
		                  ' ' ORDER BY g)
		  FROM generate_series(0, $nshards - 1) g});
}

sub next_seqs
{
	my ($node, $stream) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(format('%s:%s', shard, next_seq), ' ' ORDER BY shard) FROM felix_shards WHERE stream = '$stream'");
}

sub states
{
	my ($node, $stream) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(DISTINCT state, ',') FROM felix_shards WHERE stream = '$stream'");
}

# The shard states once the node worker has opened every shard of the
# stream after a start (felix_shards shows one not opened yet as closed),
# or as they are after three minutes.
sub states_after_start
{
	my ($node, $stream) = @_;
	$node->poll_query_until('postgres',
		"SELECT string_agg(DISTINCT state, ',') = 'open' FROM felix_shards WHERE stream = '$stream'");
	return states($node, $stream);
}

# Stop (immediately: no shutdown checkpoint, felix recovers its logs) and
# start again.
sub restart_immediate
{
	my ($node) = @_;
	my $t0 = time;
	$node->stop('immediate');
	$node->start;
	note(sprintf('immediate stop and start took %.2fs', time - $t0));
	return;
}

my $node = felix_node('disk_full',
	"felix.data_directory = '$fdir'",
	"felix.segment_bytes = '256kB'");

# The payload of record $i of a stream: about 1 kB, and its own.
sub payload_sql
{
	my ($tag, $i) = @_;
	return "format('$tag-%s-%s', $i, repeat(md5(($i)::text), 32))";
}

# ======================================================================
# a. felix_publish until the disk is full
# ======================================================================
$node->safe_psql('postgres', q{
	SELECT felix_create_stream('full1', payload_type => 'text');
	CREATE TABLE acks1 (i int PRIMARY KEY, seq bigint NOT NULL);
});

# Publish records $from..$to one call each, stopping at the first error.
# Returns the acknowledged (i, seq) pairs, psql's exit code and stderr.
sub publish_loop
{
	my ($from, $to) = @_;
	my $payload = payload_sql('full1', 'i');
	my ($rc, $err) = psql_error($node, qq{
		DO \$\$ DECLARE p felix_position; BEGIN
			FOR i IN $from..$to LOOP
				p := felix_publish('full1', $payload, shard => 0);
				RAISE NOTICE 'ack % %', i, p.seq;
			END LOOP; END \$\$;});
	my @acks;
	push @acks, [ $1, $2 ] while $err =~ /NOTICE:\s+(?:00000:\s+)?ack (\d+) (\d+)/g;
	return (\@acks, $rc, $err);
}

sub record_acks
{
	my ($acks) = @_;
	return unless @$acks;
	$node->safe_psql('postgres',
		"INSERT INTO acks1 VALUES " . join(',', map { "($_->[0], $_->[1])" } @$acks));
	return;
}

# Every acknowledged record at its seq with its payload, and nothing else.
sub check_full1
{
	my ($label) = @_;
	my $payload = payload_sql('full1', 'a.i');
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM acks1 a
			 WHERE NOT EXISTS (SELECT 1 FROM full1 f
			                    WHERE f.shard = 0 AND f.seq = a.seq AND f.payload = $payload)}),
		'0', "$label: every acknowledged record is readable at its seq with its payload");
	is( $node->safe_psql('postgres', q{
			SELECT count(*) FROM full1 f WHERE NOT EXISTS (SELECT 1 FROM acks1 a WHERE a.seq = f.seq)}),
		'0', "$label: the stream holds no record that was not acknowledged");
	is(contiguity($node, 'full1'), '', "$label: seqs are contiguous from 0, no duplicate");
	is(next_seqs($node, 'full1'),
		'0:' . $node->safe_psql('postgres', 'SELECT count(*) FROM acks1'),
		"$label: next_seq is the number of acknowledged records");
	return;
}

{
	my ($acks, $rc, $err) = publish_loop(1, 20);
	is($rc, 0, 'a: 20 records published before the disk fills') or diag($err);
	record_acks($acks);
	my @segs = glob("$fdir/*/*/0/*.seg");
	ok(scalar(@segs) > 0, "a: the shard's segments are on the tmpfs ($fdir)");

	my $free = fill_leaving(64 * 1024);
	cmp_ok($free, '<=', 128 * 1024, 'a: the tmpfs has at most 128 kB free');
	my $t0 = start_time($node);

	# 3000 records of 1 kB cannot fit in what is left (plus at most one
	# preallocated segment tail of 256 kB).
	($acks, $rc, $err) = publish_loop(21, 3020);
	record_acks($acks);
	my $n = scalar @$acks;
	my $last = $n ? $acks->[-1][0] : 20;
	note("a: $n records acknowledged before the failure");
	isnt($rc, 0, 'a: publishing fails once the disk is full (within 3000 records)');
	cmp_ok($n, '>', 0, 'a: some records still fitted after the filler');
	like($err, qr/CONTEXT:\s+PL\/pgSQL function/, 'a: the error came from the publish loop');
	check_disk_full_error('a: the failing felix_publish', $err, 'full1', '0');
	my $failed_i = $last + 1;

	is(start_time($node), $t0, 'a: the server stayed up (pg_postmaster_start_time unchanged)');
	is(states($node, 'full1'), 'open', 'a: the shard still serves');
	check_full1('a: disk full');
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM full1 WHERE payload LIKE 'full1-$failed_i-%'"),
		'0', "a: the record whose publish failed (i = $failed_i) is not visible");

	# Still full: the shard refuses again, the same clean way.
	($acks, $rc, $err) = publish_loop($failed_i, $failed_i);
	record_acks($acks);
	isnt($rc, 0, 'a: a retry while the disk is still full fails too');
	check_disk_full_error('a: the retry', $err, 'full1', '0');
	check_full1('a: after the retry');

	# The heartbeats go on while the disk is full.  The worker writes what
	# the node has seen of the control plane every second; that write
	# failing ended the worker at every try, and the lease lapsed (a
	# publish right after space was freed was refused).
	my $hb_sql = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'felix heartbeat'";
	my $hb = $node->safe_psql('postgres', $hb_sql);
	my ($lapsed, $samples, $t_full) = (0, 0, time);
	while (time - $t_full < 2.5)
	{
		my $l = $node->safe_psql('postgres',
			"SELECT coalesce(max(lease_remaining_ms), -1) FROM felix_shards WHERE stream = 'full1' AND shard = 0");
		$samples++;
		$lapsed++ unless $l > 0;
		usleep(100_000);
	}
	is($node->safe_psql('postgres', $hb_sql), $hb, 'a: the heartbeat worker carried on through 2.5 s of a full disk');
	unlike(slurp_file($node->logfile), qr/background worker "felix heartbeat" \(PID \d+\) exited/,
		'a: and never exited while the disk was full');
	is($lapsed, 0, "a: the lease stayed live at every one of $samples samples");
	like(slurp_file($node->logfile),
		qr/WARNING:  felix data directory: could not (?:create|write) "[^"]*control_plane\.tmp"/,
		'a: and the node warned that it could not keep what it saw of the control plane');

	# Space freed: publishing continues at the next seq.
	unfill();
	my $before = $node->safe_psql('postgres', 'SELECT count(*) FROM acks1');
	($acks, $rc, $err) = publish_loop(5001, 5020);
	record_acks($acks);
	is($rc, 0, 'a: with space freed, 20 more records publish') or diag($err);
	is($acks->[0][1] // -1, $before, "a: the first of them gets seq $before, right after the last acknowledged one");
	check_full1('a: after space was freed');
	is(start_time($node), $t0, 'a: still the same server');

	restart_immediate($node);
	is(states_after_start($node, 'full1'), 'open', 'a: after a restart the shard serves');
	check_full1('a: after an immediate stop and start');
	($acks, $rc, $err) = publish_loop(6001, 6001);
	record_acks($acks);
	is($rc, 0, 'a: publishing works after the restart') or diag($err);
	check_full1('a: after the restart and one more publish');
}

# ======================================================================
# b. a transactional INSERT over 4 shards runs out of space in its COMMIT
# ======================================================================
# 2800 rows of ~1 kB, 700 per shard: each shard's part is one batch of
# ~730 kB (a segment of its own, since it exceeds felix.segment_bytes).
# With 1 MB free, the first shard's part fits and the whole does not.
sub insert_sql
{
	my ($stream, $tag, $nshards, $rows) = @_;
	my $payload = payload_sql($tag, 'i');
	return qq{INSERT INTO $stream (shard, key, payload)
		SELECT i % $nshards, '$tag-' || i, $payload FROM generate_series(1, $rows) i;};
}

sub small_publish_each_shard
{
	my ($stream, $nshards, $tag) = @_;
	my $payload = payload_sql($tag, 'g');
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(format('%s:%s', p.shard, p.seq), ' ' ORDER BY p.shard)
		  FROM generate_series(0, $nshards - 1) g,
		       LATERAL felix_publish('$stream', $payload, shard => g) p});
}

{
	$node->safe_psql('postgres',
		"SELECT felix_create_stream('full4', shards => 4, payload_type => 'text')");
	is(small_publish_each_shard('full4', 4, 'pre1'), '0:0 1:0 2:0 3:0',
		'b: one record on each of the 4 shards');
	small_publish_each_shard('full4', 4, 'pre2');
	my $held = '0:2 1:2 2:2 3:2';
	is(counts($node, 'full4', 4), $held, 'b: each shard holds 2 records');

	my $free = fill_leaving(1024 * 1024);
	cmp_ok($free, '>', 800 * 1024, 'b: more than one shard\'s part (~730 kB) is free');
	cmp_ok($free, '<', 1400 * 1024, 'b: much less than the whole INSERT (~2.9 MB) is free');
	my $t0     = start_time($node);
	my $bytes0 = metric($node, 'bytes_appended');

	my ($rc, $err, $out) = psql_error($node,
		"BEGIN;\n" . insert_sql('full4', 'b1', 4, 2800) . "\nSELECT 'buffered';\nCOMMIT;\n");
	like($out, qr/buffered/, 'b: the INSERT itself succeeded (rows buffered)');
	isnt($rc, 0, 'b: the COMMIT fails');
	check_disk_full_error('b: the failing COMMIT', $err, 'full4', '[0-3]');
	note('b: bytes appended by the failed commit before it failed: '
		  . (metric($node, 'bytes_appended') - $bytes0));
	note('b: ' . free_bytes() . ' bytes free on the tmpfs after the failed commit');

	is(start_time($node), $t0, 'b: the server stayed up');
	is(states($node, 'full4'), 'open', 'b: every shard still serves');
	is(counts($node, 'full4', 4), $held, 'b: no shard shows a row of the failed commit');
	is($node->safe_psql('postgres', "SELECT count(*) FROM full4 WHERE key LIKE 'b1-%'"),
		'0', 'b: no row of the failed commit is visible');
	is(next_seqs($node, 'full4'), $held, 'b: every shard\'s next_seq is unchanged');

	# Writing to every shard again (the disk still nearly full, but a 1 kB
	# record fits) must not bring anything of the failed commit with it.
	my $pos = small_publish_each_shard('full4', 4, 'after1');
	is($pos, '0:2 1:2 2:2 3:2', 'b: the next publish on each shard gets seq 2, right after what it held');
	$held = '0:3 1:3 2:3 3:3';
	is(counts($node, 'full4', 4), $held, 'b: each shard holds exactly its 3 records');
	is($node->safe_psql('postgres', "SELECT count(*) FROM full4 WHERE key LIKE 'b1-%'"),
		'0', 'b: still no row of the failed commit after more writes');
	is(contiguity($node, 'full4'), '', 'b: seqs contiguous on every shard');

	# The disk still nearly full: the server must start, and recovery must
	# not bring back anything of the failed commit.
	restart_immediate($node);
	is(states_after_start($node, 'full4'), 'open', 'b: after a restart every shard serves');
	is(counts($node, 'full4', 4), $held, 'b: after a restart no shard shows a row of the failed commit');
	is($node->safe_psql('postgres', "SELECT count(*) FROM full4 WHERE key LIKE 'b1-%'"),
		'0', 'b: after a restart no row of the failed commit is visible');
	is(next_seqs($node, 'full4'), $held, 'b: after a restart next_seq is unchanged');
	is(contiguity($node, 'full4'), '', 'b: after a restart seqs are contiguous');

	# Space freed: the same INSERT commits and is fully visible.
	unfill();
	($rc, $err) = psql_error($node, "BEGIN;\n" . insert_sql('full4', 'b2', 4, 2800) . "\nCOMMIT;\n");
	is($rc, 0, 'b: with space freed, the INSERT commits') or diag($err);
	is(counts($node, 'full4', 4), '0:703 1:703 2:703 3:703',
		'b: every shard holds its 700 new rows after its 3 records');
	my $payload = payload_sql('b2', "substr(key, 4)::int");
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM full4
			 WHERE key LIKE 'b2-%' AND seq >= 3 AND shard = substr(key, 4)::int % 4
			   AND payload = $payload}),
		'2800', 'b: all 2800 rows are visible with their payloads, on their shards, after seq 2');
	is(contiguity($node, 'full4'), '', 'b: seqs contiguous on every shard');
}

# ======================================================================
# c. a single-shard INSERT appended as several batches runs out of space
# ======================================================================
# 3500 rows of ~1 kB into one shard: ~3.6 MB, appended as 4 batches of
# ~1 MB (each a segment of its own).  With 1.5 MB free the first batch fits
# and the second does not.
{
	$node->safe_psql('postgres',
		"SELECT felix_create_stream('fullc', payload_type => 'text')");
	small_publish_each_shard('fullc', 1, 'pre1');
	small_publish_each_shard('fullc', 1, 'pre2');
	my $held = '0:2';
	is(counts($node, 'fullc', 1), $held, 'c: the shard holds 2 records');

	my $free = fill_leaving(1536 * 1024);
	cmp_ok($free, '>', 1100 * 1024, 'c: more than one 1 MB batch is free');
	cmp_ok($free, '<', 2000 * 1024, 'c: much less than the whole INSERT (~3.6 MB) is free');
	my $t0     = start_time($node);
	my $bytes0 = metric($node, 'bytes_appended');
	my $batches0 = metric($node, 'batches_appended');

	my ($rc, $err, $out) = psql_error($node,
		"BEGIN;\n" . insert_sql('fullc', 'c1', 1, 3500) . "\nSELECT 'buffered';\nCOMMIT;\n");
	like($out, qr/buffered/, 'c: the INSERT itself succeeded (rows buffered)');
	isnt($rc, 0, 'c: the COMMIT fails');
	check_disk_full_error('c: the failing COMMIT', $err, 'fullc', '0');
	note('c: bytes appended by the failed commit before it failed: '
		  . (metric($node, 'bytes_appended') - $bytes0)
		  . ', batches counted: ' . (metric($node, 'batches_appended') - $batches0));
	note('c: ' . free_bytes() . ' bytes free on the tmpfs after the failed commit');

	is(start_time($node), $t0, 'c: the server stayed up');
	is(states($node, 'fullc'), 'open', 'c: the shard still serves');
	is(counts($node, 'fullc', 1), $held, 'c: no row of the failed commit is visible');
	is(next_seqs($node, 'fullc'), $held, 'c: next_seq is unchanged');

	my $pos = small_publish_each_shard('fullc', 1, 'after1');
	is($pos, '0:2', 'c: the next publish gets seq 2, right after what the shard held');
	$held = '0:3';
	is(counts($node, 'fullc', 1), $held, 'c: the shard holds exactly its 3 records');
	is($node->safe_psql('postgres', "SELECT count(*) FROM fullc WHERE key LIKE 'c1-%'"),
		'0', 'c: still no row of the failed commit after another publish');

	restart_immediate($node);
	is(states_after_start($node, 'fullc'), 'open', 'c: after a restart the shard serves');
	is(counts($node, 'fullc', 1), $held, 'c: after a restart the shard holds exactly its 3 records');
	is($node->safe_psql('postgres', "SELECT count(*) FROM fullc WHERE key LIKE 'c1-%'"),
		'0', 'c: after a restart no row of the failed commit is visible');
	is(contiguity($node, 'fullc'), '', 'c: after a restart seqs are contiguous');

	# Space freed: a commit of several batches goes through.
	unfill();
	($rc, $err) = psql_error($node, "BEGIN;\n" . insert_sql('fullc', 'c2', 1, 2500) . "\nCOMMIT;\n");
	is($rc, 0, 'c: with space freed, a 2.5 MB INSERT commits') or diag($err);
	is(counts($node, 'fullc', 1), '0:2503', 'c: the shard holds its 3 records and the 2500 new rows');
	my $payload = payload_sql('c2', "substr(key, 4)::int");
	my $first = $node->safe_psql('postgres', "SELECT min(seq) FROM fullc WHERE key LIKE 'c2-%'");
	is( $node->safe_psql('postgres', qq{
			SELECT count(*) FROM fullc
			 WHERE key LIKE 'c2-%' AND seq = substr(key, 4)::int - 1 + $first AND payload = $payload}),
		'2500', 'c: all 2500 new rows are visible, in insert order, one run, with their payloads');
	is($first, '3', 'c: the new rows start at seq 3, right after the 3 records the shard held');
	is(contiguity($node, 'fullc'), '', 'c: seqs contiguous');
}

# Everything once more after a last restart.
restart_immediate($node);
check_full1('end');
is(counts($node, 'full4', 4), '0:703 1:703 2:703 3:703', 'end: full4 reads back the same');
is(counts($node, 'fullc', 1), '0:2503', 'end: fullc reads back the same');
is(contiguity($node, 'full4') . contiguity($node, 'fullc'), '', 'end: seqs contiguous');

$node->stop;
note(sprintf('010_disk_full took %.1fs', time - $t_start));
done_testing();
