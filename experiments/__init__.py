"""Experiments, in three layers: what a scenario declares (``model``: the scenario file, its fault
timeline, sweep and collective, the claims it may make), what a run of it yields (``analysis``:
metrics, verdicts against the faults, fidelity faults, the regime, plots and reports) and running it
(``run``: the runner, the endpoints, the fidelity monitor, admission, captures, sweeps, repeats,
the paper's table, the doctor). Shipped scenario files are in ``scenarios/``.
"""
