"""acl_runtime, the torch-free bottom: exit policies, the exit-request rule, the early-exit loop and the refill
scheduler, tokenization and the input layout, atomic files, the console, the ONNX folder's manifest, and the rule
that two engines' exits are compared by (tests/exit_parity.py)."""
