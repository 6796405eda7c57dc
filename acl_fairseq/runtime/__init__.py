"""Serving without torch or fairseq: the early-exit loop both engines share (:mod:`acl_fairseq.runtime.loop`) and
the ONNX Runtime engine on it (:mod:`acl_fairseq.runtime.engine`)."""
from acl_fairseq.runtime.engine import Engine, RuntimeMissing, read_manifest  # noqa: F401
from acl_fairseq.runtime.loop import ExitRequest, Prediction  # noqa: F401
