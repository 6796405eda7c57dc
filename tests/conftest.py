import os
import sys

# tests import their helpers as `helpers`, the demo's synthetic data as `toy_data` (scripts/toy_data.py) and
# the benchmark scripts by name (`import step_time`, as the scripts import each other): none of them is part of
# the package. acl_fairseq itself is installed (editable) or on the path.
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: tests kept out of make test (real data, or long fairseq-train runs); "
                            "run with -m slow")
