"""mrclab: a lab for MRC-style multipath transport on an emulated multi-plane SRv6 Clos.

One import namespace over the repository's top-level folders (pyproject.toml maps ``mrclab`` to
the repository root): ``mrclab.topologies`` (the fabric as data and its Mininet builder),
``mrclab.p4src`` (the P4 program), ``mrclab.controller`` (routes, queues and faults written into
a data plane), ``mrclab.traffic`` (the MRC and RoCE endpoints), ``mrclab.experiments`` (scenarios,
runs, metrics, verdicts, reports), ``mrclab.bench`` (benchmarks) and ``mrclab.cli`` (the
``mrclab`` command line, above everything it drives). Data flows one way:
spec -> address plan -> route plan -> data plane -> endpoints -> metrics -> report.
"""
