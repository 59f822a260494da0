"""``glassgpt.sample.loading``: the old home of :mod:`glassgpt.interop.loading`, kept as a name.

``load`` and ``parse_device`` moved to ``glassgpt.interop`` (the stage that reads the model's
files, just below ``model``), so that ``train`` and ``interop`` load models without importing
``sample``, a stage below them. New code imports them from :mod:`glassgpt.interop.loading`.
"""

from __future__ import annotations

from glassgpt.interop.loading import HF_WEIGHTS, load, parse_device

__all__ = ["HF_WEIGHTS", "load", "parse_device"]
