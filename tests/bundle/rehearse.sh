#!/usr/bin/env bash
# The GPU bundle rehearsed on a machine without a GPU (ctest label `bundle`):
#   rehearse.sh BUILD_DIR SOURCE_DIR
# 1. scripts/gpu/bundle makes the bundle and its archive from BUILD_DIR (built already);
# 2. the archive alone is unpacked elsewhere, as on the GPU machine (python3 -m tarfile);
# 3. gpu-bundle/run --cpu runs with LibTorch taken from another directory (hard links, or symbolic
#    links across file systems, of the environment's torch/lib and nvidia/) and the build directory
#    hidden under an empty tmpfs in a private mount namespace: nothing can come from the build;
# 4. the summary must show the CPU steps passing and the CUDA steps "skipped: no GPU";
# 5. `run --cpu --only ranks,graphs,tensor-parallel,pipeline-parallel,moe,expert-parallel` (steps a plain run
#    leaves out) in the same way: ranks over Gloo against one rank, a restart, a stopped rank
#    named, the collectives table; the graphs step's runs (CUDA graphs are off on the CPU: only its
#    plumbing); tensor parallelism (T = 2, and 2 x 2 at ZeRO 3) against one rank, and its
#    collectives; pipeline parallelism (P = 2, and P2 x T2) against one rank; the MoE step's
#    reference case and both of its training runs; expert parallelism (E_p = 2) against one rank;
# 6. `run --cpu --only bench-seeds,bench-liger,bench-long,long-seq,long-seq-8b,bench-auto` (the
#    benchmark steps): the wheels of those that need DeepSpeed and liger-kernel unpack and import from the run's own
#    directory, the users' stack and dstrain train the users' train.yaml for two steps on the CPU
#    (tiny model), dstrain accepts every configuration of those steps, the memory model predicts
#    the long-sequence steps' lengths, Liger patches Llama, scripts/bench/long-seq's CPU benchmark
#    runs on the tiny model, and they report "skipped: no GPU";
# 7. the wheels on a python3 that lacks DeepSpeed's dependencies (the environment's packages
#    without pydantic, hjson, ... and the two themselves, run with -S): they are unpacked from the
#    bundle and DeepSpeed imports with them;
# 8. with one bundled library removed, the environment step must fail naming it.
# Needs root (the mount namespace): exits 77 (skipped) otherwise.
set -euo pipefail
build=$(cd "$1" && pwd) repo=$(cd "$2" && pwd)
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "skipped: hiding the build directory needs root and a mount namespace"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dstrain-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

echo "== 1. bundle"
python3 "$repo/scripts/gpu/bundle" --build "$build" --out "$tmp/made" --no-build

echo "== 2. unpack the archive alone"
mkdir device
(cd device && python3 -m tarfile -e "$tmp/made/gpu-bundle.tar.xz" .)
bundle=$tmp/device/gpu-bundle

echo "== 3. run --cpu with LibTorch from $tmp/site and $build hidden"
site=$(echo "$repo"/.venv/lib/python3*/site-packages)
mkdir -p site/torch
cp -al "$site/torch/lib" site/torch/lib 2>/dev/null || cp -rs "$site/torch/lib" site/torch/lib
cp -al "$site/nvidia" site/nvidia 2>/dev/null || cp -rs "$site/nvidia" site/nvidia
export DSTRAIN_TORCH_LIB=$tmp/site/torch/lib DSTRAIN_PYTHON=$repo/.venv/bin/python
hide_build="mount -t tmpfs -o size=1M none '$build' && test -z \"\$(ls -A '$build')\""
rc=0 rc_ranks=0
unshare -m bash -c "$hide_build && bash '$bundle/run' --cpu '$tmp/out'" || rc=$?
unshare -m bash -c "$hide_build && bash '$bundle/run' --cpu --only ranks,graphs,tensor-parallel,pipeline-parallel,moe,expert-parallel '$tmp/out-ranks'" ||
  rc_ranks=$?
