"""Inference on trained checkpoints: the layer-by-layer early-exit engine, its latency timing and the hub
interface (raw text in, labels and exit layers out). Never imported at training time."""
