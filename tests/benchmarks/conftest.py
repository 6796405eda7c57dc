"""The benchmarks: the harness, every script at a toy size, their records and outputs, and README's claims
recomputed from the committed records. No timing is asserted here."""
