"""The fabric: its spec (YAML), sizing, address plan, and the emulation that runs it in network
namespaces (Mininet nodes, veths, the kernel calls, the run state that cleanup reads)."""
