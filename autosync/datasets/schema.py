"""The runtime dataset's schema: one row per measured trial.

Plain data: imported by search and models, importing neither. ``SCHEMA_VERSION`` is
stored in every row and in the Parquet metadata; a file of an unknown version is refused,
one of an older version is read as the current one (version 1's ``efficiency_key`` computed
from its columns; version 2's ``sent_bytes_per_step`` missing, null).

Version 2 adds ``efficiency_key``: the row's key into the efficiency table
(``EFFICIENCY_SCHEMA``, one row per measured (workload, batch, world, lossy choices), see
:mod:`autosync.efficiency`). Reading a dataset joins the efficiency columns onto the trials:
a lossless strategy has efficiency 1 by definition, a lossy one its measured value, or NaN
when it has not been measured.

Version 3 adds ``sent_bytes_per_step``: bytes one rank sent to other hosts per timed step, measured at the
emulated hosts' interfaces (:mod:`autosync.executor.measure`); null where it was not measured.
"""
from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
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
    ("efficiency_key", pa.string()),      # v2: workload|b<batch>|w<world>[x<ranks/host>]|<lossy key> (efficiency table)
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
    ("sent_bytes_per_step", pa.float64()),  # v3: per rank, to other hosts, measured on emulated hosts (else null)
    # provenance
    ("torch_version", pa.string()),
    ("cores", pa.int32()),
    ("timestamp", pa.float64()),
    ("schema_version", pa.int32()),
], metadata={b"autosync_dataset": str(SCHEMA_VERSION).encode()})

COLUMNS = tuple(SCHEMA.names)

# --- the efficiency table: one row per (workload, batch, world, lossy choices), and the reference's seeds ---
EFFICIENCY_VERSION = 2           # 2 adds pairs and pair_ratios (efficiency protocol 4); version 1 reads with them null
EFFICIENCY_KEY = ("efficiency_key",)
EFFICIENCY_SCHEMA = pa.schema([
    ("efficiency_key", pa.string()),
    ("workload", pa.string()),
    ("batch_size", pa.int32()),
    ("world_size", pa.int32()),
    ("ranks_per_host", pa.int32()),
    ("lossy_key", pa.string()),           # Strategy.lossy_key(): "lossless" for the reference rows
    ("strategy", pa.string()),            # the strategy that was trained (one of those sharing the key)
    ("status", pa.string()),              # ok | failed | timeout
    ("reason", pa.string()),
    # protocol
    ("horizon", pa.int32()), ("eval_every", pa.int32()), ("seed", pa.int32()), ("lr", pa.float64()),
    ("optimizer", pa.string()), ("protocol", pa.int32()),
    # result
    ("efficiency", pa.float64()),         # what decides: raw, or the band's lower bound where it stayed wide (protocol
                                          # 4); protocol <= 3 reported 1 within the reference's noise band
    ("efficiency_raw", pa.float64()),
    ("efficiency_lo", pa.float64()),
    ("efficiency_hi", pa.float64()),
    ("band", pa.float64()),               # the reference's seed-to-seed relative spread of steps to L*
    ("within_noise", pa.bool_()),
    ("pairs", pa.int32()),                # v2: seed pairs measured (null: one, protocol <= 3)
    ("pair_ratios", pa.string()),         # v2: JSON list of each pair's n_ref / n_cand
    ("target_loss", pa.float64()),
    ("reached_loss", pa.float64()),
    ("steps_ref", pa.float64()),
    ("steps_cand", pa.float64()),
    ("final_eval_loss", pa.float64()),
    ("final_loss_ratio", pa.float64()),
    ("final_loss_band", pa.float64()),
    ("curve", pa.string()),               # JSON: {"steps": [...], "eval_loss": [...]}
    # online signals (means over the horizon's evaluation steps)
    ("grad_error", pa.float64()),
    ("ef_norm", pa.float64()),
    ("local_drift", pa.float64()),
    ("grad_noise_scale", pa.float64()),
    # provenance
    ("wall_s", pa.float64()),
    ("torch_version", pa.string()),
    ("timestamp", pa.float64()),
    ("schema_version", pa.int32()),
], metadata={b"autosync_efficiency": str(EFFICIENCY_VERSION).encode()})
EFFICIENCY_COLUMNS = tuple(EFFICIENCY_SCHEMA.names)
#: the efficiency columns a read of the trials gets (joined by efficiency_key)
JOINED = ("efficiency", "efficiency_lo", "efficiency_hi", "within_noise", "final_loss_ratio", "grad_error",
          "ef_norm", "local_drift", "grad_noise_scale")
