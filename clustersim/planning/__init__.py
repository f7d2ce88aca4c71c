"""Planning: the best parallelism, size and hardware for a training job, failures included
(`clustersim plan`). Sits above the cluster timeline (whose failure rates and Young/Daly
helpers it reuses) and below the runner; it calls the training step model, never a copy."""

from clustersim.planning.engine import Engine
from clustersim.planning.ettr import Recovery, renewal_ettr
from clustersim.planning.planner import plan
from clustersim.planning.plans import OBJECTIVES, PlanError, PlanOptions, PlanResult

__all__ = ["Engine", "Recovery", "renewal_ettr", "OBJECTIVES", "PlanError", "PlanOptions",
           "PlanResult", "plan"]
