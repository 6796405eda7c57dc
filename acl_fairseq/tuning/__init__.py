"""acl-tune's internals (the command is :mod:`acl_fairseq.cli.tune`): where a study measures (``data``: the
validation split it tunes on, never the split the results report) and what it searches (``space``: the search
spaces of recipes/glue/search_spaces.tsv and the seeded sampler)."""
