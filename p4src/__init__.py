"""P4_16 v1model programs. ``MRCLAB_P4`` is the data plane; ``FORWARD_P4`` the trivial yardstick."""

from pathlib import Path

MRCLAB_P4 = Path(__file__).with_name("mrclab.p4")
FORWARD_P4 = Path(__file__).with_name("forward.p4")
