#!/usr/bin/env bash
# Runs the cuda-tagged tests of package model on a machine without a GPU:
# builds the cuda-tagged test binary (needs the CUDA headers and link stubs,
# as for CI: docs/GPU.md), builds fakecuda.cpp as a stand-in libcuda.so.1
# (the kernels compiled as C++, run on the CPU; g++ with C++20) plus a stub
# for every other driver symbol the binary links, and runs the binary in
# model/ with that library first on the loader's path. Arguments go to the
# test binary; pick small cases, the emulation is slow (minutes for a
# preset-scale model):
#
#   bash model/kernels/emu/cuda-on-cpu.sh -test.run 'TestCUDASeqPassesMatchCPU' -test.v
#
# It checks the engine's arithmetic, indexing and Go glue against the CPU
# oracle, and device memory overruns past a buffer's last 16 bytes (each
# allocation ends at a PROT_NONE page: a segmentation fault); not a GPU's
# memory model, concurrency or speed. A real GPU run is still needed
# (bench/gpu/device-check.sh).
set -euo pipefail
emu=$(cd "$(dirname "$0")" && pwd)
model=$(cd "$emu/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$model" && CGO_LDFLAGS=${CGO_LDFLAGS:--L/usr/lib/$(gcc -print-multiarch)/stubs} \
	go test -c -tags cuda -o "$tmp/model.test" .)
# A stub for each driver symbol the binary links that fakecuda.cpp does not
# define.
grep -oE 'CUresult cu[A-Za-z0-9_]+\(' "$emu/fakecuda.cpp" | sed 's/CUresult //; s/($//' | sort -u >"$tmp/defined"
nm -D --undefined-only "$tmp/model.test" | awk '{print $2}' | grep '^cu' | sort -u | comm -23 - "$tmp/defined" |
	awk '{printf "int %s(void) { return 801; }\n", $1}' >"$tmp/stubs.c"
gcc -c -fPIC -o "$tmp/stubs.o" "$tmp/stubs.c"
g++ -std=c++20 -O1 -ffp-contract=off -pthread -w -fPIC -shared -Wl,-soname,libcuda.so.1 \
	-o "$tmp/libcuda.so.1" "$emu/fakecuda.cpp" "$tmp/stubs.o"
cd "$model"
LD_LIBRARY_PATH="$tmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/model.test" "$@"
