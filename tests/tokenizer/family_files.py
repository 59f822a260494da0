"""Model families' tokenizer folders, built in the test by the ``tokenizers`` library and
written as the hub writes them (``tokenizer.json`` + ``tokenizer_config.json``, with a chat
template), for ``from tests.tokenizer.family_files import write_family``.

- ``llama3``: byte-level BPE with Llama 3's Split regex and ``ignore_merges``, BOS added by a
  TemplateProcessing post-processor, ``<|eot_id|>`` ending a turn, Llama 3's chat template;
- ``qwen``: NFC, Qwen 2's Split regex, byte-level BPE, no BOS, ChatML (``<|im_end|>``);
- ``fallback``: SentencePiece-style BPE (Llama 2, TinyLlama, Gemma): ``▁`` for spaces, byte
  fallback ``<0xNN>`` tokens, ``<s>`` first; no chat template;
- ``gemma``: Gemma's variant of it: no ``▁`` prepended to a text, ``<bos>`` first, ``<eos>``;
- ``smollm``: SmolLM's byte-level BPE: single digits split off, then GPT-2's regex; ChatML.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog. It's 1234 o'clock, naïve café.",
    "def main():\n    return 42\n\n\nclass A:\n    pass\n",
    "Ünïcödé text — with dashes, «quotes» and 日本語, plus   runs of   spaces.\n",
    "user: hi there\nassistant: hello, how can I help you today?\n",
] * 8


def _byte_level(split: str, specials: list[str], *, nfc: bool, size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(ignore_merges=not nfc))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _fallback(size: int, *, gemma: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    spaces = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(spaces if gemma else [normalizers.Prepend("▁"), *spaces])
    strip = [] if gemma else [decoders.Strip(" ", 1, 0)]
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=[*specials, *byte_tokens], show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = "<bos>" if gemma else "<s>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return tok


def _save(
    tok: Tokenizer, folder: Path, config: dict[str, Any], keep: set[str] | None = None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = json.loads(tok.to_str())
    if keep is not None:  # the byte tokens are ordinary vocabulary, as in Llama 2's file
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in keep]
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def write_family(kind: str, folder: Path, *, size: int = 320) -> Path:
    """Write the tokenizer folder of ``kind`` (see the module docstring) into ``folder``."""
    if kind == "llama3":
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"]  # fmt: skip
        tok = _byte_level(LLAMA3_SPLIT, specials, nfc=False, size=size)
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                  "chat_template": LLAMA3_TEMPLATE}  # fmt: skip
        _save(tok, folder, config)
    elif kind == "qwen":
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tok = _byte_level(QWEN_SPLIT, specials, nfc=True, size=size)
        config = {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE}
        _save(tok, folder, config)
    elif kind == "fallback":
        tok = _fallback(size + 100)
        _save(tok, folder, {"bos_token": "<s>", "eos_token": "</s>"}, {"<unk>", "<s>", "</s>"})
    elif kind == "smollm":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )  # fmt: skip
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )  # fmt: skip
        tok.train_from_iterator(CORPUS, trainer)
        config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                  "chat_template": CHATML_TEMPLATE}  # fmt: skip
        _save(tok, folder, config)
    elif kind == "gemma":
        tok = _fallback(size + 100, gemma=True)
        config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
        _save(tok, folder, config, {"<pad>", "<eos>", "<bos>", "<unk>"})
    else:
        raise ValueError(kind)
    return folder
