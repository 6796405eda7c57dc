"""The command-line tools (``acl-evaluate`` with its checks and ``--calibrate``, ``acl-help``, ``acl-tune``) and
nothing below them: what they compute lives in ``inference/``, ``tuning/``, ``recipes/`` and :mod:`acl_runtime`.
Never imported at training time, nor by any module outside this folder (tests/house/test_package_layers.py)."""
