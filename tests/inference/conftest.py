"""From a trained checkpoint to answers: acl-predict and acl-evaluate, the ONNX export and its int8 copy against
the torch engine, calibrated thresholds, FLOPs, and the commands' refusals and atomic outputs."""
