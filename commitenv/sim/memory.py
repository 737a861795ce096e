"""GPU memory of co-located model instances: each instance is a vLLM process that reserves, when it is placed, a
part of its GPU's usable memory (its memory share) and holds its footprint (weights, activations, CUDA graphs) plus a
fixed KV cache in it; vLLM cannot grow or share a running instance's KV cache. The memory share is the instance's
placement SM share, or, when the placement declares a KV budget (``kv_tokens``, what a per-process
``gpu_memory_utilization`` sets in vLLM), its footprint plus that budget: then memory and SMs are two separate
resources, as in Festina's bin packing (sec. 3.5).

A profile's ``scheduler.kv_capacity_tokens`` is the KV cache of an instance that has its GPU to itself: usable memory
(``gpu_memory_utilization`` x ``gpu.memory_gb``) minus the footprint. The footprint is recovered from it, so an
instance at share 1 keeps exactly its profile's capacity, and one at share s has s x usable - footprint. The memory
share travels with the instance when it moves (a later SM share change does not move memory); the memory shares on a
GPU sum to at most 1, and every instance must hold one request at its context limit (vLLM refuses to start otherwise).
"""

from __future__ import annotations

import math

from commitenv.profiles.schema import Profile

# vLLM's default gpu_memory_utilization (vllm EngineArgs), the fraction every profile's KV capacity is derived with
GPU_MEMORY_UTILIZATION = 0.9
GB = 1e9


class PlacementMemoryError(ValueError):
    """A placement or move whose instances' memory does not fit its GPU."""


def usable_bytes(profile: Profile) -> float:
    """The memory vLLM may reserve on the profile's GPU."""
    return GPU_MEMORY_UTILIZATION * profile.gpu.memory_gb * GB


def block_bytes(profile: Profile) -> float:
    """Bytes of one KV block of the profile's model."""
    return profile.scheduler.block_size * profile.model.kv_bytes_per_token


def footprint_bytes(profile: Profile) -> float:
    """Weights, activations and CUDA graphs of one instance: usable memory minus its KV cache at share 1."""
    return usable_bytes(profile) - profile.kv_capacity_blocks * block_bytes(profile)


def min_blocks(profile: Profile) -> int:
    """KV blocks of one request at the context limit: the least vLLM starts with."""
    return -(-profile.scheduler.context_limit // profile.scheduler.block_size)


def instance_memory(profile: Profile, share: float, kv_tokens: int | None, where: str) -> tuple[float, int]:
    """(memory share, KV blocks) of an instance placed at SM share ``share`` that declares ``kv_tokens`` of KV budget
    (None: it reserves its SM share, `kv_blocks`); raises naming ``where`` when the budget cannot hold one request
    at the context limit or the footprint and budget exceed the usable memory."""
    if kv_tokens is None:
        return share, kv_blocks(profile, share, where)
    blocks = kv_tokens // profile.scheduler.block_size
    if blocks < min_blocks(profile):
        raise PlacementMemoryError(
            f"{where}: {profile.model.name} declares kv_tokens {kv_tokens} ({blocks} blocks of "
            f"{profile.scheduler.block_size}), less than one request at its context limit "
            f"({profile.scheduler.context_limit} tokens); vLLM refuses to start such an instance")
    need = footprint_bytes(profile) + blocks * block_bytes(profile)
    if need > usable_bytes(profile) * (1 + 1e-12):
        raise PlacementMemoryError(
            f"{where}: {profile.model.name} with kv_tokens {kv_tokens} needs {footprint_bytes(profile) / GB:.2f} GB of "
            f"footprint plus {blocks * block_bytes(profile) / GB:.2f} GB of KV cache, more than the "
            f"{usable_bytes(profile) / GB:.2f} GB usable on its GPU")
    return need / usable_bytes(profile), blocks


def kv_blocks(profile: Profile, memory_share: float, where: str) -> int:
    """KV blocks of an instance reserving ``memory_share`` of its GPU's usable memory: the profile's capacity less
    the blocks the rest of the GPU would have held; raises (naming ``where``) below one request at the context
    limit."""
    lost = (1.0 - memory_share) * usable_bytes(profile) / block_bytes(profile)
    blocks = max(math.floor(profile.kv_capacity_blocks - lost + 1e-9), 0)
    if blocks < min_blocks(profile):
        kv_gb = max(memory_share * usable_bytes(profile) - footprint_bytes(profile), 0.0) / GB
        raise PlacementMemoryError(
            f"{where}: {profile.model.name} at memory share {memory_share:.3f} of {usable_bytes(profile) / GB:.2f} GB "
            f"usable keeps {kv_gb:.2f} GB for its KV cache after its {footprint_bytes(profile) / GB:.2f} GB footprint "
            f"({blocks * profile.scheduler.block_size} tokens), less than one request at its context limit "
            f"({profile.scheduler.context_limit} tokens); vLLM refuses to start such an instance: "
            "give it a larger share"
        )
    return blocks
