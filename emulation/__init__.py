"""The fabric emulated: Mininet nodes (hosts, BMv2 and linux switches), the network builder on one
machine or over servers (Mininet's cluster edition), every kernel call, and the run state cleanup
reads."""
