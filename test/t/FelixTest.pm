# FelixTest: helpers shared by felix's TAP tests (test/t/*.pl).
#
# A node with felix preloaded, the directory of a shard's segment log, a
# reader of the segment format (src/include/storage/format.h is the
# authority: a 64-byte file header, then batches of a 48-byte header, a
# body and an 8-byte trailer; the active segment may end in preallocated
# zero bytes after its last batch), and a crash that waits until every
# process of the old server is gone before anyone restarts it.  Every wait
# here is bounded.
package FelixTest;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use Digest::MD5 ();

our @EXPORT = qw(
  felix_base_conf felix_node felix_node_conninfo felix_done_testing FELIX_TEST_SECRET shard_dir segment_files read_file write_file write_at
  read_batches record_batches data_end flip_byte crash_node metric
  psql_error crc32c batch_header batch_trailer shipment_hex replicate_call
  durable_mark segment_digest publish_acked fault_shim
);

use constant SEGMENT_HEADER_BYTES => 64;
use constant BATCH_HEADER_BYTES   => 48;
use constant BATCH_TRAILER_BYTES  => 8;
use constant BATCH_MAGIC          => 0x31425846;
use constant TRAILER_MAGIC        => 0x45425846;
use constant BATCH_RECORDS        => 1;

# A password every test node logs in with, kept in a password file named
# by its felix.node_conninfo (the test servers trust local connections
# unless a test asks otherwise): it must never appear in a server log,
# which felix_done_testing checks.
use constant FELIX_TEST_SECRET => 'felixTAPsecret';

# The postgresql.conf lines every felix test node has: felix preloaded,
# its worker in the "postgres" database, messages untranslated, publishes
# not forwarded.
# fault_shim.c (beside the tests), built for this machine into tmp_check
# once per test script: the LD_PRELOAD library that fails syncs or writes
# of chosen files while a trigger file exists (see its header).  Bails out
# if it does not build.
sub fault_shim
{
	my $shim = "$PostgreSQL::Test::Utils::tmp_check/fault_shim.so";
	return $shim if -e $shim;
	my $src = (__FILE__ =~ s{[^/]*$}{}r) . 'fault_shim.c';
	my $out = `cc -shared -fPIC -O2 -Wall -o '$shim' '$src' -ldl 2>&1`;
	BAIL_OUT("cannot build $src: $out") unless $? == 0 && -e $shim;
	return $shim;
}

sub felix_base_conf
{
	return ("shared_preload_libraries = 'felix'",
		"felix.database = 'postgres'",
		"lc_messages = 'C'",
		# the tests route their publishes themselves, and count on a
		# follower's refusal (55F02); 145_publish_anywhere turns it on
		"felix.forward_publishes = off");
}

# This node's felix.node_conninfo: where it is (its Unix socket, its port,
# database postgres) and the password file it logs in with (as
# felix_node_<name>, the default user; password FELIX_TEST_SECRET-<name>).
sub felix_node_conninfo
{
	my ($node, $name) = @_;
	my $passfile = "$PostgreSQL::Test::Utils::tmp_check/pgpass_$name";
	write_file($passfile, "*:*:*:felix_node_$name:" . FELIX_TEST_SECRET . "-$name\n");
	chmod 0600, $passfile or die "chmod $passfile: $!";
	return 'host=' . $node->host . ' port=' . $node->port
	  . " dbname=postgres passfile=$passfile";
}

# A started node with felix preloaded and the extension created in the
# "postgres" database (where the node worker runs).  Extra lines go into
# postgresql.conf.
sub felix_node
{
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf',
		join("\n", felix_base_conf(),
			"felix.node_conninfo = '" . felix_node_conninfo($node, $name) . "'", @conf)
		  . "\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION felix');
	return $node;
}

