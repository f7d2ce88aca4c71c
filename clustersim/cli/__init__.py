"""The command line: a thin shell over the Python API, one module per command group."""

from clustersim.cli.app import main

__all__ = ["main"]
