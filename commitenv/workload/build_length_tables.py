"""Regenerate a shipped length table from a trace: ``python -m commitenv.workload.build_length_tables TRACE OUT``.

The shipped tables were made from the two 2023 files of Azure/AzurePublicDataset with::

    python -m commitenv.workload.build_length_tables AzureLLMInferenceTrace_code_2023.csv \
        commitenv/workload/data/azure_code_lengths.json
    python -m commitenv.workload.build_length_tables AzureLLMInferenceTrace_conv_2023.csv \
        commitenv/workload/data/azure_conv_lengths.json

Only quantiles are written, never the trace itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .lengths import EmpiricalLengths
from .loaders import load_trace
from .table import WorkloadError

_ATTRIBUTION = {
    "AzureLLMInferenceTrace_code": "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_code.csv",
    "AzureLLMInferenceTrace_conv": "Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv",
}
_AZURE_TERMS = "licence CC-BY-4.0; cite Patel et al., Splitwise, ISCA 2024"


def describe_source(trace: Path, n_bins: int) -> str:
    """The ``source`` text stored in a table: origin, licence and how the numbers were computed."""
    origin = next((v for k, v in _ATTRIBUTION.items() if trace.name.startswith(k)), None)
    head = f"{origin} (file {trace.name}; {_AZURE_TERMS})" if origin else f"file {trace.name}"
    return (f"{head}. Computed by commitenv.workload.build_length_tables: quantiles of ContextTokens (prompt) and, "
            f"within {n_bins} equal-count prompt-length bins, of GeneratedTokens (output); numpy linear quantiles.")


def build(trace: str | Path, out: str | Path, *, n_bins: int = 8, source: str | None = None) -> EmpiricalLengths:
    """Fit an :class:`EmpiricalLengths` from ``trace`` and write it to ``out`` as JSON."""
    trace = Path(trace)
    table = load_trace(trace)
    lengths = EmpiricalLengths.from_table(table, n_bins=n_bins, source=source or describe_source(trace, n_bins))
    lengths.to_json(out)
    return lengths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m commitenv.workload.build_length_tables",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="trace file (Azure CSV, BurstGPT CSV or Mooncake JSONL)")
    ap.add_argument("out", help="output JSON path")
    ap.add_argument("--bins", type=int, default=8, help="prompt-length bins for conditional output quantiles")
    ap.add_argument("--source", default=None, help="override the source/attribution text")
    args = ap.parse_args(argv)
    try:
        lengths = build(args.trace, args.out, n_bins=args.bins, source=args.source)
    except (WorkloadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = lengths.summary
    print(f"wrote {args.out}: {s['n_requests']} requests; prompt mean/median/p99 "
          f"{s['prompt']['mean']:.0f}/{s['prompt']['median']:.0f}/{s['prompt']['p99']:.0f}, output "
          f"{s['output']['mean']:.1f}/{s['output']['median']:.0f}/{s['output']['p99']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
