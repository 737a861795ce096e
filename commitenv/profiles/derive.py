"""Derive the shipped profiles (``profiles/*.yaml``) from a few base parameters per GPU and model.

Run ``python -m commitenv.profiles.derive`` to rewrite the files and print the sanity checks
(``--check`` prints only). Every number in a written profile carries its derivation in ``sources``.

The physical model (its laws, constants and records) is `commitenv.profiles.physics`; the base parameters per
GPU and model, the profiles built from them, their rendering and checks are here.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from commitenv.profiles.physics import (ENGINE_INIT_S, ETA_DEC, FIT_SPEC, Fit, GAMMA, GB, Gpu,  # noqa: F401
                                        HBM_J_PER_GB, Leaderboard, MEM_EFF, Model, PCIE_EFF, PCIE_GBS,
                                        POWER_EXP_K, SS_CONTEXT, SS_DECODE_1_J, SS_DECODE_256_J,
                                        SS_DECODE_MEDIAN_S, SS_PREFILL_S, SS_PREFILL_TOKENS, SS_TAU0_S,
                                        Spec, VOLTAGE_FLOOR_MHZ, _flops_pair, _flops_token, _g, _peak,
                                        _step, energy_law, fit_stepsplit_h100, idle_power,
                                        kv_capacity_tokens, load_power_w, load_time_s,
                                        per_output_token_j, request_marginal_j, sm_power, time_law)

# ---------------------------------------------------------------------------------------------------
# Base parameters per GPU and model
# ---------------------------------------------------------------------------------------------------
_SPECS = "data/profiles/gpu_specs_seen.csv"

H20 = Gpu(
    name="NVIDIA H20 (96 GB HBM3)", memory_gb=96.0, bandwidth_gbs=4000.0, tdp_w=400.0,
    gemm_tflops=296.0, attn_tflops=148.0, spec_clock_mhz=1980,
    clocks_mhz=(345, 750, 1170, 1575, 1980),
    idle_top_w=121.5, standby_w=70.0, prefill_power_w=340.0, mfu=0.65,
    src={
        "memory": f"H20 96 GB HBM3 ({_SPECS}; third-party spec page willitrunai.com)",
        "bandwidth": f"4,000 GB/s ({_SPECS}; third-party spec page)",
        "tdp": f"400 W TDP ({_SPECS}; third-party spec page; a 500 W board cap was also seen in public nvidia-smi output)",
        "peak": f"FP16 dense 148 TFLOPS ({_SPECS}), x2 = 296 TFLOPS for FP8 GEMMs, 148 for BF16 attention, taken at 1980 MHz",
        "clocks": "ePACT App. C.1: H20 clock levels {345, 750, 1170, 1575, 1980} MHz, reference (vLLM, Fixed-Config) 1980",
        "idle_top": "calibration anchor: the 32-GPU pool's vLLM idle floor ~14.0 MJ/h (intercept of hourly vLLM energy vs requests, data/paper/epact_day_hourly.csv) / (32 x 3600 s) = 121.5 W at 1980 MHz (least-squares refit by benchmarks/calibration.py confirms 121.5 W)",
        "standby": f"assumed 70 W: no-load P0 idle of the same Hopper die family (H100 SXM 67-71 W, {_SPECS}); no public H20 no-load figure",
        "prefill_power": "calibrated 340 W (85 % of the 400 W TDP) for compute-bound prefill at 1980 MHz: benchmarks/calibration.py fits the full-capacity vLLM day on azure-code-day to the paper's hourly references (data/paper/epact_day_hourly.csv, h20_reference_vllm_mj); the TDP figure (splitwise-sim prompt power = TDP) overstated the dynamic energy by ~17 %",
        "mfu": "assumed 0.65 (typical vLLM FP8 prefill; H20 is compute-poor for its 4 TB/s, so non-GEMM work costs little relative to its tensor peak); calibration knob for the ~210 J/request anchor",
    },
)

H200 = Gpu(
    name="NVIDIA H200 (141 GB HBM3e)", memory_gb=141.0, bandwidth_gbs=4800.0, tdp_w=700.0,
    gemm_tflops=1979.0, attn_tflops=989.0, spec_clock_mhz=1980,
    clocks_mhz=(345, 690, 1035, 1380, 1710),
    idle_top_w=94.6, standby_w=75.0, prefill_power_w=590.0, mfu=0.38,
    src={
        "memory": f"H200 141 GB HBM3e ({_SPECS}; third-party spec pages)",
        "bandwidth": f"4,800 GB/s ({_SPECS}; third-party spec pages)",
        "tdp": f"700 W TDP, SXM ({_SPECS}; third-party spec pages)",
        "peak": "NVIDIA H100/H200 SXM spec figure (third-party copies): 989 TFLOPS FP16/BF16 dense, 1,979 FP8 dense, at the 1980 MHz boost clock",
        "clocks": "ePACT App. C.1 caps evaluated H200 clocks at 1710 MHz (thermal throttling at 1980); five levels 345..1710 in uniform 345-MHz steps (last step 330 MHz), on the 15-MHz grid, as ePACT picks five clocks at near-uniform rank intervals keeping both ends (sec. 4); reference 1710 (vLLM and Fixed-Config run at 1710 on H200)",
        "idle_top": f"calibration anchor: pool idle floor ~10.9 MJ/h = 0.827 x 14.0 - 0.70 MJ (least-squares fit of the paper's H200 hourly reference energies on the H20 ones, data/paper/epact_day_hourly.csv, r = 0.994) / (32 x 3600 s) = 94.6 W at 1710 MHz. Note: public nvidia-smi output shows 122 W with a model loaded at 0% util ({_SPECS}), i.e. this anchor is 27 W lower; that reading cannot describe the paper's pool: its quietest hour (hour 10, 13.036 MJ on 32 GPUs, every one active under vLLM) averages 113.2 W per GPU with all its serving work included, so no active idle above 113.2 W is consistent with the paper's references",
        "standby": f"75 W: H200 no-load P0 idle 73-76 W from public nvidia-smi outputs ({_SPECS})",
        "prefill_power": "calibrated 590 W (84 % of the 700 W TDP) for compute-bound prefill at the 1710 MHz top clock: benchmarks/calibration.py fits the full-capacity vLLM day on azure-code-day to the paper's hourly references (data/paper/epact_day_hourly.csv, h200_reference_vllm_mj); near-TDP operation is consistent with Festina (secs. 2.1, 3.2.1: same-die H100 TDP-limited at 1635 MHz) and ePACT App. C.1 (throttling at 1980 MHz)",
        "mfu": "assumed 0.38 of the FP8 peak: vLLM FP8 prefill on H100/H200-class parts is held back by non-GEMM work (norms, activation quantisation, BF16 attention) that does not speed up with the FP8 tensor peak (plausible 0.3-0.5); set within that range so that an average Azure-code request (2,048 in / 28 out) served alone costs ~0.83 x the H20 profile's marginal energy, the slope of the H200-on-H20 hourly reference fit (data/paper/epact_day_hourly.csv)",
    },
)

H100 = Gpu(
    name="NVIDIA H100 SXM (80 GB HBM3)", memory_gb=80.0, bandwidth_gbs=3350.0, tdp_w=700.0,
    gemm_tflops=989.0, attn_tflops=989.0, spec_clock_mhz=1980,
    clocks_mhz=(705, 1005, 1305, 1605, 1980),
    idle_top_w=116.0, standby_w=69.0, prefill_power_w=700.0, mfu=0.0,  # mfu: fitted
    src={
        "memory": f"H100 SXM 80 GB HBM3 ({_SPECS})",
        "bandwidth": f"3,350 GB/s ({_SPECS}; third-party spec page)",
        "tdp": f"700 W TDP ({_SPECS}; third-party spec page)",
        "peak": "NVIDIA H100 SXM spec figure (third-party copies): 989 TFLOPS BF16 dense at the 1980 MHz boost clock (model weights and KV are BF16)",
        "clocks": f"five levels on the 15-MHz SUPPORTED_CLOCKS grid (data/profiles/nvidia_smi_INFO_H100.txt shows 15-MHz steps) from 705 MHz to the SXM max 1980 MHz ({_SPECS}) in ~300-MHz steps (375 MHz last); reference 1980 = default clocks of StepSplit's runs",
        "idle_top": f"116 W: H100 SXM no-load idle 67-71 W ({_SPECS}) + 47 W, the H200's public loaded-vs-unloaded increment (122 W vs 73-76 W, same file); check: StepSplit (sec. 2.3) finds idle power is 24.4-46.2% of busy energy",
        "standby": f"69 W: H100 SXM no-load P0 idle 67-71 W from public nvidia-smi outputs ({_SPECS})",
        "prefill_power": "700 W = TDP for compute-bound prefill at the 1980 MHz top clock (splitwise-sim constant power model for H100: idle/prompt/token 75/700/380 W; at default clocks the GPU power-manages prefill at TDP, cf. Festina sec. 2.1)",
        "mfu": "fitted",
    },
)

QWEN38_27B_FP8 = Model(
    name="Qwen3.8-27B-FP8", params_b=27.0, weight_gb=27.0, layers=64, q_dim=64 * 128, kv_heads=8, head_dim=128,
    kv_dtype_bytes=2,
    src={
        "arch": "assumed Qwen3-32B-like dense shape: 64 layers, hidden 5120, 64 query heads x 128 (q_dim 8192), GQA 8 KV heads x 128, BF16 KV cache. StepSplit (sec. 4.1) calls Qwen3.8-27B a linear-attention hybrid; if so, only its full-attention layers hold a per-token KV cache and kv_bytes_per_token, tau3/kappa and tau4/c2 are overstated (KV capacity understated) by about the hybrid ratio",
        "weights": "27B parameters (ePACT sec. 5.1: Qwen3.8-27B-FP8) at 1 byte each in FP8 = 27 GB (BF16 embeddings/lm_head, if kept, add ~1.5 GB; ignored)",
    },
)

QWEN25_7B = Model(
    name="Qwen2.5-7B", params_b=7.62, weight_gb=15.23, layers=28, q_dim=28 * 128, kv_heads=4, head_dim=128,
    kv_dtype_bytes=2,
    src={
        "arch": "Qwen2.5-7B (Qwen2.5 technical report, StepSplit ref. [34]): 28 layers, hidden 3584 = 28 query heads x 128, GQA 4 KV heads x 128, BF16 KV cache",
        "weights": "7.62B parameters in BF16 (StepSplit sec. 4.1: weights in BF16) = 15.23 GB",
    },
)

LLAMA2_13B = Model(
    name="Llama-2-13B", params_b=13.016, weight_gb=26.03, layers=40, q_dim=40 * 128, kv_heads=40, head_dim=128,
    kv_dtype_bytes=2,
    src={
        "arch": "meta-llama/Llama-2-13b-hf config.json: 40 layers, hidden 5120 = 40 query heads x 128, no GQA (40 KV heads x 128), intermediate 13,824, vocab 32,000, max_position_embeddings 4,096; 16-bit KV cache",
        "weights": "13.016B parameters counted from the meta-llama/Llama-2-13b-hf config.json shapes (40 x (4 x 5120^2 attention + 3 x 5120 x 13,824 MLP + 2 x 5120 norms) + 2 x 32,000 x 5120 untied embedding/lm_head + 5120 = 13,015,864,320) at 2 bytes (float16 checkpoint, served in 16-bit) = 26.03 GB",
    },
)

MISTRAL_SMALL_24B = Model(
    name="Mistral-Small-24B-Instruct-2501", params_b=23.572, weight_gb=47.14, layers=40, q_dim=32 * 128, kv_heads=8,
    head_dim=128, kv_dtype_bytes=2,
    src={
        "arch": "mistralai/Mistral-Small-24B-Instruct-2501 config.json: 40 layers, hidden 5120, 32 query heads x head_dim 128 (q_dim 4096), GQA 8 KV heads x 128, intermediate 32,768, vocab 131,072, max_position_embeddings 32,768; BF16 KV cache. Festina's 'Mistral-24B' taken as this text-only Mistral-Small 24B (Festina names no release)",
        "weights": "23.572B parameters counted from the config.json shapes (40 x (5120 x (4096 + 2 x 1024) + 4096 x 5120 attention + 3 x 5120 x 32,768 MLP + 2 x 5120 norms) + 2 x 131,072 x 5120 untied embedding/lm_head + 5120 = 23,572,403,200) in BF16 = 47.14 GB",
    },
)

_H20_SCHED_SRC = "ePACT App. C.1: vLLM 0.27.1 with a 16,384-token context limit, a 2,048-token scheduling budget, at most 64 sequences per replica"
_VLLM_BLOCK = "vLLM default KV block size 16 tokens"
_LAT_SRC = {
    "clock_change": "assumption: locking SM clocks through NVML/nvidia-smi -lgc takes tens of ms; 0.05 s; ePACT applies a clock change after the pending step completes (App. A)",
    "activation": "assumption: reactivating a standby replica without reload (weights and CUDA graphs resident) ~3 s (warm-up and router re-registration); ePACT standby replicas retain weights for reactivation (sec. 3)",
}

# Festina (papers/festina.txt) co-hosts Qwen-7B, Llama2-13B and Mistral-24B on 8 H100s, implemented on vLLM
_FESTINA_SCHED = ("vLLM V1 OpenAI-server defaults on a GPU with >= 70 GiB that is not an A100 (vllm/engine/arg_utils.py, "
                  "EngineArgs.get_batch_defaults): max_num_batched_tokens 8,192, max_num_seqs 1,024; Festina (sec. 1) is built on "
                  "vLLM and states no engine settings")
_FESTINA_ACT = ("~4 GB assumed for activations, CUDA graphs and non-torch memory at an 8,192-token budget: one gate+up MLP buffer is "
                "8,192 x 2 x intermediate x 2 B (0.45 GB for Llama-2-13B, 1.07 GB for Mistral-Small-24B, 0.62 GB for Qwen2.5-7B); a public "
                "vLLM startup log on an 80 GB GPU shows a 2.38 GiB activation peak + 0.16 GiB non-torch memory "
                "(kubernetes-sigs/gateway-api-inference-extension PR #550) and CUDA graphs took 0.48 GiB (vllm-project/vllm issue #20264)")
_LOAD_SRC = (
    f"load_s = weight_gb / ({PCIE_GBS:g} GB/s x {PCIE_EFF}) + {ENGINE_INIT_S:g} s. Host-to-GPU copy: PCIe Gen5 x16 nominal {PCIE_GBS:g} GB/s "
    f"per direction (32 GT/s x 16 lanes, 128b/130b = 63 GB/s; NVIDIA lists 128 GB/s bidirectional for H100 SXM), achievable "
    f"fraction {PCIE_EFF} assumed for pinned host-to-device copies, weights assumed already in host DRAM (page cache or pinned "
    f"buffers, ServerlessLLM's DRAM tier; Festina sec. 3.2.1 profiles the one-time weight load, sec. 3.5.2 cold-start "
    f"penalties), not on SSD. Engine init {ENGINE_INIT_S:g} s assumed for memory profiling, KV-cache allocation, torch.compile "
    f"from cache and CUDA-graph capture: a public vLLM V1 log reports 'init engine (profile, create kv cache, warmup model) "
    f"took 34.11 seconds' with the torch.compile cache reused, graph capture 17 s of it (vllm-project/vllm issue #20264), "
    f"and capturing the default 67 CUDA graphs alone can take more than 10 s (RFC vllm-project/vllm #20098); taken equal "
    f"for all models (capture time growing with depth is not modelled)"
)
_LOAD_W_SRC = ("= active_idle_w at the reference clock (derived: P_idle(f_top)), energy per cold start = load_s x load_w: the "
               "copy engine and host-side initialisation leave the SMs mostly idle, so the replica draws its active-idle "
               "power at the held clock (assumption; short graph-capture and profiling kernels above idle are ignored)")

SPECS: tuple[Spec, ...] = (
    Spec(
        name="h20-qwen3.8-27b-fp8", gpu=H20, model=QWEN38_27B_FP8,
        token_budget=2048, max_seqs=64, context_limit=16384, block_size=16, gpu_mem_util=0.9, activation_gb=4.0,
        clock_change_s=0.05, activation_s=3.0,
        src={"scheduler": _H20_SCHED_SRC, "block": _VLLM_BLOCK, "activation_gb": "~4 GB assumed for activations and CUDA graphs at a 2,048-token budget", **_LAT_SRC},
    ),
    Spec(
        name="h200-qwen3.8-27b-fp8", gpu=H200, model=QWEN38_27B_FP8,
        token_budget=2048, max_seqs=64, context_limit=16384, block_size=16, gpu_mem_util=0.9, activation_gb=4.0,
        clock_change_s=0.05, activation_s=3.0,
        src={"scheduler": _H20_SCHED_SRC + " (same setup on H200, sec. 5.1)", "block": _VLLM_BLOCK, "activation_gb": "~4 GB assumed for activations and CUDA graphs at a 2,048-token budget", **_LAT_SRC},
    ),
    Spec(
        name="h100-qwen2.5-7b", gpu=H100, model=QWEN25_7B,
        token_budget=65536, max_seqs=256, context_limit=16384, block_size=16, gpu_mem_util=0.9, activation_gb=8.0,
        clock_change_s=0.05, activation_s=3.0,
        src={
            "scheduler": "StepSplit sec. 6.1: a budget of 65,536 tokens per step (262,144 only for large static batches); max_seqs 256 = the largest batch of its microbenchmark and static batches (sec. 4.1, Fig. 4a); context_limit 16,384 not stated there (prompts <= 8,192 + outputs <= 256), chosen",
            "block": _VLLM_BLOCK,
            "activation_gb": "~8 GB assumed: vLLM reserves peak activations at max_num_batched_tokens 65,536 (one MLP buffer 18,944 x 65,536 x 2 B = 2.5 GB)",
            **_LAT_SRC,
        },
    ),
    Spec(
        name="h100-qwen2.5-7b-festina", gpu=H100, model=QWEN25_7B,
        token_budget=8192, max_seqs=1024, context_limit=16384, block_size=16, gpu_mem_util=0.9, activation_gb=4.0,
        clock_change_s=0.05, activation_s=3.0, load=True,
        src={
            "scheduler": _FESTINA_SCHED + "; context_limit 16,384 as in h100-qwen2.5-7b (chosen; Festina's longest class is <= 8,192 input tokens, Table 2)",
            "block": _VLLM_BLOCK, "activation_gb": _FESTINA_ACT, **_LAT_SRC,
        },
        leaderboard=(
            Leaderboard("Qwen/Qwen3-8B (comparable dense 8B, GQA 8 KV heads x 36 layers), ML.ENERGY leaderboard v3, lm-arena-chat, H100 x1, max_num_seqs 64 (data/profiles/mlenergy_leaderboard_v3_llm_configs.csv)", 63.9, 644.54, 0.1192),
        ),
    ),
    Spec(
        name="h100-llama2-13b", gpu=H100, model=LLAMA2_13B,
        token_budget=8192, max_seqs=1024, context_limit=4096, block_size=16, gpu_mem_util=0.9, activation_gb=4.0,
        clock_change_s=0.05, activation_s=3.0, load=True,
        src={
            "scheduler": _FESTINA_SCHED + "; context_limit 4,096 = the model's max_position_embeddings (vLLM's default max_model_len), so Festina's long class (up to 8,192 input tokens, Table 2) does not fit this model",
            "block": _VLLM_BLOCK, "activation_gb": _FESTINA_ACT, **_LAT_SRC,
        },
        leaderboard=(
            Leaderboard("codellama/CodeLlama-13b-hf (Llama-2-13B architecture, vocab 32,016), ML.ENERGY leaderboard v2, code, H100 TP1, bs64 (data/profiles/mlenergy_leaderboard_v2_llm_configs.csv; v2: older vLLM, its derived powers far below v3's, treat with caution)", 63.5, 97.85, 0.3370, 200),
            Leaderboard("codellama/CodeLlama-13b-hf, ML.ENERGY leaderboard v2, code, H100 TP1, bs192 (same file)", 183.6, 96.03, 0.2711, 200),
        ),
    ),
    Spec(
        name="h100-mistral-small-24b", gpu=H100, model=MISTRAL_SMALL_24B,
        token_budget=8192, max_seqs=1024, context_limit=32768, block_size=16, gpu_mem_util=0.9, activation_gb=4.0,
        clock_change_s=0.05, activation_s=3.0, load=True,
        src={
            "scheduler": _FESTINA_SCHED + "; context_limit 32,768 = the model's max_position_embeddings (vLLM's default max_model_len)",
            "block": _VLLM_BLOCK, "activation_gb": _FESTINA_ACT, **_LAT_SRC,
        },
        leaderboard=(
            Leaderboard("Qwen/Qwen3-14B (dense 14.8B, 40 layers, GQA 8 KV heads), ML.ENERGY leaderboard v3, lm-arena-chat, H100 x1, max_num_seqs 32 (data/profiles/mlenergy_leaderboard_v3_llm_configs.csv)", 31.9, 611.41, 0.2441),
            Leaderboard("google/gemma-3-27b-it (dense 27B), ML.ENERGY leaderboard v3, lm-arena-chat, H100 x1, max_num_seqs 32 (same file)", 31.7, 714.30, 0.5251),
            Leaderboard("Qwen/Qwen3-32B (dense 32.8B, 64 layers, GQA 8 KV heads), ML.ENERGY leaderboard v3, lm-arena-chat, H100 x1, max_num_seqs 32 (same file)", 29.3, 629.32, 0.6240),
        ),
    ),
)


def _fitted_specs() -> tuple[Spec, ...]:
    h100 = next(s for s in SPECS if s.name == FIT_SPEC)
    fit = fit_stepsplit_h100(h100)
    note = (f"fitted to StepSplit Qwen2.5-7B/H100 (h100-qwen2.5-7b): launch {fit.launch_per_layer_s * 1e6:.2f} us/layer, "
            f"t_req {fit.t_req_per_layer_s * 1e6:.3f} us/layer, u_dec {fit.u_dec:.4f}")
    out = []
    for s in SPECS:
        gpu = replace(s.gpu, mfu=fit.mfu) if s.gpu is H100 else s.gpu
        out.append(replace(s, gpu=gpu, launch_per_layer_s=fit.launch_per_layer_s,
                           t_req_per_layer_s=fit.t_req_per_layer_s, u_dec=fit.u_dec, fit_note=note))
    return tuple(out)


def _r(x: float) -> float:
    """Round to 6 significant digits so the YAML stays readable and stable."""
    return float(f"{x:.6g}")


def _is_fit(spec: Spec) -> bool:
    """True for the model and GPU the Hopper constants were fitted to (StepSplit's Qwen2.5-7B on H100)."""
    return spec.gpu.name == H100.name and spec.model.name == QWEN25_7B.name


def build_profile(spec: Spec) -> dict[str, Any]:
    """The profile mapping (schema of :class:`commitenv.profiles.schema.Profile`) for one fitted spec."""
    g, m = spec.gpu, spec.model
    top = max(g.clocks_mhz)
    clocks = []
    for f in g.clocks_mhz:
        idle = _r(idle_power(spec, f))
        clocks.append({
            "mhz": int(f),
            "time": {k: _r(v) for k, v in time_law(spec, f).items()},
            "energy": {k: _r(v) for k, v in energy_law(spec, f).items()},
            "active_idle_w": idle,
            "draining_idle_w": idle,
        })
    return {
        "name": spec.name,
        "gpu": {"name": g.name, "memory_gb": g.memory_gb, "tdp_w": g.tdp_w, "memory_bandwidth_gbs": g.bandwidth_gbs},
        "model": {"name": m.name, "params_b": m.params_b, "weight_gb": m.weight_gb,
                  "kv_bytes_per_token": float(m.kv_bytes_per_token)},
        "clocks": clocks,
        "reference_clock_mhz": int(top),
        "standby_w": g.standby_w,
        "scheduler": {"token_budget": spec.token_budget, "max_seqs": spec.max_seqs, "context_limit": spec.context_limit,
                      "block_size": spec.block_size, "kv_capacity_tokens": kv_capacity_tokens(spec)},
        "latencies": {"clock_change_s": spec.clock_change_s, "activation_s": spec.activation_s,
                      **({"load_s": _r(load_time_s(spec)), "load_w": _r(load_power_w(spec))} if spec.load else {})},
        "sm_share": {"compute_exponent": 1.0, "memory_exponent": 0.4, "min_share": 0.1},
        "sources": _sources(spec),
        "notes": _notes(spec),
    }


def _sources(spec: Spec) -> dict[str, str]:
    g, m = spec.gpu, spec.model
    top = max(g.clocks_mhz)
    fs = g.spec_clock_mhz
    is_h100 = _is_fit(spec)
    mfu_txt = (f"mfu {g.mfu:.4f} fitted so that tau0 + 7,142*tau1 + 7,142*7,143/2*tau4 = 158 ms at {top} MHz "
               "(StepSplit Insight 3: a step prefilling a 7,142-token input lasts 158 ms)") if is_h100 else (
        f"mfu {g.mfu:.4f} transferred from the h100-qwen2.5-7b fit (same GPU; fitted there to StepSplit Insight 3's 158-ms "
        "prefill of 7,142 tokens), assumed to hold for this model's 16-bit GEMMs" if g.name == H100.name else f"mfu {g.mfu} ({g.src['mfu']})")
    g_txt = f"g(f) = 1 + {GAMMA}*({top}/f - 1) (memory clock fixed, SM clock only limits issue rate; gamma assumed)"
    bw_txt = f"bandwidth {g.src['bandwidth']} x mem_eff {MEM_EFF} (assumed achievable fraction)"
    launch_txt = (f"launch = {spec.launch_per_layer_s * 1e6:.2f} us/layer x {m.layers} layers, fitted so that tau0 = 6.68 ms at 1980 MHz "
                  "(StepSplit Insight 2: the step-duration fit meets zero tokens at 6.68 ms)" if is_h100 else
                  f"launch = {spec.launch_per_layer_s * 1e6:.2f} us/layer x {m.layers} layers, per-layer overhead transferred from the h100-qwen2.5-7b fit")
    treq_txt = (f"t_req = {spec.t_req_per_layer_s * 1e6:.3f} us/layer x {m.layers} layers, fitted so that b + 512*kappa = (9.15 - 2.66)/255 J "
                "(StepSplit sec. 4: decode-step energy 2.66 J with 1 request to 9.15 J with 256 at input length 512)" if is_h100 else
                f"t_req = {spec.t_req_per_layer_s * 1e6:.3f} us/layer x {m.layers} layers, transferred from the h100-qwen2.5-7b fit")
    udec_txt = (f"u_dec {spec.u_dec:.4f} fitted so that a = 2.66 - (9.15 - 2.66)/255 = 2.6345 J at 1980 MHz (= 0.173 J per GB of weights, StepSplit's 0.172-0.212 J/GB on H100)"
                if is_h100 else f"u_dec {spec.u_dec:.4f} transferred from the h100-qwen2.5-7b fit")
    peak_txt = f"peak_gemm {g.gemm_tflops:g} / peak_attn {g.attn_tflops:g} TFLOPS at {fs} MHz ({g.src['peak']})"
    p_idle_txt = f"P_idle(f) = {g.standby_w:g} + {g.idle_top_w - g.standby_w:g}*f/{top} W"
    p_sm_txt = (f"P_sm(f) = (prefill_power {g.prefill_power_w:g} W - idle_top {g.idle_top_w:g} W) * (f/{top}) * (max(f,{VOLTAGE_FLOOR_MHZ})/{top})**{POWER_EXP_K - 1:g} "
                f"(dynamic ~ f*V**2 with V**2 ~ f above {VOLTAGE_FLOOR_MHZ} MHz: Festina sec. 3.5.1 energy proxy F**3; flat voltage below {VOLTAGE_FLOOR_MHZ} MHz: Festina sec. 3.2.1 citing EVeREST; "
                f"prefill power: {g.src['prefill_power']})")
    pcomp = f"P_comp(f) = P_idle(f) + 1.0*P_sm(f), {p_idle_txt}, {p_sm_txt}"
    pmem = f"P_mem(f) = P_idle(f) + u_dec*P_sm(f), {udec_txt}"
    hbm = f"HBM energy {HBM_J_PER_GB} J/GB read (assumed ~6 pJ/bit: HBM3 DRAM+PHY ~4 pJ/bit plus on-chip transport; clock-independent)"
    idle_txt = f"derived: {p_idle_txt} (clock tree and leakage rise with the held clock); top-clock value: {g.src['idle_top']}; zero-clock intercept = standby_w"
    if is_h100:
        t1, e1 = _step(spec, top, n=1, L=SS_CONTEXT)
        t256, e256 = _step(spec, top, n=256, L=256 * SS_CONTEXT)
        idle = idle_power(spec, top)
        idle_txt += f" (here {idle * t1 / e1 * 100:.1f}% of a 1-request and {idle * t256 / e256 * 100:.1f}% of a 256-request decode step)"
    return {
        "gpu.memory_gb": g.src["memory"],
        "gpu.tdp_w": g.src["tdp"],
        "gpu.memory_bandwidth_gbs": g.src["bandwidth"],
        "model.params_b": m.src["weights"],
        "model.weight_gb": m.src["weights"],
        "model.kv_bytes_per_token": f"derived: 2 (K,V) x {m.layers} layers x {m.kv_heads} KV heads x {m.head_dim} head dim x {m.kv_dtype_bytes} B = {m.kv_bytes_per_token:,} B; {m.src['arch']}",
        "clocks.mhz": g.src["clocks"],
        "reference_clock_mhz": g.src["clocks"],
        "clocks.time.tau0": f"derived: tau0(f) = (weight_bytes/(bandwidth*mem_eff) + launch) * g(f); weights {m.weight_gb:g} GB; {bw_txt}; {launch_txt}; {g_txt}",
        "clocks.time.tau1": f"derived: tau1(f) = 2*params/(peak_gemm*(f/{fs})*mfu) = 2*{m.params_b:g}e9 FLOPs per token, compute-bound so ~ {top}/f; {peak_txt}; {mfu_txt}",
        "clocks.time.tau2": f"derived: tau2(f) = t_req*g(f) + eta_dec*2*params/(peak_gemm*(f/{fs})*mfu); {treq_txt}; eta_dec {ETA_DEC} assumed (half of a decode token's GEMM compute is not hidden under the weight read); {g_txt}",
        "clocks.time.tau3": f"derived: tau3(f) = kv_bytes_per_token/(bandwidth*mem_eff) * g(f) = {m.kv_bytes_per_token:,} B per context token; {bw_txt}; {g_txt}",
        "clocks.time.tau4": f"derived: tau4(f) = 4*layers*q_dim/(peak_attn*(f/{fs})*mfu) = 4 x {m.layers} x {m.q_dim} FLOPs per causal (query,key) pair (QK^T and PV), compute-bound so ~ {top}/f; {peak_txt}; {mfu_txt}",
        "clocks.energy.a": f"derived: a(f) = tau0(f)*P_mem(f) + weight_gb*hbm (weight read, idle floor over tau0 included); {pmem}; {p_idle_txt}; {p_sm_txt}; {hbm}",
        "clocks.energy.c1": f"derived: c1(f) = tau1(f)*P_comp(f); {pcomp}",
        "clocks.energy.c2": f"derived: c2(f) = tau4(f)*P_comp(f); {pcomp}",
        "clocks.energy.b": f"derived: b(f) = t_req*g(f)*P_mem(f) + eta_dec*2*params/(peak_gemm*(f/{fs})*mfu)*P_comp(f); {pmem}; {pcomp}",
        "clocks.energy.kappa": f"derived: kappa(f) = tau3(f)*P_mem(f) + kv_bytes_per_token*hbm; {pmem}; {p_idle_txt}; {p_sm_txt}; {hbm}",
        "clocks.active_idle_w": idle_txt,
        "clocks.draining_idle_w": "= active_idle_w: a draining replica idles between its last steps with the same clock held and the same engine state, so the same physics",
        "standby_w": g.src["standby"],
        "scheduler.token_budget": spec.src["scheduler"],
        "scheduler.max_seqs": spec.src["scheduler"],
        "scheduler.context_limit": spec.src["scheduler"],
        "scheduler.block_size": spec.src["block"],
        "scheduler.kv_capacity_tokens": (f"derived: ({spec.gpu_mem_util} (vLLM gpu_memory_utilization default) x {g.memory_gb:g} GB - {m.weight_gb:g} GB weights - "
                                         f"{spec.activation_gb:g} GB activations) / {m.kv_bytes_per_token:,} B per token, floored to a multiple of {spec.block_size}; "
                                         f"{spec.src['activation_gb']}; memory in decimal GB (conservative vs GiB)"),
        "latencies.clock_change_s": spec.src["clock_change"],
        "latencies.activation_s": spec.src["activation"],
        **({"latencies.load_s": f"derived: {m.weight_gb:g} GB / ({PCIE_GBS:g} x {PCIE_EFF}) GB/s + {ENGINE_INIT_S:g} s; {_LOAD_SRC}",
            "latencies.load_w": f"{_LOAD_W_SRC}; here {p_idle_txt} at {top} MHz"} if spec.load else {}),
        "sm_share.compute_exponent": "1.0: prefill is compute-bound, its time scales with the inverse SM share (Festina sec. 2.2 phase sensitivity: compute-heavy prefill vs memory-bound decode; sec. 3.4 sizes per-task SM shares from the profiled LUT)",
        "sm_share.memory_exponent": "0.4 assumed: memory-bound decode saturates HBM bandwidth with part of the SMs, so a smaller share slows it much less than prefill (Festina sec. 2.3: the energy-optimal SM partition shifts, e.g. 30-30-40 -> 20-40-40 SMs at 1155 -> 1065 MHz, and sec. 2.2: decode prefers fewer resources/lower frequency); 0.4 gives 1.3x at half the SMs, 2.5x at 10%",
        "sm_share.min_share": "0.1: Festina sec. 3.2.1 profiles SM allocations from 10% to 100% in 10% steps",
    }


def _notes(spec: Spec) -> str:
    g = spec.gpu
    pre = {f: _step(spec, f, P=2048, A=2048 * 2049 / 2)[1] for f in g.clocks_mhz}
    dec = {f: _step(spec, f, n=32, L=32 * 2060)[1] for f in g.clocks_mhz}
    best_pre, best_dec = min(pre, key=pre.__getitem__), min(dec, key=dec.__getitem__)
    lo = min(g.clocks_mhz)
    shape = ("interior minima: U-shaped, Festina Observation Two" if lo not in (best_pre, best_dec) else
             "minimum on the lowest level: the bottom of the U lies at or below it for this GPU x model")
    return (
        f"Generated by `python -m commitenv.profiles.derive` (do not edit by hand). Physical model: compute-bound prefill terms "
        f"(tau1, tau4) scale as f_top/f; memory-bound terms (tau0, tau3, the per-request part of tau2) as 1 + {GAMMA}*(f_top/f - 1); "
        f"energy = time x power per term plus {HBM_J_PER_GB} J/GB of HBM traffic, with busy power = idle(f) + u*P_sm(f), "
        f"P_sm ~ f^{POWER_EXP_K:g} above {VOLTAGE_FLOOR_MHZ} MHz and ~ f below; u = 1 for compute, u_dec = {spec.u_dec:.4f} for memory-bound work. "
        f"Base parameters: mfu {g.mfu:.4g}, idle_top {g.idle_top_w:g} W, standby {g.standby_w:g} W, prefill power {g.prefill_power_w:g} W at "
        f"{max(g.clocks_mhz)} MHz, mem_eff {MEM_EFF}; Hopper decode constants {spec.fit_note}. Energy includes the GPU's idle floor "
        f"over each step; gaps between steps are metered at active_idle_w. Energy per token is lowest at {best_pre} MHz for a "
        f"2,048-token prefill and at {best_dec} MHz for a 32-request decode step at context 2,060 ({shape})."
    ) + (_extra_notes(spec) if spec.load else "")


def _extra_notes(spec: Spec) -> str:
    top = max(spec.gpu.clocks_mhz)
    ls, lw = load_time_s(spec), load_power_w(spec)
    txt = (" Step laws identical to h100-qwen2.5-7b; scheduler (Festina's vLLM settings), KV capacity and cold start differ."
           if _is_fit(spec) and spec.name != FIT_SPEC else "")
    txt += (f" Cold start: {ls:.2f} s ({spec.model.weight_gb:g} GB over {PCIE_GBS * PCIE_EFF:g} GB/s + {ENGINE_INIT_S:g} s engine init) at "
           f"{lw:.1f} W = {ls * lw / 1e3:.2f} kJ. KV capacity assumes this model alone on the GPU (vLLM gpu_memory_utilization "
           f"{spec.gpu_mem_util}); co-hosted models share the memory. Festina runs its H100s TDP-limited at 1635 MHz and profiles "
           f"795-1635 MHz (secs. 2.1, 3.2.1), not the levels here.")
    if spec.leaderboard:
        txt += (f" Check only (not fitted), ML.ENERGY at default clocks vs this profile at {top} MHz, energy per output token in "
                "steady decoding at the row's batch size and mean context prompt + output/2, decode only / with each request's "
                "prefill (prompt lengths assumed: the files give none; 512 for chat, 200 for code, where a batch of 184 fits the "
                "same 80 GB only below ~280 tokens of mean context): " + "; ".join(_lb_line(spec, r) for r in spec.leaderboard) + ".")
    return txt


def _lb_line(spec: Spec, r: Leaderboard) -> str:
    n = round(r.batch)
    dec, full = per_output_token_j(spec, max(spec.gpu.clocks_mhz), n, r.prompt_len, r.output_len)
    over = " (batch exceeds this profile's KV capacity)" if n * (r.prompt_len + r.output_len / 2) > kv_capacity_tokens(spec) else ""
    return (f"{r.what}: batch {r.batch:.1f}, output {r.output_len:.0f} tokens, {r.j_per_token:.4f} J/token vs derived "
            f"{dec:.4f} / {full:.4f} J/token at prompt {r.prompt_len} (ratio {full / r.j_per_token:.2f}){over}")


# ---------------------------------------------------------------------------------------------------
# Rendering, checks, CLI
# ---------------------------------------------------------------------------------------------------
def render(profile: dict[str, Any]) -> str:
    """YAML text of a profile (deterministic)."""
    head = (f"# {profile['name']}: generated by `python -m commitenv.profiles.derive` from the base parameters in\n"
            "# commitenv/profiles/derive.py; every number's derivation is in `sources`. Do not edit by hand.\n")
    return head + yaml.safe_dump(profile, sort_keys=False, width=10_000, allow_unicode=False)


def render_all() -> dict[str, str]:
    """File stem -> YAML text of every shipped profile."""
    return {s.name: render(build_profile(s)) for s in _fitted_specs()}


def check_report(spec: Spec) -> str:
    """Human-readable physics checks for one fitted spec."""
    g = spec.gpu
    top = max(g.clocks_mhz)
    lines = [f"== {spec.name}  (mfu {g.mfu:.4f}, u_dec {spec.u_dec:.4f}, kv capacity {kv_capacity_tokens(spec):,} tokens)"]
    lines.append(f"{'MHz':>5} {'prefill2048 s':>13} {'dec n=1 ms':>10} {'dec n=32 ms':>11} {'P_pre W':>8} {'P_dec32 W':>9} "
                 f"{'mJ/tok pre':>10} {'mJ/tok dec32':>12} {'idle W':>7} {'req alone J':>11} {'req m=32 J':>10}")
    ctx = 2060
    for f in g.clocks_mhz:
        tp, ep = _step(spec, f, P=2048, A=2048 * 2049 / 2)
        t1, _ = _step(spec, f, n=1, L=ctx)
        t32, e32 = _step(spec, f, n=32, L=32 * ctx)
        lines.append(f"{f:>5} {tp:>13.4f} {t1 * 1e3:>10.2f} {t32 * 1e3:>11.2f} {ep / tp:>8.1f} {e32 / t32:>9.1f} "
                     f"{ep / 2048 * 1e3:>10.2f} {e32 / 32 * 1e3:>12.2f} {idle_power(spec, f):>7.1f} "
                     f"{request_marginal_j(spec, f):>11.1f} {request_marginal_j(spec, f, share_with=32):>10.1f}")
    if spec.load:
        lines.append(f"cold start {load_time_s(spec):.3f} s at {load_power_w(spec):.1f} W = {load_time_s(spec) * load_power_w(spec):.1f} J")
    for r in spec.leaderboard:
        lines.append("ML.ENERGY check: " + _lb_line(spec, r))
    if _is_fit(spec):
        e1 = _step(spec, top, n=1, L=SS_CONTEXT)[1]
        e256 = _step(spec, top, n=256, L=256 * SS_CONTEXT)[1]
        t1 = _step(spec, top, n=1, L=SS_CONTEXT)[0]
        tp = _step(spec, top, P=SS_PREFILL_TOKENS, A=SS_PREFILL_TOKENS * (SS_PREFILL_TOKENS + 1) / 2)[0]
        a = energy_law(spec, top)["a"]
        lines.append(f"StepSplit fit residuals at {top} MHz: E(1 req) {e1:.4f} J vs 2.66 ({e1 - SS_DECODE_1_J:+.2e}); "
                     f"E(256) {e256:.4f} J vs 9.15 ({e256 - SS_DECODE_256_J:+.2e}); t(1 req) {t1 * 1e3:.3f} ms vs 6.70 "
                     f"({(t1 / SS_DECODE_MEDIAN_S - 1) * 100:+.2f}%); prefill 7142 {tp * 1e3:.2f} ms vs 158; a/weights {a / spec.model.weight_gb:.4f} J/GB "
                     f"(0.172-0.212); idle share of decode energy {idle_power(spec, top) * t1 / e1 * 100:.1f}% (1 req), "
                     f"{idle_power(spec, top) * _step(spec, top, n=256, L=256 * 512)[0] / e256 * 100:.1f}% (256) vs 24.4-46.2%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Write ``profiles/*.yaml`` (or only print the checks with ``--check``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "profiles")
    ap.add_argument("--check", action="store_true", help="print the checks only, write nothing")
    args = ap.parse_args(argv)
    for spec in _fitted_specs():
        print(check_report(spec))
    if not args.check:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in render_all().items():
            (args.out / f"{name}.yaml").write_text(text)
            print(f"wrote {args.out / (name + '.yaml')}")


if __name__ == "__main__":
    main()
