"""clustersim: a discrete-event simulator of large AWS Trainium clusters.

The command line is a thin shell over this API, which notebooks use directly::

    import clustersim
    scenario = clustersim.load_scenario("scenarios/quickstart.yaml", overrides=["seed=3"])
    result = clustersim.simulate(scenario)
    result.summary["cluster"]["chips"]
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("clustersim")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

from clustersim.hardware.catalog import HardwareSpec, catalog_entry, catalog_names  # noqa: E402
from clustersim.hardware.topology import Topology, build_topology  # noqa: E402
from clustersim.runner.api import RunResult, run_to, simulate, write_run  # noqa: E402
from clustersim.scenario.loader import Scenario, ScenarioError, load_scenario  # noqa: E402

__all__ = [
    "__version__",
    "HardwareSpec",
    "RunResult",
    "Scenario",
    "ScenarioError",
    "Topology",
    "build_topology",
    "catalog_entry",
    "catalog_names",
    "load_scenario",
    "run_to",
    "simulate",
    "write_run",
]
