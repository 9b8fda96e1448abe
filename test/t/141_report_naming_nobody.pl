# A report that names none of a shard's followers does not let its marks
# move (found by model-checking, docs/formal: finding 5).
#
# A leader sends one report request for every shard it leads.  A shard
# whose followers have not answered yet at its generation -- every shard
# at the start of a generation -- adds no row to it, and the control plane
# leaves that shard's rows alone: rows of the previous generation, calling
# followers caught up, stand.  The leader took the request's landing for a
# report on that shard too: with nobody named, nobody could be "believed
# caught up", so the next mark moved on any majority without a report, and
# the control plane could still promote a follower of the old generation
# that lacks the record.  Now a shard's part goes into a request only if
# it names a follower, and its marks wait for a report that does.
#
# Four nodes, node1 hosting the embedded store.  Stream A is led by L with
# followers F1 and F2 (not node1); stream B by L with node1 among its
# followers, so that L's reports keep landing.  L restarts where F1 and F2
# refuse its connections and leads both again at generation 2 (its lease
# made long, so that it is back before it lapses and is preferred); B's
# reports land, A's part names nobody.  Then reports are refused at the
# control plane and F1 lets L in: a publish to A is not acknowledged -- no
# report naming A's followers at generation 2 can land -- while the
# control plane still holds generation 1's rows calling F2, which lacks
# the record, caught up.  Once reports land again it is, and F2 is counted
# out.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixCluster;

use PostgreSQL::Test::Utils;
use Test::More;

my $c = FelixCluster->new(nodes => 4, store => 'embedded');
my ($sa, @a) = $c->pick_stream_name('nobody_a', 3, sub { !grep { $_ eq 'node1' } @_ });
my ($ln, $f1, $f2) = @a;
my ($sb) = $c->pick_stream_name('nobody_b', 3, sub { $_[0] eq $ln && grep { $_ eq 'node1' } @_ });
$c->create_stream(1, $sa, replication_factor => 3, consistency => 'quorum');
$c->create_stream(1, $sb, replication_factor => 3, consistency => 'quorum');
my $l = $c->node($ln);
for my $s ($sa, $sb)
{
	my ($who) = $c->wait_leader($s, 0);
	is($who->{felix_name}, $ln, "$ln leads $s");
	$c->wait_shipping($l, $s, 0, 2);
	$l->safe_psql('postgres', "SELECT count(felix_publish('$s', to_jsonb(i), shard => 0)) FROM generate_series(1, 10) i");
}

sub rows
{
	my ($s) = @_;
	return $c->state_query("SELECT string_agg(follower || ':' || generation || ':' || caught_up, ' ' ORDER BY follower) "
		  . "FROM felix.replica_reports WHERE stream = '$s' AND shard = 0");
}
ok(defined FelixCluster::poll(30, sub {
	rows($sa) eq join(' ', map { "$_:1:true" } sort ($f1, $f2)) }, 0.05),
	"$sa: generation 1's report calls $f1 and $f2 caught up");

# L's claims last 6 s: it is back, and preferred, before they lapse
$l->safe_psql('postgres', "ALTER SYSTEM SET felix.lease_duration = '6s'; SELECT pg_reload_conf()");
ok(defined FelixCluster::poll(10, sub {
	$c->state_query("SELECT bool_and((c->>'lease_ms')::int = 6000) FROM felix.nodes, "
		  . "jsonb_array_elements(claims) c WHERE name = '$ln'") eq 't' }, 0.05),
	"$ln claims 6 s leases");
$c->node($_)->safe_psql('postgres', 'ALTER DATABASE postgres CONNECTION LIMIT 0') for ($f1, $f2);
$c->kill_node($l);
$c->start_node($l);
for my $s ($sa, $sb)
{
	my ($who, $g) = $c->wait_leader($s, 0, min_generation => 2, timeout => 30);
	is($who->{felix_name} . " $g", "$ln 2", "$ln, started again, leads $s at generation 2");
}
ok(defined FelixCluster::poll(30, sub { rows($sb) =~ /node1:2:true/ }, 0.05),
	"$sb: generation 2's reports land (node1 answers)");
sleep 1;    # several requests land, each with A's part naming nobody
is(rows($sa), join(' ', map { "$_:1:true" } sort ($f1, $f2)),
	"$sa: the control plane still holds generation 1's rows");

# Reports refused; F1 lets L in; a publish to A has a majority, not a report.
$c->break_reports;
$c->node($f1)->safe_psql('postgres', 'ALTER DATABASE postgres CONNECTION LIMIT -1');
ok(defined FelixCluster::poll(30, sub {
	$l->safe_psql('postgres', "SELECT count(*) FROM felix_replication WHERE stream = '$sa' "
		  . "AND follower = '$f1' AND generation = 2 AND acked_seq >= 9") eq '1' }, 0.05),
	"$f1 answers $ln at generation 2");
my ($rc, $err) = psql_error($l,
	"SET statement_timeout = '4s'; SELECT felix_publish('$sa', '\"x\"'::jsonb, shard => 0)");
isnt($rc, 0, "$sa: a publish held by $ln and $f1 is not acknowledged while no report naming them can land")
  or diag('the control plane still had: ' . rows($sa) . " -- $f2, which lacks the record, caught up");
$c->mend_reports;
ok(defined FelixCluster::poll(30, sub { rows($sa) =~ /^\Q$f1\E:2:true|\Q$f1\E:2:true/ }, 0.05),
	"$sa: once reports land, $f1 is reported caught up at generation 2")
  or diag(rows($sa));
unlike(rows($sa), qr/\Q$f2\E:\d+:true/, "$sa: $f2 is not counted caught up");
is($l->safe_psql('postgres', "SELECT count(felix_publish('$sa', to_jsonb(i), shard => 0)) FROM generate_series(1, 5) i"),
	'5', "$sa: publishes are acknowledged again");

$c->node($f2)->safe_psql('postgres', 'ALTER DATABASE postgres CONNECTION LIMIT -1');
$c->teardown;
felix_done_testing();
