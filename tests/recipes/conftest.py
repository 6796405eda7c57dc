"""The GLUE recipes and what feeds them: preprocessing (and the SCL paper's data protocols), the run plan and its
runner, the recipe tables, collect_results, and acl-tune. Helpers: tests/recipe_helpers.py, recipe_dry_runs.py."""
from helpers import mark_heavy

# tests that train or start processes without a session model (keeps them out of make test-fast)
MARKS = {}


def pytest_collection_modifyitems(config, items):
    mark_heavy(items, "recipes", MARKS)
