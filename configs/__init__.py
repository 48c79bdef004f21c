"""Data files shipped with syncpass: default pass settings and hardware profiles."""
