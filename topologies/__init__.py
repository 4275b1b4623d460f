"""The fabric's model: its spec (YAML -> frozen dataclasses, validated), its address plan (locator
block, uSIDs, EVs -> paths), sizing and the errors every layer raises. Pure: nothing here touches
the kernel. Its emulation is ``mrclab.emulation``."""
