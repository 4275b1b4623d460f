"""Running scenarios: the runner (fabric, endpoints, fault timeline, telemetry, verdicts), the
endpoints' side of their contract, the fidelity monitor, admission, captures, sweeps, repeats, the
paper's table (``mrclab reproduce``), the doctor and results folders."""
