"""An SAE folder with the model it reads: opened, measured, paged, exported and imported (the
jobs behind ``glassgpt sae eval``, ``features``, ``export`` and ``import``).

The model is the one the SAE was trained on (its ``sae.json`` names it; ``model`` for
another). The corpus is ``data`` (a prepared data folder or text files encoded with the
model's tokenizer), else the SAE's own data folder; windows are read in order from its start.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from glassgpt.checkpoint import load, needs_tokenizer, open_run
from glassgpt.data import DataDir
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.features.identity import check_identity, sae_extra
from glassgpt.features.metrics import EVAL_TOKENS, eval_split, eval_window, measure
from glassgpt.features.pages import FILE, FeaturePages, compute_pages, save_pages, windows
from glassgpt.features.sae import CONFIG_FILE, SAE, sae_folder
from glassgpt.features.saelens import from_saelens, save_saelens
from glassgpt.features.sites import check_model
from glassgpt.model import GPT
from glassgpt.train.evaluate import encode_files
from glassgpt.train.inputs import is_prepared


def open_sae(
    sae_dir: str, *, model: str | None = None, device: str = "cpu", on_purpose: bool = False
) -> tuple[SAE, GPT, Any, dict[str, Any]]:
    """(SAE, the model it reads (``model``, else the one its sae.json names), tokenizer, its
    sae.json), on ``device``; one line when the model is not named, does not fit, or is not
    the one the SAE was trained on (:func:`check_identity`; a note instead ``on_purpose``)."""
    where = parse_device(device)
    sae = SAE.load(sae_dir, device=where)
    extra = sae_extra(sae_dir)
    model_path = model or extra.get("model")
    if not model_path:
        raise GlassError(f"{sae_dir}: names no model; pass --model DIR")
    run = open_run(model_path, device=where)
    if run.tokenizer is None:  # as glassgpt.load says it
        warnings.warn(f"{model_path}: no tokenizer found; working with token ids only", stacklevel=2)  # fmt: skip
    assert run.model is not None
    check_model(sae, run.model)
    moved = f"{model_path} holds another model now; train the SAE again, or measure it there with sae eval --model {model_path}"  # fmt: skip
    check_identity(sae_dir, extra, run, what="-c", on_purpose=on_purpose,
                   **({} if model else {"hint": moved}))  # fmt: skip
    return sae, run.model, run.tokenizer, extra


def eval_sae(
    sae_dir: str,
    *,
    model: str | None = None,
    data: Sequence[str] | None = None,
    tokens: int = EVAL_TOKENS,
    seq_len: int | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """The metrics of :func:`glassgpt.features.metrics.evaluate` for the SAE in ``sae_dir``, on
    ``data`` (default: its data folder's val split, else train)."""
    where = parse_device(device)
    # another model than its own, named on purpose (transfer to a fine-tune): measured, noted
    sae, net, tok, extra = open_sae(sae_dir, model=model, device=device, on_purpose=model is not None)  # fmt: skip
    model_path = model or extra["model"]
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    T = eval_window(net.config.n_ctx, seq_len)
    stream, source = eval_stream(sae_dir, data, extra.get("data"), tok, model_path, T)
    with torch.no_grad():
        result = measure(net, sae, stream, seq_len=T, tokens=tokens, device=where)
    return {**result, "source": source, "hook": sae.cfg.hook, "arch": sae.cfg.arch}


def eval_stream(folder: str, data: Sequence[str] | None, own: Any, tok: Any, model_path: str, T: int) -> tuple[Any, str]:  # fmt: skip
    """(token stream, its description) a dictionary is measured on: ``data`` (text files or a
    prepared folder's val split), else the val split (else train) of ``own``, its data folder."""
    found, source = _data(folder, data, own, tok, model_path)
    if not isinstance(found, DataDir):
        return found, source
    split = eval_split(found, T)
    return found.stream(split), f"{source}, {split} split"


def write_pages(
    sae_dir: str,
    *,
    model: str | None = None,
    data: Sequence[str] | None = None,
    split: str = "train",
    tokens: int = 1_000_000,
    seq_len: int | None = None,
    batch: int | None = None,
    top: int = 20,
    context: tuple[int, int] = (12, 4),
    device: str = "cpu",
    output: str | None = None,
) -> tuple[Path, FeaturePages]:
    """Compute and write the pages of the SAE in ``sae_dir`` (default file:
    ``SAE_DIR/features.safetensors``): (the file, the pages)."""
    # pages of another model would show its tokens and activations as this SAE's: refused
    sae, net, tok, extra = open_sae(sae_dir, model=model, device=device)
    batches, meta = page_windows(sae_dir, net, tok, extra, model=model, data=data, split=split,
                                 tokens=tokens, seq_len=seq_len, batch=batch)  # fmt: skip
    pages = compute_pages(net, sae, batches, top=top, before=context[0], after=context[1], meta=meta)  # fmt: skip
    out = Path(output) if output else sae_folder(sae_dir) / FILE
    return save_pages(out, pages), pages


def page_windows(
    folder: str, net: GPT, tok: Any, extra: dict[str, Any], *, model: str | None,
    data: Sequence[str] | None, split: str, tokens: int, seq_len: int | None, batch: int | None,
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """(the windows pages are computed on, the pages' metadata), for the dictionary in
    ``folder`` whose JSON is ``extra`` (an SAE's, a CLT's)."""
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    T = eval_window(net.config.n_ctx, seq_len)
    B = batch or max(1, 4096 // T)
    if B < 1:
        raise GlassError(f"--batch: must be ≥ 1, got {B}")
    stream, source = _corpus(folder, data, split, extra.get("data"), tok)
    meta = {"source": source, "model": str(model or extra["model"]), "seq_len": T}
    return windows(stream, seq_len=T, batch=B, tokens=tokens), meta


def _data(folder: str, data: Sequence[str] | None, own: Any, tok: Any, model: str) -> tuple[Any, str]:  # fmt: skip
    """(the token stream of ``data`` text files, or the prepared folder ``data`` or ``own``
    names (a DataDir), its description); one line when there is neither."""
    if data and not (len(data) == 1 and is_prepared(data[0])):
        needs_tokenizer(tok, model, flag=None, text="--data text")
        return encode_files(tok, data)[0], ", ".join(data)
    path = data[0] if data else own
    if not path or not is_prepared(path):
        raise GlassError(f"{folder}: its data folder ({path}) is gone; pass --data with a "
                         "prepared data folder or text files")  # fmt: skip
    return DataDir.open(path), str(path)


def _corpus(sae_dir: str, data: Sequence[str] | None, split: str, own: Any, tok: Any) -> tuple[Any, str]:  # fmt: skip
    """(token stream, its description): ``data`` text files or prepared folder, else ``own``."""
    found, source = _data(sae_dir, data, own, tok, "the model")
    if not isinstance(found, DataDir):
        return found, source
    if split not in found.meta.splits:
        raise GlassError(f"--split {split}: {source} has the splits {', '.join(found.meta.splits)}")  # fmt: skip
    if tok is not None:
        found.check_tokenizer(tok)
    return found.stream(split), f"{source}, {split} split"


def _free(out: Path, overwrite: bool) -> None:
    """``out`` may be written: a missing or empty folder, or any folder with ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise GlassError(f"-o {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise GlassError(f"-o {out}: not empty; pass --overwrite to replace it")


def export_sae(
    sae_dir: str, out: str, *, model: str | None = None, model_name: str | None = None,
    overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write the glassgpt SAE in ``sae_dir`` to ``out`` in SAELens's format (a transcoder with
    its model: ``model``, else the one it was trained on)."""
    path = Path(out)
    _free(path, overwrite)
    sae = SAE.load(sae_dir)
    net = None
    if sae.cfg.arch == "transcoder":
        model = model or json.loads((sae_folder(sae_dir) / CONFIG_FILE).read_text(encoding="utf-8")).get("model")  # fmt: skip
        if model:
            net = load(model)[0]
    elif model:
        net = load(model)[0]
        check_model(sae, net)
    return save_saelens(sae, path, model=net, model_name=model_name)


def import_sae(
    source: str, out: str, *, model: str | None = None, processed: bool | None = None,
    overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write the SAELens SAE in ``source`` to ``out`` as a glassgpt SAE folder."""
    path = Path(out)
    _free(path, overwrite)
    net = load(model)[0] if model else None
    sae = from_saelens(source, model=net, processed=processed)
    extra = {"source": str(Path(source).resolve())}
    if model:
        extra["model"] = str(Path(model).resolve())
    return sae.save(path, extra=extra)
