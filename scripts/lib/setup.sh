#!/usr/bin/env bash
# Set-up shared by scripts/main-job.sh, scripts/test.sh and .ci/run: the
# Debian packages each needs, and the one function that installs the
# missing ones. Source it (". scripts/lib/setup.sh"), or run it as root to
# install packages by hand:
#
#   sudo scripts/lib/setup.sh install nvidia-cuda-dev
#
# ensure_packages installs only what dpkg says is missing. It installs when
# it may: as root, or through sudo without a password (sudo -n). Otherwise
# it prints the exact commands to run and returns 1, changing nothing.

# OPENBLAS_PACKAGES: the -tags openblas build (cgo: gcc and libc6-dev;
# libopenblas-dev), the fastest CPU back end, about 4× the pure-Go one on
# the mlp (docs/BENCHMARKS.md, "Per-example clipped gradients").
OPENBLAS_PACKAGES=(gcc libc6-dev libopenblas-dev)

# MAIN_JOB_PACKAGES: dataset-fashion-mnist puts Fashion-MNIST where the
# binaries look for it (/usr/share/datasets/fashion-mnist); a run given
# --data DIR or $DPCLUSTER_DATA does not need it. OPENBLAS_PACKAGES make
# main-job.sh build with -tags openblas; without them (and where it may not
# install them) it builds the pure-Go back end and says so.
MAIN_JOB_PACKAGES=(dataset-fashion-mnist "${OPENBLAS_PACKAGES[@]}")

# TEST_PACKAGES: gcc and libc6-dev for cgo, which -race needs;
# dataset-fashion-mnist: the real-data tests; libopenblas-dev: the
# -tags openblas build (cgo); nvidia-cuda-dev (Debian non-free, CUDA 11.8):
# the CUDA headers (cuda.h, cublas_v2.h) and the link stubs in
# /usr/lib/<multiarch>/stubs (libcuda.so) for compiling the -tags cuda build
# (47 packages beyond a base system, 1.4 GB to download, 4.9 GB unpacked);
# python3-numpy: the Python package in python/, which
# TestPythonPackageMatchesEngine, TestPythonPackageUnitTests and
# TestPythonPackageMatchesEvaluation run (with python3-torch, its torch
# module too); chromium: the headless browser
# in which TestDashboardInChromium renders the coordinator's dashboard;
# fortunes (Debian main, 2.6 MB of text in /usr/share/games/fortunes): the
# fortunes-seq next-token dataset, which TestFortunesPackage reads; g++
# (C++20): TestCUDAKernelsEmulated, which runs the CUDA kernels of the
# sequence layers on the CPU (model/kernels/emu); python3 and python3-regex:
# the Python references of the tokenizers (tokenizer/testdata/*.py), which
# TestWordPieceConformance and TestBPEConformance run (GPT-2's pattern
# needs the regex module); python3-torch (PyTorch 1.13, Debian main, 177 MB
# to download with its dependencies): the reference BERT and GPT-2 in plain
# PyTorch (pretrained/testdata/torchref.py), which TestPyTorchConformance
# and TestFineTunedLoadsInPyTorch run.
TEST_PACKAGES=(gcc g++ libc6-dev dataset-fashion-mnist libopenblas-dev nvidia-cuda-dev python3-numpy chromium fortunes python3 python3-regex python3-torch)

# NON_FREE_PACKAGES are in Debian's contrib or non-free components, which
# ensure_packages enables before installing one of them.
NON_FREE_PACKAGES=(nvidia-cuda-dev)

# DPCLUSTER_T0 is when the outermost script started (seconds since the
# epoch); section headers print the seconds elapsed since then.
: "${DPCLUSTER_T0:=$(date +%s)}"
export DPCLUSTER_T0

# section TITLE prints a section header with the seconds elapsed so far.
section() {
	echo "== $1 (t=$(($(date +%s) - DPCLUSTER_T0))s)"
}

# can_be_root reports whether this shell may run commands as root: it is
# root, or sudo works without asking for a password.
can_be_root() {
	[ "$(id -u)" = 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }
}

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

# enable_contrib_non_free adds the contrib and non-free components to
# Debian's own apt sources (the deb822 debian.sources and, if present, the
# Debian lines of a classic sources.list), keeping the components already
# there. Idempotent: a component already listed is not added again
# (non-free-firmware is not non-free).
enable_contrib_non_free() {
	local f add='/[[:space:]]contrib([[:space:]]|$)/!s/[[:space:]]*$/ contrib/;/[[:space:]]non-free([[:space:]]|$)/!s/[[:space:]]*$/ non-free/'
	f=/etc/apt/sources.list.d/debian.sources
	if [ -f "$f" ]; then
		as_root sed -i -E "/^Components:/{$add;}" "$f"
	fi
	f=/etc/apt/sources.list
	if [ -f "$f" ]; then
		as_root sed -i -E "/^deb(-src)?[[:space:]].*[./]debian\.org\//{$add;}" "$f"
	fi
}

# missing_packages PKG... prints the packages dpkg does not list as
# installed, one a line.
missing_packages() {
	local p
	for p in "$@"; do
		dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || echo "$p"
	done
}

# ensure_packages PKG... installs the packages that are missing (see the
# file's comment). It returns 0 when all are installed at the end; 1, with
# the commands to run on stderr, when some are missing and it may not
# install them or this is not a Debian-based system.
ensure_packages() {
	local self missing nonfree=() p q
	self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup.sh"
	if ! command -v dpkg-query >/dev/null; then
		echo "setup: no dpkg-query: this is not a Debian-based system. Install the equivalents of these Debian packages: $*" >&2
		return 1
	fi
	mapfile -t missing < <(missing_packages "$@")
	[ "${#missing[@]}" = 0 ] && return 0
	for p in "${missing[@]}"; do
		for q in "${NON_FREE_PACKAGES[@]}"; do
			[ "$p" = "$q" ] && nonfree+=("$p")
		done
	done
	if ! can_be_root; then
		echo "setup: missing Debian packages: ${missing[*]}" >&2
		echo "setup: this user is not root and cannot use sudo without a password, so install them first; run:" >&2
		if [ "${#nonfree[@]}" != 0 ]; then
			echo "  sudo $self install ${missing[*]}" >&2
			echo "setup: (it adds Debian's contrib and non-free components to the apt sources, which ${nonfree[*]} needs, then runs apt-get install)" >&2
		else
			echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
		fi
		echo "setup: then run this command again." >&2
		return 1
	fi
	echo "setup: installing missing Debian packages: ${missing[*]}" >&2
	if [ "${#nonfree[@]}" != 0 ]; then
		enable_contrib_non_free
	fi
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	mapfile -t missing < <(missing_packages "$@")
	if [ "${#missing[@]}" != 0 ]; then
		echo "setup: apt-get install finished but dpkg does not list as installed: ${missing[*]}" >&2
		return 1
	fi
}

# Run directly: "setup.sh install PKG..." installs the packages (as root).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	if [ "${1:-}" != install ] || [ $# -lt 2 ]; then
		echo "usage: $0 install PKG..." >&2
		exit 2
	fi
	shift
	ensure_packages "$@"
fi
