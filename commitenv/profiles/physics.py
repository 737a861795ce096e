"""The physical model the shipped profiles are derived from (`commitenv.profiles.derive` writes them): the
Hopper-wide constants, the base-parameter records (`Gpu`, `Model`, `Spec`, `Leaderboard`), the time and
energy laws per clock level, the fit to StepSplit, KV capacity and cold start.

Physical model, per clock level f (f_top: the profile's top clock, f_spec: the clock at which the
spec-sheet FLOPS hold, the 1980 MHz boost clock of all three Hopper parts here)

Time (seconds)
  compute-bound, scale as 1/f:
    tau1 = 2*params / (peak_gemm*(f/f_spec)*mfu)                   per prefill token
    tau4 = 4*layers*q_dim / (peak_attn*(f/f_spec)*mfu)             per causal (query, key) pair
  memory-bound, scale weakly, by g(f) = 1 + gamma*(f_top/f - 1) (HBM clock is fixed; the SM clock only
  limits the issue rate):
    tau0 = (weight_bytes/(bandwidth*mem_eff) + launch) * g(f)       weight read + launch overhead per step
    tau3 = kv_bytes_per_token/(bandwidth*mem_eff) * g(f)            KV read per context token
  per decode request, both kinds:
    tau2 = t_req*g(f) + eta_dec * 2*params/(peak_gemm*(f/f_spec)*mfu)
           (per-sequence decode work, and the part eta_dec of the token's GEMM compute not hidden
           under the weight read)

Power (watts)
    P_idle(f) = standby + (idle_top - standby) * f/f_top             clock tree + leakage rise with f
    P_sm(f)   = P_sm_top * (f/f_top) * (max(f, f_v)/f_top)**(k-1)    ~ f*V(f)**2, V flat below f_v
    P_sm_top  = prefill_power_w - P_idle(f_top)                      compute-bound busy power = TDP at f_top
  compute work draws P_idle + 1.0*P_sm, memory-bound work P_idle + u_dec*P_sm; HBM traffic costs
  hbm_j_per_gb per GB read whatever the clock.

Energy (joules, whole GPU, idle floor included) = time x power per term, plus HBM energy:
    a     = tau0*P_mem + weight_gb*hbm_j_per_gb       c1 = tau1*P_comp       c2 = tau4*P_comp
    kappa = tau3*P_mem + kv_gb*hbm_j_per_gb           b  = t_req*g*P_mem + tau2_comp*P_comp

The Hopper decode constants (launch per layer, t_req per layer, u_dec) and the H100 MFU are fitted in
closed form to StepSplit's Qwen2.5-7B/H100 figures (:func:`fit_stepsplit_h100`) and carried over to
H20/H200 and the other H100 models. ``k = 3`` follows Festina's F**3 energy proxy (EWR, sec. 3.5.1);
``f_v = 795 MHz`` is Festina's profiling floor, below which EVeREST finds no further voltage reduction (sec. 3.2.1). Together with the
idle floor this gives Festina's U-shaped energy per token across clocks (Observation Two, sec. 2.2):
interior minima on H20 and H200; on H100 the bottom of the U falls on its lowest level, 705 MHz.

Cold start (``Spec.load``): load_s = weight_gb / (PCIe bandwidth x efficiency) + engine init, drawn at the
active-idle power of the top clock (``latencies.load_s``, ``latencies.load_w``).
"""

from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------------
# Hopper-wide constants (assumptions unless noted; the calibration knobs are the per-GPU ones in `derive`)
# ---------------------------------------------------------------------------------------------------
MEM_EFF = 0.80  # achievable fraction of HBM peak bandwidth in decode GEMV / paged-attention kernels
GAMMA = 0.15  # clock sensitivity of memory-bound work: t ~ 1 + GAMMA*(f_top/f - 1)
POWER_EXP_K = 3.0  # dynamic SM power ~ f**K above the voltage floor (Festina EWR uses F**3)
VOLTAGE_FLOOR_MHZ = 795  # below this, voltage stops falling (Festina sec. 3.2.1 citing EVeREST)
HBM_J_PER_GB = 0.05  # ~6 pJ/bit: HBM3 DRAM+PHY ~4 pJ/bit plus on-chip L2/NoC transport
ETA_DEC = 0.5  # fraction of a decode token's GEMM compute not hidden under the weight read
GB = 1e9

