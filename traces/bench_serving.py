"""Workloads as SGLang's own client draws them (``python -m sglang.bench_serving``, SGLang 0.5.23).

The source is ``sglang/benchmark/datasets/{common,random,sharegpt}.py`` and ``sglang/benchmark/serving.py``
(``bench_serving.py`` re-exports it). The client seeds both global generators once, ``random.seed(seed)`` and
``np.random.seed(seed)`` (serving.py:2055), then draws in this order, which these functions replay with private
``random.Random(seed)`` / ``np.random.RandomState(seed)`` objects (the same streams):

1. the dataset: ``random``/``random-ids`` draw input lengths, then output lengths, each
   ``np.random.randint(max(int(L * ratio), 1), L + 1, size=n)`` (``compute_random_lens``); ``random`` then shuffles
   the ShareGPT conversations with ``random.shuffle``; ``random-ids`` draws ``offsets = np.random.randint(0,
   vocab_size, size=n)``; ``sharegpt`` shuffles with ``random.shuffle`` and draws nothing from numpy;
2. the arrivals (``get_request``): request 0 is sent at once, and after each request the client sleeps
   ``np.random.exponential(1 / request_rate)`` (none when the rate is ``inf``).

Token lengths without a tokenizer: a ShareGPT text counts ``traces.sharegpt.estimate_tokens`` tokens
(``ceil(utf8_bytes / 4)``, at least 1), an approximation of the model tokenizer's count; an empty text counts 0
(bench_serving skips empty prompts). Token identity for the prefix cache:

- ``random``: the prompt is the ShareGPT prompt's tokens repeated and truncated to the drawn length, as
  bench_serving does; a prompt text is one segment (``traces.sharegpt.message_segment``), so two requests share a
  prefix exactly when they were cut from the same ShareGPT text, as on the real server;
- ``random`` without a ShareGPT file (``sharegpt_standin=True``): prompt ``i`` is a stand-in text of its own, one
  segment whose id depends only on ``(seed, i)`` (``standin_segment``), cut to the drawn length. This keeps what
  the prefix cache sees of bench_serving's ``random`` prompts: the client shuffles the same ShareGPT file with the
  same seed in every run, and every run draws its input lengths first, so prompt ``i`` of one run and prompt ``i``
  of a later run on the same server are the same text repeated and cut, and share ``min`` of their lengths as a
  prefix (and ``k`` of ``n`` drawn lengths equal the first ``k`` of ``n' > k``: runs of 10, 80 and 320 prompts
  repeat each other's first prompts exactly). Lost: ShareGPT's duplicate first turns (two prompts of one run
  that are the same text) and the decode/re-encode of the cut text, which can change a token at the cut;
- ``random-ids``: token ``j`` of request ``i`` is ``(offsets[i] + i + j) % vocab_size``, bench_serving's ids;
  prompts share a prefix only by chance (two equal start ids);
- ``sharegpt``: the first turn's text is one segment; the output is the second turn's length.
bench_serving (``return_text``, its default) decodes these ids to text and the server re-encodes them, which can
change the count slightly; here the ids reach the server as drawn. With text prompts bench_serving first lowers
each drawn random input length by the tokenizer's ``num_special_tokens_to_add()`` (1 for a BOS tokenizer such as
Llama's, 0 for Qwen's) and the server adds the BOS back, so the server sees the drawn length, which is what these
requests hold; bench_serving's printed "Total input tokens" is lower by that count per request.

Version notes. ``--random-range-ratio`` in SGLang draws from ``[max(int(L * r), 1), L]``. Before
``compute_random_lens`` (e.g. sgl-project/sglang commit 0033168f, python/sglang/bench_serving.py) the output lower
bound was ``int(L * r)`` without the ``max(.., 1)``, so ratio 0 could draw 0-token outputs; 0.5.23 has the bound 1
for inputs and outputs. ``range_style="sglang-legacy"`` draws with that older bound (the same numpy stream, so the
published totals of such runs are reproduced) and sends a drawn 0 as 1 token. vLLM's ``benchmark_serving`` reads the
ratio as a half-width: ``[int(L * (1 - r)), int(L * (1 + r))]``, output low at least 1 (``range_style="vllm"``; drawn
here with the same numpy stream, so only the bounds are vLLM's, and the input low is at least 1 too: a prompt needs a
token). ``burstiness`` is vLLM's gamma-interval option (shape ``b``, scale ``1 / (rate * b)``); SGLang 0.5.23 has
only the exponential, which equals the gamma stream at ``b = 1`` in numpy's legacy generator. Not replayed:
``--dataset-offset``, ``--prompt-suffix``, ``--apply-chat-template`` (they change text a tokenizer would count).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np

from poolsim.traces.errors import TraceFormatError
from poolsim.traces.request import MAX_SEGMENT_LEN, Request
from poolsim.traces.sharegpt import estimate_tokens, message_segment

DATASETS = ("random", "random-ids", "sharegpt")
RANGE_STYLES = ("sglang", "vllm", "sglang-legacy")
DEFAULT_SEED = 42  # bench_serving's --seed default
WARMUP_OUTPUT_LEN = 32  # warm-up requests ask min(output_len, 32) tokens (serving.py benchmark())
SHAREGPT_MIN_LEN = 2  # sample_sharegpt_requests prunes prompts or outputs under 2 tokens


def random_lens(full_len: int, range_ratio: float, num: int, rng: np.random.RandomState,
                style: str = "sglang", output: bool = False) -> list[int]:
    """``compute_random_lens`` (SGLang), its predecessor (``sglang-legacy``: an output may draw 0) or vLLM's bounds,
    drawn from ``rng``."""
    if full_len <= 0:
        return [0] * num
    if style == "vllm":
        low, high = max(int(full_len * (1 - range_ratio)), 1), int(full_len * (1 + range_ratio))
    elif style == "sglang-legacy" and output:
        low, high = int(full_len * range_ratio), full_len
    else:
        low, high = max(int(full_len * range_ratio), 1), full_len
    return rng.randint(low, high + 1, size=num).tolist()


def arrival_times(num: int, request_rate: float, rng: np.random.RandomState, burstiness: float = 1.0) -> list[float]:
    """Send times of ``get_request``: 0, then cumulative intervals (exponential, or gamma for burstiness != 1)."""
    if request_rate == math.inf:
        return [0.0] * num
    times, t = [], 0.0
    for _ in range(num):
        times.append(t)
        if burstiness == 1.0:
            t += rng.exponential(1.0 / request_rate)
        else:
            t += rng.gamma(burstiness, 1.0 / (request_rate * burstiness))
    return times


def load_sharegpt_pairs(path: str | Path) -> list[tuple[str, str]]:
    """(first turn, second turn) texts of every conversation with at least two turns, in file order."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TraceFormatError(path, e.lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    except UnicodeDecodeError as e:
        raise TraceFormatError(path, None, None, f"not UTF-8 text ({e.reason})") from None
    if not isinstance(data, list):
        raise TraceFormatError(path, 1, None, "expected a JSON array of ShareGPT conversations")
    pairs = []
    for k, conv in enumerate(data):
        turns = conv.get("conversations", conv.get("conversation", [])) if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            raise TraceFormatError(path, None, f"[{k}].conversations", "missing, or not a list of turns")
        if len(turns) < 2:
            continue
        texts = [t.get("value") if isinstance(t, dict) else None for t in turns[:2]]
        for j, text in enumerate(texts):
            if not isinstance(text, str):
                raise TraceFormatError(path, None, f"[{k}].conversations[{j}].value", "missing, or not a string")
        pairs.append((texts[0], texts[1]))
    return pairs


