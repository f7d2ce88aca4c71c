"""The largest (and smallest) values clustersim accepts, in one place (docs/limits.md).

Each bound is either physical (no chip has a petabyte of HBM; a checkpoint is not written in
a nanosecond) or what one machine can simulate in reasonable time and memory (a cluster of
two million chips builds in about two minutes and 5 GiB; a run of two million events takes
about fifteen minutes). Values beyond them are refused with the bound in the message, before
any work is done. Keep docs/limits.md in step with this file (tests/test_limits.py checks it).
"""

from __future__ import annotations

__all__ = [name for name in dir() if name.isupper()]

YEAR_S = 365 * 86400.0

# Time
MAX_DURATION_S = 10 * YEAR_S  # a scenario's horizon
MIN_DURATION_S = 1.0
MAX_ANY_DURATION_S = 1e12  # any duration at all (an MTBF of 30,000 years)
MIN_CHECKPOINT_WRITE_S = 1e-3  # when not zero
MIN_CHECKPOINT_INTERVAL_S = 1.0
MIN_TRACE_BIN_S = 1.0
MIN_TRACE_RUN_S = 1.0  # a native job table's run_for (1e-9 s gave a job done with 0 steps)

# Cluster
MAX_INSTANCES = 131_072  # 4x the 32,768 instances of the 524,288-chip library scenario
MAX_CHIPS = 2_097_152
MAX_SPINES = 4_096
MAX_INSTANCES_PER_LEAF = 4_096
MIN_OVERSUBSCRIPTION = 0.01
MAX_OVERSUBSCRIPTION = 100.0
MAX_TOPOLOGY_ELEMENTS = 12_000_000  # graph nodes + links: about 5 GiB

# Hardware figures
MAX_TFLOPS = 1e5  # per chip (the largest today are ~1e4 at FP4)
MAX_BYTES = 2.0**50  # any memory size: 1 PiB
MIN_BANDWIDTH_BYTES_PER_S = 1e6  # 1 MB/s
MAX_BANDWIDTH_BYTES_PER_S = 1e21  # sanity only: 1e20 stands for "never limits" in tests
MAX_LATENCY_S = 1.0
MAX_POWER_W = 1e6
MAX_PRICE_PER_HOUR_USD = 1e5
MIN_EFFICIENCY = 0.01  # fraction of a peak reached
MAX_CHIPS_PER_INSTANCE = 1_024
MAX_INSTANCES_PER_ULTRASERVER = 1_024
MAX_RANKS_PER_CHIP = 64

# Models and jobs
MAX_LAYERS = 1_024
MAX_HIDDEN = 262_144
MAX_HEADS = 4_096
MAX_VOCAB = 16_777_216
MAX_SEQ_LEN = 4_194_304
MAX_EXPERTS = 4_096
MAX_PARALLEL_DEGREE = 2_097_152  # tp, pp, dp, ep each
MAX_INTERLEAVE = 64
MAX_GLOBAL_BATCH = 16_777_216  # sequences per step
MAX_MICRO_BATCH = 65_536
MAX_PIPELINE_PASSES = 2_097_152  # pp x interleave x micro-batches per step, the schedule
MAX_STEPS = 10**12
MAX_JOBS = 1_000_000  # written plus generated (rainier-year's million load in ~1 min, 2.5 GiB)
MAX_PRIORITY = 10**9
# A template's log-normal run-time sigma: e^(10 x 6) stays a float at a million draws (the
# sixth standard deviation); sigma 1e6 overflowed exp (published traces fit 1 to 3)
MAX_RUN_TIME_SIGMA = 10.0

# Failures and stragglers
MAX_RATE_PER_S = 1.0  # any rate per unit: one event a second
MIN_MTBF_S = 1.0
MAX_FAILURE_SCALE = 10_000.0
MIN_WEIBULL_SHAPE = 0.1
MAX_WEIBULL_SHAPE = 20.0
MAX_SLOWDOWN = 100.0

# Serving (clustersim.scenario.serving)
MAX_REQUEST_RATE_PER_S = 1e5  # requests per second to one deployment
MAX_REQUESTS = 100_000_000  # per deployment (a million run in about a minute)
MAX_REPLICAS = 100_000
# Measured on serving-1m-requests (1 h, 64 replicas): about 390 bytes and 41 us of CPU per
# request (100,000 requests: 5.7 s, 277 MiB; 400,000: 18.1 s, 388 MiB), so 10 million take
# about 4 GiB and 7 minutes.
MAX_SERVED_REQUESTS = 10_000_000  # expected requests of a run, every deployment together
MAX_REQUEST_TRACE_BYTES = 512 * 2**20  # a request trace file (CSV or Parquet)
MAX_REQUEST_TRACE_ROWS = MAX_SERVED_REQUESTS
MAX_RATE_SEARCH_REQUESTS = 1_000_000  # expected requests of one --find-rate trial
# Fleet-day runs (clustersim.serving.fleetday): fluid steps x (fluid deployments + jobs + 1),
# the rows of their per-step books. Measured on the docs/fleet-day.md example (one
# deployment, one job, a step a minute): 20 to 60 days added 7.9 MB and 2.2 s of CPU for
# 57,600 steps, about 70 bytes and 20 us a row, so the limit is about 1.4 GB and 7 minutes.
MAX_FLEET_DAY_ROWS = 20_000_000

# Planning (clustersim.planning, `clustersim plan`)
MAX_PLAN_SIZES = 32  # chip counts of --chips (about 9 s of CPU each on the quickstart)
MAX_PLAN_CANDIDATES = 1_000_000  # candidates listed over every hardware and size

# Runs
MAX_EVENTS = 16_000_000  # estimated per replication before it starts
MAX_REPLICATIONS = 1_000
MAX_SWEEP_RUNS = 10_000  # variants x grid points x seeds
MAX_SEED = 2**63 - 1

# Files
MAX_YAML_BYTES = 8 * 2**20
MAX_YAML_NODES = 1_000_000  # values once aliases are expanded
MAX_YAML_DEPTH = 64
MAX_TRACE_FILE_BYTES = 256 * 2**20  # a workload's job trace
MAX_TRACE_ROWS = MAX_JOBS
# A job trace's dates: the published traces span 2017-2023; pandas' nanosecond clock ends in
# 1677 and 2262 (a year-1 or year-9999 date overflowed).
TRACE_FIRST_YEAR = 1900
TRACE_LAST_YEAR = 2200
# GPUs of one trace job, per instance of the cluster: more than any mapping can place (the
# largest instance has MAX_CHIPS_PER_INSTANCE chips), refused before mapping it (1e300 GPUs
# printed a 300-digit instance count).
MAX_TRACE_GPUS_PER_INSTANCE = MAX_CHIPS_PER_INSTANCE
# A run's summary.json (read by `report`) and a golden (read by `check`): about 2.3 KB a job
# (rainier-2000-jobs: 4.65 MB); past SUMMARY_JOBS jobs it lists the largest 100
# (cluster.fleet), so a run of MAX_JOBS jobs writes under a MB there, every job to
# job_summary.parquet.
MAX_SUMMARY_BYTES = 256 * 2**20

__all__ = [name for name in dir() if name.isupper()]
