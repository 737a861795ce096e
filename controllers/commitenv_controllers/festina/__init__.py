"""Festina (shared-GPU, energy-aware serverless serving): LUT, dispatch, local scheduling, consolidation."""