def _text_tokens(text: str) -> int:
    return estimate_tokens(text) if text else 0


def standin_segment(seed: int, index: int) -> int:
    """The segment of the ``index``-th shuffled ShareGPT text under ``seed`` when no ShareGPT file is at hand: the
    same for every run with that seed (bench_serving shuffles the same file with the same seed every run)."""
    return message_segment("bench_serving random stand-in", f"{seed}:{index}")


def _repeat_to(seg: int, prompt_len: int, want: int) -> tuple[tuple[int, int], ...]:
    """The prompt's tokens cut to ``want``, or repeated until ``want`` then cut (sample_random_requests)."""
    if prompt_len >= want:
        return ((seg, want),)
    full, rest = divmod(want, prompt_len)
    return ((seg, prompt_len),) * full + (((seg, rest),) if rest else ())


def _check(num_prompts, input_len, output_len, range_ratio, request_rate, burstiness, style) -> None:
    if num_prompts < 1:
        raise ValueError(f"--num-prompts {num_prompts}: must be >= 1")
    if input_len < 1 or input_len > MAX_SEGMENT_LEN:
        raise ValueError(f"--random-input-len {input_len}: must lie in [1, 2**20]")
    if output_len < 1 or output_len > MAX_SEGMENT_LEN:
        raise ValueError(f"--random-output-len {output_len}: must lie in [1, 2**20]")
    if style not in RANGE_STYLES:
        raise ValueError(f"range style {style!r}: expected sglang, vllm or sglang-legacy")
    if not 0.0 <= range_ratio <= 1.0 or (style == "vllm" and range_ratio >= 1.0):
        raise ValueError(f"--random-range-ratio {range_ratio}: must lie in [0, 1] ([0, 1) for vllm)")
    if not request_rate > 0:
        raise ValueError(f"--request-rate {request_rate}: must be > 0 (inf sends everything at once)")
    if not burstiness > 0:
        raise ValueError(f"--burstiness {burstiness}: must be > 0")


