"""Scenarios: validated YAML files (``scenarios/*.yaml``) naming a pool, a workload window, hourly energy
commitments and settlement rates; each is registered with Gymnasium as ``commitenv/<name>-v0``.

Typical use by an environment::

    sc = load_scenario("commitenv/epact-h20-day-v0")
    commit = commitments_mj(sc)                 # frozen at construction
    table = scenario_workload(sc, seed)         # per episode
    opts = engine_options(sc, seed)
    prof = scenario_profile(sc)
"""

from typing import TYPE_CHECKING

from commitenv._lazy import lazy_names

# Public names and the submodule defining each. Loaded on first use, so that ``import commitenv`` (which
# registers the scenarios) does not pull in the engine.
_WHERE = {
    **dict.fromkeys(
        ["engine_options", "scenario_layout", "scenario_profile", "scenario_profile_path", "scenario_profiles",
         "scenario_tenant_model", "scenario_workload", "workload_seed"], "build"
    ),
    **dict.fromkeys(
        ["CACHE_FORMAT", "cache_root", "commitments_mj", "compute_reference", "reference_cache_path",
         "reference_hourly_energy_j", "reference_key", "reference_workload_seed"], "commitments"
    ),
    **dict.fromkeys(
        ["check_scenario", "env_id", "list_scenarios", "load_scenario", "parse_scenario", "scenarios_dir"], "loader"
    ),
    **dict.fromkeys(["describe_scenarios", "register_all"], "registry"),
    **dict.fromkeys(
        ["CommitmentSpec", "InitialConfig", "InstanceSpec", "ModelSpec", "NoiseSpecModel", "ObservationSpec",
         "PoolSpec", "ReferenceSpec", "Scenario", "ScenarioError", "WorkloadSpec"], "schema"
    ),
}


__getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


if TYPE_CHECKING:  # for type checkers and IDEs
    from commitenv.scenarios.build import (
        engine_options,
        scenario_layout,
        scenario_profile,
        scenario_profile_path,
        scenario_profiles,
        scenario_tenant_model,
        scenario_workload,
        workload_seed,
    )
    from commitenv.scenarios.commitments import (
        CACHE_FORMAT,
        cache_root,
        commitments_mj,
        compute_reference,
        reference_cache_path,
        reference_hourly_energy_j,
        reference_key,
        reference_workload_seed,
    )
    from commitenv.scenarios.loader import (
        check_scenario,
        env_id,
        list_scenarios,
        load_scenario,
        parse_scenario,
        scenarios_dir,
    )
    from commitenv.scenarios.registry import describe_scenarios, register_all
    from commitenv.scenarios.schema import (
        CommitmentSpec,
        InitialConfig,
        InstanceSpec,
        ModelSpec,
        NoiseSpecModel,
        ObservationSpec,
        PoolSpec,
        ReferenceSpec,
        Scenario,
        ScenarioError,
        WorkloadSpec,
    )

__all__ = [
    "CACHE_FORMAT",
    "CommitmentSpec",
    "InitialConfig",
    "InstanceSpec",
    "ModelSpec",
    "NoiseSpecModel",
    "ObservationSpec",
    "PoolSpec",
    "ReferenceSpec",
    "Scenario",
    "ScenarioError",
    "WorkloadSpec",
    "cache_root",
    "check_scenario",
    "commitments_mj",
    "compute_reference",
    "describe_scenarios",
    "engine_options",
    "env_id",
    "list_scenarios",
    "load_scenario",
    "parse_scenario",
    "reference_cache_path",
    "reference_hourly_energy_j",
    "reference_key",
    "reference_workload_seed",
    "register_all",
    "scenario_layout",
    "scenario_profile",
    "scenario_profile_path",
    "scenario_profiles",
    "scenario_tenant_model",
    "scenario_workload",
    "scenarios_dir",
    "workload_seed",
]
