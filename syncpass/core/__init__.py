"""Helpers every stage uses: errors, units, atomic file writes, entry points. Imports nothing of syncpass."""
