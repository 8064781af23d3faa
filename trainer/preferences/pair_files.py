"""Step preference pairs as step-wise DPO trains on them: read from an export, and kept only
where they fit the model's length.

Each pair is (prompt = the policy prompt + the steps so far, chosen next step, rejected next step).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError

FIELDS = ("prompt", "chosen", "rejected")
log = logging.getLogger(__name__)


def load_preferences(folder: Path) -> list[dict[str, str]]:
    """A ``stepq export preferences`` folder (``train.jsonl`` or ``train.parquet``)."""
    jsonl, parquet = folder / "train.jsonl", folder / "train.parquet"
    rows: list[dict[str, Any]]
    if jsonl.exists():
        rows = []
        for n, line in enumerate(jsonl.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{jsonl}:{n}: not JSON ({exc.msg})") from None
    elif parquet.exists():
        import pyarrow.parquet as pq

        rows = pq.read_table(parquet).to_pylist()
    else:
        raise ConfigError(f"{folder} holds no train.jsonl or train.parquet (write one with 'stepq export preferences')")
    for n, r in enumerate(rows, 1):
        if not all(isinstance(r.get(k), str) for k in FIELDS):
            raise ConfigError(f"{folder}: pair {n} lacks one of {', '.join(FIELDS)}")
    return [{k: r[k] for k in FIELDS} for r in rows]


def pairs_that_fit(
    pairs: Sequence[dict[str, str]], count_tokens: Callable[[str], int], max_length: int | None
) -> tuple[list[dict[str, str]], int]:
    """The pairs whose prompt and longer next step fit in ``max_length`` tokens (one spare for
    the end-of-sequence token), and how many do not.  A pair that does not fit is left out, not
    cut: TRL cuts the prompt from one end, and a step-wise DPO prompt loses either its problem
    (``keep_end``) or the steps the pair continues (``keep_start``); either teaches another
    conditional than the one the pair was sampled in."""
    if not max_length:
        return list(pairs), 0
    kept = [
        p
        for p in pairs
        if count_tokens(p["prompt"]) + max(count_tokens(p["chosen"]), count_tokens(p["rejected"])) + 1 <= max_length
    ]
    return kept, len(pairs) - len(kept)


def fitting(
    pairs: Sequence[dict[str, str]], base_model: str, max_length: int | None, dataset: str
) -> list[dict[str, str]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model)
    kept, dropped = pairs_that_fit(
        pairs, lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]), max_length
    )
    if not kept:
        raise ConfigError(
            f"{dataset}: none of its {len(pairs)} pairs fits in max_length {max_length} tokens (raise "
            "trainer.max_length: a pair is never cut, since a cut prompt loses its problem or its steps)"
        )
    if dropped:
        log.warning(
            "%s: %d of %d pairs are longer than max_length %s tokens and are left out (never cut)",
            dataset,
            dropped,
            len(pairs),
            max_length,
        )
    return kept
