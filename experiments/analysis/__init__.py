"""What a run yields, from its telemetry and its fault timeline: goodput and completion metrics,
verdicts against what the faults left of the fabric, the fidelity faults and which verdicts they
void, collectives' figures, the regime beside the paper's, plots and reports."""
