"""What every endpoint shares: the model, its tokenizer, the scheduler and the server's name."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glassgpt.serve.errors import APIError
from glassgpt.serve.scheduler import Scheduler
from glassgpt.tokenizer.special import start_id


@dataclass
class ServeState:
    model: Any
    tokenizer: Any
    name: str
    scheduler: Scheduler
    api_key: str | None = None
    source: Path | None = None  # the checkpoint or run folder served (its other checkpoints)
    chat: Any = None  # the chat template (tokenizer.chat): the model's, a file's, PLAIN, or None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n_ctx(self) -> int:
        """The server's context: the longest prompt, at most the model's n_ctx."""
        return int(self.scheduler.n_ctx)

    @property
    def n_valid(self) -> int:
        """Ids a prompt may use: the model's vocabulary (and the tokenizer's, if smaller)."""
        return self.scheduler.n_valid

    @property
    def start_id(self) -> int:
        """The token an empty prompt starts from (as ``generate`` does)."""
        return start_id(self.tokenizer)

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode_bytes(ids).decode("utf-8", errors="replace")

    def model_card(self) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "created": self.created,
                "owned_by": "glassgpt", "context_length": self.n_ctx}  # fmt: skip

    def check_model(self, name: str) -> None:
        if name != self.name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves "
                           f"{self.name!r}", param="model", code="model_not_found")  # fmt: skip
