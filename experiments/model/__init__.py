"""What a scenario declares, read and checked before anything runs: the scenario file (fabric, data
plane, seed, transport, workload), its fault timeline, its sweep and collective, and the claims
(metrics and bounds) its expectations may make."""
