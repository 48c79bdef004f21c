"""Choosing sync points: the optimiser, the strategies and baselines, the schedule simulator, explanations, plan files and batch re-targeting. Imports neither libcst, torch nor jax."""
