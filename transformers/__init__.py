"""libcst transformers that carry out a plan, one per backend and strategy.

Installed as ``syncpass.transformers`` (never as a top-level ``transformers``
package, which would shadow Hugging Face's library).
"""

from __future__ import annotations

__all__: list[str] = []
