"""The cluster over time: the timeline of jobs, failures, repairs, checkpoints and scheduling.
"""