# done_testing(), after checking that no server log of this test holds a
# conninfo secret (FELIX_TEST_SECRET): felix masks every secret in every
# message, error, view and setting it shows.
sub felix_done_testing
{
	my @hits;
	for my $log (glob("$PostgreSQL::Test::Utils::log_path/*.log"))
	{
		next if $log =~ m{/regress_log_};
		open my $fh, '<', $log or next;
		while (my $line = <$fh>)
		{
			push @hits, "$log: $line" if index($line, FELIX_TEST_SECRET) >= 0;
		}
		close $fh;
	}
	ok(!@hits, 'no server log contains a conninfo secret')
	  or diag(join('', @hits[ 0 .. ($#hits < 9 ? $#hits : 9) ]));
	done_testing();
	return;
}

# <data_directory>/felix/<dboid>/<relid>/<shard> of a stream (server up).
sub shard_dir
{
	my ($node, $stream, $shard) = @_;
	my $ids = $node->safe_psql('postgres',
		    "SELECT d.oid || '/' || c.oid FROM pg_database d, pg_class c "
		  . "WHERE d.datname = current_database() "
		  . "AND c.oid = to_regclass(quote_ident('$stream'))");
	die "no stream $stream" if $ids eq '';
	return $node->data_dir . "/felix/$ids/$shard";
}

# Segment files of a shard directory, oldest first (names are the
# zero-padded base seq, so name order is seq order).
sub segment_files
{
	my ($dir) = @_;
	return sort glob("$dir/*.seg");
}

sub read_file
{
	my ($file) = @_;
	open my $fh, '<:raw', $file or die "open $file: $!";
	local $/;
	my $data = <$fh>;
	close $fh;
	return $data;
}

sub write_file
{
	my ($file, $data, $append) = @_;
	open my $fh, $append ? '>>:raw' : '>:raw', $file or die "open $file: $!";
	print $fh $data;
	close $fh or die "close $file: $!";
	return;
}

# Overwrite bytes of a file at an offset (extending it if need be).
sub write_at
{
	my ($file, $offset, $data) = @_;
	open my $fh, '+<:raw', $file or die "open $file: $!";
	seek($fh, $offset, 0) or die "seek: $!";
	print $fh $data;
	close $fh or die "close $file: $!";
	return;
}

# The whole batches of a segment file, in file order: hashes with offset,
# size (header, body and trailer), kind, count, base_seq, body_len and
# body_crc.
# Stops at the first header that is not a batch (such as the zeros of a
# preallocated tail) or whose batch runs past the end of the file.
sub read_batches
{
	my ($file) = @_;
	my $data = read_file($file);
	my @batches;
	my $off = SEGMENT_HEADER_BYTES;
	while ($off + BATCH_HEADER_BYTES <= length $data)
	{
		my ($magic, $hcrc, $kind, $flags, $count, $base, $gen, $ts, $blen,
			$bcrc)
		  = unpack('V V v v V Q< Q< q< V V',
			substr($data, $off, BATCH_HEADER_BYTES));
		last unless $magic == BATCH_MAGIC;
		last
		  if $off + BATCH_HEADER_BYTES + $blen + BATCH_TRAILER_BYTES >
		  length $data;
		push @batches,
		  {
			offset     => $off,
			size       => BATCH_HEADER_BYTES + $blen + BATCH_TRAILER_BYTES,
			kind       => $kind,
			count      => $count,
			base_seq   => $base,
			generation => $gen,
			body_len   => $blen,
			body_crc   => $bcrc,
		  };
		$off += BATCH_HEADER_BYTES + $blen + BATCH_TRAILER_BYTES;
	}
	return @batches;
}

# Where the data of a segment file ends: right after its last whole batch
# (bytes after that are the preallocated zero tail, if any).
sub data_end
{
	my ($file) = @_;
	my @b = read_batches($file);
	return @b ? $b[-1]{offset} + $b[-1]{size} : SEGMENT_HEADER_BYTES;
}

# CRC-32C (Castagnoli, reflected, as PostgreSQL's pg_crc32c computes it).
my @crc_table;
for my $i (0 .. 255)
{
	my $c = $i;
	$c = ($c & 1) ? (($c >> 1) ^ 0x82F63B78) : ($c >> 1) for 1 .. 8;
	$crc_table[$i] = $c;
}

sub crc32c
{
	my ($data) = @_;
	my $crc = 0xFFFFFFFF;
	$crc = ($crc >> 8) ^ $crc_table[ ($crc ^ $_) & 0xFF ] for unpack('C*', $data);
	return $crc ^ 0xFFFFFFFF;
}

# A 48-byte batch header with a correct header CRC.
sub batch_header
{
	my (%h) = @_;
	my $rest = pack('v v V Q< Q< q< V V',
		$h{kind} // BATCH_RECORDS, 0, $h{count}, $h{base_seq},
		$h{generation}, $h{timestamp} // 0, $h{body_len}, $h{body_crc} // 0);
	return pack('V V', BATCH_MAGIC, crc32c($rest)) . $rest;
}

# The 8-byte trailer that closes the batch whose header is $header.
sub batch_trailer
{
	my ($header) = @_;
	return pack('V', TRAILER_MAGIC) . substr($header, 4, 4);
}

# One batch of records [base, ...) at generation $gen, as felix.replicate
# takes it, in hex (for decode(..., 'hex')): each record a [key or undef,
# payload bytes] pair.
sub shipment_hex
{
	my ($base, $gen, @records) = @_;
	my $body = '';
	for my $r (@records)
	{
		my ($key, $payload) = @$r;
		$body .= pack('V V', defined $key ? length $key : 0xFFFFFFFF, length $payload)
		  . ($key // '') . $payload;
	}
	my $h = batch_header(
		count      => scalar(@records),
		base_seq   => $base,
		generation => $gen,
		timestamp  => 0,
		body_len   => length($body),
		body_crc   => crc32c($body));
	return unpack('H*', $h . $body . batch_trailer($h));
}

# The SQL of a felix.replicate call that ships the batches in $hex (from
# shipment_hex) to $target (a node) as if from the leader of $gen: it
# names the target by its felix name and incarnation, as a leader does.
# %opt: op => 'ship' | 'bootstrap' | 'rebuild', hwm => leader_hwm_end,
# name/incarnation => to address it to another node than $target.
sub replicate_call
{
	my ($target, $stream, $shard, $gen, $from, $hex, %opt) = @_;
	my ($name, $inc) = split /\|/, $target->safe_psql('postgres',
		"SELECT name || '|' || incarnation FROM felix.node_identity()");
	$name = $opt{name} if defined $opt{name};
	$inc = $opt{incarnation} if defined $opt{incarnation};
	my $op = $opt{op} // 'ship';
	my $hwm = $opt{hwm} // 0;
	return "SELECT status || ' ' || seq FROM felix.replicate('$stream', $shard, $gen, "
	  . "'$name', '$inc', '$op', $from, $hwm, decode('" . ($hex // '') . "', 'hex'))";
}

# The durable mark in a shard directory's hwm file: two 24-byte slots
# {hwm_end, diverged_at, count, crc32c of the 20 bytes before it}; the
# valid slot with the highest count holds the mark.  Returns hwm_end
# (undef when no slot is valid), or in list context (hwm_end, diverged_at)
# with diverged_at undef when the copy is not known to differ.
sub durable_mark
{
	my ($dir) = @_;
	return undef unless -e "$dir/hwm";
	my $data = read_file("$dir/hwm");
	my ($best, $end, $div) = (0, undef, undef);
	for my $i (0, 1)
	{
		last if length($data) < 24 * ($i + 1);
		my $slot = substr($data, 24 * $i, 24);
		my ($e, $d, $count, $crc) = unpack('Q< Q< V V', $slot);
		next unless crc32c(substr($slot, 0, 20)) == $crc && $count > $best;
		($best, $end, $div) = ($count, $e, $d);
	}
	$div = undef if defined $div && $div == ~0;
	return wantarray ? ($end, $div) : $end;
}

# Only the batches that hold records (not seals).
sub record_batches
{
	return grep { $_->{kind} == BATCH_RECORDS } read_batches(@_);
}

# One line per segment of a shard on $node (server up): its name and the
# MD5 of its record batches as stored.  Two replicas holding the same
# batches in segments of the same names give the same text (a segment's
# header and seal are each node's own: creation time, checksum over it).
sub segment_digest
{
	my ($node, $stream, $shard) = @_;
	my $out = '';
	for my $file (segment_files(shard_dir($node, $stream, $shard)))
	{
		my $data = read_file($file);
		(my $name = $file) =~ s{.*/}{};
		$out .= "$name " . Digest::MD5::md5_hex(join('',
			map { substr($data, $_->{offset}, $_->{size}) } record_batches($file))) . "\n";
	}
	return $out;
}

# Publish $n jsonb records {tag, i} on shard 0 of $stream through $node,
# in one statement (each row comes back only once acknowledged); dies
# unless all $n are.  Adds seq => payload text to %$acks; returns $n.
sub publish_acked
{
	my ($node, $stream, $tag, $n, $acks) = @_;
	my $out = $node->safe_psql('postgres', qq{
		SELECT p.seq || '|' || jsonb_build_object('tag', '$tag', 'i', i)::text
		  FROM generate_series(1, $n) i,
		       LATERAL felix_publish('$stream', jsonb_build_object('tag', '$tag', 'i', i), shard => 0) p
		 ORDER BY i}, timeout => 120);
	my @rows = split /\n/, $out;
	die "publish $tag: " . scalar(@rows) . " of $n acknowledged" unless @rows == $n;
	for (@rows) { my ($s, $p) = split /\|/, $_, 2; $acks->{$s} = $p; }
	return scalar @rows;
}

# XOR one byte of a file with 0xFF; returns the original byte.
sub flip_byte
{
	my ($file, $offset) = @_;
	open my $fh, '+<:raw', $file or die "open $file: $!";
	seek($fh, $offset, 0) or die "seek: $!";
	read($fh, my $byte, 1) == 1 or die "read at $offset of $file";
	seek($fh, $offset, 0) or die "seek: $!";
	print $fh chr(ord($byte) ^ 0xFF);
	close $fh or die "close: $!";
	return $byte;
}

# A felix_metrics counter.
sub metric
{
	my ($node, $name) = @_;
	return $node->safe_psql('postgres',
		"SELECT value::bigint FROM felix_metrics WHERE name = '$name'");
}

# Run SQL expected to fail; returns its stderr with the verbose error
# (SQLSTATE, DETAIL, HINT).
sub psql_error
{
	my ($node, $sql) = @_;
	my ($out, $err) = ('', '');
	my $rc = $node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		stdout => \$out,
		stderr => \$err);
	return ($rc, $err, $out);
}

# Live (not zombie) process?
sub _alive
{
	my ($pid) = @_;
	open my $fh, '<', "/proc/$pid/stat" or return 0;
	my $line = <$fh>;
	close $fh;
	return 0 unless defined $line;
	return 0 if $line =~ /^\d+ \(.*\) Z /s;
	return 1;
}

sub _children
{
	my ($ppid) = @_;
	my @kids;
	for my $stat (glob '/proc/[0-9]*/stat')
	{
		open my $fh, '<', $stat or next;
		my $line = <$fh>;
		close $fh;
		next unless defined $line && $line =~ /^(\d+) \(.*\) \S+ (\d+) /s;
		push @kids, $1 if $2 == $ppid;
	}
	return @kids;
}

# kill -9 the postmaster (and, with all => 1, every child at the same
# instant), then wait until every one of those processes is gone, so that
# a restart on the same data directory is not refused.  Returns the
# seconds the old processes took to go.
sub crash_node
{
	my ($node, %opt) = @_;
	my $pidfile = $node->data_dir . '/postmaster.pid';
	open my $fh, '<', $pidfile or die "open $pidfile: $!";
	my $pm = <$fh>;
	close $fh;
	chomp $pm;
	my @kids = _children($pm);
	my $t0   = time;
	$node->kill9;
	kill 'KILL', @kids if $opt{all};
	my $deadline = $t0 + 60;
	my $killed   = 0;
	while (my @left = grep { _alive($_) } $pm, @kids)
	{
		if (time > $deadline)
		{
			die "processes @left survived SIGKILL" if $killed;
			diag("processes still alive 60s after the crash: @left; killing them");
			kill 'KILL', @left;
			$killed   = 1;
			$deadline = time + 30;
		}
		usleep(20_000);
	}
	my $took = time - $t0;
	# Where nothing reaps orphans (some containers' PID 1), the dead
	# postmaster stays a zombie and its PID still looks in use to the
	# lock-file checks of the next postmaster: it is dead, so both its
	# lock files are stale.
	if (-e "/proc/$pm" && !_alive($pm))
	{
		unlink $pidfile;
		unlink $node->host . '/.s.PGSQL.' . $node->port . '.lock';
	}
	return $took;
}

1;
