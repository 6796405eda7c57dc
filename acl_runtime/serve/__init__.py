"""``acl-serve``: the ONNX Runtime early-exit engine as an HTTP service (Open Inference Protocol v2, TEI's
``/predict``, Prometheus metrics) on Starlette and uvicorn. Part of the torch-free runtime: it imports neither
torch nor fairseq wherever it runs; needs ``pip install .[serve]``."""
