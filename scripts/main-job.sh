#!/usr/bin/env bash
# The main job in one command on a Debian machine with Go: installs the
# Debian packages it needs if they are missing (Fashion-MNIST; see
# scripts/lib/setup.sh for when it may install and what it prints when it
# may not), then runs `go run ./cmd/coordinator local` with this script's
# arguments, for example
#
#   ./scripts/main-job.sh --max-steps 1000 --data-dir /tmp/dpcluster-run
#
# With --data DIR or $DPCLUSTER_DATA the data comes from there and nothing
# is installed.
set -euo pipefail
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
	ensure_packages "${MAIN_JOB_PACKAGES[@]}"
fi
exec go run ./cmd/coordinator local "$@"
