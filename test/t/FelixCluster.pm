# FelixCluster: a felix cluster of N PostgreSQL nodes on this machine for
# the replication TAP tests (test/t/1xx_*.pl).
#
# The control-plane store is FELIX_STORE (or new's store option): with
# "embedded" (the default) node1 hosts the control plane
# (felix.control_conninfo = '') and nodes 2..N point felix.control_conninfo
# at node1; with "etcd" an etcd member runs beside each node (FelixEtcd)
# and every node lists them all in felix.etcd_endpoints.  Every node
# is named nodeK, is reached over its Unix socket, and logs in to its peers
# and the control plane as its own role, felix_node_nodeK, created on every
# server (its conninfo carries a password the trusting test servers never
# ask for, and that no log may show).  The helpers create streams (and pick names
# whose placement puts the leader where a test needs it), find leaders,
# wait for followers to be shipped to, run publishers in background psql
# sessions that log every acknowledged record, read shards, compare
# segment bytes across nodes, diag() what every node and the control
# plane know about a shard when a test fails, and provoke
# failures: kill -9 (FelixTest::crash_node, which copes with a PID 1 that
# does not reap zombies), SIGSTOP/SIGCONT of a postmaster and all its
# children, and a clean stop/start.  Every wait is bounded; a helper that
# times out dies with what it last saw.
package FelixCluster;

use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;
use FelixTest;
use FelixEtcd;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

# Every cluster made in this process, so the END block can wake paused
# nodes before PostgreSQL::Test::Cluster's own END stops them (a stopped
# postmaster cannot act on pg_ctl's signal).
my @clusters;

