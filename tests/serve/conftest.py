"""acl-serve: its answers against the engine's on every protocol, the clients people use, refusals, faults,
fuzzing, the listener's stop, real processes under signals and load, timeouts, and the torch-free serving
install. Helpers and the int8 export it serves: tests/serve_helpers.py."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast (helpers.mark_heavy)
MARKS = {f"test_serve{name}.py": "server" for name in ("", "_clients", "_errors", "_faults", "_fuzz", "_listener",
                                                      "_models", "_phases", "_process", "_shutdown", "_timeouts",
                                                      "_deadlines", "_edges", "_promises", "_supervisor",
                                                      "_workers_metrics")}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "serve", MARKS)
