"""The discriminative PRM: a language-model backbone with a scoring head, one logit per step.

A solution is encoded as the problem, then each step, tokenized piece by piece so each
step's last token is known exactly; the step's score is the head applied to the backbone's
hidden state there (a causal backbone has read the problem and every step so far, and
nothing after).  Saved as a folder: the backbone (``save_pretrained``), its tokenizer,
``score_head.pt`` and ``stepq_prm.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepq.models.errors import ConfigError

HEAD = "score_head.pt"
HEADS = ("mlp", "linear")
META = "stepq_prm.json"
STEP_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Encoded:
    """Token ids of one solution and the position of each step's last token (steps that do
    not fit in ``max_length`` are left out: ``len(ends)`` may be below the step count)."""

    ids: list[int]
    ends: list[int]


def encode(tokenizer: Any, problem: str, steps: Sequence[str], max_length: int) -> Encoded:
    """The problem, a blank line, then the steps as written; each piece tokenized alone."""
    ids: list[int] = list(tokenizer(problem + STEP_SEPARATOR, add_special_tokens=True)["input_ids"])
    ends: list[int] = []
    for step in steps:
        piece = tokenizer(step, add_special_tokens=False)["input_ids"] or [tokenizer.unk_token_id or 0]
        if len(ids) + len(piece) > max_length:
            break
        ids.extend(piece)
        ends.append(len(ids) - 1)
    return Encoded(ids, ends)


def collate(batch: Sequence[Encoded], pad_id: int) -> tuple[Any, Any, Any, Any]:
    """Right-padded ids, attention mask, step end positions and the step mask."""
    import torch

    width = max(len(e.ids) for e in batch)
    steps = max(len(e.ends) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    ends = torch.zeros((len(batch), steps), dtype=torch.long)
    step_mask = torch.zeros((len(batch), steps), dtype=torch.bool)
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        attention[i, : len(e.ids)] = 1
        ends[i, : len(e.ends)] = torch.tensor(e.ends)
        step_mask[i, : len(e.ends)] = True
    return ids, attention, ends, step_mask


def make_head(kind: str, hidden: int) -> Any:
    """The scoring head on the backbone's hidden state.  ``mlp`` (the default): a two-layer
    MLP, as the outcome-supervised PRM paper replaces the LM head with (its width and
    activation are stepq's choice: hidden -> hidden, ReLU, -> 1); ``linear``: one layer."""
    import torch

    if kind not in HEADS:
        raise ConfigError(f"PRM head '{kind}' is not one of: {', '.join(HEADS)}")
    if kind == "linear":
        head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(head.bias)
        return head
    out = torch.nn.Linear(hidden, 1)
    torch.nn.init.zeros_(out.bias)
    return torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), out)


class StepScorer:
    """Backbone + scoring head; ``logits(ids, attention, ends)`` gives [batch, steps]."""

    def __init__(self, backbone: Any, tokenizer: Any, head: Any, max_length: int, meta: dict[str, Any]) -> None:
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.head = head
        self.max_length = max_length
        self.meta = meta

    @classmethod
    def from_base(cls, base_model: str, max_length: int | None = None, seed: int = 0, head: str = "mlp") -> StepScorer:
        """A fresh head on a pretrained (or locally built) causal LM's backbone."""
        import torch
        from transformers import AutoModel, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(base_model)
            backbone = AutoModel.from_pretrained(base_model)
        except OSError as exc:
            raise ConfigError(f"cannot load the PRM's base model {base_model}: {exc}") from None
        torch.manual_seed(seed)
        scorer = make_head(head, backbone.config.hidden_size)
        limit = max_length or _positions(backbone.config)
        return cls(backbone, tokenizer, scorer, limit, {"base_model": base_model, "max_length": limit, "head": head})

    @classmethod
    def starting_from(
        cls, base_model: str, max_length: int | None = None, seed: int = 0, head: str = "mlp"
    ) -> StepScorer:
        """What a training starts from: a stepq PRM whole (its backbone and head: the trainer
        service continues a lineage from its latest judge), any other model with a fresh head."""
        if (Path(base_model) / META).exists():
            return cls.load(base_model)
        return cls.from_base(base_model, max_length, seed, head)

    @classmethod
    def load(cls, path: str | Path) -> StepScorer:
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = Path(path)
        if not (folder / META).exists():
            raise ConfigError(f"{path} is not a stepq PRM (no {META}; train one with 'stepq train --method prm')")
        meta = json.loads((folder / META).read_text())
        backbone = AutoModel.from_pretrained(str(folder))
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        head = make_head(str(meta.get("head", "linear")), backbone.config.hidden_size)  # older folders: linear
        head.load_state_dict(torch.load(folder / HEAD, map_location="cpu", weights_only=True))
        return cls(backbone, tokenizer, head, int(meta["max_length"]), meta)

    def save(self, path: str | Path, **meta: Any) -> None:
        import torch

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        torch.save(self.head.state_dict(), folder / HEAD)
        self.meta = {**self.meta, **meta, "max_length": self.max_length}
        (folder / META).write_text(json.dumps(self.meta, indent=2) + "\n")

    def parameters(self) -> list[Any]:
        return [*self.backbone.parameters(), *self.head.parameters()]

    def train(self, mode: bool = True) -> None:
        self.backbone.train(mode)
        self.head.train(mode)

    def to(self, device: str) -> StepScorer:
        self.backbone.to(device)
        self.head.to(device)
        return self

    @property
    def device(self) -> Any:
        return next(self.head.parameters()).device

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0))

    def encode(self, problem: str, steps: Sequence[str]) -> Encoded:
        return encode(self.tokenizer, problem, steps, self.max_length)

    def logits(self, ids: Any, attention: Any, ends: Any) -> Any:
        import torch

        hidden = self.backbone(input_ids=ids, attention_mask=attention).last_hidden_state
        at_ends = torch.gather(hidden, 1, ends.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        return self.head(at_ends).squeeze(-1)

    def score(self, solutions: Sequence[tuple[str, Sequence[str]]], batch_size: int = 16) -> list[list[float | None]]:
        """Each step's probability of being right; None for steps past ``max_length``."""
        import torch

        out: list[list[float | None]] = []
        self.train(False)
        with torch.no_grad():
            for start in range(0, len(solutions), batch_size):
                part = solutions[start : start + batch_size]
                encoded = [self.encode(problem, steps) for problem, steps in part]
                scored = [e for e in encoded if e.ends]
                found: list[list[float]] = []
                if scored:
                    ids, attention, ends, _ = (t.to(self.device) for t in collate(scored, self.pad_id))
                    p = torch.sigmoid(self.logits(ids, attention, ends)).cpu()
                    found = [p[i, : len(e.ends)].tolist() for i, e in enumerate(scored)]
                probs = iter(found)
                for (_, steps), e in zip(part, encoded, strict=True):
                    row: list[float | None] = list(next(probs)) if e.ends else []
                    out.append(row + [None] * (len(steps) - len(row)))
        return out


def _positions(config: Any) -> int:
    for key in ("n_positions", "max_position_embeddings"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1024
