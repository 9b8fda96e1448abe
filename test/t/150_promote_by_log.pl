# Promotion by log (issue 20): a quorum shard whose leader is lost while
# no report names a follower caught up is promoted to the copy with the
# newest log, when enough copies are known to have kept their log since
# the generation was taken -- and only then.
#
# The fault harness left such shards unplaced for good (seeds 8011 and
# 9016, embedded): a leader came back from an older copy of itself while
# its reports still said its followers held nothing, although they held
# every acknowledged record.
#
# Four nodes, node1 hosting the embedded control plane and no replica; a
# quorum stream on nodes 2-4.  Leadership is handed from A to B (B takes
# generation 2 while A and C hold copies: the claim records their copies'
# tokens), 100 records are published, B's felix directory is copied, 1000
# more are acknowledged.  Then B is killed, the report is forged back to
# what B's first reports of generation 2 said (nobody holds anything
# yet; the race is narrow in a real run), and B is started from its copy.
# The other nodes' duty workers are held from before the kill until the
# forgery has landed: on a loaded machine B's lease lapsed first, and a
# caught-up follower was promoted from the true reports.
#   1. A and C kept their logs: one of them, holding all 1100 records,
#      leads generation 3, promoted by its log; B, back with 100 records,
#      does not lead, and the stream serves all 1100 and takes more.
#   2. The same, but C was started again after B took generation 2: only
#      A is known to have kept its log, one copy of three is not enough
#      (C could be a copy put back from a backup), so the shard stays
#      unplaced and says why.
# Parts 3 and 4 (below) do the same for a new stream's first generation,
# and part 5 for a generation granted and never taken.
use strict;
use warnings;

use File::Path ();
use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

sub shard_json
{
	my ($c, $stream, $expr) = @_;
	my $key = sprintf('shards/%s/%06d', $stream, 0);
	return $c->state_query(
		"SELECT $expr FROM (SELECT value::jsonb AS v FROM felix.store_read('$key') WHERE key = '$key') s");
}

# What the control plane's log says about the stream's generations.
sub promotions
{
	my ($c, $stream) = @_;
	return join("\n", grep { /"\Q$stream\E" shard 0(:| is unplaced)/ } split /\n/, slurp_file($c->cp->logfile));
}