# StepSplit (papers/stepsplit.txt) Qwen2.5-7B on H100, the numbers the H100 fit reproduces
SS_DECODE_1_J = 2.66  # energy of one decode step, 1 request, input length 512 (sec. 4, Fig. 4a)
SS_DECODE_256_J = 9.15  # same with 256 requests
SS_CONTEXT = 512
SS_TAU0_S = 6.68e-3  # fitted step duration at zero tokens (Insight 2, Fig. 5a)
SS_DECODE_MEDIAN_S = 6.70e-3  # median decode step (Insight 2)
SS_PREFILL_TOKENS = 7142  # one step prefilling a 7,142-token input lasts 158 ms (Insight 3)
SS_PREFILL_S = 0.158
FIT_SPEC = "h100-qwen2.5-7b"  # the spec whose figures the Hopper constants are fitted to

# Cold start (model load), assumptions; see `_LOAD_SRC`
PCIE_GBS = 64.0  # PCIe Gen5 x16 nominal, per direction
PCIE_EFF = 0.80  # achievable fraction for pinned host-to-device copies
ENGINE_INIT_S = 30.0  # vLLM engine initialisation after the weight copy


@dataclass(frozen=True)
class Gpu:
    """Base parameters of one GPU (spec figures, anchors and calibration knobs)."""

    name: str
    memory_gb: float
    bandwidth_gbs: float
    tdp_w: float
    gemm_tflops: float  # dense tensor peak in the weights' dtype at spec_clock_mhz
    attn_tflops: float  # dense BF16 peak (attention runs on the BF16 KV cache)
    spec_clock_mhz: int
    clocks_mhz: tuple[int, ...]
    idle_top_w: float  # active idle (model loaded, engine up, no work) at the top clock
    standby_w: float  # weights resident, engine paused, clock parked at the lowest level
    prefill_power_w: float  # busy power of a compute-bound step at the top clock
    mfu: float  # achieved fraction of peak in prefill GEMMs and attention
    src: dict[str, str]  # provenance of each of the above


@dataclass(frozen=True)
class Model:
    """Transformer shape needed by the laws."""

    name: str
    params_b: float
    weight_gb: float
    layers: int
    q_dim: int  # query heads x head dim (attention FLOPs per pair per layer = 4*q_dim)
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: int
    src: dict[str, str]

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes


@dataclass(frozen=True)
class Spec:
    """One profile: GPU x model, engine settings, and the Hopper decode constants it uses."""

    name: str
    gpu: Gpu
    model: Model
    token_budget: int
    max_seqs: int
    context_limit: int
    block_size: int
    gpu_mem_util: float
    activation_gb: float
    clock_change_s: float
    activation_s: float
    src: dict[str, str]
    launch_per_layer_s: float = 0.0  # from the H100 fit
    t_req_per_layer_s: float = 0.0  # from the H100 fit
    u_dec: float = 0.0  # from the H100 fit
    fit_note: str = ""
    load: bool = False  # write latencies.load_s/load_w (cold start); off keeps older profiles byte-identical
    leaderboard: tuple[Leaderboard, ...] = ()  # ML.ENERGY rows to check against (stated in notes when load is on)


@dataclass(frozen=True)
class Leaderboard:
    """One ML.ENERGY leaderboard row used as a check (never as a fitted input)."""

    what: str  # model, leaderboard version, task, file
    batch: float  # average batch size
    output_len: float  # average output tokens per request
    j_per_token: float  # energy per output token (whole GPU)
    prompt_len: int = 512  # assumed: the leaderboard files give no input length


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------
def _g(spec: Spec, f: float) -> float:
    """Slow-down of memory-bound work at clock f relative to the top clock."""
    return 1.0 + GAMMA * (max(spec.gpu.clocks_mhz) / f - 1.0)


