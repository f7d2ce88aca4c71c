"""`python -m clustersim` is the same program as the `clustersim` command."""

from clustersim.cli import main

main()
