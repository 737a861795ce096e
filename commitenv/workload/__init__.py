"""Workloads: request tables from public traces, synthetic generators and built-in days.

Sources (``load_trace``, ``synthesize``, ``builtin_workload``) all produce a :class:`RequestTable`;
``transforms`` reshape tables (windows, rate scaling, time compression, multi-tenant merges).
"""

from .builtin import AZURE_CODE_DAY_HOURLY_COUNTS, azure_code_day, azure_conv_hour, builtin_workload, list_builtin
from .lengths import EmpiricalLengths, builtin_lengths
from .loaders import load_azure_csv, load_burstgpt_csv, load_mooncake_jsonl, load_plain_csv, load_trace
from .synthetic import synthesize
from .table import RequestTable, WorkloadError, make_table
from .transforms import compress_time, merge, scale_rate, select_rows, tag_tenant, time_window

__all__ = [
    "AZURE_CODE_DAY_HOURLY_COUNTS",
    "EmpiricalLengths",
    "RequestTable",
    "WorkloadError",
    "azure_code_day",
    "azure_conv_hour",
    "builtin_lengths",
    "builtin_workload",
    "compress_time",
    "list_builtin",
    "load_azure_csv",
    "load_burstgpt_csv",
    "load_mooncake_jsonl",
    "load_plain_csv",
    "load_trace",
    "make_table",
    "merge",
    "scale_rate",
    "select_rows",
    "synthesize",
    "tag_tenant",
    "time_window",
]