rc_bench=0
unshare -m bash -c "$hide_build && bash '$bundle/run' --cpu --only bench-seeds,bench-liger,bench-long,long-seq,long-seq-8b,bench-auto '$tmp/out-bench'" ||
  rc_bench=$?

echo "== 4. check the summary (run exit $rc)"
summary=$tmp/out/summary.md
fails=0
expect() {  # expect PATTERN WHAT
  if grep -qE -- "$1" "$2"; then echo "ok: $3"; else echo "FAILED: $3 (no /$1/ in $2)"; fails=1; fi
}
expect '^\| 1 environment \| ok \|.*libtorch_cuda\.so from '"$tmp"'/site/torch/lib' "$summary" \
       "environment ok, LibTorch from the other directory"
expect '^\| 2 gpu-tests \| skipped: no GPU \|.*CPU-side tests passed' "$summary" "gpu-tests skipped"
expect '^\| 3 parity \| skipped: no GPU \|.*1 passed' "$summary" "parity skipped (plumbing ran)"
expect '^\| 4 tiny-run \| ok \|.*30/30 losses bit-identical.*export in transformers' "$summary" \
       "tiny run, resume and export"
expect '^\| 5 benchmark \| skipped: no GPU \|' "$summary" "benchmark skipped"
expect '^\| 6 trace \| ok \| [0-9]+ \| 5 steps.*profile: 2 steps' "$summary" "trace and profile summarised"
if grep -q -- "$build/" "$tmp/out/1-environment.log"; then
  echo "FAILED: the environment log names the build directory"; fails=1
fi
files=$(find "$tmp/out" -type f | wc -l)
# summary.md, six step logs and the trace step's profile (the peer's needs a GPU)
[ "$files" = 8 ] || { echo "FAILED: $files files in the output directory, expected 8"; fails=1; }
python3 -c 'import gzip, json, sys; json.load(gzip.open(sys.argv[1]))["traceEvents"]' \
  "$tmp/out/6-profile-rank-0.json.gz" || { echo "FAILED: no readable profile in the output"; fails=1; }
[ "$rc" = 0 ] || { echo "FAILED: run exited $rc"; fails=1; }
if grep -q '^| 7 ranks ' "$summary"; then
  echo "FAILED: a run without --only ran the ranks step"; fails=1
fi

echo "== 5. the ranks step (run exit $rc_ranks)"
ranks=$tmp/out-ranks/summary.md
expect '^\| 7 ranks \| ok \| [0-9]+ \| 3/3 cases equal 1 rank \(2 with losses bit for bit\).*SIGKILL restart ok; SIGSTOP rank 0 ok' \
       "$ranks" "ranks: zero0 and zero3 bit for bit, sp2 within 1e-5, restart, stopped rank 0 named"
expect '^\| zero3 \| 2 \| fp32 \| bit for bit \| 0\.00e\+00 \| (losses )?bit for bit' "$tmp/out-ranks/7-ranks.md" \
       "the equivalence table"
expect '^\| zero3 \| 2 \| all_gather \| [0-9.]+ \| [0-9.]+ [kM]?B \|' "$tmp/out-ranks/7-ranks.md" \
       "the collectives table (stage 3 all-gathers)"
expect '^\| zero0 sp2 \| 2 \| all_to_all \| [0-9.]+ \|' "$tmp/out-ranks/7-ranks.md" \
       "the collectives table (sequence parallelism's all-to-all)"
expect '^\| 13 graphs \| skipped: no GPU \|.*zero2: off on auto ran / lora-zero3-micro1x4: off on ran / lora-zero3-micro1x4 on: resume from 4: 4/4 losses bit-identical / checkpointing: off on ran / 2-ranks-zero3: off on ran' \
       "$ranks" "graphs: every case ran with cuda_graphs off and on (ZeRO-2 auto too), the resume equal (CPU: no graphs)"
expect 'training.cuda_graphs: on has no effect: the run is on the CPU' "$tmp/out-ranks/13-graphs.log" \
       "graphs: on says it has no effect on the CPU"