# FelixCluster->new(nodes => 3, conf => [lines for every node],
#                   node_conf => {K => [lines for nodeK]}, prefix => 'c')
# Starts the nodes, creates the extension on node1 and then on the others,
# and waits until node1's felix_nodes shows every node alive.  With etcd,
# etcd_max_txn_ops sets the members' --max-txn-ops (4096 by default).
sub new
{
	my ($class, %opt) = @_;
	my $n      = $opt{nodes} // 3;
	my $prefix = $opt{prefix} // 'node';
	my $store  = $opt{store} // $ENV{FELIX_STORE} // 'embedded';
	my $self   = bless {
		n       => $n,
		nodes   => [],
		by_name => {},
		state   => {},    # name -> up | down | paused
		store   => $store,
	}, $class;
	push @clusters, $self;
	die "unknown FELIX_STORE $store (embedded or etcd)"
	  unless $store eq 'embedded' || $store eq 'etcd';
	$self->{etcd} = FelixEtcd->new(members => $n, tls => $opt{etcd_tls},
		max_txn_ops => $opt{etcd_max_txn_ops}) if $store eq 'etcd';
	$self->{etcd_prefix} = "/felix/$prefix/";
	my %etcd_auth;
	if ($self->{etcd} && $opt{etcd_auth})
	{
		# each node authenticates as etcd user felix_nodeK, its password in a file
		my %users;
		for my $k (1 .. $n)
		{
			my $pw = "etcd-$k-" . int(rand(1e9));
			my $file = "$PostgreSQL::Test::Utils::tmp_check/etcd_password_$prefix$k";
			write_file($file, "$pw\n");
			chmod 0600, $file or die "chmod $file: $!";
			$users{"felix_node$k"} = $pw;
			$etcd_auth{$k} = [ "felix.etcd_user = 'felix_node$k'", "felix.etcd_password_file = '$file'" ];
		}
		$self->{etcd}->enable_auth($self->{etcd_prefix}, %users);
		$self->{etcd_passwords} = \%users;
	}

	my @pg;
	for my $k (1 .. $n)
	{
		push @pg, PostgreSQL::Test::Cluster->new("${prefix}$k");
	}
	$self->{cp_conninfo} = _conninfo($pg[0]);
	$self->{etcd_auth} = \%etcd_auth;
	$self->{opt} = \%opt;
	my @names = map { "node$_" } 1 .. $n;
	for my $k (1 .. $n)
	{
		my $node = $pg[ $k - 1 ];
		my $name = "node$k";
		init_node($node);
		$node->append_conf('postgresql.conf',
			join("\n", $self->_node_conf($node, $name, $k), @{ $opt{node_conf}{$k} // [] }) . "\n");
		$self->{nodes}[ $k - 1 ] = $node;
		$self->{by_name}{$name} = $node;
		$node->{felix_name} = $name;
	}
	for my $k (1 .. $n)
	{
		my $node = $pg[ $k - 1 ];
		$node->start;
		$self->{state}{"node$k"} = 'up';
		$node->safe_psql('postgres', 'CREATE EXTENSION felix') if $k == 1;
	}
	$pg[$_]->safe_psql('postgres', 'CREATE EXTENSION felix') for 1 .. $n - 1;
	my $roles = join(', ', map { "felix_create_node_role('$_')" } @names);
	$_->safe_psql('postgres', "SELECT $roles") for @pg;
	$self->wait_alive(\@names, 60);
	return $self;
}

# The postgresql.conf lines of a server that is node $name of this
# cluster ($k: which node's etcd credentials it uses; node 1 hosts the
# embedded control plane).
sub _node_conf
{
	my ($self, $node, $name, $k) = @_;
	my %opt = %{ $self->{opt} };
	return (
		felix_base_conf(),
		"felix.node_name = '$name'",
		"felix.node_conninfo = '" . felix_node_conninfo($node, $name) . "'",
		$self->{etcd}
		? ("felix.etcd_endpoints = '" . $self->{etcd}->endpoints . "'",
			"felix.etcd_prefix = '$self->{etcd_prefix}'", @{ $self->{etcd_auth}{$k} // [] },
			($opt{etcd_tls}
			? ("felix.etcd_cacert = '$opt{etcd_tls}{ca}'",
				"felix.etcd_cert = '$opt{etcd_tls}{client_cert}'",
				"felix.etcd_key = '$opt{etcd_tls}{client_key}'")
			: ()))
		: ("felix.control_conninfo = '" . ($k == 1 ? '' : $self->{cp_conninfo}) . "'"),
		"max_connections = 40",
		"log_min_messages = info",
		@{ $opt{conf} // [] });
}

# $node->init, with initdb run once per test run: every data directory
# starts as a copy of one initdb output, kept in tmp_check (PostgreSQL 16
# does the same with INITDB_TEMPLATE).  initdb costs a second of the
# suite's two cores per node; the copy a fifth of that.  The copies share
# a system identifier, which felix never reads.
sub init_node
{
	my ($node) = @_;
	my $template = "$PostgreSQL::Test::Utils::tmp_check/initdb_template";
	if (!-d $template)
	{
		my $tmp = "$template.$$";
		PostgreSQL::Test::Utils::system_or_bail('initdb', '-D', $tmp, '-A', 'trust', '-N');
		rename($tmp, $template) or die "rename $tmp: $!";
	}
	my $initdb = \&PostgreSQL::Test::Utils::system_or_bail;
	no warnings 'redefine';
	local *PostgreSQL::Test::Utils::system_or_bail = sub {
		return $initdb->(@_) unless $_[0] eq 'initdb';
		my ($dash_d, $pgdata) = @_[ 1, 2 ];
		die "initdb called as @_" unless $dash_d eq '-D' && @_ == 6;
		copy_tree($template, $pgdata);
	};
	$node->init;
	return;
}

# A server outside the cluster's node list (PostgreSQL::Test::Cluster
# $pgname) configured as node $name of this cluster -- a second server
# given a name already in use, say -- with etcd credentials of node $k.
# Started, with the extension and every node's role; not waited for.
sub extra_server
{
	my ($self, $pgname, $name, $k) = @_;
	my $node = PostgreSQL::Test::Cluster->new($pgname);
	init_node($node);
	$node->append_conf('postgresql.conf', join("\n", $self->_node_conf($node, $name, $k)) . "\n");
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION felix');
	my $roles = join(', ', map { "felix_create_node_role('node$_')" } 1 .. $self->{n});
	$node->safe_psql('postgres', "SELECT $roles");
	$node->{felix_name} = $name;
	return $node;
}

# Where a node is: host=<socket dir> port=<port> dbname=postgres (what it
# registers, and what felix.control_conninfo names).
sub _conninfo
{
	my ($node) = @_;
	return 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
}

sub conninfo { my ($self, $node) = @_; return _conninfo($self->node($node)); }

# node(1), node('node1') or a node object -> the PostgreSQL::Test::Cluster.
sub node
{
	my ($self, $k) = @_;
	return $k if ref $k;
	return $self->{by_name}{$k} // die "no node $k" if $k =~ /\D/;
	return $self->{nodes}[ $k - 1 ] // die "no node $k";
}

sub nodes { my ($self) = @_; return @{ $self->{nodes} }; }
sub name_of { my ($self, $k) = @_; return $self->node($k)->{felix_name}; }
sub cp { my ($self) = @_; return $self->{nodes}[0]; }
sub store { my ($self) = @_; return $self->{store}; }
sub etcd { my ($self) = @_; return $self->{etcd}; }

# Nodes that can answer queries (not stopped, not paused).
sub up_nodes
{
	my ($self) = @_;
	return grep { $self->{state}{ $_->{felix_name} } eq 'up' } $self->nodes;
}

# Poll $code (returns true when done) every $step seconds for at most
# $secs seconds; returns the seconds it took, or undef on time-out.
sub poll
{
	my ($secs, $code, $step) = @_;
	$step //= 0.05;
	my $t0 = time;
	while (1)
	{
		my $ok = eval { $code->() };
		return time - $t0 if $ok;
		return undef if time - $t0 > $secs;
		usleep($step * 1e6);
	}
}

# A query that returns undef instead of dying when the node refuses or
# does not answer within $timeout seconds.
sub try_psql
{
	my ($self, $k, $sql, $timeout) = @_;
	my $node = $self->node($k);
	my ($out, $err) = ('', '');
	my $rc = eval {
		$node->psql(
			'postgres', $sql,
			stdout  => \$out,
			stderr  => \$err,
			timeout => $timeout // 10,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	};
	return undef if !defined $rc || $rc != 0;
	return $out;
}

# Does (stream, shard) take a text publish at node $k within 30 s (a
# refusal, such as a lease still to be taken, is tried again)?
sub publish_ok
{
	my ($self, $k, $stream, $shard) = @_;
	my $took = poll(30, sub {
		my ($rc) = $self->node($k)->psql('postgres',
			"SELECT felix_publish('$stream', 'x'::text, shard => $shard)");
		return $rc == 0;
	}, 0.1);
	return defined $took;
}

# Wait until node1's felix_nodes shows every named node alive, each one
# started by start_node with a heartbeat since that start, for half a
# second on end.  A node killed and started again stays on the duty
# holder's alive list until its old record expires, and may leave it
# for a moment after its new start; a stream created then is placed
# without it.
sub wait_alive
{
	my ($self, $names, $secs) = @_;
	my $want = join(',', sort @$names);
	my $seen = '';
	my $since;
	my $took = poll(
		$secs // 30,
		sub {
			$seen = $self->cp->safe_psql('postgres',
				"SELECT string_agg(name || ':' || extract(epoch FROM last_heartbeat), ',' ORDER BY name) "
				  . "FROM felix_nodes WHERE alive",
				timeout => 10);
			my %beat = map { split /:/, $_, 2 } split /,/, $seen;
			my $ok = !grep { !defined $beat{$_} || $beat{$_} < ($self->{started}{$_} // 0) } @$names;
			$since = $ok ? ($since // time) : undef;
			return $ok && time - $since >= 0.5;
		},
		0.1);
	die "nodes $want not all alive in felix_nodes on node1 (alive: $seen)"
	  unless defined $took;
	return $took;
}

# Replica set (ranked, leader first) that the control plane would give
# shard $shard of a stream called $stream with these alive nodes: the
# same score and tie order as felix.cp_create_stream.
sub placement
{
	my ($self, $stream, $shard, $rf, @alive) = @_;
	@alive = map { $self->name_of($_) } $self->nodes unless @alive;
	my $list = join(',', map { "'$_'" } @alive);
	my $r = $self->cp->safe_psql('postgres',
		    "SELECT string_agg(n, ',' ORDER BY felix.cp_score(n, '$stream', $shard) DESC, n COLLATE \"C\") "
		  . "FROM unnest(ARRAY[$list]) n");
	my @ranked = split /,/, $r;
	return @ranked[ 0 .. $rf - 1 ];
}

# The first name "$prefix", "${prefix}_1", ... whose shard-0 replica set
# (leader first) satisfies $want->(@replicas).
sub pick_stream_name
{
	my ($self, $prefix, $rf, $want, @alive) = @_;
	for my $i (0 .. 199)
	{
		my $name = $i ? "${prefix}_$i" : $prefix;
		my @set = $self->placement($name, 0, $rf, @alive);
		return ($name, @set) if $want->(@set);
	}
	die "no stream name with prefix $prefix gives the wanted placement";
}

# Create a stream through node $k; waits until every up node lists it in
# felix_shards (the heartbeat creates it there).  Returns the stream name.
sub create_stream
{
	my ($self, $k, $name, %args) = @_;
	my $extra = join('', map { ", $_ => " . _lit($args{$_}) } sort keys %args);
	$self->node($k)->safe_psql('postgres',
		"SELECT felix_create_stream('$name'$extra)");
	$self->wait_stream($name, $args{shards} // 1);
	return $name;
}

# Wait until every up node lists all $shards shards of the stream in
# felix_shards.
sub wait_stream
{
	my ($self, $name, $shards) = @_;
	for my $node ($self->up_nodes)
	{
		my $got;
		my $took = poll(
			30,
			sub {
				$got = $node->safe_psql('postgres',
					"SELECT count(*) FROM felix_shards WHERE stream = '$name'");
				return $got == $shards;
			},
			0.1);
		die "stream $name: $node->{felix_name} lists $got of $shards shards after 30 s"
		  unless defined $took;
	}
	return;
}

sub _lit
{
	my ($v) = @_;
	return $v =~ /^-?\d+$/ ? $v : "'$v'";
}

# felix_shards row of (stream, shard) as node $k sees it: a hash of
# role, generation, start_seq, next_seq, hwm, leader, replicas,
# lease_remaining_ms, unplaced_reason, state, error.  undef if the node
# does not answer.
sub shard_row
{
	my ($self, $k, $stream, $shard) = @_;
	my @cols = qw(role generation start_seq next_seq hwm leader replicas
	  lease_remaining_ms unplaced_reason state error);
	my $out = $self->try_psql($k,
		    "SELECT "
		  . join(", ", map { "coalesce($_\::text, '')" } @cols)
		  . " FROM felix_shards WHERE stream = '$stream' AND shard = $shard",
		5);
	return undef unless defined $out && $out ne '';
	my @v = split /\|/, $out, -1;
	my %h;
	@h{@cols} = @v;
	return \%h;
}

# Where node $k's log of (stream, shard) ends (felix_shards.next_seq).
sub next_seq
{
	my ($self, $k, $stream, $shard) = @_;
	return $self->node($k)->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = " . ($shard // 0));
}

# Leave on the leader of shard 0 of $stream (replicas @set, all up) a
# record nobody else holds and nobody acknowledged, then kill it: first
# $n records, published there and held by every replica; then {"R": true}
# at seq $n, published with the leader's ship worker stopped, so that its
# quorum wait times out.  Returns the leader (its node), the generation
# it led, whether the publish of R failed, and where the leader's log
# ended (seq $n + 1).
sub unadopted_record
{
	my ($self, $stream, $n, @set) = @_;
	my ($leader, $generation) = $self->wait_leader($stream, 0);
	my $name = $leader->{felix_name};
	$self->wait_shipping($leader, $stream, 0, 2);
	$leader->safe_psql('postgres',
		"SELECT count(felix_publish('$stream', jsonb_build_object('i', i), shard => 0)) FROM generate_series(1, $n) i");
	poll(30, sub { !grep { $self->next_seq($_, $stream) ne $n } @set }, 0.1)
	  or die "$stream: the replicas do not all reach seq $n";
	my $ship = $leader->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'felix ship'");
	kill 'STOP', $ship;
	my ($rc) = $leader->psql('postgres',
		"SET felix.quorum_timeout = '500ms'; SELECT felix_publish('$stream', '{\"R\": true}'::jsonb, shard => 0)");
	my $end = $self->next_seq($name, $stream);
	$self->kill_node($name);
	return ($leader, $generation, $rc != 0, $end);
}

# Replace directory $to with a copy of $from (cp -a): a test taking, or
# putting back, a copy of a felix directory.
sub copy_tree
{
	my ($from, $to) = @_;
	system('rm', '-rf', $to) == 0 or die "rm -rf $to";
	system('cp', '-a', $from, $to) == 0 or die "cp -a $from $to";
	return;
}

# Leader name and generation of (stream, shard) as node $k's felix_shards
# says (default node1).
sub leader_of
{
	my ($self, $stream, $shard, $k) = @_;
	my $r = $self->shard_row($k // 1, $stream, $shard) or return;
	return ($r->{leader}, $r->{generation});
}

# Wait until some up node leads (stream, shard) with a live lease at a
# generation >= $opt{min_generation}; returns (node, generation).
sub wait_leader
{
	my ($self, $stream, $shard, %opt) = @_;
	my $min = $opt{min_generation} // 1;
	my ($who, $gen, $last);
	my $took = poll(
		$opt{timeout} // 30,
		sub {
			$last = '';
			for my $node ($self->up_nodes)
			{
				my $r = $self->shard_row($node, $stream, $shard) or next;
				$last .= "$node->{felix_name}: $r->{role} g$r->{generation} lease $r->{lease_remaining_ms}; ";
				next
				  unless $r->{role} eq 'leader'
				  && $r->{leader} eq $node->{felix_name}
				  && $r->{generation} >= $min
				  && ($r->{lease_remaining_ms} || 0) > 0;
				($who, $gen) = ($node, $r->{generation});
				return 1;
			}
			return 0;
		},
		0.05);
	die "no node leads $stream/$shard with a live lease at generation >= $min "
	  . "within $opt{timeout}s ($last)"
	  unless defined $took;
	return ($who, $gen);
}

# diag() what every up node and the control plane know about (stream,
# shard): felix_shards rows, the assignment, the replica reports and the
# leader's felix_replication rows.
sub diag_shard
{
	my ($self, $stream, $shard) = @_;
	for my $node ($self->up_nodes)
	{
		my $r = $self->shard_row($node, $stream, $shard);
		if (!$r) { diag("$node->{felix_name}: no answer"); next; }
		diag("$node->{felix_name} felix_shards: role $r->{role} g$r->{generation} leader $r->{leader} "
			  . "next_seq $r->{next_seq} hwm $r->{hwm} lease_ms '$r->{lease_remaining_ms}' "
			  . "state $r->{state} unplaced '$r->{unplaced_reason}' $r->{error}");
		my $rep = $self->try_psql($node,
			"SELECT string_agg(format('%s g%s acked %s lag %s %s err %s', follower, generation, acked_seq, lag_records, state, last_error), '; ') "
			  . "FROM felix_replication WHERE stream = '$stream' AND shard = $shard", 5);
		diag("$node->{felix_name} felix_replication: $rep") if defined $rep && $rep ne '';
	}
	if (my $sn = $self->state_node)
	{
		diag('control plane assignment: '
			  . ($self->try_psql($sn,
				"SELECT format('g%s leader %s replicas %s taken g%s by boot %s assigned_at %s unplaced %s', generation, leader, replicas, taken_generation, taken_boot, assigned_at, unplaced_reason) "
				  . "FROM felix.assignments WHERE stream = '$stream' AND shard = $shard", 5) // 'no answer'));
		diag('control plane reports: '
			  . ($self->try_psql($sn,
				"SELECT string_agg(format('%s by %s g%s acked_end %s caught_up %s at %s (beat %s)', follower, leader, generation, acked_end, caught_up, reported_at, leader_beat), '; ') "
				  . "FROM felix.replica_reports WHERE stream = '$stream' AND shard = $shard", 5) // 'no answer'));
		diag('control plane nodes: '
			  . ($self->try_psql($sn,
				"SELECT string_agg(format('%s beat %s claims %s', name, beat, claims), '; ') FROM felix.nodes", 5) // 'no answer'));
		diag('duties: ' . ($self->try_psql($sn, "SELECT string_agg(name, ',') FROM felix_nodes WHERE duty", 5) // ''));
	}
	return;
}

# The name of the node running the control-plane duties, as the first up
# node that knows says (felix_nodes.duty); undef if none does.
sub duty_node_name
{
	my ($self) = @_;
	for my $node ($self->up_nodes)
	{
		my $d = $self->try_psql($node, 'SELECT name FROM felix_nodes WHERE duty', 5);
		chomp $d if defined $d;
		return $d if defined $d && $d ne '';
	}
	return undef;
}

# A node that can read the control plane's state (felix.assignments and
# the other views over the store): node1, which hosts the embedded store,
# or with etcd any node that is up.  undef if none.
sub state_node
{
	my ($self) = @_;
	if ($self->{store} eq 'embedded')
	{
		return $self->{state}{node1} eq 'up' ? $self->cp : undef;
	}
	my @up = $self->up_nodes;
	return $up[0];
}

# Rewrite one key of the control-plane store by hand (a test forging
# state): the new value is $expr, a SQL expression over v (the key's
# value as jsonb), computed on state_node.
sub store_edit
{
	my ($self, $key, $expr) = @_;
	my $new = $self->state_query(
		"SELECT ($expr)::text FROM (SELECT value::jsonb AS v FROM felix.store_read('$key') WHERE key = '$key') s");
	die "store key $key not found" if $new eq '';
	# and mark its section in the same transaction, as every write does
	# (store.c), so that readers of what changed find it; with the
	# embedded store under the table lock every writer takes
	# (store_table.c), so that its revision is drawn in commit order: a
	# revision drawn before a concurrent writer's and committed after it
	# is never read by a reader that already passed the later one (a
	# forged report the duty holder never saw)
	my $mark = 'marks/' . ($key =~ m{^([^/]*/)} ? $1 : $key);
	if ($self->{store} eq 'embedded')
	{
		$self->cp->safe_psql('postgres',
			"BEGIN; LOCK TABLE felix.cp_store IN SHARE ROW EXCLUSIVE MODE;"
			  . "UPDATE felix.cp_store SET value = \$felix\$$new\$felix\$, "
			  . "mod_revision = nextval('felix.cp_store_revision') WHERE key = '$key';"
			  . "INSERT INTO felix.cp_store AS s (key, value, mod_revision) "
			  . "VALUES ('$mark', '{}', currval('felix.cp_store_revision')) "
			  . "ON CONFLICT (key) DO UPDATE SET mod_revision = EXCLUDED.mod_revision; COMMIT");
	}
	else
	{
		$self->{etcd}->put_all($self->{etcd_prefix} . $key => $new,
			$self->{etcd_prefix} . $mark => '{}');
	}
	return;
}

# Make replica reports fail while heartbeats (and so leases) go on, and
# make them land again: with the embedded store felix_replication loses
# EXECUTE on felix.cp_report; with etcd (made with etcd_auth => 1) the
# nodes' etcd user loses its write permission on the reports keys.
sub break_reports
{
	my ($self) = @_;
	if ($self->{store} eq 'etcd')
	{
		die 'break_reports with etcd needs FelixCluster->new(etcd_auth => 1)'
		  unless $self->{etcd_passwords};
		$self->{etcd}->revoke_reports;
		return;
	}
	$self->cp->safe_psql('postgres',
		'REVOKE EXECUTE ON FUNCTION felix.cp_report(text, jsonb, bigint, text) FROM felix_replication');
	return;
}

sub mend_reports
{
	my ($self) = @_;
	if ($self->{store} eq 'etcd')
	{
		$self->{etcd}->grant_reports;
		return;
	}
	$self->cp->safe_psql('postgres',
		'GRANT EXECUTE ON FUNCTION felix.cp_report(text, jsonb, bigint, text) TO felix_replication');
	return;
}

# Cut node $k off from the control-plane store, and let it back: with
# the embedded store its role may no longer log in to node1 (its
# sessions there end); with etcd (made with etcd_auth => 1) its etcd user
# loses its role.  Its peers other than node1 can still reach it, and it
# them.
sub cut_from_store
{
	my ($self, $k) = @_;
	my $name = $self->name_of($k);
	(my $num = $name) =~ s/^node//;
	if ($self->{store} eq 'etcd')
	{
		die 'cut_from_store with etcd needs FelixCluster->new(etcd_auth => 1)'
		  unless $self->{etcd_passwords};
		$self->{etcd}->cut_user("felix_node$num");
		return;
	}
	$self->cp->safe_psql('postgres', "ALTER ROLE felix_node_$name NOLOGIN");
	$self->cp->safe_psql('postgres',
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'felix_node_$name'");
	return;
}

sub mend_store
{
	my ($self, $k) = @_;
	my $name = $self->name_of($k);
	(my $num = $name) =~ s/^node//;
	if ($self->{store} eq 'etcd')
	{
		$self->{etcd}->mend_user("felix_node$num");
		return;
	}
	$self->cp->safe_psql('postgres', "ALTER ROLE felix_node_$name LOGIN");
	return;
}

# One value from the control plane's state views (on state_node).
sub state_query
{
	my ($self, $sql) = @_;
	my $sn = $self->state_node // die 'no node can read the control plane now';
	return $sn->safe_psql('postgres', $sql);
}

# Wait until felix_replication on the leader shows every follower of
# (stream, shard) answering (state shipping, an answer, no error): the
# leader knows where its followers are.  Returns the seconds it took.
sub wait_shipping
{
	my ($self, $leader, $stream, $shard, $followers, $secs) = @_;
	my $rows = '';
	my $took = poll(
		$secs // 20,
		sub {
			$rows = $leader->safe_psql('postgres',
				"SELECT count(*) FILTER (WHERE state = 'shipping' AND last_answer IS NOT NULL AND last_error IS NULL) "
				  . "|| '/' || count(*) FROM felix_replication WHERE stream = '$stream' AND shard = $shard");
			return $rows eq "$followers/$followers";
		},
		0.05);
	die "stream $stream shard $shard: followers answering/total on $leader->{felix_name}: $rows after "
	  . ($secs // 20) . ' s'
	  unless defined $took;
	return $took;
}

# The SQL a background publisher runs: up to $count records on one shard
# (or routed by key when shard is undef), stopping after $seconds.  Each
# acknowledged record is logged as
#   NOTICE: ack <w> <i> <shard> <seq> <epoch returned> <epoch called>
# and, with catch => 1, each refused one as
#   NOTICE: err <w> <i> <sqlstate> <epoch refused> <epoch called> <message>
# after which the loop sleeps $err_sleep and goes on; without catch the
# first error ends the session (psql prints it with its SQLSTATE).
sub publisher_sql
{
	my (%o) = @_;
	my $payload = "jsonb_build_object('tag', '$o{tag}', 'w', $o{w}, 'i', i)";
	my $route =
	  defined $o{shard} ? "shard => $o{shard}" : "key => '$o{tag}-$o{w}-' || i";
	my $publish = qq{ts := extract(epoch FROM clock_timestamp());
				p := felix_publish('$o{stream}', $payload, $route);
				RAISE NOTICE 'ack % % % % % %', $o{w}, i, p.shard, p.seq,
					extract(epoch FROM clock_timestamp()), ts;};
	my $body =
	  $o{catch}
	  ? qq{BEGIN
				$publish
			EXCEPTION WHEN OTHERS THEN
				RAISE NOTICE 'err % % % % % %', $o{w}, i, SQLSTATE,
					extract(epoch FROM clock_timestamp()), ts, SQLERRM;
				PERFORM pg_sleep($o{err_sleep});
			END;}
	  : $publish;
	return qq{$o{settings}
	DO \$\$ DECLARE p felix_position; ts numeric; t0 timestamptz := clock_timestamp(); BEGIN
		FOR i IN 1..$o{count} LOOP
			EXIT WHEN clock_timestamp() > t0 + interval '$o{seconds} seconds';
			$body
			$o{pause}
		END LOOP; END \$\$;};
}

# Start $opt{sessions} psql sessions publishing on node $opt{node}.
# Options: stream, shard (undef: by key), sessions (4), count (100000),
# seconds (60), catch (0), err_sleep (0.05), tag, settings (SQL run
# first, e.g. SET felix.quorum_timeout = '2s'), sleep (seconds between
# publishes).  Returns a handle for acks/errors/stop_publishers.
sub start_publishers
{
	my ($self, %opt) = @_;
	my $node = $self->node($opt{node});
	my $tag  = $opt{tag} // 'p';
	my $pub  = { tag => $tag, files => [], handles => [] };
	for my $w (1 .. ($opt{sessions} // 4))
	{
		my $file = "$PostgreSQL::Test::Utils::tmp_check/pub_${tag}_w$w.txt";
		unlink $file;
		push @{ $pub->{files} }, $file;
		my $sql = publisher_sql(
			stream    => $opt{stream},
			shard     => $opt{shard},
			w         => $w,
			tag       => $tag,
			count     => $opt{count} // 100000,
			seconds   => $opt{seconds} // 60,
			catch     => $opt{catch} // 0,
			err_sleep => $opt{err_sleep} // 0.05,
			settings  => $opt{settings} // '',
			pause     => $opt{sleep} ? "PERFORM pg_sleep($opt{sleep});" : '');
		push @{ $pub->{handles} },
		  IPC::Run::start(
			[
				'psql', '-X', '-q', '-v', 'VERBOSITY=verbose',
				'-h', $node->host, '-p', $node->port, '-d', 'postgres',
				'-c', $sql
			],
			'<', \undef, '>', '/dev/null', '2>', $file,
			IPC::Run::timeout(($opt{seconds} // 60) + 120));
	}
	return $pub;
}

# Acknowledged records so far: hashes w, i, shard, seq, t (epoch when
# the publish returned), t_start (when it was called), payload.
sub acks
{
	my ($self, $pub) = @_;
	my @rows;
	for my $f (@{ $pub->{files} })
	{
		next unless -e $f;
		for my $line (split /\n/, read_file($f))
		{
			next
			  unless $line =~
			  /NOTICE:\s+(?:00000: )?ack (\d+) (\d+) (-?\d+) (-?\d+) ([\d.]+) ([\d.]+)/;
			push @rows,
			  {
				w       => $1,
				i       => $2,
				shard   => $3,
				seq     => $4,
				t       => $5,
				t_start => $6,
				payload => qq({"i": $2, "w": $1, "tag": "$pub->{tag}"}),
			  };
		}
	}
	return @rows;
}

sub ack_count { my ($self, $pub) = @_; return scalar(my @a = $self->acks($pub)); }

# Refusals so far: hashes w, i, sqlstate, t, t_start, message (catch mode), plus
# the ERROR that ended a session outside catch mode (w, sqlstate, message).
sub errors
{
	my ($self, $pub) = @_;
	my @rows;
	my $w = 0;
	for my $f (@{ $pub->{files} })
	{
		$w++;
		next unless -e $f;
		for my $line (split /\n/, read_file($f))
		{
			if ($line =~ /NOTICE:\s+(?:00000: )?err (\d+) (\d+) (\w{5}) ([\d.]+) ([\d.]+) (.*)/)
			{
				push @rows,
				  { w => $1, i => $2, sqlstate => $3, t => $4, t_start => $5, message => $6 };
			}
			elsif ($line =~ /ERROR:\s+(\w{5}): (.*)/)
			{
				push @rows, { w => $w, sqlstate => $1, message => $2, t => undef };
			}
			elsif ($line =~ /^psql: error: (.*)|server closed the connection|connection to server .* failed/)
			{
				push @rows, { w => $w, sqlstate => 'conn', message => $line, t => undef };
			}
		}
	}
	return @rows;
}

# Wait (bounded) for the sessions to end by themselves; kill the psql
# clients still running after $secs.
sub stop_publishers
{
	my ($self, $pub, $secs) = @_;
	my $deadline = time + ($secs // 0);
	for my $h (@{ $pub->{handles} })
	{
		while ($h->pumpable && time < $deadline) { usleep(50_000); eval { $h->pump_nb }; }
		if ($h->pumpable) { eval { $h->kill_kill(grace => 1) }; }
		eval { $h->finish; 1 };
	}
	return;
}

# Wait until the publishers together acknowledged at least $n records.
sub wait_acks
{
	my ($self, $pub, $n, $secs) = @_;
	my $took = poll($secs // 30, sub { $self->ack_count($pub) >= $n }, 0.05);
	return defined $took;
}

# Records of (stream, shard) on node $k as text lines "seq|key|payload",
# ordered by seq (a follower serves up to the hwm it knows); with $all,
# every column (SELECT *).
sub records
{
	my ($self, $k, $stream, $shard, $all) = @_;
	my $cols = $all ? '*' : "seq, coalesce(key, ''), payload::text";
	return $self->node($k)->safe_psql('postgres',
		"SELECT $cols FROM \"$stream\" WHERE shard = $shard ORDER BY seq",
		timeout => 60);
}

# After a leader-stream failover to $new, at $t_kill: two tests.  Every
# acknowledged record (from acks()) below where $new's log ends is there,
# unchanged; the ones at or above it -- the loss window -- are no more
# than were acknowledged in the last half second before $t_kill.
sub leader_loss_ok
{
	my ($self, $new, $stream, $shard, $t_kill, @acks) = @_;
	my $start = $new->safe_psql('postgres',
		"SELECT next_seq FROM felix_shards WHERE stream = '$stream' AND shard = $shard");
	my %held = map { my ($s, $k, $p) = split /\|/, $_, 3; ($s => $p) } split /\n/,
	  $self->records($new, $stream, $shard);
	my (@missing, @lost);
	for my $a (@acks)
	{
		my $have = $held{ $a->{seq} };
		next if defined $have && $have eq $a->{payload};
		if ($a->{seq} < $start) { push @missing, $a->{seq} } else { push @lost, $a->{seq} }
	}
	is(scalar(@missing), 0,
		"every acknowledged record below the new leader's end ($start) is there, unchanged")
	  or diag("missing: @missing[0 .. ($#missing < 9 ? $#missing : 9)]");
	my $last = grep { $_->{t} >= $t_kill - 0.5 } @acks;
	cmp_ok(scalar(@lost), '<=', $last,
		scalar(@lost) . " acknowledged records lost, at or above seq $start: no more than were acknowledged in the last half second ($last)");
	return;
}

# The stored bytes of (stream, shard) on node $k: for every segment file,
# its name and the bytes of its batches (after the 64-byte file header,
# whose creation time is per node, up to the end of the last whole batch).
sub segment_bytes
{
	my ($self, $k, $stream, $shard) = @_;
	my $node = $self->node($k);
	my $dir  = shard_dir($node, $stream, $shard);
	my @out;
	for my $f (segment_files($dir))
	{
		my $end = data_end($f);
		my $data = read_file($f);
		(my $base = $f) =~ s{.*/}{};
		push @out, [ $base, substr($data, 64, $end - 64) ];
	}
	return @out;
}

# Generation of every record batch of (stream, shard) on node $k:
# list of [base_seq, count, generation].
sub batch_generations
{
	my ($self, $k, $stream, $shard) = @_;
	my $dir = shard_dir($self->node($k), $stream, $shard);
	return map {
		my $f = $_;
		map { [ $_->{base_seq}, $_->{count}, $_->{generation} ] } record_batches($f)
	} segment_files($dir);
}

# A felix_metrics value on node $k; undef when felix_metrics has no such
# row.
sub metric_of
{
	my ($self, $k, $name) = @_;
	my $v = $self->node($k)->safe_psql('postgres',
		"SELECT value FROM felix_metrics WHERE name = '$name'");
	return $v eq '' ? undef : $v;
}

# kill -9 every process of node $k at once (a machine that dies);
# returns the epoch at which the signal was sent.
sub kill_node
{
	my ($self, $k) = @_;
	my $node = $self->node($k);
	my $t = time;
	crash_node($node, all => 1);
	$self->{state}{ $node->{felix_name} } = 'down';
	return $t;
}

sub _pids
{
	my ($node) = @_;
	my $pidfile = $node->data_dir . '/postmaster.pid';
	open my $fh, '<', $pidfile or die "open $pidfile: $!";
	my $pm = <$fh>;
	close $fh;
	chomp $pm;
	my @all = ($pm);
	my @queue = ($pm);
	while (@queue)
	{
		my $p = shift @queue;
		my @kids = FelixTest::_children($p);
		push @all, @kids;
		push @queue, @kids;
	}
	return ($pm, @all[ 1 .. $#all ]);
}

# SIGSTOP the postmaster, then every process under it (it can fork no
# new one while stopped); returns the epoch.
sub pause_node
{
	my ($self, $k) = @_;
	my $node = $self->node($k);
	my ($pm) = _pids($node);
	my $t = time;
	kill 'STOP', $pm;
	my (undef, @kids) = _pids($node);
	kill 'STOP', @kids;
	$self->{paused}{ $node->{felix_name} } = [ $pm, @kids ];
	$self->{state}{ $node->{felix_name} } = 'paused';
	return $t;
}

# SIGCONT the children, then the postmaster; returns the epoch.
sub resume_node
{
	my ($self, $k) = @_;
	my $node = $self->node($k);
	my $pids = delete $self->{paused}{ $node->{felix_name} } or return;
	my ($pm, @kids) = @$pids;
	my $t = time;
	kill 'CONT', @kids;
	kill 'CONT', $pm;
	$self->{state}{ $node->{felix_name} } = 'up';
	return $t;
}

sub stop_node
{
	my ($self, $k, $mode) = @_;
	my $node = $self->node($k);
	$node->stop($mode // 'fast');
	$self->{state}{ $node->{felix_name} } = 'down';
	return time;
}

sub start_node
{
	my ($self, $k) = @_;
	my $node = $self->node($k);
	# what the node did before this start is older than this (wait_alive)
	$self->{started}{ $node->{felix_name} } = time;
	$node->start;
	$self->{state}{ $node->{felix_name} } = 'up';
	return time;
}

# Stop every node that is still up (paused ones are woken first).
# Hold every promotion: SIGSTOP the duty worker of each given node (all
# up nodes by default) while it sleeps between two ticks -- its activity
# not active, so no tick of its is half done -- until release_duties.  A test
# that forges the control plane's state after a kill holds the duties
# first: on a loaded machine the lease can lapse, and a tick promote from
# what it read, before the forgery lands.  Returns the pids held.
sub hold_duties
{
	my ($self, @which) = @_;
	my @nodes = @which ? map { $self->node($_) } @which : $self->up_nodes;
	for my $node (@nodes)
	{
		my $held;
		for my $try (1 .. 200)
		{
			my $pid = $node->safe_psql('postgres',
				"SELECT pid FROM pg_stat_activity WHERE backend_type = 'felix duties'");
			die "no duty worker on $node->{felix_name}" unless $pid =~ /^\d+$/;
			kill 'STOP', $pid;
			my $state = $node->safe_psql('postgres', "SELECT state FROM pg_stat_activity WHERE pid = $pid");
			if ($state ne 'active')
			{
				$held = $pid;
				last;
			}
			kill 'CONT', $pid;
			usleep(20_000);
		}
		die "could not catch $node->{felix_name}'s duty worker between ticks" unless $held;
		push @{ $self->{held_duties} }, $held;
	}
	return @{ $self->{held_duties} };
}

sub release_duties
{
	my ($self) = @_;
	kill 'CONT', @{ delete $self->{held_duties} // [] };
	return;
}

sub teardown
{
	my ($self) = @_;
	$self->release_duties;
	$self->resume_node($_) for keys %{ $self->{paused} // {} };
	for my $node ($self->nodes)
	{
		next unless $self->{state}{ $node->{felix_name} } eq 'up';
		$node->stop('immediate', fail_ok => 1);
		$self->{state}{ $node->{felix_name} } = 'down';
	}
	return;
}

END
{
	for my $c (@clusters)
	{
		kill 'CONT', @{ $c->{held_duties} // [] };
		for my $pids (values %{ $c->{paused} // {} })
		{
			kill 'CONT', @$pids;
		}
	}
}

1;
