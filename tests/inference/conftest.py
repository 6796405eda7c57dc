"""From a trained checkpoint to answers: acl-predict and acl-evaluate, the ONNX export and its int8 copy against
the torch engine, calibrated thresholds, FLOPs, and the commands' refusals and atomic outputs."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_evaluate.py": "fairseq",
    "test_flops.py": "fairseq",
    "test_export_errors.py": "fairseq",
    "test_calibrate.py": "fairseq",
    "test_onnx.py": "fairseq",
    "test_predict.py": "fairseq",
    "test_pairing.py::test_the_export_records_it_and_both_routes": "server",
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "inference", MARKS)
