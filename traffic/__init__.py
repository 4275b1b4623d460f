"""The transport: MRC and a RoCE-style baseline as pure state machines, their wire format, and
what drives them (the host stack the endpoint runs, collectives, the path probe)."""
