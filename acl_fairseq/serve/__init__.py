"""``acl-serve``: the ONNX Runtime early-exit engine as an HTTP service (Open Inference Protocol v2, TEI's
``/predict``, Prometheus metrics) on Starlette and uvicorn. Imports neither torch nor fairseq
(:func:`acl_fairseq._serving_only`); needs ``pip install .[serve]``."""
