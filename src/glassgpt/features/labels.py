"""Feature labels: ``labels.json`` in an SAE, transcoder or CLT folder, one short explanation per
feature with its detection score (written by ``glassgpt sae label``; read by the feature pages,
the explorer and the graph view; a folder without the file has no labels, and everything still
works).

Keys are ``"i"`` for feature i of an SAE or a per-layer transcoder, and ``"l/i"`` for feature i
of layer l in a CLT (:func:`key`). Each value is ``{"label": str, "detection": float | None}``,
the detection score being a balanced accuracy in [0, 1]; ``sae label`` adds how it was measured
(``activating``, ``silent``: the held-out contexts of each kind; ``unread``: answers it could
not read, counted wrong; ``explained_by``: the contexts the label was written from). The file's
other keys say who wrote the labels: ``endpoint``, ``model``, ``date``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glassgpt.errors import GlassError
from glassgpt.storage import atomic_write

FILE = "labels.json"


def key(index: int, layer: int | None = None) -> str:
    """The labels file's key of feature ``index`` (of ``layer`` in a CLT)."""
    return str(index) if layer is None else f"{layer}/{index}"


def read_labels(folder: str | Path) -> dict[str, dict[str, Any]]:
    """The folder's labels by key (:func:`key`); {} when it has none. A file that is not a
    labels file is one line naming it."""
    path = Path(folder) / FILE
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        features = doc["features"]
        return {str(k): {**v, "label": str(v["label"]), "detection": v.get("detection")} for k, v in features.items()}  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise GlassError(f"{path}: not a labels file ({type(e).__name__}: {e})") from None


def write_labels(folder: str | Path, labels: dict[str, dict[str, Any]], **meta: Any) -> Path:
    """Write ``labels`` (merged over the folder's existing ones) with ``meta`` (the endpoint,
    the model that wrote them), atomically; returns the path."""
    path = Path(folder) / FILE
    merged = {**read_labels(folder), **labels}
    doc = {**meta, "features": dict(sorted(merged.items(), key=lambda kv: _order(kv[0])))}
    atomic_write(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode())
    return path


def _order(k: str) -> tuple[int, ...]:
    return tuple(int(p) for p in k.split("/"))
