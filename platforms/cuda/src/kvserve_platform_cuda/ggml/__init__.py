"""The CUDA platform's GGML kernel: GGUF layers' products on their blocks, dequantized tile by tile in Triton.

``kernel`` imports no triton; ``triton_ggml`` (which does) loads when a GGUF model's layers are
offered the kernel.
"""
