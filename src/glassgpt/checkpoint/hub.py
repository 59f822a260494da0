"""``hf:ORG/NAME[@REVISION]``: a model of the Hugging Face Hub, opened from the local cache.

An id resolves to a snapshot folder of huggingface_hub's cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, read when the id is opened, not when glassgpt is imported): the snapshot of
``REVISION`` (a branch, tag or commit; default ``main``) when it is there with a config and
weights; otherwise, unless ``HF_HUB_OFFLINE`` is set, the files a model needs are downloaded
into that cache first. The folder is then an HF model folder like any other
(:func:`glassgpt.checkpoint.open_run`).

Not there and not downloadable: one line naming the id, the cache looked in and the command
that downloads it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from glassgpt.errors import GlassError

PREFIX = "hf:"
# what a model needs: its config, weights and tokenizer; never the repo's other files
# (ONNX, GGUF, the original checkpoints, images)
NEEDED = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "encoder.json", "vocab.bpe", "chat_template.jinja",
)  # fmt: skip
# only for a repo or revision without safetensors (older Pythia training steps, say)
PICKLED = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")
_NAME = re.compile(r"(?:[\w.-]+/)?[\w.-]+")
_TRUE = {"1", "ON", "YES", "TRUE"}  # as huggingface_hub reads its flags


@dataclass(frozen=True)
class HubId:
    """A model on the hub: ``repo`` (``ORG/NAME``) at ``revision`` (None: the default branch)."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return PREFIX + self.repo + (f"@{self.revision}" if self.revision else "")

    @property
    def download(self) -> str:
        """The command that puts this model into the cache."""
        return f"hf download {self.repo}" + (
            f" --revision {self.revision}" if self.revision else ""
        )


def is_hub_id(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is written as a hub id.

    >>> is_hub_id("hf:EleutherAI/pythia-160m@step3000"), is_hub_id("runs/hf")
    (True, False)
    """
    return os.fspath(path).startswith(PREFIX)


def parse_hub_id(text: str) -> HubId:
    """``hf:ORG/NAME[@REVISION]`` as a :class:`HubId`; anything else is a one-line error.

    >>> parse_hub_id("hf:EleutherAI/pythia-160m@step3000")
    HubId(repo='EleutherAI/pythia-160m', revision='step3000')
    >>> parse_hub_id("hf:")
    Traceback (most recent call last):
    glassgpt.errors.GlassError: 'hf:': not a hub id; expected hf:ORG/NAME or hf:ORG/NAME@REVISION (a branch, tag or commit)
    """
    body = text[len(PREFIX) :] if text.startswith(PREFIX) else text
    repo, at, revision = body.partition("@")
    bad = GlassError(
        f"{text!r}: not a hub id; expected hf:ORG/NAME or hf:ORG/NAME@REVISION "
        "(a branch, tag or commit)"
    )
    if not _NAME.fullmatch(repo) or (at and not re.fullmatch(r"[^\s@]+", revision)):
        raise bad
    try:
        validate_repo_id(repo)  # the hub's own rules: no '--' or '..', at most 96 characters
    except HFValidationError:
        raise bad from None
    return HubId(repo, revision or None)


def hub_cache() -> Path:
    """The folder huggingface_hub caches models in, as the environment names it now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ["HF_HUB_CACHE"])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """Whether downloads are off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.HF_HUB_OFFLINE or any((f or "").upper() in _TRUE for f in flags)


def resolve_hub_id(text: str) -> Path:
    """The local snapshot folder of the hub id ``text`` (see the module docstring)."""
    hub = parse_hub_id(text)
    cache = hub_cache()
    folder = _cached(hub, cache)
    if folder is not None and _is_model(folder):
        return folder
    if hub_offline():
        where = "incomplete in" if folder is not None else "not in"
        raise GlassError(
            f"{hub}: {where} the Hugging Face cache {cache}, and HF_HUB_OFFLINE is set; "
            f"download it with `{hub.download}` where there is a network"
        )
    return _download(hub, cache)


def _cached(hub: HubId, cache: Path) -> Path | None:
    """The snapshot folder of ``hub`` already in ``cache``, or None."""
    try:
        found = snapshot_download(
            hub.repo, revision=hub.revision, cache_dir=cache, allow_patterns=list(NEEDED),
            local_files_only=True,
        )  # fmt: skip
    except LocalEntryNotFoundError:  # not there, or (per the cached file list) incomplete
        return None
    return Path(found)


def _download(hub: HubId, cache: Path) -> Path:
    """Download the files of ``hub`` that a model needs into ``cache``; the snapshot folder."""
    try:
        folder = Path(
            snapshot_download(
                hub.repo, revision=hub.revision, cache_dir=cache, allow_patterns=list(NEEDED)
            )
        )
        if not _is_model(folder):
            folder = Path(
                snapshot_download(
                    hub.repo, revision=hub.revision, cache_dir=cache, allow_patterns=list(PICKLED)
                )
            )
    except RevisionNotFoundError:
        raise GlassError(f"{hub}: the hub has no revision {hub.revision!r} of {hub.repo}") from None
    except (RepositoryNotFoundError, GatedRepoError):  # the hub answers the same for both
        raise GlassError(
            f"{hub}: no such model on the hub, or it is private or gated "
            "(log in with `hf auth login` if you have access)"
        ) from None
    except OSError as e:  # the network: refused, timed out, the hub down (HfHubHTTPError too)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GlassError(
            f"{hub}: not in the Hugging Face cache {cache}, and the hub could not be reached "
            f"({reason}); download it with `{hub.download}` where there is a network"
        ) from None
    if not _is_model(folder):
        raise GlassError(f"{hub}: has no config.json with safetensors or pytorch_model.bin weights")
    return folder


def _is_model(folder: Path) -> bool:
    """Whether ``folder`` holds a config and weights (what open_run's HF branch opens)."""
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    return (folder / "config.json").is_file() and bool(weights)
