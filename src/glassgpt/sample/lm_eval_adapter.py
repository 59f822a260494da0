"""lm-evaluation-harness on glassgpt: the tasks' requests answered by the model itself.

    loglikelihood(ctx, cont)   = (Σ_j log p(cont_j | ctx, cont_<j), greedy(cont))
    loglikelihood_rolling(s)   = Σ over windows of loglikelihood (every token of s once)
    generate_until(ctx, until) = greedy (or sampled) text after ctx, cut before the first stop

:class:`GlassLM` is an ``lm_eval`` ``LM`` (a ``TemplateLM``: the harness's own split of a
request into context and continuation ids, trailing spaces moved into the continuation, an
empty context replaced by the prefix token ``<|endoftext|>``). It scores with
:func:`glassgpt.sample.harness.score` (shared contexts encoded once on the KV cache, only the
scored positions unembedded) and generates with :func:`glassgpt.sample.generate` (batched,
left-padded, stop strings and ``<|endoftext|>``), so nothing is converted to Hugging Face.
Its numbers are those of the harness's ``hf`` backend on the ``glassgpt export --format hf``
folder of the same weights (``tests/sample/test_lm_eval.py`` checks it).

:func:`run_tasks` is ``glassgpt eval -c RUN --tasks ...``: tasks are found by name in
lm-eval's catalogue or in ``--include-path`` folders of task YAML files, and download their
data as lm-eval does (``datasets`` and its cache). ``lm_eval`` is the optional extra
``glassgpt[eval]``; importing this module without it is a one-line :class:`GlassError`.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from glassgpt.checkpoint import load, needs_tokenizer
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.model.precision import cast, parse_dtype
from glassgpt.sample.generation import generate
from glassgpt.sample.harness import rolling_windows, score
from glassgpt.tokenizer.special import END_OF_TEXT, start_id

MISSING = "lm-eval is not installed: pip install 'glassgpt[eval]' (or pip install lm-eval)"
try:
    import lm_eval
    import lm_eval.tasks  # read at each call: a test may replace its TaskManager
    from lm_eval.api.model import TemplateLM
except ImportError:  # pragma: no cover - the optional extra
    raise GlassError(MISSING) from None

MAX_GEN_TOKS = 256  # the harness's default for generate_until, as its hf backend


class GlassLM(TemplateLM):
    """A glassgpt model and tokenizer as an lm-eval ``LM``.

    ``batch_size``: continuations (or prompts) per forward pass; ``seed``: the sampling seed
    of generation tasks that ask for ``do_sample`` (greedy ones need none).
    """

    backend = "causal"

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 32, seed: int = 0,
                 progress: bool = True, name: str = "glassgpt") -> None:  # fmt: skip
        super().__init__()
        needs_tokenizer(tokenizer, "the model", flag=None, text="the tasks' text")
        if batch_size < 1:
            raise GlassError(f"--batch-size: must be ≥ 1, got {batch_size}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.seed, self.progress, self.name = batch_size, seed, progress, name
        self._device = next(model.parameters()).device

    # -- what TemplateLM asks of a model ---------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return start_id(self.tokenizer)  # <|endoftext|>, else id 0

    @property
    def max_length(self) -> int:
        return int(self.model.config.n_ctx)

    @property
    def tokenizer_name(self) -> str:
        return self.name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   **kwargs: Any) -> list[int]:  # fmt: skip
        """Special-token strings in the text become their ids, as an HF tokenizer reads them."""
        return list(self.tokenizer.encode(string, allowed_special="all"))

    def tok_decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids)))

    def _bar(self, total: int, what: str, disable: bool) -> Any:
        return tqdm(total=total, desc=what, unit="req", disable=disable or not self.progress)

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False, **kwargs: Any,
    ) -> list[tuple[float, bool]]:  # fmt: skip
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        with self._bar(len(pairs), "loglikelihood", disable_tqdm) as bar:
            out = score(self.model, pairs, batch_size=self.batch_size, progress=bar.update)
        for (key, _, _), answer in zip(requests, out, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over disjoint windows of n_ctx tokens (see
        :func:`glassgpt.sample.harness.rolling_windows`), every window in one batched pass."""
        texts = [req.args[0] for req in requests]
        windows, owner = [], []
        for i, text in enumerate(texts):
            for w in rolling_windows(self.tok_encode(text), self.prefix_token_id, self.max_length):
                windows.append(w)
                owner.append(i)
        with self._bar(len(windows), "loglikelihood_rolling windows", disable_tqdm) as bar:
            scored = score(self.model, windows, batch_size=self.batch_size, progress=bar.update)
        totals = [0.0] * len(texts)
        for i, (lp, _) in zip(owner, scored, strict=True):
            totals[i] += lp
        for text, total in zip(texts, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Text after each context until a stop string, ``<|endoftext|>`` or ``max_gen_toks``
        tokens; requests with the same generation options run in batches, longest first."""
        args = [req.args for req in requests]
        groups: dict[str, list[int]] = {}
        for i, (_, kwargs) in enumerate(args):
            groups.setdefault(json.dumps(kwargs, sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(args)
        with self._bar(len(args), "generate_until", disable_tqdm) as bar:
            for members in groups.values():
                options, until = self._generation_options(dict(args[members[0]][1]))
                keep = self.max_length - options["max_new_tokens"]
                keep = keep if keep > 0 else max(1, 3 * self.max_length // 4)
                prompts = {i: self.tok_encode(args[i][0])[-keep:] for i in members}
                order = sorted(members, key=lambda i: -len(prompts[i]))
                for s in range(0, len(order), self.batch_size):
                    chunk = order[s : s + self.batch_size]
                    ids = generate(self.model, [prompts[i] for i in chunk],
                                   tokenizer=self.tokenizer, **options)  # fmt: skip
                    for i, row in zip(chunk, ids, strict=True):
                        out[i] = cut_at_stop(self.tok_decode(row), until)
                        self.cache_hook.add_partial("generate_until", args[i], out[i])
                    bar.update(len(chunk))
        return out

    def _generation_options(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """``glassgpt.sample.generate``'s options for a task's ``generation_kwargs``."""
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else [s for s in until if s]
        eot = self.tokenizer.special_tokens.get(END_OF_TEXT) if hasattr(
            self.tokenizer, "special_tokens") else None  # fmt: skip
        options: dict[str, Any] = {
            "max_new_tokens": int(kwargs.pop("max_gen_toks", MAX_GEN_TOKS)),
            "stop": tuple(until),
            "stop_ids": () if eot is None else (int(eot),),
            "overflow": "truncate",
            "temperature": 0.0,
        }
        temperature = float(kwargs.get("temperature", 0.0) or 0.0)
        if kwargs.get("do_sample") and temperature > 0:
            options.update(temperature=temperature, seed=self.seed)
            if kwargs.get("top_p") is not None:
                options["top_p"] = float(kwargs["top_p"])
            if kwargs.get("top_k") is not None:
                options["top_k"] = int(kwargs["top_k"])
        return options, until

    def get_model_info(self) -> dict[str, Any]:
        config = self.model.config
        return {"model_name": self.name, "model_num_parameters": sum(
            p.numel() for p in self.model.parameters()), "n_ctx": config.n_ctx}  # fmt: skip


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first occurrence of any stop string.

    >>> cut_at_stop("one. two\\n\\nthree", ["\\n\\n", "."])
    'one'
    """
    cut = min((i for s in until if (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


def parse_tasks(spec: str | Sequence[str]) -> list[str]:
    """Task names from ``"a,b"`` (or a list of such), in order, without repeats.

    >>> parse_tasks(["hellaswag,lambada_openai", "hellaswag"])
    ['hellaswag', 'lambada_openai']
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    names = [n.strip() for item in items for n in item.split(",") if n.strip()]
    if not names:
        raise GlassError("--tasks: no task named (e.g. --tasks hellaswag,lambada_openai)")
    return list(dict.fromkeys(names))


def task_manager(names: Sequence[str], include_path: Sequence[str] = ()) -> Any:
    """lm-eval's ``TaskManager`` that knows every name: the ``include_path`` folders alone
    when they hold them all (fast), else with lm-eval's catalogue (seconds: thousands of
    YAML files); an unknown name is a one-line error naming the closest ones."""
    for path in include_path:
        if not Path(path).is_dir():
            raise GlassError(f"--include-path {path}: not a folder of task YAML files")
    logging.getLogger("lm_eval").setLevel(logging.WARNING)

    def unknown(tm: Any) -> list[str]:
        known = tm.all_tasks
        return [n for n in names if not (fnmatch.filter(known, n) if "*" in n else n in known)]

    paths = [str(p) for p in include_path] or None
    if paths:
        tm = lm_eval.tasks.TaskManager(include_path=paths, include_defaults=False)
        if not unknown(tm):
            return tm
    tm = lm_eval.tasks.TaskManager(include_path=paths)
    missing = unknown(tm)
    if missing:
        close = difflib.get_close_matches(missing[0], tm.all_tasks, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise GlassError(
            f"--tasks: unknown task {missing[0]!r}{hint}; `lm-eval ls tasks` lists them, "
            "--include-path DIR adds your own YAML tasks"
        )
    return tm


def run_tasks(
    checkpoint: str | Path,
    tasks: str | Sequence[str],
    *,
    num_fewshot: int | None = None,
    limit: float | None = None,
    batch_size: int | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    include_path: Sequence[str] = (),
    bootstrap_iters: int = 100_000,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` of the checkpoint's model on ``tasks``: its results
    dictionary (``results``, ``configs``, ``n-shot``, ... as lm-eval writes them)."""
    names = parse_tasks(tasks)
    if num_fewshot is not None and num_fewshot < 0:
        raise GlassError(f"--num-fewshot: must be ≥ 0, got {num_fewshot}")
    if limit is not None and limit <= 0:
        raise GlassError(f"--limit: must be > 0, got {limit}")
    manager = task_manager(names, include_path)
    model, tok = load(checkpoint, device=parse_device(device))
    dtype_ = parse_dtype(dtype or "float32")
    if dtype_ != torch.float32:
        model = cast(model, dtype_)
    lm = GlassLM(model, tok, batch_size=batch_size or 32, seed=seed, progress=progress,
                 name=str(checkpoint))  # fmt: skip
    if limit is not None and limit >= 1:
        limit = int(limit)
    try:
        results = lm_eval.simple_evaluate(
            model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit, task_manager=manager,
            bootstrap_iters=bootstrap_iters, log_samples=False, random_seed=seed,
            numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
        )  # fmt: skip
    except (ConnectionError, FileNotFoundError) as e:  # the tasks' data, through datasets
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GlassError(
            f"--tasks: a task's data could not be read: {first} (lm-eval fetches it with "
            "datasets: it needs the network once, then HF_DATASETS_OFFLINE=1 reads the cache)"
        ) from None
    if results is None:  # pragma: no cover - only on ranks > 0 of a distributed run
        raise GlassError("lm-eval returned no results")
    return results
