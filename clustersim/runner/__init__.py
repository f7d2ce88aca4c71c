"""Running simulations: the public API (simulate, write_run), output folders, sweeps and checks.
"""
