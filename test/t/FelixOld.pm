# The felix 1.0 release, for the upgrade tests: built from its source
# (test/upgrade/felix-1.0.tar.gz) and installed into a copy of this
# machine's PostgreSQL installation, so that a node started from that copy
# runs felix 1.0 and the same data directory, started from the system's
# installation, runs the felix under test -- as replacing the binaries on
# a server does.  PostgreSQL finds its share and library directories
# relative to its binaries, so the copy is a complete installation.
package FelixOld;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use File::Path qw(make_path rmtree);
use PostgreSQL::Test::Utils;

our @EXPORT = qw(felix_1_0_install use_install system_install);

sub _pg_config
{
	my ($what) = @_;
	my $v = `pg_config --$what`;
	die "pg_config --$what failed" if $? != 0;
	chomp $v;
	return $v;
}

# The install path (what PostgreSQL::Test::Cluster->new(install_path =>)
# takes: the directory above bin/) of the system's PostgreSQL.
sub system_install
{
	return dirname(_pg_config('bindir'));
}

sub _run
{
	my ($log, @cmd) = @_;
	system("@cmd >> '$log' 2>&1") == 0
	  or die "felix 1.0: '@cmd' failed (exit " . ($? >> 8) . "); see $log";
	return;
}

# Build and install felix 1.0 once per test run; returns its install path.
sub felix_1_0_install
{
	my $root = "$PostgreSQL::Test::Utils::tmp_check/felix-1.0";
	my $inst_rel = system_install();
	my $inst = "$root$inst_rel";
	return $inst if -e "$root/installed";

	my $tarball = ($ENV{TESTDIR} // '.') . '/test/upgrade/felix-1.0.tar.gz';
	die "felix 1.0 source $tarball is missing" unless -e $tarball;
	my $share = _pg_config('sharedir');
	my $pkglib = _pg_config('pkglibdir');
	my $log = "$PostgreSQL::Test::Utils::log_path/felix-1.0-build.log";

	rmtree($root);
	make_path("$root" . dirname($inst_rel), "$root" . dirname($share), "$root/src");
	_run($log, 'cp', '-a', $inst_rel, "$root" . dirname($inst_rel) . '/');
	_run($log, 'cp', '-a', $share, "$root" . dirname($share) . '/');
	# nothing of the felix under test in the copy
	unlink glob("$root$share/extension/felix*"), "$root$pkglib/felix.so";
	_run($log, 'tar', '-xzf', $tarball, '-C', "$root/src");
	_run($log, 'make', '-C', "$root/src/felix-1.0", '-j2', 'PG_CONFIG=' . _pg_config('bindir') . '/pg_config');
	_run($log, 'make', '-C', "$root/src/felix-1.0", 'install', "DESTDIR=$root",
		'PG_CONFIG=' . _pg_config('bindir') . '/pg_config');
	die "felix 1.0 did not install into $root$pkglib" unless -e "$root$pkglib/felix.so";
	open my $fh, '>', "$root/installed" or die "$root/installed: $!";
	close $fh;
	return $inst;
}

# Run $node from another installation from now on (it must be stopped):
# the binaries replaced under its data directory.
sub use_install
{
	my ($node, $install_path) = @_;
	$node->{_install_path} = $install_path;
	return;
}

1;
