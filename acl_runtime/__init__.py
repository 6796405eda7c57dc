"""acl_runtime: what serving an acl_fairseq model needs, and nothing that trains one (no torch, no fairseq).

- the early-exit policies (``exits``) and the one exit request a command resolves (``loop.resolve_request``);
- a model's input layout and tokenizers (``conventions``, ``tokenization``), the GLUE task table (``glue_tasks``);
- the exported ONNX folder's contract (``manifest``), its engine (``engine``) on the early-exit loop both engines
  share (``loop``), and the refill scheduler (``scheduler``);
- the commands that run on it: ``acl-predict`` (``predict``, with ``inputs`` and ``console``) and ``acl-serve``
  (``serve/``), and the atomic writer every command uses (``io``).

The training plugin :mod:`acl_fairseq` imports this package; this package never imports it, torch or fairseq
(tests/runtime/test_runtime_imports.py walks every import). acl-predict reaches a fairseq checkpoint through the
``acl_runtime.checkpoint_reader`` entry point that the training install declares (setup.py).
"""
