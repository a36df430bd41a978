#!/usr/bin/env bash
# The tests in one command on a Debian machine with Go: installs the Debian
# packages the tests need if they are missing (scripts/lib/setup.sh: when it
# may install, and the exact commands it prints when it may not), then runs
# `go test -race ./...` for the product and, as its own step, for the
# experiments module (experiments/, a nested module that ./... at the root
# leaves out). Arguments are passed to both go test commands, before the
# package pattern:
#
#   ./scripts/test.sh
#   ./scripts/test.sh -count=1 -run TestConformance
#
# With DPCLUSTER_CI set (as .ci/run sets it), tests whose optional
# dependency is missing fail instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh

section "set-up: Debian packages for the tests"
ensure_packages "${TEST_PACKAGES[@]}"

section "tests: go test -race ./..."
go test -race -timeout 20m "$@" ./...

section "tests of the experiments module: cd experiments && go test -race ./..."
(cd experiments && go test -race -timeout 10m "$@" ./...)
