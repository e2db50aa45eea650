#!/usr/bin/env bash
# The device checks of issue 28 as one prepared script for a lent GPU machine (device tool):
#   run(command="bash benchmarks/gpu_issue28.sh", timeout_s=560)
# Each step has its own time limit and writes its output under $OUT (default ./gpu-out), so a
# step that overruns costs only itself. The machine reaches nothing outside it: it runs with
# the torch and transformers installed there and this checkout on PYTHONPATH; steps whose
# packages are missing there (accelerate, transformer_lens, tuned-lens) say so and go on.
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD:$PWD/benchmarks"
export RESSTREAM_DATA=${RESSTREAM_DATA:-$PWD/../shared/data} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

step() {  # step NAME SECONDS COMMAND...: run one check, its output and exit status to $OUT/NAME.txt
  local name=$1 seconds=$2
  shift 2
  echo "== $name (limit ${seconds}s)"
  local start=$SECONDS
  timeout "$seconds" "$@" > "$OUT/$name.txt" 2>&1
  echo "rc=$? after $((SECONDS - start))s" | tee -a "$OUT/$name.txt"
  tail -n 4 "$OUT/$name.txt"
}

python - > "$OUT/device.txt" 2>&1 <<'PY'
import importlib.util, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
for name in ("transformers", "accelerate", "transformer_lens", "tuned_lens"):
    print(name, "present" if importlib.util.find_spec(name) else "absent")
PY
cat "$OUT/device.txt"

# 1. the CUDA test subset: both rank schemes on the device, device maps half on the GPU
step tests 150 python -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/test_ranks.py tests/test_ranks_sync.py tests/test_alignment.py tests/test_device_map.py
# 2. exact shift vs the naive lens (and TransformerLens where present), with profiles
step shift 120 python benchmarks/bench_shift.py --cuda --no-memory --rounds 1 --threads 16 \
  --variants forward,unembed,shift-selecting,shift-sync-free,naive,transformer_lens --profile
# 3. attribute: one position against its floor, corpus mode against a forward
step attribute 90 python benchmarks/bench_attribute.py --device cuda
# 4. tune-lens training tokens/s
step tuned 90 python benchmarks/bench_tuned.py --device cuda --rounds 2
# 5. train --preset gpt2-124m MFU
step train 90 python benchmarks/bench_train.py --cuda --rounds 1
# 6. tokenisation workers on the machine's cores
step shards 60 python benchmarks/bench_shards.py --workers 1 2 4 8 16 --rounds 3
