# shellcheck shell=bash
# scripts/common.sh: helpers shared by scripts/felix-start and scripts/test-all.
#
# Sourced, never run.  Everything here works on a fresh Debian 12 machine,
# run either as root or as an ordinary user who may use sudo.

FELIX_PG_BIN=/usr/lib/postgresql/15/bin
FELIX_PG_CONFIG=$FELIX_PG_BIN/pg_config

# What building and testing felix needs from Debian.
FELIX_PACKAGES=(
	postgresql-15
	postgresql-server-dev-15
	libcurl4-openssl-dev
	libssl-dev
	libpq-dev
	libipc-run-perl
	postgresql-15-cron
	etcd-server
	openssl
	build-essential
	spin
	faketime
	nftables
	python3-psycopg2
	iproute2
)

felix_log() { printf '==> %s\n' "$*"; }
felix_warn() { printf 'warning: %s\n' "$*" >&2; }
felix_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

felix_is_root() { [ "$(id -u)" -eq 0 ]; }

# Run a command as root: directly when we are root, else through sudo.
felix_as_root() {
	if felix_is_root; then
		"$@"
	elif command -v sudo >/dev/null 2>&1; then
		sudo -- "$@"
	else
		felix_die "this step needs root and sudo is not installed: run this script as root, or install sudo"
	fi
}

# Install the Debian packages that are missing (one apt-get update, one
# apt-get install); do nothing when every one is already installed.
felix_install_packages() {
	local missing=() p
	for p in "${FELIX_PACKAGES[@]}"; do
		if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
			missing+=("$p")
		fi
	done
	if [ "${#missing[@]}" -eq 0 ]; then
		felix_log "Debian packages: all present"
		return 0
	fi
	felix_log "Debian packages: installing ${missing[*]}"
	felix_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
	felix_as_root env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q "${missing[@]}" </dev/null
	[ -x "$FELIX_PG_CONFIG" ] || felix_die "$FELIX_PG_CONFIG is missing after installing packages"
}

felix_jobs() {
	local n
	n=$(nproc 2>/dev/null || echo 2)
	echo "$n"
}

# Build the tree at $1 as the current user, then install it as root.
felix_build_install() {
	local src=$1
	felix_log "building felix in $src"
	make -C "$src" -j"$(felix_jobs)" PG_CONFIG="$FELIX_PG_CONFIG" || return 1
	felix_log "installing felix into $("$FELIX_PG_CONFIG" --pkglibdir)"
	felix_as_root make -C "$src" PG_CONFIG="$FELIX_PG_CONFIG" install || return 1
}

# Create a system user (with a home directory) unless it exists.
felix_ensure_user() {
	local user=$1 home=$2
	if ! id -u "$user" >/dev/null 2>&1; then
		felix_log "creating user $user (home $home)"
		felix_as_root useradd --system --user-group --home-dir "$home" \
			--create-home --shell /bin/bash "$user"
	fi
}
