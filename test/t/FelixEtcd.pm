# FelixEtcd: an etcd cluster of N members on loopback ports for the TAP
# tests, each with its own data directory under the test's temp dir;
# never the system service.  Members can be killed (-9), stopped
# (SIGSTOP) and started again on their data directory.  Every member is
# killed when the test process ends.
package FelixEtcd;

use strict;
use warnings;

use HTTP::Tiny;
use IO::Socket::INET;
use MIME::Base64;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my @all;    # every cluster made in this process, for END

# FelixEtcd->new(members => 3): starts them and waits for a leader.
# With tls => {ca, cert, key} the client URLs are https with those files,
# and clients must present a certificate the CA signed.
sub new
{
	my ($class, %opt) = @_;
	my $n    = $opt{members} // 3;
	my $self = bless {
		n       => $n,
		token   => 'felix-' . $$ . '-' . int(rand(1e9)),
		members => [],
		tls     => $opt{tls},
		# a stream's creation writes all its shards in one transaction
		max_txn_ops => $opt{max_txn_ops} // 4096,
	}, $class;
	push @all, $self;
	my $base = PostgreSQL::Test::Utils::tempdir('etcd');
	for my $k (1 .. $n)
	{
		push @{ $self->{members} },
		  {
			name   => "e$k",
			client => PostgreSQL::Test::Cluster::get_free_port(),
			peer   => PostgreSQL::Test::Cluster::get_free_port(),
			dir    => "$base/e$k",
			log    => "$PostgreSQL::Test::Utils::log_path/etcd_e${k}_$self->{token}.log",
		  };
	}
	$self->{initial} = join(',',
		map { "$_->{name}=http://127.0.0.1:$_->{peer}" } @{ $self->{members} });
	$self->start_member($_, 'new') for 1 .. $n;
	if ($self->{tls}) { $self->wait_listening(30); }
	else { $self->wait_ready(30); }
	return $self;
}

sub scheme { my ($self) = @_; return $self->{tls} ? 'https' : 'http'; }

sub member { my ($self, $k) = @_; return $self->{members}[ $k - 1 ]; }

# Client URLs of every member, comma-separated (felix.etcd_endpoints).
sub endpoints
{
	my ($self) = @_;
	my $scheme = $self->scheme;
	return join(',', map { "$scheme://127.0.0.1:$_->{client}" } @{ $self->{members} });
}

sub start_member
{
	my ($self, $k, $state) = @_;
	my $m = $self->member($k);
	$state //= -d "$m->{dir}/member" ? 'existing' : 'new';
	my $scheme = $self->scheme;
	my @tls = $self->{tls}
	  ? ('--cert-file', $self->{tls}{cert}, '--key-file', $self->{tls}{key},
		'--trusted-ca-file', $self->{tls}{ca}, '--client-cert-auth')
	  : ();
	my @cmd = (
		'etcd', '--name', $m->{name},
		'--data-dir', $m->{dir},
		'--listen-client-urls', "$scheme://127.0.0.1:$m->{client}",
		'--advertise-client-urls', "$scheme://127.0.0.1:$m->{client}",
		@tls,
		'--listen-peer-urls', "http://127.0.0.1:$m->{peer}",
		'--initial-advertise-peer-urls', "http://127.0.0.1:$m->{peer}",
		'--initial-cluster', $self->{initial},
		'--initial-cluster-state', $state,
		'--initial-cluster-token', $self->{token},
		'--max-txn-ops', $self->{max_txn_ops},
		'--log-level', 'warn');
	$m->{h} = IPC::Run::start(\@cmd, '<', \undef, '>>', $m->{log}, '2>>', $m->{log});
	$m->{pid} = $m->{h}->{KIDS}[0]{PID};
	$m->{up} = 1;
	return;
}

# kill -9 of member $k.
sub kill_member
{
	my ($self, $k) = @_;
	my $m = $self->member($k);
	return unless $m->{up};
	kill 'CONT', $m->{pid};
	kill 'KILL', $m->{pid};
	eval { $m->{h}->finish };
	$m->{up} = 0;
	return;
}

sub pause_member  { my ($self, $k) = @_; kill 'STOP', $self->member($k)->{pid}; return; }
sub resume_member { my ($self, $k) = @_; kill 'CONT', $self->member($k)->{pid}; return; }

