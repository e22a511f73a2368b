"""The runtime dataset's schema: one row per measured trial.

Plain data: imported by search and models, importing neither. ``SCHEMA_VERSION`` is
stored in every row and in the Parquet metadata; a file of another version is refused.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1
KEY = ("context_id", "strategy_hash")

SCHEMA = pa.schema([
    # context: what was trained where
    ("context_id", pa.string()),          # workload|b<batch>|<cluster spec>
    ("workload", pa.string()),
    ("cluster", pa.string()),
    ("world_size", pa.int32()),
    ("nodes", pa.int32()),
    ("ranks_per_node", pa.int32()),
    ("bandwidth_bps", pa.float64()),      # slowest host link
    ("latency_s", pa.float64()),
    ("heterogeneous", pa.bool_()),
    ("batch_size", pa.int32()),
    # profile summary
    ("n_params", pa.int64()),
    ("n_tensors", pa.int32()),
    ("model_bytes", pa.int64()),
    ("embedding_bytes_frac", pa.float64()),
    ("forward_s", pa.float64()),
    ("backward_s", pa.float64()),
    ("optimizer_s", pa.float64()),
    ("flops_per_step", pa.float64()),
    ("allreduce_alpha_s", pa.float64()),
    ("allreduce_beta_s_per_byte", pa.float64()),
    # strategy
    ("strategy", pa.string()),            # canonical JSON
    ("strategy_hash", pa.string()),
    ("source", pa.string()),              # baseline name | random | tune
    ("lossless", pa.bool_()),
    # analytical simulator
    ("sim_step_s", pa.float64()),
    ("sim_compute_s", pa.float64()),
    ("sim_exposed_comm_s", pa.float64()),
    ("sim_comm_s", pa.float64()),
    ("sim_bytes", pa.string()),           # JSON: bytes sent per plan
    # measurement
    ("status", pa.string()),              # ok | failed | timeout
    ("reason", pa.string()),
    ("samples_per_s", pa.float64()),
    ("median_step_s", pa.float64()),      # TrialResult.step_s: the median step, but the MEAN over whole periods
                                          # for periodic modes (local SGD); name kept for schema version 1
    ("cv", pa.float64()),
    ("steps", pa.int32()),
    ("peak_mem_mb", pa.float64()),
    # provenance
    ("torch_version", pa.string()),
    ("cores", pa.int32()),
    ("timestamp", pa.float64()),
    ("schema_version", pa.int32()),
], metadata={b"autosync_dataset": str(SCHEMA_VERSION).encode()})

COLUMNS = tuple(SCHEMA.names)
