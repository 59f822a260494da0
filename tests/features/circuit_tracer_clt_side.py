"""The circuit-tracer side of tests/features/test_clt_train.py's export test, run by the
interpreter of circuit-tracer's own venv; imports nothing from glassgpt.

    python circuit_tracer_clt_side.py DIR   loads DIR/clt with circuit-tracer's load_clt
      (float32, CPU, decoders loaded), encodes DIR/u.safetensors {u [L, N, d_model]} and
      reconstructs → DIR/out.safetensors {acts [L, N, d_sae], recon [L, N, d_model]}
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(folder: Path) -> None:
    import torch
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from safetensors.torch import load_file, save_file

    clt = load_clt(str(folder / "clt"), device=torch.device("cpu"), dtype=torch.float32,
                   lazy_decoder=False)  # fmt: skip
    u = load_file(folder / "u.safetensors")["u"]
    with torch.no_grad():
        acts = clt.encode(u)
        recon = clt(u)
    save_file({"acts": acts.contiguous(), "recon": recon.contiguous()}, folder / "out.safetensors")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
