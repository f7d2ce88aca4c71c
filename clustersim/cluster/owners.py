"""Who holds an instance in the timeline (`Timeline.owner`): a job's index, or one of these."""

FREE = -1  # in the pool, for any job
SERVING = -2  # held by a serving deployment for the whole run
FLUID = -3  # held by a fluid deployment's holding for a while (cluster.fluid_holding)

__all__ = ["FREE", "SERVING", "FLUID"]
