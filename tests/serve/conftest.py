"""acl-serve: its answers against the engine's on every protocol, the clients people use, refusals, faults,
fuzzing, the listener's stop, real processes under signals and load, timeouts, and the torch-free serving
install. Helpers and the int8 export it serves: tests/serve_helpers.py."""
