"""A tiny neural policy for the budget benchmark: a character-level GPT-2 pretrained on
correct synthetic solutions, then sampled at temperature 1 through the hf backend.

Its errors are a model's, not the synthetic policy's independent per-step coin flips: they
follow from what it has not learnt (which operation comes next, a carry), so they correlate
within a solution and across samples of one prefix, and most of its answers are wrong at
the weak strength.  Its steps are still checkable: the synthetic checker
(``synthetic_policy.step_is_right``) says whether each chunk and those before it compute the
true running values.  Strength is the amount of pretraining; each strength is built once
and kept (``--policy-cache``), keyed by its recipe, so the benchmark stays runnable.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.experiments.lm_training import train_causal_lm
from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
from stepq.workers.data.synthetic_set import NUMBERS
from stepq.workers.grading.grader import extract_boxed
from stepq.workers.seeds import derive_seed

DEFAULT_CACHE = Path.home() / ".cache" / "stepq" / "bench-neural-policy"
PROMPT = "Problem: {question}\nSolution:\n"
"""The policy's prompt (``stepq generate --template-file`` takes any text with ``{question}``):
the synthetic set's long instruction would cost a character-level model most of its
compute for nothing it needs to learn."""


@dataclass(frozen=True)
class Recipe:
    steps: int
    """Pretraining steps: the strength."""
    width: int = 64
    layers: int = 2
    heads: int = 2
    batch_size: int = 32
    lr: float = 2e-3
    problems: int = 20000
    numbers: str = "small"
    lengths: tuple[int, int] = (3, 8)
    """Steps per problem, as ``stepq synth`` draws them."""
    seed: int = 0

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


STRENGTHS = {"weak": Recipe(steps=4000), "medium": Recipe(steps=8000)}
"""Pretraining per strength.  Measured here (0.34 s a step on 2 cores): 500 and 1,500 steps
answer 2 of 64 problems right (format and copying learnt, not the arithmetic); 4,000 steps
(23 min) answer 17 of 64; figures per strength are in docs/experiments/budget.md."""

MAX_TOKENS = 300
"""Characters a sample may write: a solution of 8 steps and its answer take ~210."""


def training_texts(recipe: Recipe) -> list[tuple[str, str]]:
    """(prompt, correct solution) pairs in exactly the format a set's trajectories use, on
    problems drawn apart from any set's (a few short ones may coincide by chance: the small
    numbers hold ~180,000 three-step problems)."""
    correct = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
    out = []
    for i in range(recipe.problems):
        problem = make_problem(derive_seed("neural-policy", recipe.seed, i), *recipe.lengths, NUMBERS[recipe.numbers])
        solution = "".join(step.text for step in correct.solve(problem, 0))
        out.append((PROMPT.format(question=problem.question), solution))
    return out


def build(recipe: Recipe, cache: Path = DEFAULT_CACHE) -> Path:
    """The policy's model directory: reused when this recipe was built before, else built
    (random weights, then ``recipe.steps`` of next-token training on correct solutions)."""
    return build_all([recipe], cache)[recipe]


def build_all(recipes: list[Recipe], cache: Path = DEFAULT_CACHE) -> dict[Recipe, Path]:
    """Each recipe's model directory, building the missing ones: recipes that differ only in
    their steps are one pretraining run, the shorter ones kept on the way (the same weights a
    run of exactly their steps ends with), so weak and medium together cost medium's time."""
    from transformers import AutoTokenizer

    from stepq.trainer.tiny_model import build_tiny_model

    out: dict[Recipe, Path] = {}
    missing: dict[Recipe, list[Recipe]] = {}
    for recipe in recipes:
        path = out[recipe] = cache / recipe.key
        if (path / "neural_policy.json").is_file():
            check = json.loads((path / "neural_policy.json").read_text()).get("greedy_check")
            said = f" (greedy check {check['right']}/{check['problems']} right when built)" if check else ""
            print(f"neural policy: reusing {path}{said}", flush=True)
        else:
            missing.setdefault(replace(recipe, steps=0), []).append(recipe)
    for group in missing.values():
        longest = max(group, key=lambda r: r.steps)
        path = out[longest]
        path.mkdir(parents=True, exist_ok=True)
        build_tiny_model(
            path, seed=longest.seed, n_positions=512, n_embd=longest.width, n_layer=longest.layers, n_head=longest.heads
        )
        tokenizer = AutoTokenizer.from_pretrained(path)
        encoded = []
        for prompt, solution in training_texts(longest):
            start = len(tokenizer.encode(prompt, add_special_tokens=False))
            ids = [*tokenizer.encode(prompt + solution, add_special_tokens=False), tokenizer.eos_token_id]
            encoded.append((ids, start))
        started = time.perf_counter()
        keep_at = {r.steps: partial(_keep, out[r], r, started, longest.steps) for r in group if r is not longest}
        loss = train_causal_lm(
            path, encoded, longest.steps, longest.batch_size, longest.seed, lr=longest.lr, keep_at=keep_at
        )
        seconds = time.perf_counter() - started
        print(f"neural policy: {longest.steps} pretraining steps in {seconds:.0f} s (loss {loss:.4f})", flush=True)
        _record(path, longest, seconds, longest.steps, loss)
        for recipe in group:
            _add_check(out[recipe], recipe)
    return out