# Returns (cluster, stream, A, B, C) with B leading generation 2 and B's
# copy at 100 of 1100 acknowledged records killed, the report forged, and
# B started from the copy.  $between is called after B took generation 2.
sub setup
{
	my ($prefix, $between) = @_;
	my $c = FelixCluster->new(nodes => 4, prefix => $prefix, store => 'embedded');
	my ($stream, @set) = $c->pick_stream_name("pl$prefix", 3, sub { !grep { $_ eq 'node1' } @_ });
	$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
	my ($a) = $c->wait_leader($stream, 0);
	$c->wait_shipping($a, $stream, 0, 2);
	my ($bn) = grep { $_ ne $a->{felix_name} } @set;
	my ($cn) = grep { $_ ne $a->{felix_name} && $_ ne $bn } @set;
	my ($b, $cc) = ($c->node($bn), $c->node($cn));
	# every copy has given its log with its token before B's claim
	FelixCluster::poll(30, sub {
		$c->state_query("SELECT count(*) FROM felix.nodes, unnest(ends) e WHERE e LIKE '$stream/0=%:%:%'") eq '3' }, 0.1)
	  or die 'the copies gave no tokens';
	$a->safe_psql('postgres', "SELECT felix_transfer_leadership('$stream', 0, '$bn')");
	my ($lead, $g) = $c->wait_leader($stream, 0, min_generation => 2, timeout => 30);
	is($lead->{felix_name}, $bn, "$prefix: $bn takes generation $g from $a->{felix_name}");
	ok(FelixCluster::poll(10, sub { shard_json($c, $stream, "jsonb_array_length(v->'taken_copy_tokens')") eq '3' }, 0.1),
		"$prefix: the claim of generation $g recorded the tokens of the three copies")
	  or diag(shard_json($c, $stream, 'v::text'));
	$between->($c, $stream, $a, $b, $cc) if $between;
	$c->wait_shipping($b, $stream, 0, 2);
	$b->safe_psql('postgres', "SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(1, 100) i");
	FelixCluster::poll(30, sub { !grep { $c->next_seq($_, $stream) ne '100' } @set }, 0.1) or die 'no 100 everywhere';
	my $copy = "$PostgreSQL::Test::Utils::tmp_check/felix_copy_$prefix";
	$c->pause_node($b);
	FelixCluster::copy_tree($b->data_dir . '/felix', $copy);
	$c->resume_node($b);
	is($b->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(101, 1100) i"),
		'1000', "$prefix: 1000 more acknowledged (quorum) after $bn was copied at 100");
	FelixCluster::poll(30, sub { !grep { $c->next_seq($_, $stream) ne '1100' } @set }, 0.1) or die 'not level';
	is($c->state_query("SELECT generation FROM felix.assignments WHERE stream = '$stream' AND shard = 0"), $g,
		"$prefix: the shard is still at generation $g when $bn is killed")
	  or diag(promotions($c, $stream));
	# nothing is promoted before the forgery lands
	$c->hold_duties(grep { $_ != $b } $c->up_nodes);
	$c->kill_node($b);
	# B's first reports of generation 2, made before its followers answered
	$c->store_edit(sprintf('reports/%s/%06d', $stream, 0),
		"jsonb_build_object('rows', (SELECT jsonb_agg(r || '{\"acked_end\": 0, \"caught_up\": false}') "
		  . "FROM jsonb_array_elements(v->'rows') r))");
	$c->release_duties;
	FelixCluster::copy_tree($copy, $b->data_dir . '/felix');
	$c->start_node($b);
	return ($c, $stream, $a, $b, $cc, $g);
}

# 1. Both followers kept their logs.
{
	my ($c, $stream, $a, $b, $cc, $g) = setup('k');
	my ($lead, $g3) = eval { $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 30) };
	ok($lead && $lead != $b, "a copy that kept its log leads generation " . ($g + 1) . ' ('
		  . ($lead ? $lead->{felix_name} : 'none') . ')')
	  or $c->diag_shard($stream, 0);
	ok($lead && $c->next_seq($lead->{felix_name}, $stream) eq '1100', 'it holds all 1100 acknowledged records');
	like(slurp_file($c->cp->logfile), qr/shard 0: \S+ leads generation \d+ \(was \S+ at generation $g\), promoted by its log/,
		'the control plane says it promoted by log');
	if ($lead)
	{
		is($lead->safe_psql('postgres', "SELECT count(*) FROM $stream WHERE shard = 0"), '1100',
			'the new leader serves all 1100 records');
		is($lead->safe_psql('postgres', "SELECT seq FROM felix_publish('$stream', '{\"after\": 1}', shard => 0)"), '1100',
			'and takes the next publish at seq 1100');
		ok(FelixCluster::poll(30, sub { $c->next_seq($b->{felix_name}, $stream) eq '1101' }, 0.2),
			"$b->{felix_name}, back from its copy, is brought level as a follower");
	}
	$c->teardown;
}

# 2. C was started again after B took generation 2.
{
	my ($c, $stream, $a, $b, $cc, $g) = setup('r', sub {
		my ($c, $stream, $a, $b, $cc) = @_;
		$c->kill_node($cc);
		$c->start_node($cc);
	});
	my ($who, $g3) = eval { $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 8) };
	ok(!defined $who, 'with one copy known to have kept its log, nobody is promoted')
	  or do { diag("$who->{felix_name} leads generation $g3"); diag(promotions($c, $stream)); $c->diag_shard($stream, 0) };
	like($c->state_query("SELECT unplaced_reason FROM felix_shards WHERE stream = '$stream' AND shard = 0"),
		qr/^no replica was reported caught up at generation $g/, 'the shard is unplaced');
	like(slurp_file($c->cp->logfile),
		qr/stream "$stream" shard 0 is unplaced: .*1 of its 3 copies are known to have kept their log since generation $g was taken and have given it since the lapse; promotion by log needs 2/,
		'and the control plane says why it is not promoted by log');
	ok($c->next_seq($a->{felix_name}, $stream) eq '1100' && $c->next_seq($cc->{felix_name}, $stream) eq '1100',
		'the followers still hold all 1100 records');
	$c->teardown;
}

