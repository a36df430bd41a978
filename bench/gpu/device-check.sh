#!/usr/bin/env bash
# The prepared GPU check: everything the GPU issues need measured or
# verified on an NVIDIA machine, in one call (GPU time is scarce; see
# docs/GPU.md). Run from the repository root on a machine with the NVIDIA
# driver, compute-sanitizer and PyTorch, and no Go:
#
#   OUT=/tmp/out bash bench/gpu/device-check.sh [CARRY]
#
# CARRY (default gpu-carry, git-ignored) holds what this machine built:
#
#   model.test.gz    CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu/stubs \
#                    go test -c -tags cuda -ldflags='-s -w' ./model
#   coordinator.gz   the same flags, go build ./cmd/coordinator
#   fashion-mnist/   the Debian package's four .gz files
#   opacus/          Opacus's package folder from its source tree (not
#                    committed; OPACUS_COMMIT names the commit)
#
# Stages, each with its own time limit and log under $OUT (stages.txt
# lists each one's exit status and seconds): the CUDA tests (CPU oracle,
# clipping proofs, adversarial inputs, determinism, every layer), the Go
# benchmarks (ours: DP step with θ up and the sum down, non-private, CPU),
# PyTorch, torch.func and Opacus on the same models (torch_step.py), the
# cnn main job on the GPU and on the CPU (accuracy for the same steps),
# and compute-sanitizer memcheck and racecheck on the kernels. When the
# tests fail, the stages that time or train on our engine are skipped.
set -u
carry=${1:-gpu-carry}
out=${OUT:?set OUT to the folder the results go to}
root=$(pwd)
bin=$(mktemp -d)
gunzip -c "$carry/model.test.gz" >"$bin/model.test"
gunzip -c "$carry/coordinator.gz" >"$bin/coordinator"
chmod +x "$bin/model.test" "$bin/coordinator"
: >"$out/stages.txt"

# stage NAME LIMIT CMD...: runs CMD in model/ (the test binary's package
# folder, where TestCUDAPTXMatchesSource reads kernels/cuda_kernels.cu and
# .ptx) with a time limit, logging to $out/NAME.log.
stage() {
	local name=$1 limit=$2 t0 rc
	shift 2
	t0=$(date +%s%N)
	(cd "$root/model" && timeout "$limit" "$@") >"$out/$name.log" 2>&1
	rc=$?
	echo "$name rc=$rc $((($(date +%s%N) - t0) / 1000000)) ms" | tee -a "$out/stages.txt"
	return $rc
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >>"$out/stages.txt" 2>&1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$out/stages.txt" 2>&1
nproc >>"$out/stages.txt"

ok=1
stage tests "${TESTS_LIMIT:-150}" "$bin/model.test" -test.run CUDA -test.v -test.timeout 140s || ok=0
grep -E '^(--- FAIL|FAIL|panic|ok|PASS)' "$out/tests.log" | head -40 >>"$out/stages.txt"
if [ "$ok" = 1 ]; then
	stage bench "${BENCH_LIMIT:-120}" "$bin/model.test" -test.run '^$' -test.bench CUDA -test.benchtime 15x -test.benchmem
fi
# cuBLAS on the products BenchmarkCUDASgemm times (in the bench stage).
stage gemm-torch "${GEMM_LIMIT:-60}" python3 "$root/bench/gpu/torch_gemm.py" --json "$out/gemm-torch.json"
if [ -d "$carry/opacus" ] && [ -z "${SKIP_TORCH:-}" ]; then
	stage torch "${TORCH_LIMIT:-170}" env PYTHONPATH="$root/$carry" python3 "$root/bench/gpu/torch_step.py" \
		--opacus "$root/$carry" --quick --json "$out/torch.json"
fi
if [ "$ok" = 1 ] && [ -z "${SKIP_CNN:-}" ]; then
	# The cnn main job, 1000 steps, on the GPU and on the CPU at once
	# (their accuracy is the point, not their speed).
	for dev in cuda:0 cpu; do
		stage "cnn-${dev%%:*}" "${CNN_LIMIT:-150}" "$bin/coordinator" local --model cnn --device "$dev" \
			--data "$root/$carry/fashion-mnist" --data-dir "$bin/run-${dev%%:*}" --progress off --json &
	done
	wait
fi
stage memcheck "${SAN_LIMIT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/model.test" \
	-test.run 'TestCUDAClippedSumIndexedEveryLayer|TestCUDAClipAdversarialLayers/cancel'
stage memcheck-meangrad "${SAN_LIMIT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/model.test" \
	-test.run 'TestCUDAMeanGradAndEvaluate'
if [ -z "${SKIP_RACE:-}" ]; then
	stage racecheck "${SAN_LIMIT:-90}" compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/model.test" \
		-test.run 'TestCUDAClippedSumIndexedEveryLayer/(conv|cnn|layernorm|embeddingbag|textbag)'
fi
tail -n 3 "$out"/memcheck*.log "$out"/racecheck*.log >>"$out/stages.txt" 2>&1
# One archive: the device tool brings back only a few files per call.
(cd "$out" && tar czf results.tgz --exclude=results.tgz --exclude=stages.txt -- * && find . -type f ! -name results.tgz ! -name stages.txt -delete)
cat "$out/stages.txt"
