"""The rewrite driver: plan, then apply the plan through a backend's hooks."""
