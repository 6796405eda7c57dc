"""The GLUE runs in Python, over the tables and shell scripts of recipes/: the task and method tables' run plan
(``plan``: ``build_plan``), the model flags a checkpoint's folder decides (``model_flags``), the runner that runs a
plan (``runner``: what recipes/glue/finetune.sh and sweep.sh call, and acl-tune and the benchmarks in-process) and
its result step (``result``). Standard library only, so that the runner starts with ``python -S`` and never loads
fairseq itself."""
