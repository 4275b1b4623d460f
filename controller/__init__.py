"""The controller: route and queue plans derived from the fabric, the writers that put them on each
data plane (P4Runtime and Thrift on bmv2, IPv6 routes and tc eBPF programs on linux), and faults
that compose."""
