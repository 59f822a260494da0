"""The model an SAE was trained on, as ``sae train`` records it in ``sae.json``, and the check
that an SAE meets that model again.

    identity = {config, weights_sha256, source, step}

``config`` is the GPT's config (every field); ``weights_sha256`` a sha256 over the model's
state dict in name order (:func:`weights_sha256`): the same for a checkpoint and its HF export,
and whatever device or dtype the model is then served in, since it is taken as loaded. Two
models are the same when both agree. The source (folder and step) is there to name the model.

Two models of the same width read each other's SAE without a shape error, and then a feature
page holds the other model's token ids and activations (an id past this vocabulary was an
IndexError in the explorer). So ``serve --sae`` (and the steering it serves) and ``sae
features`` refuse another model; ``sae eval --model`` (transfer to a fine-tune, asked on
purpose) measures it with a note. An SAE saved without an identity (an older one, a SAELens
import) is checked by shape only, with a note.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from glassgpt.checkpoint import Run
from glassgpt.console import say
from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.sae import read_sae_json

KEY = "model_identity"  # its key in sae.json


def model_identity(run: Run) -> dict[str, Any]:
    """The identity of ``run``'s model (module docstring), JSON-able; the model as loaded,
    before any cast to another dtype."""
    if run.model is None:
        raise GlassError(f"{run.source}: opened without its weights")
    return {
        "config": run.model_config.to_dict(),
        "weights_sha256": weights_sha256(run.model),
        "source": str(Path(run.source).resolve()),
        "step": run.step,
    }


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict in name order: each tensor's name, dtype, shape and bytes.

    >>> a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> b.load_state_dict(a.state_dict())
    <All keys matched successfully>
    >>> weights_sha256(a) == weights_sha256(b), weights_sha256(a) == weights_sha256(torch.nn.Linear(2, 2))
    (True, False)
    """
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        digest.update(f"{name} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def sae_extra(sae_dir: str | Path) -> dict[str, Any]:
    """The SAE folder's sae.json (where its identity is), as :meth:`SAE.load` finds it."""
    path, doc = read_sae_json(sae_dir)
    if not isinstance(doc, dict):
        raise InputFileError(f"{path}: not a glassgpt SAE file")
    return doc


def describe(identity: dict[str, Any]) -> str:
    """``runs/a (step 500, weights 3f2a9c1d0b7e)``: a model named in one phrase."""
    step = identity.get("step")
    where = f"step {step}, " if step is not None else ""
    return f"{identity.get('source', '?')} ({where}weights {str(identity.get('weights_sha256'))[:12]})"  # fmt: skip


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> str:
    """What tells the two apart, in a few words: the config fields that differ, else the weights.

    >>> differences({"config": {"n_vocab": 65, "d_model": 64}}, {"config": {"n_vocab": 80, "d_model": 64}})
    'n_vocab 65 ≠ 80'
    >>> differences({"config": {"d_model": 64}, "weights_sha256": "a"}, {"config": {"d_model": 64}, "weights_sha256": "b"})
    'the same config, other weights'
    """
    a, b = recorded.get("config") or {}, current.get("config") or {}
    fields = [f"{k} {a.get(k)} ≠ {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]  # fmt: skip
    if fields:
        return ", ".join(fields[:3]) + (", …" if len(fields) > 3 else "")
    return "the same config, other weights"


def same_model(recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    return recorded.get("weights_sha256") == current.get("weights_sha256") and (
        recorded.get("config") == current.get("config")
    )


def check_identity(
    sae_dir: str | Path, extra: dict[str, Any], run: Run, *, what: str, on_purpose: bool = False,
    hint: str = "use the model it was trained on, or train an SAE on this one",
) -> None:  # fmt: skip
    """Whether the SAE (its sae.json ``extra``) was trained on ``run``'s model: silent when
    it was; one line (a GlassError) when not, or a note when the user asked for this model
    ``on_purpose``; a note when the SAE records no identity (its shapes are checked apart)."""
    recorded = extra.get(KEY)
    if not isinstance(recorded, dict):
        say(f"{sae_dir}: the SAE records no model identity (an older SAE or an import); checking its shapes only")  # fmt: skip
        return
    current = model_identity(run)
    if same_model(recorded, current):
        return
    told = (f"{what} {sae_dir}: the SAE was trained on {describe(recorded)}, not on "
            f"{describe(current)} ({differences(recorded, current)})")  # fmt: skip
    if on_purpose:
        say(f"{told}; measuring it on this model, as asked")
        return
    raise GlassError(f"{told}; {hint}")
