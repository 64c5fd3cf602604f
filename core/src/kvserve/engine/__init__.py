"""The engine: resolves components, runs the step loop (imports torch)."""
