"""The CUDA platform's LoRA kernel in Triton: SGMV over segments, BGMV over one-token rows.

Nothing here is imported until ``CudaPlatform.lora_kernel()`` asks for it (triton loads then).
"""
