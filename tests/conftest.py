import os
import sys

# tests import their helpers as `helpers` and the demo's synthetic data as `toy_data` (scripts/toy_data.py,
# not part of the package); acl_fairseq itself is installed (editable) or on the path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: tests kept out of make test (real data, or long fairseq-train runs); run with -m slow")
