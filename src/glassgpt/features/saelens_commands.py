"""``glassgpt sae export --format saelens`` and ``glassgpt sae import``: argument parsing and the
two jobs (the format itself: :mod:`glassgpt.features.saelens`, imported on use, with torch)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from glassgpt.cli.arguments import add_checkpoint, add_output
from glassgpt.errors import GlassError


def register(sub: Any) -> None:
    """Add ``export`` and ``import`` to ``glassgpt sae``'s subcommands."""
    x = sub.add_parser(
        "export",
        help="write an SAE in SAELens's format (cfg.json + sae_weights.safetensors)",
        description="Write the SAE of -c in SAELens's format, which sae_lens loads with "
        "SAE.load_from_disk(DIR) and which computes the same codes. Hook names are written "
        "TransformerLens's way; the model kwargs say center_writing_weights=false (load the "
        "model with HookedTransformer.from_pretrained_no_processing).",
    )
    add_checkpoint(x, help="the SAE folder (sae train's -o, or its sae/)")
    x.add_argument("--format", choices=("saelens",), default="saelens", help="saelens (the only one)")  # fmt: skip
    add_output(x, required=True, metavar="DIR", help="the folder to write")
    x.add_argument("--model", metavar="DIR", help="the model (default: the one it was trained on; a transcoder needs it)")  # fmt: skip
    x.add_argument("--model-name", metavar="NAME", help="metadata.model_name (e.g. gpt2)")
    x.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    x.set_defaults(func=_export)

    i = sub.add_parser(
        "import",
        help="read an SAELens SAE folder as a glassgpt SAE",
        description="Read an SAE saved by sae_lens (cfg.json + sae_weights.safetensors) and "
        "write it as a glassgpt SAE folder that sae eval, features and the explorer read. "
        "With --model (e.g. a GPT-2 imported from HF), the SAE is checked against it and, when "
        "it was trained on TransformerLens's processed model (centred residual stream, folded "
        "value biases, ln2.hook_normalized), folded to read the model's own activations.",
    )
    i.add_argument("source", metavar="DIR", help="the SAELens folder")
    add_output(i, required=True, metavar="SAE_DIR", help="the glassgpt SAE folder to write")
    i.add_argument("--model", metavar="DIR", help="the model the SAE reads (checked; needed for hook_z and transcoders)")  # fmt: skip
    proc = i.add_mutually_exclusive_group()
    proc.add_argument("--processed", dest="processed", action="store_true", default=None,
                      help="it read TransformerLens's from_pretrained processing (default: as cfg.json says)")  # fmt: skip
    proc.add_argument("--no-processed", dest="processed", action="store_false",
                      help="it read unprocessed activations (from_pretrained_no_processing)")  # fmt: skip
    i.add_argument("--overwrite", action="store_true", help="replace what -o already holds")
    i.set_defaults(func=_import)


def _free(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise GlassError(f"-o {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise GlassError(f"-o {out}: not empty; pass --overwrite to replace it")


def _export(args: argparse.Namespace) -> int:
    out = export_command(args.checkpoint, args.output, model=args.model,
                         model_name=args.model_name, overwrite=args.overwrite)  # fmt: skip
    print(f"wrote {out} (SAELens: SAE.load_from_disk({str(out)!r}))")
    return 0


def _import(args: argparse.Namespace) -> int:
    out = import_command(args.source, args.output, model=args.model, processed=args.processed,
                         overwrite=args.overwrite)  # fmt: skip
    print(f"wrote {out}")
    return 0


def export_command(
    sae_dir: str, out: str, *, model: str | None = None, model_name: str | None = None,
    overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write the glassgpt SAE in ``sae_dir`` to ``out`` in SAELens's format."""
    import json

    from glassgpt.features.sae import CONFIG_FILE, SAE
    from glassgpt.features.saelens import save_saelens

    path = Path(out)
    _free(path, overwrite)
    sae = SAE.load(sae_dir)
    net = None
    if sae.cfg.arch == "transcoder":
        folder = Path(sae_dir) if (Path(sae_dir) / CONFIG_FILE).is_file() else Path(sae_dir) / "sae"  # fmt: skip
        model = model or json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")).get("model")  # fmt: skip
        if model:
            from glassgpt.checkpoint import load

            net = load(model)[0]
    elif model:
        from glassgpt.checkpoint import load
        from glassgpt.features.sites import check_model

        net = load(model)[0]
        check_model(sae, net)
    return save_saelens(sae, path, model=net, model_name=model_name)


def import_command(
    source: str, out: str, *, model: str | None = None, processed: bool | None = None,
    overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write the SAELens SAE in ``source`` to ``out`` as a glassgpt SAE folder."""
    from glassgpt.features.saelens import from_saelens

    path = Path(out)
    _free(path, overwrite)
    net = None
    if model:
        from glassgpt.checkpoint import load

        net = load(model)[0]
    sae = from_saelens(source, model=net, processed=processed)
    extra = {"source": str(Path(source).resolve())}
    if model:
        extra["model"] = str(Path(model).resolve())
    return sae.save(path, extra=extra)
