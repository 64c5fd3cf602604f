"""kvserve_models_gemma kvserve plugin package."""
