"""clustersim: a discrete-event simulator of large AWS Trainium clusters.

The command line is a thin shell over this API, which notebooks use directly::

    import clustersim
    scenario = clustersim.load_scenario("scenarios/quickstart.yaml", overrides=["seed=3"])
    result = clustersim.simulate(scenario)
    result.summary["cluster"]["chips"]
"""

from importlib import import_module
from typing import Any

# The public names (and the version, read from the installed metadata) are looked up on first
# use (PEP 562), so that `import clustersim` (and the command line's `--version` and `--help`)
# does not pay for numpy, pandas, networkx and pydantic.
_EXPORTS = {
    "HardwareSpec": "clustersim.hardware.catalog",
    "catalog_entry": "clustersim.hardware.catalog",
    "catalog_names": "clustersim.hardware.catalog",
    "Topology": "clustersim.hardware.topology",
    "build_topology": "clustersim.hardware.build",
    "RunResult": "clustersim.runner.api",
    "run_to": "clustersim.runner.api",
    "simulate": "clustersim.runner.api",
    "write_run": "clustersim.runner.api",
    "step_timeline": "clustersim.runner.views",
    "write_step_timeline": "clustersim.runner.views",
    "write_html_report": "clustersim.runner.views",
    "Scenario": "clustersim.scenario.loader",
    "ScenarioError": "clustersim.scenario.loader",
    "load_scenario": "clustersim.scenario.loader",
}

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
    "step_timeline",
    "write_html_report",
    "write_run",
    "write_step_timeline",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clustersim")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'clustersim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
