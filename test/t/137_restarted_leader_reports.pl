# A leader restarted at its generation reports its followers before they
# answer it: acknowledged end 0.  Such a report must not erase what the
# control plane knew they held (found by the fault harness, test/fault:
# seed 1011 of the long profile, embedded store, 1,689 acknowledged quorum
# records lost).
#
# There the leader's felix directory was put back from an older copy of
# itself and the server restarted; its first reports at the old generation
# landed with its followers at 0, so the check of a returning leader's log
# (leader_holds_reported) found nothing to compare with, and the leader --
# holding 100 of 1100 acknowledged records -- led the next generation and
# cut its followers' copies back.  Those first reports are made here by
# hand, through felix.cp_report as the leader (its ship worker makes them
# within milliseconds of starting, before anything else can be observed),
# so the embedded store only: the report logic is the same C for both.
#
# Within one generation a follower's copy only grows, so a report never
# lowers the acknowledged end already recorded for it; the restored
# leader is refused, and nothing acknowledged is lost.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 4, store => 'embedded');
my ($stream, @set) = $c->pick_stream_name('rlr', 3, sub { !grep { $_ eq 'node1' } @_ });
$c->create_stream(1, $stream, replication_factor => 3, consistency => 'quorum');
my ($a, $g) = $c->wait_leader($stream, 0);
my $an = $a->{felix_name};
my @followers = grep { $_ ne $an } @set;
$c->wait_shipping($a, $stream, 0, 2);

sub next_seq
{
	my ($node) = @_;
	return $c->node($node)->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = 0");
}

sub store_field
{
	my ($key, $field) = @_;
	return $c->state_query("SELECT value::jsonb ->> '$field' FROM felix.store_read('$key') WHERE key = '$key'");
}

$a->safe_psql('postgres', "SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(1, 100) i");
my $dir  = $a->data_dir . '/felix';
my $copy = "$PostgreSQL::Test::Utils::tmp_check/felix_copy_rlr";
$c->pause_node($a);
system('cp', '-a', $dir, $copy) == 0 or die "cp -a $dir $copy";
$c->resume_node($a);
is($a->safe_psql('postgres',
	"SELECT count(felix_publish('$stream', to_jsonb(i), shard => 0)) FROM generate_series(101, 1100) i"),
	'1000', "1000 more records acknowledged (quorum) after $an was copied at 100");
ok(defined FelixCluster::poll(30, sub {
	$c->state_query("SELECT count(*) FROM felix.replica_reports WHERE stream = '$stream' "
		  . "AND shard = 0 AND caught_up AND acked_end >= 1100") eq '2' }, 0.05),
	'the control plane has a report calling both followers caught up at 1100');

# The leader dies; as it comes back its first reports say its followers
# hold nothing at its generation yet.
my $inc = store_field(sprintf('shards/%s/%06d', $stream, 0), 'leader_incarnation');
$c->kill_node($a);
my $rows = join(',', map {
	sprintf('{"stream": "%s", "shard": 0, "generation": %d, "follower": "%s", "incarnation": "%s", '
		  . '"acked_end": 0, "caught_up": false}', $stream, $g, $_, store_field("nodes/$_", 'incarnation'))
} @followers);
is($c->cp->safe_psql('postgres',
	"SELECT felix.cp_report('$an', '[$rows]'::jsonb, 4611686018427387904, '$inc')"), '2',
	"a report of $an at generation $g saying its followers hold nothing lands");
is($c->state_query("SELECT min(acked_end) FROM felix.replica_reports WHERE stream = '$stream' AND shard = 0"),
	'1100', 'and leaves the acknowledged end recorded for them at 1100');

system('rm', '-rf', $dir) == 0 or die;
system('cp', '-a', $copy, $dir) == 0 or die;
$c->start_node($a);
my ($who, $g2) = eval { $c->wait_leader($stream, 0, min_generation => $g + 1, timeout => 8) };
ok(!defined $who || $who->{felix_name} ne $an,
	"$an, back with 100 of 1100 acknowledged records, is not given the shard")
  or diag("$an leads generation $g2");
ok(!grep({ next_seq($_) ne '1100' } @followers), "@followers still hold all 1100 records");

$c->teardown;
felix_done_testing();
