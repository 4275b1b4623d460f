"""Scenarios and their runs: the fault and metric registries, the runner, the fidelity monitor,
admission, repeats, metrics, verdicts, reports and plots.
"""
