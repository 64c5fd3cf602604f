"""kvserve-attention-triton: paged attention kernels written in Triton (NVIDIA and AMD GPUs)."""
