"""The compiled loop's array layout: the columns of its state arrays (``si``, ``sf``, ``ri``, ``rf``, ``qi``, ``qf``,
``gi``, ``gf``), of its scheduler limits (``sched``), step log (``lgi``, ``lgf``, ``lgm``) and coefficients (``coc``),
and which arrays a `KernelState` writes."""

from __future__ import annotations

import math


INF = math.inf


# int64 scalars of the state (``si``)
(I_CURSOR, I_SEQ, I_HEAP, I_PEND, I_LIVE, I_DONE, I_EVENTS, I_N, I_CAPLEFT, I_CAPARR, I_LOG, I_LOGM, I_UHEAD,
 I_UTAIL, I_ULEN, I_PLAN_REP, I_PLAN_N, I_NMIG, I_COLD, I_MIGRATED, I_PLAN_BUDGET, I_LOCAL_N) = range(22)
N_SI = 22
# I_PLAN_BUDGET: the token budget of the planned step (0: the replica's own, `StepPlan.token_budget`); I_LOCAL_N: steps
# planned by a compiled local policy in the loop (`commitenv.sim.local_compiled`; the host counts its own plans)
# I_N: requests that arrive at all; I_CAPLEFT: captured requests not finished; I_CAPARR: arrivals are captured;
# I_LOG, I_LOGM: step log entries and their members written since the last `KernelState._drain_log`; I_UHEAD, I_UTAIL,
# I_ULEN: the requests no replica could take (`Pool.unrouted`: no active replica of their model), a linked list through
# ``wq`` like a waiting queue; I_PLAN_REP, I_PLAN_N: the replica whose local plan the host wrote (-1: none) and its
# length (``plan[:I_PLAN_N]``, -1: the plan is None, the vLLM scheduler); I_NMIG: replicas moving with their requests
# migrating (their transfers may push an event per request: the loop keeps that much heap room); I_COLD, I_MIGRATED:
# cold starts begun and requests migrated (`Pool.cold_starts`, `Pool.migrated`)
# float64 scalars (``sf``)
F_NOW, F_LAST, F_MIG_BYTES, F_MIG_J, F_MIG_SETUP, F_MIG_GBS, F_MIG_JPG = range(7)  # the engine clock; the time of the
# last event processed (heap or arrival); KV bytes migrated and the link energy of those transfers
# (`Pool.migration_bytes`, `Pool.migration_j`); the link (`MigrationSpec`: setup s, GB/s, J per GB)
# per-replica float64 columns (``rf``); R_SHARE: its SM share now, R_SSHARE: the share its segment started with (the
# step log's share)
(R_T0, R_T1, R_BT0, R_D, R_E0, R_F, R_FT, R_FE, R_ENERGY, R_FLOOR_W, R_FLOOR_T, R_FLOOR_ACC, R_SHARE, R_SSHARE, R_MEM,
 R_LOAD_T, R_LOAD_S, R_LOAD_W, R_KVB, R_WAKE_S) = range(20)
N_RF = 20
# R_MEM: the memory share it reserves (`Replica.mem_share`); R_LOAD_T: LOADING, when its cold start ends; R_LOAD_S,
# R_LOAD_W: its profile's cold start (s, W; NaN: none); R_KVB: its model's KV bytes per token; R_WAKE_S: its profile's
# activation latency (standby -> active)
# per-replica int64 columns (``ri``)
(R_UNF, R_FREE, R_SEG, R_K, R_VER, R_PENDING, R_RUN_N, R_BATCH_N, R_WHEAD, R_WLEN, R_STATE, R_WTAIL, R_NPOS, R_NEND,
 R_SCLK, R_LOGGED, R_GPU, R_MODEL, R_BUDGET, R_MAXSEQ, R_BS, R_RESERVE, R_LOCAL, R_DEST, R_MIGRATE, R_AFTER, R_LREADY,
 R_LWAIT, R_CAP) = range(29)
