"""The masked LM: where it runs (runtime), reading it at the mask (encoder, ONNX), the offline default model and
its head, and sentence vectors."""
