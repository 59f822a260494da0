"""The request bodies of the OpenAI-compatible endpoints, validated field by field.

Field names, types and defaults follow the OpenAI API reference (``/v1/completions``,
``/v1/chat/completions``); ``top_k``, ``min_p`` and ``repetition_penalty`` are extensions.
Fields the reference has and this server ignores (``user`` …) are accepted and ignored.
A value of the wrong type or out of range fails validation, which the app turns into a 400
naming the field: that request only, whatever else the server is decoding.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

from glassgpt.tokenizer.chat import PLAIN

PositiveInt = Annotated[StrictInt, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0.0, le=100.0)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
Ids = list[StrictInt]
Prompt = str | list[str] | Ids | list[Ids]


class RequestBase(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: PositiveInt | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    top_k: PositiveInt | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0  # CTRL's; 1 = off
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0  # 0 = off
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    stop: str | list[str] | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None  # + choice index
    stream: StrictBool = False
    stream_options: dict[str, StrictBool] | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or not all(stops):
            raise ValueError("at most 4 non-empty stop strings")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and (len(v) > 300 or not all(k.isdigit() for k in v)):
            raise ValueError("at most 300 entries, each a token id (a string of digits)")
        return v

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(RequestBase):
    """``POST /v1/completions``."""

    prompt: Prompt = ""
    max_tokens: PositiveInt | None = 16
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    echo: StrictBool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(RequestBase):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1)]
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    max_completion_tokens: PositiveInt | None = None


def chat_prompt(messages: list[Message]) -> str:
    """The plain-text chat template: one ``role: content`` line per turn, then ``assistant:``.

    >>> chat_prompt([Message(role="system", content="Be brief."), Message(role="user", content="Hi")])
    'system: Be brief.\\nuser: Hi\\nassistant:'

    Generation stops where the model starts a new turn (see :data:`CHAT_STOPS`).
    """
    return PLAIN.render([m.model_dump() for m in messages])


CHAT_STOPS = PLAIN.stops
