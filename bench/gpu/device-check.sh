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
#   stepbench.gz     optional: the same flags, go build ./bench/step (the
#                    distributed step on the GPU against its floor, issue 25;
#                    11 MB gzipped: with the data (31 MB) and the two other
#                    binaries it nears the 64 MiB a call carries, so leave
#                    opacus/ out of that call if it does not fit)
#   fashion-mnist/   the Debian package's four .gz files
#   opacus/          Opacus's package folder from its source tree (not
#                    committed; OPACUS_COMMIT names the commit)
#
# Stages, each with its own time limit and log under $OUT (stages.txt
# lists each one's exit status and seconds): the CUDA tests (CPU oracle,
# clipping proofs, adversarial inputs, determinism, every layer), the Go
# benchmarks (ours: DP step with θ up and the sum down, non-private, CPU),
# PyTorch, torch.func and Opacus on the same models (torch_step.py; the
# transformer preset in bench/cpu_transformer.py --device cuda), the
# cnn main job on the GPU and on the CPU (accuracy for the same steps),
# the distributed step on the GPU (bench/step: 20M and 141M parameters, one
# and three nodes, and the null engine; when stepbench.gz is carried), and
# compute-sanitizer memcheck and racecheck on the kernels. When the tests
# fail, the stages that time or train on our engine are skipped. SKIP_TORCH,
# SKIP_CNN, SKIP_STEP and SKIP_RACE leave a stage out.
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
# The sequence layers' tests (TestCUDASeq*, and the transformer cases of
# the others; not yet run on a GPU when added) add the CPU oracle at the
# transformer preset's scale: hence 210 s, not 150.
stage tests "${TESTS_LIMIT:-210}" "$bin/model.test" -test.run CUDA -test.v -test.timeout 200s || ok=0
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
if [ -z "${SKIP_TORCH:-}" ]; then
	# The transformer preset in PyTorch, torch.func and (when carried)
	# Opacus ghost clipping and hooks, fp32 on the GPU (issue 29's
	# side-by-side; our engine's side is the bench stage's transformer rows).
	op=()
	[ -d "$carry/opacus" ] && op=(--opacus "$root/$carry")
	stage torch-transformer "${TT_LIMIT:-90}" env PYTHONPATH="$root/$carry" python3 "$root/bench/cpu_transformer.py" \
		--device cuda --steps 20 ${op[@]+"${op[@]}"} --json "$out/torch-transformer.json"
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
if [ "$ok" = 1 ] && [ -f "$carry/stepbench.gz" ] && [ -z "${SKIP_STEP:-}" ]; then
	# The step against node compute and its floor (docs/BENCHMARKS.md,
	# "GPU rows after the charge-ahead path"): each configuration's JSON
	# has the phases, the floor, peak RSS and the data dir's size.
	gunzip -c "$carry/stepbench.gz" >"$bin/stepbench" && chmod +x "$bin/stepbench"
	data="$root/$carry/fashion-mnist"
	stage step-20m "${STEP_LIMIT:-120}" "$bin/stepbench" -data "$data" -device cuda:0 -models 784-4096-4096-10 \
		-nodes 1,3 -steps 10 -warmup 3 -json "$out/step-20m.json"
	stage step-null "${STEP_LIMIT:-120}" "$bin/stepbench" -data "$data" -engine null -models 784-4096-4096-10 \
		-nodes 1 -steps 10 -warmup 3 -json "$out/step-null.json"
	stage step-141m "${STEP_LIMIT:-120}" "$bin/stepbench" -data "$data" -device cuda:0 -models 784-8192-8192-8192-10 \
		-nodes 1 -steps 4 -warmup 2 -json "$out/step-141m.json"
fi
stage memcheck "${SAN_LIMIT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/model.test" \
	-test.run 'TestCUDAClippedSumIndexedEveryLayer|TestCUDAClipAdversarialLayers/cancel|TestCUDASeqClipAdversarial|TestCUDAHostBuffers'
stage memcheck-meangrad "${SAN_LIMIT:-90}" compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/model.test" \
	-test.run 'TestCUDAMeanGradAndEvaluate'
if [ -z "${SKIP_RACE:-}" ]; then
	stage racecheck "${SAN_LIMIT:-90}" compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/model.test" \
		-test.run 'TestCUDAClippedSumIndexedEveryLayer/(conv|cnn|layernorm|embeddingbag|textbag|transformer|seq-embed)'
fi
tail -n 3 "$out"/memcheck*.log "$out"/racecheck*.log >>"$out/stages.txt" 2>&1
# One archive: the device tool brings back only a few files per call.
(cd "$out" && tar czf results.tgz --exclude=results.tgz --exclude=stages.txt -- * && find . -type f ! -name results.tgz ! -name stages.txt -delete)
cat "$out/stages.txt"