expect '^\| 15 tensor-parallel \| ok \| [0-9]+ \| 2/2 cases equal 1 rank' "$ranks" \
       "tensor-parallel: T = 2 and 2 x 2 at ZeRO 3 equal one rank"
expect '^\| zero3 dp2 x tp2 \| 4 \| fp32 \| rel 1e-05 \| [0-9.e+-]+ \| (ok|losses bit for bit)' \
       "$tmp/out-ranks/15-tensor-parallel.md" "the tensor-parallel equivalence table"
expect '^\| zero0 tp2 \| 2 \| reduce_scatter \| [0-9.]+ \| [0-9.]+ [kM]?B \|' \
       "$tmp/out-ranks/15-tensor-parallel.md" "the collectives table (the region's reduce-scatters)"
expect '^\| 16 pipeline-parallel \| ok \| [0-9]+ \| 2/2 cases equal 1 rank' "$ranks" \
       "pipeline-parallel: P = 2 and P2 x T2 equal one rank"
expect '^\| p2 x tp2 \| 4 \| fp32 \| rel 1e-05 \| [0-9.e+-]+ \| (ok|losses bit for bit|bit for bit)' \
       "$tmp/out-ranks/16-pipeline-parallel.md" "the pipeline-parallel equivalence table"
expect '^\| 17 moe \| skipped: no GPU \|.*reference 1 passed, 0 failed/grouped: loss [0-9.]+ -> [0-9.]+; per expert: loss [0-9.]+ -> [0-9.]+; losses within' \
       "$ranks" "moe: the reference plumbing and both training runs ran on the CPU"
expect '^\| 18 expert-parallel \| ok \| [0-9]+ \| 1/1 cases equal 1 rank' "$ranks" \
       "expert-parallel: E_p = 2 equals one rank"
expect '^\| e2 \| 2 \| fp32 \| rel 1e-05 \| [0-9.e+-]+ \| (ok|losses bit for bit|bit for bit)' \
       "$tmp/out-ranks/18-expert-parallel.md" "the expert-parallel equivalence table"
files=$(find "$tmp/out-ranks" -type f | wc -l)
# summary.md, six step logs, the ranks and tensor-parallel tables, the pipeline- and
# expert-parallel ones
[ "$files" = 11 ] || { echo "FAILED: $files files from the ranks, graphs, tensor-parallel, pipeline-parallel, moe and expert-parallel steps, expected 11"; fails=1; }
[ "$rc_ranks" = 0 ] || { echo "FAILED: run --only ranks,graphs,tensor-parallel,pipeline-parallel,moe,expert-parallel exited $rc_ranks"; fails=1; }

echo "== 6. the benchmark steps on request (run exit $rc_bench)"
bench=$tmp/out-bench/summary.md
expect "^\| 8 bench-seeds \| skipped: no GPU \|.*deepspeed from the bundle's wheels.*dstrain 2 steps, the users' stack 2 steps \(tiny Qwen2, 1 x 64 tokens x accumulation 8, ZeRO-3\): both ran" \
       "$bench" "bench-seeds: both sides of the users' train.yaml ran on the CPU"
expect "^\| 9 bench-liger \| skipped: no GPU \|.*liger-kernel from the bundle's wheels patches Qwen2 \(LigerRMSNorm LigerSwiGLUMLP.*dstrain accepts" \
       "$bench" "bench-liger: Liger's patch from the wheel, dstrain's configurations accepted"
expect "^\| 10 bench-long \| skipped: no GPU \|.*dstrain accepts" "$bench" \
       "bench-long: dstrain's checkpointing configurations accepted"
expect "^\| 11 long-seq \| skipped: no GPU \|.*dstrain accepts its configurations; memory model predicts tiled [0-9]+, offload [0-9]+; Liger patches Llama \(LigerRMSNorm LigerSwiGLUMLP\); on the CPU \(tiny model\): 3 lengths ran" \
       "$bench" "long-seq: configurations, memory model, Liger on Llama, the CPU benchmark"
