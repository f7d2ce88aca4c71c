"""Training on one placement: model shapes, the per-layer workload, pipeline schedules and the
simpy step model that times one training step.
"""