# One request to member $k's JSON gateway (as root once auth is on); the
# decoded-enough answer text.
sub _post
{
	my ($self, $k, $path, $body) = @_;
	my $m = $self->member($k);
	my %headers;
	$headers{Authorization} = $self->{root_token} if $self->{root_token};
	my $r = HTTP::Tiny->new(timeout => 2)
	  ->post("http://127.0.0.1:$m->{client}$path", { content => $body, headers => \%headers });
	return $r->{success} ? $r->{content} : '';
}

sub _b64 { return MIME::Base64::encode_base64($_[0], ''); }

# The first key past every key starting with $prefix.
sub _prefix_end
{
	my ($p) = @_;
	my $last = chop $p;
	return $p . chr(ord($last) + 1);
}

# One administrative request (auth API), as root once auth is on.
sub _admin
{
	my ($self, $path, $body) = @_;
	my $m = (grep { $_->{up} } @{ $self->{members} })[0] // die 'etcd: no member up';
	my %headers;
	$headers{Authorization} = $self->{root_token} if $self->{root_token};
	my $r = HTTP::Tiny->new(timeout => 5)->post("http://127.0.0.1:$m->{client}$path",
		{ content => $body, headers => \%headers });
	die "etcd $path: $r->{status} $r->{content}" unless $r->{success};
	return $r->{content};
}

sub _root_token
{
	my ($self) = @_;
	my $out = $self->_admin('/v3/auth/authenticate', qq({"name":"root","password":"$self->{root_pw}"}));
	($self->{root_token}) = $out =~ /"token":"([^"]+)"/ or die "etcd: no root token: $out";
	return;
}

sub _perm
{
	my ($self, $verb, $type, $from, $to) = @_;
	$self->_root_token;
	if ($verb eq 'grant')
	{
		$self->_admin('/v3/auth/role/grant',
			'{"name":"felix","perm":{"permType":"' . $type . '","key":"' . _b64($from)
			  . '","range_end":"' . _b64($to) . '"}}');
	}
	else
	{
		$self->_admin('/v3/auth/role/revoke',
			'{"role":"felix","key":"' . _b64($from) . '","range_end":"' . _b64($to) . '"}');
	}
	return;
}

# Turn etcd authentication on: user root, and for each user => password
# of %users (one per felix node) role felix, which may read everything
# under $prefix and write it -- the writes of $prefix."reports/" granted
# separately so that a test can take them away (revoke_reports) and give
# them back (grant_reports).  cut_user/mend_user take the role from one
# user and give it back.
sub enable_auth
{
	my ($self, $prefix, %users) = @_;
	$self->{root_pw} = 'root-' . int(rand(1e9));
	$self->{prefix}  = $prefix;
	$self->_admin('/v3/auth/user/add', qq({"name":"root","password":"$self->{root_pw}"}));
	$self->_admin('/v3/auth/user/grant', '{"user":"root","role":"root"}');
	$self->_admin('/v3/auth/role/add', '{"name":"felix"}');
	for my $u (sort keys %users)
	{
		$self->_admin('/v3/auth/user/add', qq({"name":"$u","password":"$users{$u}"}));
		$self->_admin('/v3/auth/user/grant', qq({"user":"$u","role":"felix"}));
	}
	my $rep = "${prefix}reports/";
	for my $p (
		[ 'READ',  $prefix,            _prefix_end($prefix) ],
		[ 'WRITE', $prefix,            $rep ],
		[ 'WRITE', _prefix_end($rep),  _prefix_end($prefix) ],
		[ 'WRITE', $rep,               _prefix_end($rep) ])
	{
		$self->_admin('/v3/auth/role/grant',
			'{"name":"felix","perm":{"permType":"' . $p->[0] . '","key":"' . _b64($p->[1])
			  . '","range_end":"' . _b64($p->[2]) . '"}}');
	}
	$self->_admin('/v3/auth/enable', '{}');
	return;
}

sub cut_user
{
	my ($self, $user) = @_;
	$self->_root_token;
	$self->_admin('/v3/auth/user/revoke', qq({"name":"$user","role":"felix"}));
	return;
}

