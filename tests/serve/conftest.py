"""acl-serve: its answers against the engine's on every protocol, the clients people use, refusals, faults,
fuzzing, the listener's stop, real processes under signals and load, timeouts, and the torch-free serving
install. Helpers and the int8 export it serves: tests/serve_helpers.py."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {**{f"test_serve{name}.py": "server" for name in ("", "_clients", "_errors", "_faults", "_fuzz", "_models",
                                                         "_phases", "_deadlines", "_edges", "_promises")},
         **{f"test_serve{name}.py": "alone" for name in ("_listener", "_process", "_shutdown", "_timeouts",
                                                        "_supervisor", "_workers_metrics")}}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "serve", MARKS)
