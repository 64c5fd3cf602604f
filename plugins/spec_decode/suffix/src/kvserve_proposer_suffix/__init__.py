"""kvserve_proposer_suffix kvserve plugin package."""
