"""The GLUE recipes and what feeds them: preprocessing (and the SCL paper's data protocols), the run plan and its
runner, the recipe tables, collect_results, and acl-tune. Helpers: tests/recipe_helpers.py, recipe_dry_runs.py."""
