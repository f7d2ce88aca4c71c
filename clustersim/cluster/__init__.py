"""The cluster over time: the timeline of jobs, failures, repairs, checkpoints and scheduling.

`timeline` runs the simpy environment and owns the instances' state; `jobrun` is one job's
process (with its books in `job_accounting`, its recovery in `job_recovery`); `faults` the
failure processes and repairs; `scheduler` the passes that start and serve jobs, with the
queue order, EASY backfill and preemption in `policies` and the choice of instances in
`placement`; `uplinks` jobs sharing oversubscribed leaf uplinks; `rates` failure rates and
checkpoint intervals; `outcomes` what a run produced; `ports` what each collaborator uses
of the timeline (they receive their port, never import the timeline).
"""
