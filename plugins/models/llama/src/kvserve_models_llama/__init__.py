"""kvserve_models_llama kvserve plugin package."""
