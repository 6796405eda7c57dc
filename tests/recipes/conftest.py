"""The GLUE recipes and what feeds them: preprocessing (and the SCL paper's data protocols), the run plan and its
runner, the recipe tables, collect_results, and acl-tune. Helpers: tests/recipe_helpers.py, recipe_dry_runs.py."""
from helpers import mark_heavy

# tests that build or train a fairseq model, or start a long-lived process, without a session model: kept out
# of make test-fast; "alone": real processes under signals or load, run in make test's second phase
# (helpers.mark_heavy)
MARKS = {
    "test_tune.py": "alone",
    "test_preprocess_errors.py::test_sigterm": "alone",
    "test_preprocess_errors.py::test_missing_folder_and_cli_exit_code": "fairseq",  # the console script imports it
}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "recipes", MARKS)
