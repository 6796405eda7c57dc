"""Inference on trained checkpoints: the layer-by-layer early-exit engine, its latency timing, the hub interface
(raw text in, labels and exit layers out) and the calibrated serving policy (``calibration``, torch-free, which
the ONNX runtime reads too). Never imported at training time."""
