"""kvserve_attention_cpu kvserve plugin package."""
