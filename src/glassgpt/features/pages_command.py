"""``glassgpt sae features``: the feature pages of an SAE (see :mod:`glassgpt.features.pages`).

    glassgpt sae features -c SAE_DIR [--data PATH…] [-o FILE] [--tokens N] [--top K]

The model is the one the SAE was trained on (``--model`` for another); the corpus is
``--data`` (a prepared data folder, its ``--split``, or text files encoded with the model's
tokenizer), else the SAE's own data folder. Windows are read in order from the corpus's
start. The pages go to ``SAE_DIR/features.safetensors`` unless ``-o`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output


def add_parser(sub: Any) -> None:
    """``features`` under ``glassgpt sae``."""
    p = sub.add_parser(
        "features",
        help="feature pages: top contexts, histogram, density and logit effect of every latent",
        description="Compute, for every latent of an SAE, its top-activating contexts (with the "
        "activation at every token), a histogram of its nonzero activations (log-spaced bins), "
        "its density and its logit effect (the decoder direction through the final norm and "
        "W_U), from one pass over a corpus; written to one file the explorer reads.",
    )
    add_checkpoint(p, help="the SAE folder (sae train's -o, or its sae/)")
    p.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on)")
    p.add_argument("--data", metavar="PATH", nargs="+", action="extend",
                   help="a prepared data folder or text files (default: the SAE's data)")  # fmt: skip
    p.add_argument("--split", default="train", help="the split of a prepared folder (default train)")  # fmt: skip
    p.add_argument("--tokens", type=int, default=1_000_000, help="tokens to read (default 1,000,000)")  # fmt: skip
    p.add_argument("--seq-len", type=int, default=None, help="window length (default: n_ctx, at most 256)")  # fmt: skip
    p.add_argument("--batch", type=int, default=None, help="windows per forward (default: ~4,096 tokens)")  # fmt: skip
    p.add_argument("--top", type=int, default=20, help="top contexts kept per latent (default 20)")
    p.add_argument("--context", type=int, nargs=2, default=(12, 4), metavar=("BEFORE", "AFTER"),
                   help="tokens shown before and after each top token (default 12 4)")  # fmt: skip
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    add_output(p, metavar="FILE", help="the pages' file (default SAE_DIR/features.safetensors)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out, pages = features_command(
        args.checkpoint, model=args.model, data=args.data, split=args.split, tokens=args.tokens,
        seq_len=args.seq_len, batch=args.batch, top=args.top, context=tuple(args.context),
        device=args.device, output=args.output,
    )  # fmt: skip
    alive = int((pages.count > 0).sum())
    print(f"{pages.d_sae:,} latents over {pages.tokens:,} tokens ({alive:,} active) in "
          f"{time.perf_counter() - t0:.1f} s → {out}")  # fmt: skip
    return 0


def sae_folder(sae_dir: str | Path) -> Path:
    """The folder holding sae.json (``sae_dir`` or its ``sae/``)."""
    from glassgpt.features.sae import CONFIG_FILE

    d = Path(sae_dir)
    return d / "sae" if not (d / CONFIG_FILE).is_file() and (d / "sae" / CONFIG_FILE).is_file() else d  # fmt: skip


def open_sae(sae_dir: str, *, model: str | None = None, device: str = "cpu") -> tuple[Any, Any, Any, dict[str, Any]]:  # fmt: skip
    """(SAE, the model it reads (``model``, else the one its sae.json names), tokenizer, its
    sae.json), on ``device``; one line when the model is not named or does not fit."""
    from glassgpt.checkpoint import load
    from glassgpt.devices import parse_device
    from glassgpt.errors import GlassError
    from glassgpt.features.sae import CONFIG_FILE, SAE
    from glassgpt.features.sites import check_model

    where = parse_device(device)
    sae = SAE.load(sae_dir, device=where)
    extra = json.loads((sae_folder(sae_dir) / CONFIG_FILE).read_text(encoding="utf-8"))
    model_path = model or extra.get("model")
    if not model_path:
        raise GlassError(f"{sae_dir}: names no model; pass --model DIR")
    net, tok = load(model_path, device=where)
    check_model(sae, net)
    return sae, net, tok, extra


def features_command(
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
) -> tuple[Path, Any]:
    """Compute and write the pages of the SAE in ``sae_dir``: (the file, the pages)."""
    from glassgpt.errors import GlassError
    from glassgpt.features.pages import FILE, compute_pages, save_pages, windows

    sae, net, tok, extra = open_sae(sae_dir, model=model, device=device)
    model_path = model or extra["model"]
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    T = seq_len or min(net.config.n_ctx, 256)
    if not 1 <= T <= net.config.n_ctx:
        raise GlassError(f"--seq-len: must be in [1, n_ctx={net.config.n_ctx}], got {T}")
    B = batch or max(1, 4096 // T)
    if B < 1:
        raise GlassError(f"--batch: must be ≥ 1, got {B}")
    stream, source = _corpus(sae_dir, data, split, extra.get("data"), tok)
    meta = {"source": source, "model": str(model_path), "seq_len": T}
    pages = compute_pages(net, sae, windows(stream, seq_len=T, batch=B, tokens=tokens),
                          top=top, before=context[0], after=context[1], meta=meta)  # fmt: skip
    out = Path(output) if output else sae_folder(sae_dir) / FILE
    return save_pages(out, pages), pages


def _corpus(sae_dir: str, data: Sequence[str] | None, split: str, own: Any, tok: Any) -> tuple[Any, str]:  # fmt: skip
    """(token stream, its description): ``--data`` text files or prepared folder, else ``own``."""
    from glassgpt.data import DataDir
    from glassgpt.errors import GlassError
    from glassgpt.train.evaluate import encode_files
    from glassgpt.train.inputs import is_prepared

    if data and not (len(data) == 1 and is_prepared(data[0])):
        if tok is None:
            raise GlassError("the model has no tokenizer, so --data text cannot be encoded")
        return encode_files(tok, data)[0], ", ".join(data)
    path = data[0] if data else own
    if not path or not is_prepared(path):
        raise GlassError(f"{sae_dir}: its data folder ({path}) is gone; pass --data with a "
                         "prepared data folder or text files")  # fmt: skip
    folder = DataDir.open(path)
    if split not in folder.meta.splits:
        raise GlassError(f"--split {split}: {path} has the splits {', '.join(folder.meta.splits)}")
    if tok is not None:
        folder.check_tokenizer(tok)
    return folder.stream(split), f"{path}, {split} split"
