#!/usr/bin/env bash
# The main job in one command on a Debian machine with Go: installs the
# Debian packages it needs if they are missing (Fashion-MNIST; see
# scripts/lib/setup.sh for when it may install and what it prints when it
# may not), then runs `go run ./cmd/coordinator local` with this script's
# arguments, for example
#
#   ./scripts/main-job.sh --max-steps 1000 --data-dir /tmp/dpcluster-run
#
# With --data DIR or $DPCLUSTER_DATA the data comes from there and the data
# package is not installed.
#
# The back end: with libopenblas-dev (and gcc for cgo) installed, or
# installable (as root or through sudo -n), it builds with -tags openblas,
# the fastest CPU back end; otherwise the pure-Go one (gonum), the same
# code as the static binaries, with a line saying how to get the faster
# one. DPCLUSTER_BACKEND=openblas requires OpenBLAS (installing it or
# failing); DPCLUSTER_BACKEND=gonum builds pure Go whatever is installed.
# The first line of output names the back end used.
set -euo pipefail
# Paths the caller gives (--data-dir, --data-path, --config, ...) are
# relative to where it runs: the coordinator is built in the repository and
# run from the caller's directory.
caller=$PWD
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh

if ! command -v go >/dev/null; then
	echo "main-job: no go command on PATH: install Go (go.mod names the version) from https://go.dev/dl/" >&2
	exit 1
fi
own_data=${DPCLUSTER_DATA:+yes}
for arg in "$@"; do
	case $arg in --data | --data=*) own_data=yes ;; esac
done
if [ -z "$own_data" ]; then
	ensure_packages dataset-fashion-mnist
fi

# openblas_ready reports whether the -tags openblas build can be made here:
# cgo on, and the OpenBLAS packages installed.
openblas_ready() {
	[ "$(go env CGO_ENABLED)" = 1 ] && [ -z "$(missing_packages "${OPENBLAS_PACKAGES[@]}")" ]
}

backend=${DPCLUSTER_BACKEND:-auto}
case $backend in
auto)
	backend=gonum
	if openblas_ready || { can_be_root && ensure_packages "${OPENBLAS_PACKAGES[@]}" && openblas_ready; }; then
		backend=openblas
	fi
	;;
openblas)
	ensure_packages "${OPENBLAS_PACKAGES[@]}"
	if ! openblas_ready; then
		echo "main-job: DPCLUSTER_BACKEND=openblas, but cgo is off (go env CGO_ENABLED): set CGO_ENABLED=1" >&2
		exit 1
	fi
	;;
gonum) ;;
*)
	echo "main-job: DPCLUSTER_BACKEND=$backend: want auto, openblas or gonum" >&2
	exit 1
	;;
esac

tags=()
if [ "$backend" = openblas ]; then
	echo "main-job: back end openblas (go build -tags openblas; libopenblas-dev)" >&2
	tags=(-tags openblas)
elif [ "${DPCLUSTER_BACKEND:-auto}" = auto ]; then
	echo "main-job: back end gonum (pure Go): OpenBLAS is not installed and could not be installed here; for the OpenBLAS back end, about 4x faster: sudo apt-get install -y --no-install-recommends ${OPENBLAS_PACKAGES[*]}, then run this again" >&2
else
	echo "main-job: back end gonum (pure Go; DPCLUSTER_BACKEND=gonum)" >&2
fi
bin_dir=${XDG_CACHE_HOME:-$HOME/.cache}/dpcluster/bin
mkdir -p "$bin_dir"
go build "${tags[@]}" -o "$bin_dir/coordinator-$backend" ./cmd/coordinator
cd "$caller"
exec "$bin_dir/coordinator-$backend" local "$@"
