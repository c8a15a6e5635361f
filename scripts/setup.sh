#!/usr/bin/env bash
# setup.sh installs what pgcluster's tests and demo need and is missing:
# redis-server, the PostgreSQL server binaries (initdb, pg_ctl), dig and
# dnsperf (the load tool of the answer measurements), zonemaster-cli (the
# delegation test), unbound (the validating resolver of the DNSSEC test),
# podman (make image and its test), systemd-analyze (the systemd unit's
# test), promtool (Debian's prometheus package: the alerting rules' tests in
# deploy/monitoring/) and the CA certificates the image ships, then
# downloads the Go modules: pgcluster's, and every module the plugin.cfg
# recipe of docs/ship.md needs to build all of CoreDNS with pgcluster (its
# test, TestPluginCfgBuild, runs it with the network off). It is
# idempotent: it installs nothing that is present. As root on Debian it
# installs with apt-get; as another user it says what is missing and how to
# install it.
#
# No service is left running: tests start their own servers on free ports, so
# nothing may listen on a fixed port (6379, 5432) while they run.
set -euo pipefail

cd "$(dirname "$0")/.."

say() { echo "setup: $*"; }

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

# need NAME PACKAGE CHECK... records PACKAGE as missing unless CHECK succeeds.
missing=()
need() {
	local what=$1 pkg=$2
	shift 2
	if "$@" >/dev/null 2>&1; then
		say "$what: present"
	else
		say "$what: missing (package $pkg)"
		missing+=("$pkg")
	fi
}

have_initdb() {
	if [ -n "${PGBIN:-}" ]; then
		[ -x "$PGBIN/initdb" ]
	else
		compgen -G '/usr/lib/postgresql/*/bin/initdb'
	fi
}

need redis-server redis-server command -v redis-server
need "PostgreSQL server (initdb)" postgresql have_initdb
need dig dnsutils command -v dig
need dnsperf dnsperf command -v dnsperf
need zonemaster-cli zonemaster-cli command -v zonemaster-cli
need unbound unbound command -v unbound
need podman podman command -v podman
need systemd-analyze systemd command -v systemd-analyze
need promtool prometheus command -v promtool
need "CA certificates" ca-certificates test -s /etc/ssl/certs/ca-certificates.crt

if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		say "not root: cannot install ${missing[*]}; run as root: apt-get update && apt-get install -y ${missing[*]}"
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# Keep the packages' services from starting at install: a policy-rc.d that
	# refuses every start, removed again on exit (unless one was there already).
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	say "apt-get update"
	apt-get update -qq
	say "apt-get install -y ${missing[*]}"
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	for svc in redis-server postgresql prometheus unbound; do
		if [[ " ${missing[*]} " == *" $svc "* ]]; then
			service "$svc" stop >/dev/null 2>&1 || true
			say "$svc: installed, service stopped (tests start their own on free ports)"
		fi
	done
fi

if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
	say "user postgres: missing (PostgreSQL refuses to run as root; the postgresql package creates it)"
	exit 1
fi

if ! command -v go >/dev/null 2>&1; then
	say "go: missing (expected at /usr/local/go/bin/go)"
	exit 1
fi
go mod download
say "go mod download: done ($(go version | cut -d' ' -f3))"

# The plugin.cfg recipe's modules: the recipe's own steps up to go get, in
# a scratch copy of CoreDNS's source, first with the network off (nothing
# is fetched when the cache already holds every module), else with it.
plugincfg_modules() {
	local repo version src dir
	repo=$PWD
	version=$(go list -m -f '{{.Version}}' github.com/coredns/coredns)
	go mod download "github.com/coredns/coredns@$version"
	src="$(go env GOMODCACHE)/github.com/coredns/coredns@$version"
	dir=$(mktemp -d)
	cp -R "$src/." "$dir"
	chmod -R u+w "$dir"
	(
		cd "$dir"
		sed -i 's|^file:file$|pgcluster:github.com/pgcluster/pgcluster\nfile:file|' plugin.cfg
		go mod edit -replace github.com/pgcluster/pgcluster="$repo" \
			-require github.com/pgcluster/pgcluster@v0.0.0-00010101000000-000000000000
		if GOPROXY=off GOFLAGS= go generate coredns.go >/dev/null 2>&1 && GOPROXY=off GOFLAGS= go get >/dev/null 2>&1; then
			say "CoreDNS $version's modules (the plugin.cfg recipe): present"
		else
			say "CoreDNS $version's modules (the plugin.cfg recipe): downloading"
			GOFLAGS= go mod download
			GOFLAGS= go generate coredns.go >/dev/null
			GOFLAGS= go get 2>&1 | grep -v '^go: \(downloading\|upgraded\|added\|module .* is deprecated\)' || true
			GOPROXY=off GOFLAGS= go get >/dev/null
			say "CoreDNS $version's modules (the plugin.cfg recipe): done"
		fi
	)
	rm -rf "$dir"
}
plugincfg_modules
