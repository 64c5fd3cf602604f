"""AWQ 4-bit weights for kvserve (AutoAWQ's GEMM checkpoint format)."""
