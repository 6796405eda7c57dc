"""Serving without torch or fairseq: the ONNX Runtime early-exit engine (:mod:`acl_fairseq.runtime.engine`)."""
from acl_fairseq.runtime.engine import Engine, Prediction, RuntimeMissing, read_manifest  # noqa: F401