sub mend_user
{
	my ($self, $user) = @_;
	$self->_root_token;
	$self->_admin('/v3/auth/user/grant', qq({"user":"$user","role":"felix"}));
	return;
}

sub revoke_reports
{
	my ($self) = @_;
	my $rep = "$self->{prefix}reports/";
	$self->_perm('revoke', 'WRITE', $rep, _prefix_end($rep));
	return;
}

sub grant_reports
{
	my ($self) = @_;
	my $rep = "$self->{prefix}reports/";
	$self->_perm('grant', 'WRITE', $rep, _prefix_end($rep));
	return;
}

# Put key = value through any member that is up (as root once auth is on).
sub put
{
	my ($self, $key, $value) = @_;
	$self->_root_token if $self->{root_pw};
	my $body = '{"key":"' . MIME::Base64::encode_base64($key, '')
	  . '","value":"' . MIME::Base64::encode_base64($value, '') . '"}';
	for my $k (1 .. $self->{n})
	{
		next unless $self->member($k)->{up};
		return 1 if $self->_post($k, '/v3/kv/put', $body) =~ /"header"/;
	}
	die "etcd: could not put $key";
}

# Delete key through any member that is up (as root once auth is on).
sub delete_key
{
	my ($self, $key) = @_;
	$self->_root_token if $self->{root_pw};
	my $body = '{"key":"' . _b64($key) . '"}';
	for my $k (1 .. $self->{n})
	{
		next unless $self->member($k)->{up};
		return 1 if $self->_post($k, '/v3/kv/deleterange', $body) =~ /"header"/;
	}
	die "etcd: could not delete $key";
}

# Put every key => value of %kv in one transaction (at one revision).
sub put_all
{
	my ($self, %kv) = @_;
	$self->_root_token if $self->{root_pw};
	my $body = '{"success":['
	  . join(',', map { '{"request_put":{"key":"' . _b64($_) . '","value":"' . _b64($kv{$_}) . '"}}' }
		sort keys %kv)
	  . ']}';
	for my $k (1 .. $self->{n})
	{
		next unless $self->member($k)->{up};
		return 1 if $self->_post($k, '/v3/kv/txn', $body) =~ /"header"/;
	}
	die 'etcd: could not put ' . join(', ', sort keys %kv);
}

# The name of the member that leads, as member $k (or any up member) sees it; undef if none.
sub leader
{
	my ($self) = @_;
	for my $k (1 .. $self->{n})
	{
		next unless $self->member($k)->{up};
		my $st = $self->_post($k, '/v3/maintenance/status', '{}');
		my ($leader) = $st =~ /"leader":"(\d+)"/;
		my ($me)     = $st =~ /"member_id":"(\d+)"/;
		next unless defined $leader && defined $me;
		return "e$k" if $leader eq $me;
		my $list = $self->_post($k, '/v3/cluster/member/list', '{}');
		while ($list =~ /\{"ID":"(\d+)","name":"(e\d+)"/g)
		{
			return $2 if $1 eq $leader;
		}
	}
	return undef;
}

# Wait until some member reports a leader.
sub wait_ready
{
	my ($self, $secs) = @_;
	my $t0 = time;
	while (time - $t0 < ($secs // 30))
	{
		return 1 if defined $self->leader;
		usleep(100_000);
	}
	die "etcd: no leader after ${secs}s";
}

# Wait until every member's client port takes connections (TLS members,
# which the plain HTTP client here cannot talk to).
sub wait_listening
{
	my ($self, $secs) = @_;
	my $t0 = time;
	while (time - $t0 < ($secs // 30))
	{
		my $up = grep {
			IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $_->{client}, Timeout => 1)
		} @{ $self->{members} };
		return 1 if $up == $self->{n};
		usleep(100_000);
	}
	die "etcd: members not listening after ${secs}s";
}

sub stop_all
{
	my ($self) = @_;
	$self->kill_member($_) for 1 .. $self->{n};
	return;
}

END
{
	for my $c (@all)
	{
		for my $m (@{ $c->{members} })
		{
			next unless $m->{up} && $m->{pid};
			kill 'CONT', $m->{pid};
			kill 'KILL', $m->{pid};
		}
	}
}

1;