def _peak(spec: Spec, f: float, tflops: float) -> float:
    return tflops * 1e12 * f / spec.gpu.spec_clock_mhz


def _flops_token(m: Model) -> float:
    return 2.0 * m.params_b * 1e9


def _flops_pair(m: Model) -> float:
    return 4.0 * m.layers * m.q_dim


def idle_power(spec: Spec, f: float) -> float:
    """Active-idle power (W) of a replica held at clock f."""
    g = spec.gpu
    return g.standby_w + (g.idle_top_w - g.standby_w) * f / max(g.clocks_mhz)


def sm_power(spec: Spec, f: float) -> float:
    """Dynamic SM power (W) at full compute utilisation and clock f: ~ f*V(f)**2, V flat below the floor."""
    g = spec.gpu
    top = max(g.clocks_mhz)
    p_top = g.prefill_power_w - g.idle_top_w
    return p_top * (f / top) * (max(f, VOLTAGE_FLOOR_MHZ) / top) ** (POWER_EXP_K - 1.0)


def time_law(spec: Spec, f: float) -> dict[str, float]:
    """tau0..tau4 (s) at clock f."""
    g, m = spec.gpu, spec.model
    bw = g.bandwidth_gbs * GB * MEM_EFF
    gf = _g(spec, f)
    comp_tok = _flops_token(m) / (_peak(spec, f, g.gemm_tflops) * g.mfu)
    return {
        "tau0": (m.weight_gb * GB / bw + spec.launch_per_layer_s * m.layers) * gf,
        "tau1": comp_tok,
        "tau2": spec.t_req_per_layer_s * m.layers * gf + ETA_DEC * comp_tok,
        "tau3": m.kv_bytes_per_token / bw * gf,
        "tau4": _flops_pair(m) / (_peak(spec, f, g.attn_tflops) * g.mfu),
    }


def energy_law(spec: Spec, f: float) -> dict[str, float]:
    """a, c1, c2, b, kappa (J) at clock f: time x power per term plus HBM traffic energy."""
    m = spec.model
    t = time_law(spec, f)
    p_comp = idle_power(spec, f) + sm_power(spec, f)
    p_mem = idle_power(spec, f) + spec.u_dec * sm_power(spec, f)
    t2_mem = spec.t_req_per_layer_s * m.layers * _g(spec, f)
    return {
        "a": t["tau0"] * p_mem + m.weight_gb * HBM_J_PER_GB,
        "c1": t["tau1"] * p_comp,
        "c2": t["tau4"] * p_comp,
        "b": t2_mem * p_mem + (t["tau2"] - t2_mem) * p_comp,
        "kappa": t["tau3"] * p_mem + m.kv_bytes_per_token / GB * HBM_J_PER_GB,
    }


@dataclass(frozen=True)
class Fit:
    """Hopper decode constants and H100 MFU fitted to StepSplit (see :func:`fit_stepsplit_h100`)."""

    launch_per_layer_s: float
    t_req_per_layer_s: float
    u_dec: float
    mfu: float