CHECK_PROBLEMS = 32


def greedy_check(path: Path, recipe: Recipe, problems: int = CHECK_PROBLEMS) -> int:
    """Problems of a fixed check set (drawn under a seed tag of its own) that the policy's greedy
    answer gets right: deterministic, so two builds of one recipe can be compared at a glance
    (the benchmarks sample at temperature 1, whose accuracy is a figure of the run, not the build)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    drawn = [
        make_problem(derive_seed("neural-policy-check", recipe.seed, i), *recipe.lengths, NUMBERS[recipe.numbers])
        for i in range(problems)
    ]
    batch = tokenizer([PROMPT.format(question=p.question) for p in drawn], return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = model.generate(**batch, do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(extract_boxed(text) == str(p.answer) for p, text in zip(drawn, texts, strict=True))


def _add_check(path: Path, recipe: Recipe) -> None:
    """Add the greedy check to a freshly built policy's record, and say it."""
    record = json.loads((path / "neural_policy.json").read_text())
    right = greedy_check(path, recipe)
    record["greedy_check"] = {"problems": CHECK_PROBLEMS, "right": right}
    (path / "neural_policy.json").write_text(json.dumps(record))
    print(f"neural policy ({recipe.steps} steps): greedy check {right}/{CHECK_PROBLEMS} right", flush=True)


def _keep(path: Path, recipe: Recipe, started: float, run_steps: int, model: Any, tokenizer: Any) -> None:
    """Save a shorter recipe's policy on the way through a longer one's run."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    _record(path, recipe, time.perf_counter() - started, run_steps)


def _record(path: Path, recipe: Recipe, seconds: float, run_steps: int, loss: float | None = None) -> None:
    """Mark a policy built: what it is, the seconds its pretraining took, and what else decides
    its weights.  The same recipe rebuilt later has answered far fewer problems right
    (docs/experiments/budget.md): the code and the transformers version do not change a build
    (500 steps bit for bit), the CPU thread count does (float sums in another order), so the
    record names the threads and the processor beside the libraries."""
    import platform

    import tokenizers
    import torch
    import transformers

    libraries = {m.__name__: m.__version__ for m in (torch, transformers, tokenizers)}
    record = {
        "recipe": asdict(recipe),
        "seconds": round(seconds),
        "built_in_run_of": run_steps,
        "loss": loss,
        "libraries": libraries,
        "torch_threads": torch.get_num_threads(),
        "processor": _processor() or platform.processor(),
    }
    (path / "neural_policy.json").write_text(json.dumps(record))


def _processor() -> str | None:
    """The CPU's model name (Linux), which decides the float kernels a build runs on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
