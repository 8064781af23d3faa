"""Hugging Face transformers, CPU or GPU: batched sampling from a local model directory.

For small models, CPU workers and checks; GPU fleets use vLLM.  Contexts are tokenised as
raw text (no chat template: it was applied once when the trajectory was sampled) and left
padded into micro-batches.  ``transformers`` draws from the global torch RNG, so seeding is
per micro-batch: the same requests give the same completions; with ``per_sample_seeds``
every sample is generated alone under its own seed, exact but slower.

A model's context window (``max_position_embeddings``) bounds context and completion
together: the samples of a context whose ``max_tokens`` would run past it are generated
apart from other contexts, cut at the window (finish reason ``length``, as a completion cut
at ``max_tokens``), and a context that fills the window already fails its work item at once
(a permanent ``GenerationError``), where generating would index past the position table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepq.models.errors import GenerationError
from stepq.workers.backends.base import Completion, GenerationRequest, SamplingParams
from stepq.workers.seeds import derive_seed


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Text up to (not including) the first stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class HFBackend:
    name = "hf"

    def __init__(
        self,
        model_path: str,
        *,
        device: str | None = None,
        dtype: str = "auto",
        batch_size: int = 16,
        per_sample_seeds: bool = False,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = model_path
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.per_sample_seeds = per_sample_seeds
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
        loaded: Any = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, dtype=torch_dtype)
        self.model: Any = loaded.to(self.device)
        self.model.eval()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HFBackend:
        from stepq.models.errors import ConfigError

        if not config.get("model"):
            raise ConfigError("the hf backend needs model: a local model directory")
        return cls(
            str(config["model"]),
            device=config.get("device"),
            dtype=str(config.get("dtype", "auto")),
            batch_size=int(config.get("batch_size", 16)),
            per_sample_seeds=bool(config.get("per_sample_seeds", False)),
        )

    @property
    def generator(self) -> str:
        return f"hf:{self.model_path}"

    @property
    def context_window(self) -> int | None:
        """Tokens of context and completion together the model has positions for."""
        window = getattr(self.model.config, "max_position_embeddings", None)
        return int(window) if window else None

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Completion]]:
        items = [(r, j, req.context, seed) for r, req in enumerate(requests) for j, seed in enumerate(req.seeds)]
        out: list[list[Completion | None]] = [[None] * req.n for req in requests]
        window = self.context_window
        room: dict[str, int] = {}
        if window is not None:
            for ctx in dict.fromkeys(req.context for req in requests):
                used = len(self.tokenizer.encode(ctx, add_special_tokens=False))
                if used >= window:
                    raise GenerationError(
                        f"a context of {used} tokens fills the model's window of {window}", permanent=True
                    )
                if used + params.max_tokens > window:
                    room[ctx] = window - used
        fits = [item for item in items if item[2] not in room]
        size = 1 if self.per_sample_seeds else self.batch_size
        parts = [(fits[start : start + size], params.max_tokens) for start in range(0, len(fits), size)]
        # Contexts near the window, batched by the room they have left, each batch cut at its
        # tightest: a row the cut stopped short of its own room is generated again alone with
        # that room, so none is cut shorter than its own room (one call each, as before, cost a
        # generation call a chunk for a judge whose every prompt is near its window).
        tight = sorted((item for item in items if item[2] in room), key=lambda item: room[item[2]])
        for start in range(0, len(tight), size):
            part = tight[start : start + size]
            parts.append((part, min(room[ctx] for _, _, ctx, _ in part)))
        for part, max_new in parts:
            for item, completion in zip(part, self._generate_batch(part, params, max_new), strict=True):
                own = room.get(item[2], params.max_tokens)
                if completion.finish_reason == "length" and completion.tokens >= max_new and own > max_new:
                    completion = self._generate_batch([item], params, own)[0]
                out[item[0]][item[1]] = completion
        return [[c for c in row if c is not None] for row in out]

    def _generate_batch(
        self, part: Sequence[tuple[int, int, str, int]], params: SamplingParams, max_new_tokens: int
    ) -> list[Completion]:
        import torch

        contexts = [ctx for _, _, ctx, _ in part]
        enc = self.tokenizer(contexts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        torch.manual_seed(derive_seed(*(seed for _, _, _, seed in part)))
        with torch.no_grad():
            generated = self.model.generate(
                **enc,
                do_sample=params.temperature > 0,
                temperature=params.temperature if params.temperature > 0 else None,
                top_p=params.top_p,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id,
            )
        new = generated[:, enc["input_ids"].shape[1] :]
        prompt_lengths = enc["attention_mask"].sum(dim=1).tolist()  # left padding is not prompt
        completions = []
        for row, prompt_tokens in zip(new.tolist(), prompt_lengths, strict=True):
            length = len(row)
            if self.tokenizer.eos_token_id in row:
                length = row.index(self.tokenizer.eos_token_id)
            text = str(self.tokenizer.decode(row[:length], skip_special_tokens=True))
            text, stopped = cut_at_stop(text, params.stop)
            if stopped:
                length = len(self.tokenizer.encode(text, add_special_tokens=False))
            reason = "stop" if stopped or length < len(row) else "length"
            completions.append(Completion(text, length, reason, int(prompt_tokens)))
        return completions

    def continuation_logprobs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """log P(continuation | context) for each (context, continuation): how a generative
        judge's probability of one verdict word is read at the point it writes it."""
        import torch

        out: list[float] = []
        window = self.context_window
        for context, continuation in pairs:
            ctx = self.tokenizer.encode(context, add_special_tokens=False)
            cont = self.tokenizer.encode(continuation, add_special_tokens=False)
            if window is not None and len(ctx) + len(cont) > window:  # it indexed past the position table
                raise GenerationError(
                    f"a context of {len(ctx)} tokens and its {len(cont)}-token verdict do not fit the model's "
                    f"window of {window} (a shorter prompt, such as the pairwise judge's template=brief, or a "
                    "model with a longer context)",
                    permanent=True,
                )
            ids = torch.tensor([ctx + cont], device=self.device)
            with torch.no_grad():
                logits = self.model(ids).logits[0, len(ctx) - 1 : -1].float()
            picked = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(cont, device=self.device)[:, None])
            out.append(float(picked.sum()))
        return out

    def format_prompt(self, user_text: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return str(
                self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
                )
            )
        return user_text

    def close(self) -> None:
        return None
