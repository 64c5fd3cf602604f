"""FP8 E4M3 weights for kvserve: ``fp8`` (vLLM-style and online) and ``compressed-tensors`` checkpoints."""
