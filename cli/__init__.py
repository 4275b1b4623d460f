"""The ``mrclab`` command line: parses arguments and drives experiments, benchmarks and the fabric.

It sits above every package it drives (experiments, bench, controller, topologies); nothing
imports it but the console script and the tests."""
