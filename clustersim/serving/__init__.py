"""Inference serving on the cluster: deployments' replicas with continuous batching, a paged
KV cache and iteration times from the same roofline and collectives as training."""

from clustersim.serving.iteration import IterationModel, ReplicaShape, kv_bytes_per_token
from clustersim.serving.simulate import (
    ServingResult,
    check_request_trace_rows,
    check_serving_fit,
    deployment_figures,
    replica_series_table,
    requests_table,
    simulate_serving,
)

__all__ = ["IterationModel", "ReplicaShape", "kv_bytes_per_token", "ServingResult",
           "simulate_serving", "deployment_figures", "requests_table", "replica_series_table",
           "check_serving_fit", "check_request_trace_rows"]
