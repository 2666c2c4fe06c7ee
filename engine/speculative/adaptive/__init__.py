"""Adaptive speculation: batch-size tiers, step-count policies and the controller that runs them."""
