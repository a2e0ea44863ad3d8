#!/usr/bin/env bash
# memplan's GPU checks in one call, for a session that is lent a GPU (H100/H200): nothing in CI
# depends on a GPU, so this is the only place where CUDA numbers are measured. It runs, each
# under its own time limit so that one hang cannot eat the lease:
#   1. the GPU, driver and package versions (env.txt);
#   2. `memplan validate --device cuda --quick` (the tiny matrix: measured vs traced vs
#      estimated allocated peak on the CUDA allocator) -> validate_cuda_quick.json;
#   3. `memplan validate --device cuda --cases validation/gpu_cases.toml`: real sizes, with the
#      allocator's reserved peak and the GPU memory in use beside the estimate's
#      -> validate_cuda_real.json;
#   4. `memplan calibrate` on the Llama-3.1-8B shapes -> calibration_<gpu>.toml.
# Usage there (the repository root is the working directory; the image's python3 holds torch,
# transformers, peft, typer and rich):
#     bash scripts/gpu_session.sh            # writes under $OUT (the device tool's folder)
# Here, with `OUT=/tmp/x PYTHON=.venv/bin/python DEVICE=cpu` for a dry run of the plumbing.
# Commit what comes back under validation/gpu/<date>-<gpu>/ with this command line.
set -u
OUT=${OUT:?set OUT to the folder for the results}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
CASES=${CASES:-validation/gpu_cases.toml}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

step() {  # step NAME SECONDS CMD...: run CMD with a limit, its stderr to NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" 2> "$OUT/$name.log"
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}

{
    date -u
    nvidia-smi 2>&1 || echo "no nvidia-smi"
    "$PY" -c 'import sys, torch, transformers, peft
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "peft", peft.__version__)
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)'
} > "$OUT/env.txt" 2>&1
GPU=$("$PY" -c 'import torch; n = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
print("H200" if "H200" in n else "H100-80GB" if "H100" in n else "A100-80GB")' 2>/dev/null)
step validate_cuda_quick 150 "$PY" -m memplan validate --device "$DEVICE" --quick --format json \
    > "$OUT/validate_cuda_quick.json"
step validate_cuda_real 280 "$PY" -m memplan validate --device "$DEVICE" \
    --cases "$CASES" --format json > "$OUT/validate_cuda_real.json"
step calibrate 100 "$PY" -m memplan calibrate meta-llama/Llama-3.1-8B --gpu "${GPU:-H200}" \
    --device "$DEVICE" --out "$OUT/calibration_${GPU:-H200}.toml"
