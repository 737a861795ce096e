#!/usr/bin/env bash
# gpu_check.sh: the real-GPU backend end to end on one NVIDIA GPU (issue 13): NVML contract tests, then a quick
# calibration of a tiny random-weight model through vLLM. Target: under 8 minutes on one H200.
#
# UNTESTED: ALL OF THIS SCRIPT. It was written on a machine without a GPU and has never run: not the install, not
# nvidia-smi, not the contract tests on real NVML, not calibrate through vLLM, not the clock-reset trap.
#
# Steps (each logs to $OUT/<step>.log; the script stops at the first failing step and prints its log's tail):
#   install      pip install -e ".[gpu]" (nvidia-ml-py and vLLM); skipped when both import already, or SKIP_INSTALL=1.
#                vLLM's wheel (~340 MB, plus its CUDA PyTorch) needs a package index; a machine without network
#                must have them installed beforehand.
#   nvidia-smi   driver, GPU, current clocks, supported clocks.
#   contracts    python -m pytest -q tests/backends/test_backend_contracts.py -m gpu (the GpuControl contract on real NVML).
#   calibrate    commitenv calibrate --gpu $GPU --model $MODEL --template $TEMPLATE --quick
#                --out $OUT/profile.yaml --report $OUT/calibration.json
#
# The model: MODEL defaults to scripts/gpu_check_model/, which holds only a Qwen2-style config.json (4 layers,
# hidden size 512, 8 query / 2 KV heads, vocab 32768, 32768 positions). VllmEngine sees a local folder without
# weight files and loads random weights (vLLM's load_format="dummy"); it never loads a tokenizer
# (skip_tokenizer_init=True: prompts are random token ids, outputs are not detokenized). So nothing downloads. The
# profile it writes describes that tiny model with the template's model facts: a check of the pipeline, not a
# profile to ship. Point MODEL at a real model (name or folder with weights) to calibrate that instead.
#
# Clocks: this script CHANGES THE GPU'S CLOCKS (the contract tests and calibrate lock them; that needs root or
# `nvidia-smi -acp UNRESTRICTED`) and resets them on every exit (`nvidia-smi -rgc` in an EXIT trap; INT and TERM
# exit through it; a step cut by its timeout gets SIGTERM, on which LockedClocks resets too). Run it only on a GPU
# you administer, never on a shared machine whose settings must stay as found: set ALLOW_CLOCK_CHANGES=1 to confirm.
#
# Environment: OUT (default ./gpu-check-out), GPU (NVML index, default 0), MODEL, TEMPLATE (a shipped profile whose
# model facts and scheduler limits configure the engine, default h200-qwen3.8-27b-fp8), CLOCKS (MHz list for
# --clocks, default the template's levels), BUDGET_S (whole-run limit, default 480), PYTHON (default python).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="${OUT:-./gpu-check-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
GPU="${GPU:-0}"
MODEL="${MODEL:-$ROOT/scripts/gpu_check_model}"
TEMPLATE="${TEMPLATE:-h200-qwen3.8-27b-fp8}"
CLOCKS="${CLOCKS:-}"
PYTHON="${PYTHON:-python}"
T_END=$((SECONDS + ${BUDGET_S:-480}))

if [[ "${ALLOW_CLOCK_CHANGES:-0}" != 1 ]]; then
    echo "gpu_check.sh locks and resets GPU $GPU's clocks; run it only on a GPU you administer." >&2
    echo "Set ALLOW_CLOCK_CHANGES=1 to confirm." >&2
    exit 2
fi

reset_clocks() {
    if nvidia-smi -i "$GPU" -rgc >"$OUT/reset-clocks.log" 2>&1; then
        echo "== locked clocks reset on GPU $GPU"
    else
        echo "WARNING: nvidia-smi -i $GPU -rgc failed; see $OUT/reset-clocks.log" >&2
    fi
}
trap reset_clocks EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_step NAME CAP_S CMD...: CMD with its output in $OUT/NAME.log, cut at CAP_S or the run's remaining budget.
run_step() {
    local name=$1 cap=$2 left rc=0 t0=$SECONDS
    shift 2
    left=$((T_END - SECONDS))
    if ((left < cap)); then cap=$left; fi
    if ((cap <= 0)); then
        echo "FAIL $name: the run's budget is spent" >&2
        return 124
    fi
    echo "== $name (at most ${cap} s; log $OUT/$name.log)"
    timeout --signal=TERM --kill-after=20 "$cap" "$@" >"$OUT/$name.log" 2>&1 || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$OUT/$name.log" >&2
        echo "FAIL $name: exit $rc after $((SECONDS - t0)) s (124: timed out)" >&2
        return "$rc"
    fi
    echo "   ok in $((SECONDS - t0)) s"
}

if [[ "${SKIP_INSTALL:-0}" == 1 ]] || "$PYTHON" -c "import vllm, pynvml" >/dev/null 2>&1; then
    echo "== install: skipped (vllm and pynvml import, or SKIP_INSTALL=1)"
else
    run_step install 240 "$PYTHON" -m pip install -e ".[gpu]"
fi

run_step nvidia-smi 30 bash -c "nvidia-smi; nvidia-smi -i '$GPU' -q -d CLOCK,PERFORMANCE,POWER; \
nvidia-smi -i '$GPU' -q -d SUPPORTED_CLOCKS | head -n 60"
"$PYTHON" -c "from importlib.metadata import version as v; print('vllm', v('vllm'), '| nvidia-ml-py', v('nvidia-ml-py'))" \
    >>"$OUT/nvidia-smi.log" 2>&1 || true

run_step contracts 90 "$PYTHON" -m pytest -q -p no:cacheprovider tests/backends/test_backend_contracts.py -m gpu -rs

if command -v commitenv >/dev/null 2>&1; then CLI=(commitenv); else CLI=("$PYTHON" -m commitenv); fi
args=(calibrate --gpu "$GPU" --model "$MODEL" --template "$TEMPLATE" --quick
      --out "$OUT/profile.yaml" --report "$OUT/calibration.json")
if [[ -n "$CLOCKS" ]]; then args+=(--clocks "$CLOCKS"); fi
run_step calibrate 420 env VLLM_ENABLE_V1_MULTIPROCESSING=0 "${CLI[@]}" "${args[@]}"

echo "== done: $OUT/profile.yaml, $OUT/calibration.json and the step logs in $OUT"