def bench_requests(dataset: str, num_prompts: int, *, input_len: int = 1024, output_len: int = 1024,
                   range_ratio: float = 0.0, seed: int = 1, request_rate: float = math.inf,
                   burstiness: float = 1.0, sharegpt_path: str | Path | None = None,
                   sharegpt_output_len: int | None = None, sharegpt_context_len: int | None = None,
                   vocab_size: int | None = None, range_style: str = "sglang", rid_base: int = 0,
                   sharegpt_standin: bool = False) -> list[Request]:
    """The requests one bench_serving run sends, with their send times (from the run's start) and ids.

    Every request asks ``max_new_tokens = output_len`` with ``ignore_eos`` (bench_serving's default). ``rid_base``
    numbers them from there (back-to-back runs in one simulation need distinct rids). ``sharegpt_standin``:
    ``random`` prompts from stand-in texts instead of a ShareGPT file (module docstring).
    """
    if dataset not in DATASETS:
        raise ValueError(f"--dataset-name {dataset!r}: expected one of {', '.join(DATASETS)}")
    _check(num_prompts, input_len, output_len, range_ratio, request_rate, burstiness, range_style)
    py_rng, np_rng = random.Random(seed), np.random.RandomState(seed)
    if dataset == "sharegpt":
        rows = _sharegpt_rows(num_prompts, py_rng, sharegpt_path, sharegpt_output_len, sharegpt_context_len)
    else:
        in_lens = random_lens(input_len, range_ratio, num_prompts, np_rng, range_style)
        # a 0-token output (sglang-legacy) is sent as 1: a request generates at least one token here
        out_lens = [max(n, 1) for n in random_lens(output_len, range_ratio, num_prompts, np_rng, range_style, True)]
        if dataset == "random" and sharegpt_standin and sharegpt_path is None:
            rows = [(n, out, {"segments": ((standin_segment(seed, i), n),)})
                    for i, (n, out) in enumerate(zip(in_lens, out_lens))]
        elif dataset == "random":
            rows = _random_rows(in_lens, out_lens, py_rng, sharegpt_path)
        else:
            rows = _random_id_rows(in_lens, out_lens, np_rng, vocab_size)
    if not rows:
        raise ValueError(f"--dataset-name {dataset}: no ShareGPT conversation passes bench_serving's filters")
    times = arrival_times(len(rows), request_rate, np_rng, burstiness)
    return [Request(rid=rid_base + i, arrival_s=t, input_len=n, output_len=out, max_new_tokens=out, ignore_eos=True,
                    **ident) for i, ((n, out, ident), t) in enumerate(zip(rows, times))]


def _need_path(path, dataset: str) -> Path:
    if path is None:
        extra = "; or --standin-prompts" if dataset == "random" else ""
        raise ValueError(f"--dataset-name {dataset} needs --dataset-path (a ShareGPT JSON file; bench_serving "
                         f"downloads ShareGPT_V3_unfiltered_cleaned_split.json, poolsim works offline{extra})")
    return Path(path)


def _random_rows(in_lens, out_lens, rng: random.Random, path):
    pairs = load_sharegpt_pairs(_need_path(path, "random"))
    rng.shuffle(pairs)
    rows = []
    for prompt, _ in pairs:
        if len(rows) == len(in_lens):
            break
        n = _text_tokens(prompt)
        if n == 0:
            continue  # bench_serving skips empty prompts
        i = len(rows)
        rows.append((in_lens[i], out_lens[i], {"segments": _repeat_to(message_segment("user", prompt), n, in_lens[i])}))
    return rows


def _random_id_rows(in_lens, out_lens, rng: np.random.RandomState, vocab_size):
    if not vocab_size or vocab_size < 1:
        raise ValueError("--dataset-name random-ids needs the tokenizer's vocab_size (from the model config)")
    offsets = rng.randint(0, vocab_size, size=len(in_lens))
    return [(n, out, {"token_ids": (int(offsets[i]) + i + np.arange(n, dtype=np.int64)) % vocab_size})
            for i, (n, out) in enumerate(zip(in_lens, out_lens))]


def _sharegpt_rows(num: int, rng: random.Random, path, fixed_output_len, context_len):
    if fixed_output_len is not None and fixed_output_len < 4:
        raise ValueError(f"--sharegpt-output-len {fixed_output_len}: bench_serving requires >= 4")
    pairs = load_sharegpt_pairs(_need_path(path, "sharegpt"))
    rng.shuffle(pairs)
    rows = []
    for prompt, completion in pairs:
        if len(rows) == num:
            break
        n = _text_tokens(prompt)
        out = _text_tokens(completion) if fixed_output_len is None else fixed_output_len
        if n < SHAREGPT_MIN_LEN or out < SHAREGPT_MIN_LEN:
            continue
        if context_len and n + out > context_len:
            continue
        if n > MAX_SEGMENT_LEN or out > MAX_SEGMENT_LEN:
            continue  # longer than any context poolsim can hold
        rows.append((n, out, {"segments": ((message_segment("user", prompt), n),)}))
    return rows


def warmup_requests(first: Request, count: int, rid_base: int) -> list[Request]:
    """bench_serving's warm-up: ``count`` copies of the first request's prompt, each asking min(output, 32)."""
    out = min(first.output_len, WARMUP_OUTPUT_LEN)
    ident = {"token_ids": first.token_ids} if first.token_ids is not None else {"segments": first.segments}
    return [Request(rid=rid_base + k, arrival_s=0.0, input_len=first.input_len, output_len=out, max_new_tokens=out,
                    ignore_eos=True, **ident) for k in range(count)]