expect "^\| 12 long-seq-8b \| skipped: no GPU \|.*memory model predicts offload [0-9]+; Liger patches Llama" \
       "$bench" "long-seq-8b: configurations and memory model of the 8B LoRA shape"
expect "^\| 14 bench-auto \| skipped: no GPU \|.*dstrain accepts auto and the 5 fixed micro-batches" \
       "$bench" "bench-auto: dstrain's configurations accepted"
expect "^== wheels/: unpacked into [^ ]*/pysite: deepspeed 0\.19\.8, liger_kernel 0\.8\.5" \
       "$tmp/out-bench/8-bench-seeds.log" "deepspeed and liger-kernel unpacked from wheels/"
files=$(find "$tmp/out-bench" -type f | wc -l)
[ "$files" = 7 ] || { echo "FAILED: $files files from the benchmark steps, expected 7"; fails=1; }
[ "$rc_bench" = 0 ] || { echo "FAILED: run --only bench-seeds,bench-liger,bench-long,long-seq,long-seq-8b,bench-auto exited $rc_bench"; fails=1; }

echo "== 7. the wheels on a python3 without DeepSpeed's dependencies"
# The environment's packages less those the bundle carries (the GPU machine has none of pydantic,
# hjson, deepspeed, liger-kernel), seen by its python3 with -S (no site-packages of its own).
mkdir bare
for entry in "$site"/*; do
  case ${entry##*/} in
    deepspeed*|liger_kernel*|hjson*|pydantic*|annotated_types*|typing_inspection*|typing_extensions*|*.pth) ;;
    *) ln -s "$entry" "bare/${entry##*/}" ;;
  esac
done
PYTHONPATH=$tmp/bare $DSTRAIN_PYTHON -S "$bundle/scripts/gpu/checks.py" wheels "$bundle/wheels" \
  "$tmp/bare-site" >"$tmp/bare.out" 2>&1 || true
cat "$tmp/bare.out"
expect "^unpacked into $tmp/bare-site: deepspeed 0\.19\.8, liger_kernel 0\.8\.5, hjson 3\.1\.0, pydantic 2\.14\.3, annotated_types [0-9.]+, pydantic_core [0-9.]+, typing_extensions [0-9.]+, typing_inspection [0-9.]+;" \
       "$tmp/bare.out" "every missing dependency unpacked (pydantic_core for this CPython)"
if PYTHONPATH=$tmp/bare-site:$tmp/bare $DSTRAIN_PYTHON -S -c '
import deepspeed, pydantic_core, sys
from deepspeed.runtime.config import DeepSpeedConfig
assert deepspeed.__file__.startswith(sys.argv[1]) and pydantic_core.__file__.startswith(sys.argv[1])
' "$tmp/bare-site" >"$tmp/bare-import.out" 2>&1; then
  echo "ok: DeepSpeed imports with the unpacked dependencies"
else
  cat "$tmp/bare-import.out"; echo "FAILED: DeepSpeed does not import from $tmp/bare-site"; fails=1
fi

echo "== 8. a bundled library removed"
victim=$(cd "$bundle/lib" && ls libyaml-cpp.so.* | head -1)
rm "$bundle/lib/$victim"
rc=0
bash "$bundle/run" --cpu --only environment "$tmp/out-missing" || rc=$?
expect "^\| 1 environment \| FAIL \(1\) \|.*dstrain-worker: $victim from outside the bundle" \
       "$tmp/out-missing/summary.md" "missing $victim reported"
[ "$rc" != 0 ] || { echo "FAILED: run exited 0 with $victim missing"; fails=1; }
if [ "$fails" != 0 ]; then
  echo "--- summary.md"; cat "$summary"
  echo "--- ranks summary.md"; cat "$ranks"
  echo "--- benchmark steps' summary.md"; cat "$bench"
  for f in "$tmp"/out/*.log "$tmp"/out-ranks/*.log "$tmp"/out-bench/*.log; do
    echo "--- $f (last 40 lines)"; tail -40 "$f"
  done
  exit 1
fi
echo "bundle rehearsal passed"