# 3-4. A new stream's first generation: its copies come after the first
# claim, which records each replica by its boot ("<boot>#0").  The leader
# is killed after 1000 acknowledged records, with the reports forged to
# "nobody caught up".
#   3. The followers' copies are their first in the boot recorded: one of
#      them leads generation 2, promoted by its log, with all 1000.
#   4. One follower was started again after the claim (its boot is not
#      the one recorded): one copy of three counts, nobody is promoted.
{
	my $c = FelixCluster->new(nodes => 4, prefix => 'f', store => 'embedded');
	for my $part (3, 4)
	{
		my ($stream, @set) = $c->pick_stream_name("first$part", 3, sub { !grep { $_ eq 'node1' } @_ });
		$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
		my ($l) = $c->wait_leader($stream, 0);
		my @f = map { $c->node($_) } grep { $_ ne $l->{felix_name} } @set;
		like(shard_json($c, $stream, "(SELECT string_agg(t, ',') FROM jsonb_array_elements_text(v->'taken_copy_tokens') t)"),
			qr/^[^,]+#0,[^,]+#0,[^,]+#0$/,
			"$part: the first claim recorded each of the three replicas by its boot")
		  or diag(shard_json($c, $stream, 'v::text'));
		is(shard_json($c, $stream, "v->>'taken_end' || '/' || (v->>'taken_last_generation')"), '0/0',
			"$part: and the leader's log at the claim as empty (a new shard)");
		if ($part == 4)
		{
			$c->kill_node($f[1]);
			$c->start_node($f[1]);
		}
		$c->wait_shipping($l, $stream, 0, 2, 30);
		is($l->safe_psql('postgres',
			"SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(1, 1000) i"),
			'1000', "$part: 1000 acknowledged at $l->{felix_name}");
		FelixCluster::poll(30, sub { !grep { $c->next_seq($_, $stream) ne '1000' } @set }, 0.1) or die 'not level';
		# the followers' copies have given their logs since (the lapse comes after)
		$c->hold_duties(grep { $_ != $l } $c->up_nodes);
		$c->kill_node($l);
		$c->store_edit(sprintf('reports/%s/%06d', $stream, 0),
			"jsonb_build_object('rows', (SELECT jsonb_agg(r || '{\"acked_end\": 0, \"caught_up\": false}') "
			  . "FROM jsonb_array_elements(v->'rows') r))");
		$c->release_duties;
		if ($part == 3)
		{
			my ($lead, $g2) = eval { $c->wait_leader($stream, 0, min_generation => 2, timeout => 30) };
			ok($lead && $lead != $l, '3: a follower leads generation 2 ('
				  . ($lead ? $lead->{felix_name} : 'none') . ')')
			  or $c->diag_shard($stream, 0);
			like(slurp_file($c->cp->logfile),
				qr/stream "$stream" shard 0: \S+ leads generation 2 \(was \S+ at generation 1\), promoted by its log/,
				'3: promoted by its log');
			# (readers see up to its mark, which its follower's first answer
			# at generation 2 brings to the end)
			my $n = '';
			FelixCluster::poll(10, sub {
				$n = $lead ? $lead->safe_psql('postgres', "SELECT count(*) FROM $stream WHERE shard = 0") : '';
				$n eq '1000' }, 0.1);
			is($n, '1000', '3: the new leader serves all 1000 records');
		}
		else
		{
			my ($who, $g2) = eval { $c->wait_leader($stream, 0, min_generation => 2, timeout => 8) };
			ok(!defined $who, '4: with one copy known to have kept its log, nobody is promoted')
			  or diag("$who->{felix_name} leads generation $g2");
			like(slurp_file($c->cp->logfile),
				qr/stream "$stream" shard 0 is unplaced: .*1 of its 3 copies are known to have kept their log since generation 1 was taken and have given it since the lapse; promotion by log needs 2/,
				'4: and the control plane says why');
		}
		$c->start_node($l);
		$c->wait_alive([ map { $c->name_of($_) } 1 .. 4 ], 60);
	}

	# 5. A generation granted and never taken (etcd seeds 2001 and 2005 of
	# a long run after bug 12's fix).  Generation 1's leader A loses its
	# lease (SIGSTOP), generation 2 is granted to follower B, and B comes
	# back with its felix directory wiped before it claims it: the grant
	# is forged, as the holder would have written it, while the duties are
	# held, with the reports forged to "nobody caught up" as above.
	# Generation 2 wrote nothing, so what generation 1's claim recorded
	# still stands: A's and C's copies kept their logs since, and one of
	# them leads generation 3 with all 1000 records.  (The shard stayed
	# unplaced before: "generation 2 was not taken with the leader's log
	# given".)
	{
		my ($stream, @set) = $c->pick_stream_name('untaken', 3, sub { !grep { $_ eq 'node1' } @_ });
		$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
		my ($a) = $c->wait_leader($stream, 0);
		my ($b, $cc) = map { $c->node($_) } grep { $_ ne $a->{felix_name} } @set;
		my $bn = $b->{felix_name};
		$c->wait_shipping($a, $stream, 0, 2, 30);
		is($a->safe_psql('postgres',
			"SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(1, 1000) i"),
			'1000', "5: 1000 acknowledged at $a->{felix_name} in generation 1");
		FelixCluster::poll(30, sub { !grep { $c->next_seq($_, $stream) ne '1000' } @set }, 0.1) or die 'not level';
		$c->hold_duties(grep { $_ != $a } $c->up_nodes);
		$c->pause_node($a);
		$c->kill_node($b);
		my $inc = $c->state_query("SELECT incarnation FROM felix.nodes WHERE name = '$bn'");
		$c->store_edit(sprintf('shards/%s/%06d', $stream, 0),
			"(v - 'unplaced_reason') || jsonb_build_object('generation', 2, 'leader', '$bn', "
			  . "'leader_incarnation', '$inc', 'grant_end', 1000, 'grant_last_generation', 1)");
		$c->store_edit(sprintf('reports/%s/%06d', $stream, 0),
			"jsonb_build_object('rows', (SELECT jsonb_agg(r || '{\"acked_end\": 0, \"caught_up\": false}') "
			  . "FROM jsonb_array_elements(v->'rows') r))");
		File::Path::rmtree($b->data_dir . '/felix');
		$c->start_node($b);
		sleep 2;				# A's lease has run out by its own clock too
		$c->resume_node($a);
		$c->release_duties;
		my ($lead, $g3) = eval { $c->wait_leader($stream, 0, min_generation => 3, timeout => 30) };
		ok($lead && $lead != $b, '5: a copy kept since generation 1 was taken leads generation 3 ('
			  . ($lead ? $lead->{felix_name} : 'none') . ')')
		  or do { diag(promotions($c, $stream)); $c->diag_shard($stream, 0) };
		like(promotions($c, $stream),
			qr/shard 0: \S+ leads generation 3 \(was $bn at generation 2\), promoted by its log/,
			'5: promoted by its log, past the generation never taken');
		my $n = '';
		FelixCluster::poll(10, sub {
			$n = $lead ? $lead->safe_psql('postgres', "SELECT count(*) FROM $stream WHERE shard = 0") : '';
			$n eq '1000' }, 0.1);
		is($n, '1000', '5: the new leader serves all 1000 records');
	}
	$c->teardown;
}

done_testing();