def fit_stepsplit_h100(spec: Spec) -> Fit:
    """Closed-form fit of launch overhead, MFU, u_dec and t_req to StepSplit's Qwen2.5-7B/H100 figures.

    tau0 = 6.68 ms (zero-token step); the 7,142-token prefill step = 158 ms; a = E(1) - slope and
    b + 512*kappa = slope = (9.15 - 2.66)/255 J, so E(1) = 2.66 J and E(256) = 9.15 J exactly.
    """
    g, m = spec.gpu, spec.model
    f = float(max(g.clocks_mhz))
    bw = g.bandwidth_gbs * GB * MEM_EFF
    launch = (SS_TAU0_S - m.weight_gb * GB / bw) / m.layers
    pairs = SS_PREFILL_TOKENS * (SS_PREFILL_TOKENS + 1) / 2
    work = SS_PREFILL_TOKENS * _flops_token(m) / _peak(spec, f, g.gemm_tflops) + pairs * _flops_pair(m) / _peak(spec, f, g.attn_tflops)
    mfu = work / (SS_PREFILL_S - SS_TAU0_S)
    slope = (SS_DECODE_256_J - SS_DECODE_1_J) / 255.0
    a = SS_DECODE_1_J - slope
    p_idle, p_sm = idle_power(spec, f), sm_power(spec, f)
    u_dec = ((a - m.weight_gb * HBM_J_PER_GB) / SS_TAU0_S - p_idle) / p_sm
    p_mem, p_comp = p_idle + u_dec * p_sm, p_idle + p_sm
    kappa = m.kv_bytes_per_token / bw * p_mem + m.kv_bytes_per_token / GB * HBM_J_PER_GB
    b = slope - SS_CONTEXT * kappa
    t_comp = ETA_DEC * _flops_token(m) / (_peak(spec, f, g.gemm_tflops) * mfu)
    t_req = (b - t_comp * p_comp) / p_mem
    return Fit(launch, t_req / m.layers, u_dec, mfu)


def kv_capacity_tokens(spec: Spec) -> int:
    free = spec.gpu_mem_util * spec.gpu.memory_gb * GB - spec.model.weight_gb * GB - spec.activation_gb * GB
    return int(free // spec.model.kv_bytes_per_token) // spec.block_size * spec.block_size


def load_time_s(spec: Spec) -> float:
    """Cold start: weight copy from host DRAM over PCIe plus engine initialisation (s)."""
    return spec.model.weight_gb / (PCIE_GBS * PCIE_EFF) + ENGINE_INIT_S


def load_power_w(spec: Spec) -> float:
    """Power during a cold start: active idle at the reference (top) clock (W)."""
    return idle_power(spec, max(spec.gpu.clocks_mhz))


def per_output_token_j(spec: Spec, f: float, n: float, prompt: float, output: float) -> tuple[float, float]:
    """Energy per output token in steady decoding of n requests at mean context prompt + output/2: decode only,
    and with each request's marginal prefill (c1*P + c2*P(P+1)/2) spread over its output tokens."""
    _, e = _step(spec, f, n=n, L=n * (prompt + output / 2))
    el = energy_law(spec, f)
    pre = el["c1"] * prompt + el["c2"] * prompt * (prompt + 1) / 2
    return e / n, e / n + pre / output


def _step(spec: Spec, f: float, P: float = 0, n: float = 0, L: float = 0, A: float = 0) -> tuple[float, float]:
    t, e = time_law(spec, f), energy_law(spec, f)
    time = t["tau0"] + t["tau1"] * P + t["tau2"] * n + t["tau3"] * L + t["tau4"] * A
    energy = e["a"] + e["c1"] * P + e["c2"] * A + e["b"] * n + e["kappa"] * L
    return time, energy


def request_marginal_j(spec: Spec, f: float, prompt: int = 2048, output: int = 28, share_with: int = 1) -> float:
    """Energy above idle of one request: one prefill chunk, then output-1 decode steps.

    ``share_with`` > 1 bills the decode steps' shared term a (above idle) 1/share_with, as when the request
    decodes alongside others at full capacity.
    """
    idle = idle_power(spec, f)
    t, e = _step(spec, f, P=prompt, A=prompt * (prompt + 1) / 2)
    total = e - idle * t
    tl, el = time_law(spec, f), energy_law(spec, f)
    shared = el["a"] - idle * tl["tau0"]
    for j in range(1, output):
        t, e = _step(spec, f, n=1, L=prompt + j)
        total += (e - idle * t) - shared + shared / share_with
    return total