N_RI = 29
# R_DEST: MOVING, the GPU it goes to (-1: none); R_MIGRATE: MOVING, its migration mode (an index of
# `commitenv.sim.migration.MIGRATE_MODES`); R_AFTER: MOVING or LOADING, the state it takes once loaded; R_LREADY,
# R_LWAIT: LOADING, loaded and waiting for SMs, not begun and waiting for memory; R_CAP: its KV capacity in blocks
# R_NPOS, R_NEND: under the legacy per-segment noise, the replica's next draw and the end of its draws in the tables;
# R_SCLK: the clock level its segment started at (the step log's clock); R_LOGGED: the segment was started while the
# step log was written (`Replica.seg_log` set), so its booking is logged; R_GPU, R_MODEL: the GPU hosting it and the
# model it serves; R_BUDGET, R_MAXSEQ, R_BS, R_RESERVE: its model's scheduler limits (token budget, max sequences,
# KV block size, whether a full sequence is reserved at admission); R_LOCAL: a local policy plans its steps (1: on the
# host, 2: compiled, in the loop)
# per-request int64 columns (``qi``)
(Q_PROMPT, Q_OUT, Q_COMPUTED, Q_GENERATED, Q_BLOCKS, Q_STARTED, Q_PREEMPT, Q_REPLICA, Q_MODEL, Q_HOFF, Q_NH,
 Q_PFXN) = range(12)
N_QI = 12
# Q_HOFF, Q_NH: where its shareable prefix hash blocks start in the prefix arrays' hash list (``pfx``: `cached`) and how
# many it has (0: none, or none any more after a migration); Q_PFXN: how many of them its admission and steps have
# considered (`Req.pfx_next`)
# per-request float64 columns (``qf``)
Q_ARRIVAL, Q_FIRST, Q_FINISH, Q_OVERHEAD, Q_LAST, Q_MAXGAP = range(6)
N_QF = 6
# Q_LAST: when its latest output token was produced (engine time, -1: none yet); Q_MAXGAP: the longest gap between
# two of its consecutive output tokens so far (0 until it has two; per-token TBT, `commitenv.latency_slo`)
# per-GPU int64 columns (``gi``; G_NHOST: how many replicas it hosts, listed in ``gh``) and float64 columns (``gf``;
# GF_CLOCK_LAT: the clock-change latency of its profile)
G_CLOCK, G_PENDING, G_VER, G_NHOST = range(4)
GF_PENDING_T, GF_FLOOR_W, GF_T_FLOOR, GF_E_FLOOR, GF_CLOCK_LAT, GF_POWER = range(6)
# GF_POWER: the part's power factor (`GPU.power_factor`); ``floor_tab[g, clock, :3]``: its idle floor (active, draining,
# standby) times that factor, ``[3:]`` the same without it (a loading instance's draw is compared before the factor)
MIG_NONE, MIG_LATENCY, MIG_ALL = range(3)  # `R_MIGRATE`: `MIGRATE_MODES`' order
# the largest max_seqs of any replica (the step log's room per event), the truth table's first cell, whether the
# tables hold legacy noise draws, whether the step log is written and whether decode runs advance in closed form
# (``sched``: int64)
S_MAX_SEQS, S_CELL0, S_NOISE, S_LOG, S_CLOSED, S_DISPATCH, S_WAKE = range(7)
# S_DISPATCH: a dispatch policy routes (each arrival and re-routed request is called back to the host, `host.dispatch`);
# S_WAKE: models scale to zero (`EngineOptions.scale_to_zero`): a request no active replica can take wakes one
# `advance`'s return codes: done, and what the host does before calling again (grow the heap, refill the legacy
# noise, drain the step log); a dispatch policy's choice and a local policy's plan are asked for from inside
# (`commitenv.sim.kernel.host`)
(DONE, ASK_HEAP, ASK_NOISE, ASK_LOG) = range(4)
# the step log: per entry int64 (``lgi``) and float64 (``lgf``) columns, per member int64 columns (``lgm``)
LG_REP, LG_STEPS, LG_CLOCK, LG_N, LG_GPU = range(5)  # (LG_GPU: where the segment ran, as booked)
LF_T0, LF_T1, LF_ENERGY, LF_FLOOR, LF_SHARE = range(5)
LM_REQ, LM_NEW, LM_COMPUTED, LM_DECODE = range(4)
# coefficients per replica and clock level (``coc[replica, clock]``, its profile at its SM share): tau0..tau4, a,
# c1, c2, b, kappa
C_TAU0, C_TAU1, C_TAU2, C_TAU3, C_TAU4, C_A, C_C1, C_C2, C_B, C_KAPPA = range(10)
# the state arrays a `KernelState` writes (a copy duplicates them; tables, rows and the step log are handled apart):
# per request (indexed like ``qi``; a compaction makes them anew) and the rest (scalars, replicas, GPUs, event heap)
REQUEST_ARRAYS = ("qi", "qf", "qc", "rejected", "wq", "done_out")
ENGINE_ARRAYS = ("ri", "rf", "gi", "gf", "gh", "si", "sf", "run", "bq", "bk", "pend", "ht", "hk", "hs", "hi", "hv", "e_dyn",
                 "coc", "plan", "on_run")
