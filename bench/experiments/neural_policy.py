"""A tiny neural policy for the budget and judge-at-work benchmarks: a character-level GPT-2
pretrained on correct synthetic solutions, then sampled at temperature 1 through the hf backend.

Its errors are a model's, not the synthetic policy's independent per-step coin flips: they
follow from what it has not learnt (which operation comes next, a carry), so they correlate
within a solution and across samples of one prefix.  Its steps are still checkable: the
synthetic checker (``synthetic_policy.step_is_right``) says whether each chunk and those before
it compute the true running values.

A strength is the skill reached, not a step count.  Builds of one recipe for a fixed number of
steps scattered (the weak one was recorded at 31% right and rebuilt at 4%): the CPU thread count
changes the float sums and the run is chaotic enough that a step count names no skill.  So a
build pretrains until its greedy check (``CHECK_PROBLEMS`` fixed problems) lands in the
strength's band, with the numerics fixed by the recipe rather than the caller's environment
(its own thread count, deterministic algorithms, seeded data and initialisation), and records
what it took: steps, the check and its history, libraries, processor, device and a hash of the
weights.  Reused, a build is verified against that hash and checked again; shipped builds
(``SHIPPED``) are found before anything is built, so every machine can use the same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.experiments.lm_training import Device, fit_causal_lm
from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
from stepq.workers.data.synthetic_set import NUMBERS
from stepq.workers.grading.grader import extract_boxed
from stepq.workers.seeds import derive_seed

DEFAULT_CACHE = Path.home() / ".cache" / "stepq" / "bench-neural-policy"
SHIPPED = Path(__file__).parent / "neural_policies"
"""Builds kept with the code (a few hundred KB each), found by recipe key before the cache."""
RECORD = "neural_policy.json"
PROMPT = "Problem: {question}\nSolution:\n"
"""The policy's prompt (``stepq generate --template-file`` takes any text with ``{question}``):
the synthetic set's long instruction would cost a character-level model most of its
compute for nothing it needs to learn."""
CHECK_PROBLEMS = 100
"""The greedy check's size: at 32 problems one answer moved the share by 3 points and a 15-point
band held 5 answers."""


class PolicyRefused(Exception):
    """A build that cannot be used as its recipe's policy (changed weights, a check outside the
    band, a run that never reached it)."""


@dataclass(frozen=True)
class Recipe:
    band: tuple[float, float]
    """The share of the greedy check answered right at which the build stops: the strength."""
    max_steps: int = 20000
    """A run still below the band here is refused, not kept."""
    check_every: int = 200
    fine_every: int = 20
    """Steps between checks once the last check reaches half of the lowest band still waiting:
    the skill does not rise steadily but jumps, after 3,400 to 11,500 steps by seed, from about
    10% to 60-100% right within 200-500 steps (docs/experiments/policies.md), so a band is
    crossed between two coarse checks."""
    threads: int = 2
    """torch's CPU threads during the build, whatever the caller's OMP_NUM_THREADS: the thread
    count decides the order of float sums, hence the weights."""
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

    def __post_init__(self) -> None:
        if self.check_every % self.fine_every:
            raise ValueError(f"check_every ({self.check_every}) must be a multiple of fine_every ({self.fine_every})")

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    @property
    def run(self) -> Recipe:
        """The pretraining run this recipe stops in: recipes that differ only in their band and
        step limit share one run, each kept when the check first lands in its band."""
        return replace(self, band=(0.0, 0.0), max_steps=0)


STRENGTHS = {"weak": Recipe(band=(0.25, 0.40)), "medium": Recipe(band=(0.60, 0.75))}
"""Bands of the greedy check's share right: the recorded builds of the old step-count recipes
answered 31% (4,000 steps) and 70% (8,000 steps) of their samples right."""

QUICK = Recipe(band=(0.0, 1.0), max_steps=200, check_every=200, fine_every=200, problems=200, batch_size=16)
"""A 200-step build of batches of 16 (batches of 32 took 89 s on 2 cores; with 16 the tiny
chain's test, build included, went from 106 s to 73 s) kept whatever its check (it has learnt
the format, not the arithmetic): the benchmarks' ``--quick`` runs check a chain, not a skill."""

POLICIES = ("synthetic", *STRENGTHS)
"""Whose trajectories a judge benchmark labels: the synthetic policy or a neural strength."""

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


Checker = Callable[[Any, Any, "Recipe"], int]
"""(model, tokenizer, recipe) -> problems of the check answered right."""


def build(recipe: Recipe, cache: Path = DEFAULT_CACHE, device: str | None = None) -> Path:
    """The policy's model directory: a shipped or cached build of this recipe, verified, or a
    new one."""
    return build_all([recipe], cache, device)[recipe]


def build_all(
    recipes: list[Recipe],
    cache: Path = DEFAULT_CACHE,
    device: str | None = None,
    checker: Checker | None = None,
    fresh: bool = False,
) -> dict[Recipe, Path]:
    """Each recipe's model directory, verifying the kept ones and building the missing ones (one
    pretraining run per ``Recipe.run``).  ``device`` None: CUDA when there is one.  ``checker``
    None: the greedy check (the tests script one to drive the stopping rule).  ``fresh``: build
    every recipe into ``cache`` whatever is kept (a rebuild, to compare with the shipped one)."""
    checker = checker or check_model
    out: dict[Recipe, Path] = {}
    missing: dict[Recipe, list[Recipe]] = {}
    for recipe in recipes:
        kept = None if fresh else find(recipe, cache)
        if kept is not None:
            out[recipe] = verify(kept, recipe, checker)
        else:
            group = missing.setdefault(recipe.run, [])
            if recipe not in group:
                group.append(recipe)
    for group in missing.values():
        out.update(_build_group(group, cache, device, checker))
    return out


def add_policy_cache_option(ap: argparse.ArgumentParser) -> None:
    """The judge benchmarks' ``--policy-cache``, read by ``policy_model``."""
    ap.add_argument(
        "--policy-cache",
        type=Path,
        default=None,
        help=f"Where the neural policies' builds are kept (default {DEFAULT_CACHE}; with --quick, a scratch folder "
        "unless named).",
    )


def policy_model(policy: str, cache: Path | None, quick: bool = False, scratch: Path | None = None) -> Path | None:
    """A judge benchmark's policy: None for the synthetic one, else the strength's build
    (verified, or built in its band) in ``cache`` (None: ``DEFAULT_CACHE``); ``quick`` takes
    ``QUICK``'s build, kept in ``scratch`` unless a ``cache`` is named (runs that share one
    build it once: the test suite's)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {POLICIES}")
    if policy == "synthetic":
        return None
    if quick:
        return build(QUICK, cache or scratch or DEFAULT_CACHE)
    return build(STRENGTHS[policy], cache or DEFAULT_CACHE)


def kept_build(recipe: Recipe, cache: Path) -> Path:
    """The kept build of this recipe (the cache's, else the shipped one), verified; never builds."""
    kept = find(recipe, cache)
    if kept is None:
        raise PolicyRefused(f"no build of recipe {recipe.key} in {cache} or {SHIPPED}")
    return verify(kept, recipe)


def find(recipe: Recipe, cache: Path) -> Path | None:
    """The kept build of this recipe: the cache's, else the shipped one."""
    for root in (cache, SHIPPED):
        if (root / recipe.key / RECORD).is_file():
            return root / recipe.key
    return None


def verify(path: Path, recipe: Recipe, checker: Checker | None = None) -> Path:
    """``path`` if its weights are the ones its record names and its greedy check still lands in
    the band; else ``PolicyRefused``, saying which."""
    record = json.loads((path / RECORD).read_text())
    if record.get("recipe") != json.loads(json.dumps(asdict(recipe))):
        raise PolicyRefused(f"{path}: its record is of another recipe than {recipe.key}; delete it to rebuild")
    digest = weights_sha256(path)
    if digest != record.get("weights_sha256"):
        raise PolicyRefused(
            f"{path}: the weights do not match their record (sha256 {digest[:16]}..., recorded "
            f"{str(record.get('weights_sha256'))[:16]}...): they were changed after the build; delete the "
            "folder to rebuild, or restore the recorded weights"
        )
    said = record["check"]
    right = greedy_check(path, recipe, checker)
    if not _in_band(right, recipe):
        raise PolicyRefused(
            f"{path}: its greedy check reads {right}/{CHECK_PROBLEMS} here, outside the band "
            f"{_band(recipe)} (recorded {said['right']}/{said['problems']} on {record['device']})"
        )
    note = "" if right == said["right"] else f"; recorded {said['right']} on {record['device']}"
    print(f"neural policy: {path.name} verified (weights {digest[:12]}, greedy check {right}/{CHECK_PROBLEMS}{note})")
    return path


def _build_group(group: list[Recipe], cache: Path, device: str | None, checker: Checker) -> dict[Recipe, Path]:
    """One pretraining run for recipes that differ only in their bands: each recipe's weights
    are kept at the first check inside its band; the run ends when every one is kept."""
    run = group[0].run
    limit = max(r.max_steps for r in group)
    work = cache / f"run-{run.key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    kept: dict[Recipe, Path] = {}
    history: list[tuple[int, int]] = []
    started = time.perf_counter()

    def on_check(step: int, model: Any, tokenizer: Any) -> bool:
        waiting = [r for r in group if r not in kept]
        near = history and history[-1][1] / CHECK_PROBLEMS >= min(r.band[0] for r in waiting) / 2
        if step % run.check_every and not near:
            return False
        right = checker(model, tokenizer, run)
        history.append((step, right))
        print(f"neural policy: step {step}: greedy check {right}/{CHECK_PROBLEMS}", flush=True)
        for recipe in waiting:
            if step <= recipe.max_steps and _in_band(right, recipe):
                kept[recipe] = _keep(
                    cache / recipe.key, recipe, model, tokenizer, history, time.perf_counter() - started
                )
        waiting = [r for r in group if r not in kept]
        return not waiting or all(right / CHECK_PROBLEMS > r.band[1] for r in waiting)

    with fixed_numerics(run.threads) as where:
        _initialise(work, run)
        encoded = _encode(work, run)
        fit_causal_lm(
            work, encoded, limit, run.batch_size, run.seed, lr=run.lr, check_every=run.fine_every,
            on_check=on_check, log_every=1000, device=Device(device or where),
        )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in group if r not in kept]
    if failed:
        trace = ", ".join(f"{s}: {r}" for s, r in history[-8:])
        raise PolicyRefused(
            "; ".join(f"recipe {r.key} never landed in its band {_band(r)}" for r in failed)
            + f" (greedy checks out of {CHECK_PROBLEMS} by step, the last ones: {trace}); a check that rose past"
            " the band needs a smaller check_every, one that stayed below it more steps"
        )
    return kept


def _keep(
    path: Path, recipe: Recipe, model: Any, tokenizer: Any, history: list[tuple[int, int]], seconds: float
) -> Path:
    """Save a recipe's weights as they are at this check, with the record that identifies them."""
    import tokenizers
    import torch
    import transformers

    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    step, right = history[-1]
    on = next(model.parameters()).device
    record = {
        "recipe": asdict(recipe),
        "steps": step,
        "check": {"problems": CHECK_PROBLEMS, "right": right, "band": list(recipe.band)},
        "check_history": history,
        "seconds": round(seconds),
        "weights_sha256": weights_sha256(path),
        "libraries": {m.__name__: m.__version__ for m in (torch, transformers, tokenizers)},
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(on) if on.type == "cuda" else "cpu",
        "processor": processor_name(),
    }
    (path / RECORD).write_text(json.dumps(record, indent=1))
    print(f"neural policy: kept {recipe.key} at step {step} ({right}/{CHECK_PROBLEMS}) in {path}", flush=True)
    return path


@contextmanager
def fixed_numerics(threads: int) -> Iterator[str]:
    """The build's numerics, whatever the caller's: its thread count, deterministic algorithms,
    no TF32; the caller's settings come back afterwards.  Yields the device the build runs on."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    cuda = torch.backends.cuda
    before_cuda = (
        cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        cuda.flash_sdp_enabled(),
        cuda.mem_efficient_sdp_enabled(),
    )
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    cuda.enable_flash_sdp(False)  # both fused attentions' backward passes are non-deterministic
    cuda.enable_mem_efficient_sdp(False)
    try:
        yield "cuda" if torch.cuda.is_available() else "cpu"
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
        cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before_cuda[:2]
        cuda.enable_flash_sdp(before_cuda[2])
        cuda.enable_mem_efficient_sdp(before_cuda[3])


def _initialise(path: Path, run: Recipe) -> None:
    from stepq.trainer.tiny_model import build_tiny_model

    build_tiny_model(path, seed=run.seed, n_positions=512, n_embd=run.width, n_layer=run.layers, n_head=run.heads)


def _encode(path: Path, run: Recipe) -> list[tuple[list[int], int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    encoded = []
    for prompt, solution in training_texts(run):
        start = len(tokenizer.encode(prompt, add_special_tokens=False))
        ids = [*tokenizer.encode(prompt + solution, add_special_tokens=False), tokenizer.eos_token_id]
        encoded.append((ids, start))
    return encoded


def check_problems(recipe: Recipe) -> list[Any]:
    """The greedy check's fixed problems (a seed tag of their own, apart from training's)."""
    return [
        make_problem(derive_seed("neural-policy-check", recipe.seed, i), *recipe.lengths, NUMBERS[recipe.numbers])
        for i in range(CHECK_PROBLEMS)
    ]


def greedy_check(path: Path, recipe: Recipe, checker: Checker | None = None) -> int:
    """Problems of the fixed check set that the saved policy's greedy answer gets right."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return (checker or check_model)(model, tokenizer, recipe)


def check_model(model: Any, tokenizer: Any, recipe: Recipe) -> int:
    """Greedy answers are deterministic, so two builds compare at a glance (the benchmarks sample
    at temperature 1, whose accuracy is a figure of the run, not of the build)."""
    import torch

    drawn = check_problems(recipe)
    tokenizer.padding_side = "left"
    on = next(model.parameters()).device
    batch = tokenizer([PROMPT.format(question=p.question) for p in drawn], return_tensors="pt", padding=True).to(on)
    with torch.no_grad():
        ids = model.generate(**batch, do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(extract_boxed(text) == str(p.answer) for p, text in zip(drawn, texts, strict=True))


def weights_sha256(path: Path) -> str:
    """A hash of the tensors themselves (names, dtypes, shapes, bytes), not of the file, whose
    header a safetensors version may write differently."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        for name in sorted(f.keys()):
            tensor = f.get_tensor(name).contiguous()
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def compare_builds(rebuilt: Path, shipped: Path) -> dict[str, Any]:
    """A rebuild beside the shipped build of its recipe: whether the weights are the same tensors,
    and where each stopped.  Different weights in the band are a build of the same strength, not a
    failure; the band is the contract, the hash is the reproducibility."""
    new = json.loads((rebuilt / RECORD).read_text())
    old = json.loads((shipped / RECORD).read_text()) if (shipped / RECORD).is_file() else None
    out: dict[str, Any] = {
        "recipe": rebuilt.name,
        "rebuilt": {k: new[k] for k in ("steps", "check", "weights_sha256", "torch_threads", "processor", "seconds")},
        "caller_omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    if old is not None:
        out["shipped"] = {k: old[k] for k in ("steps", "check", "weights_sha256", "torch_threads", "processor")}
        out["same_weights"] = new["weights_sha256"] == old["weights_sha256"]
    return out


def _in_band(right: int, recipe: Recipe) -> bool:
    low, high = recipe.band
    return low <= right / CHECK_PROBLEMS <= high


def _band(recipe: Recipe) -> str:
    return f"{recipe.band[0]:.0%}-{recipe.band[1]:.0%}"


def processor_name() -> str:
    """The CPU's model name (Linux's, else the platform's), which decides the float kernels a
    build runs on: the same recipe built on another processor gives other weights."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def trace(recipe: Recipe, workdir: Path, device: str | None = None, emit: Callable[[str], None] = print) -> None:
    """Pretrain ``recipe.max_steps`` steps without stopping, printing the greedy check at every
    ``check_every``: how a recipe's skill moves with steps, seeds and numerics (the GPU sweep)."""
    run = recipe.run
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)

    def on_check(step: int, model: Any, tokenizer: Any) -> bool:
        right = check_model(model, tokenizer, run)
        emit(
            json.dumps(
                {"recipe": run.key, "seed": run.seed, "width": run.width, "lr": run.lr, "step": step, "right": right}
            )
        )
        return False

    with fixed_numerics(run.threads) as where:
        _initialise(workdir, run)
        fit_causal_lm(
            workdir, _encode(workdir, run), recipe.max_steps, run.batch_size, run.seed, lr=run.lr,
            check_every=run.check_every, on_check=on_check, log_every=0, device=Device(device or where),
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description="Build, verify or trace the benchmarks' neural policies.")
    ap.add_argument(
        "action",
        choices=["build", "verify", "rebuild", "trace"],
        help="rebuild: build into --cache whatever is kept, then compare with the shipped build",
    )
    ap.add_argument("--strengths", default="weak,medium")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    ap.add_argument("--seed", type=int, default=None, help="trace/build: another seed of the recipe")
    ap.add_argument("--max-steps", type=int, default=None, help="trace: steps to run")
    ap.add_argument("--check-every", type=int, default=None)
    ap.add_argument("--fine-every", type=int, default=None)
    ap.add_argument("--width", type=int, default=None, help="trace/build: another width")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--band", default=None, help="LOW,HIGH: another band for every strength (a dry run's)")
    args = ap.parse_args()
    knobs = ("seed", "max_steps", "check_every", "fine_every", "width", "lr")
    changes: dict[str, Any] = {k: v for k in knobs if (v := getattr(args, k)) is not None}
    if args.band:
        low, high = (float(x) for x in args.band.split(","))
        changes["band"] = (low, high)
    recipes = [replace(STRENGTHS[s], **changes) for s in args.strengths.split(",")]
    try:
        if args.action == "trace":
            trace(recipes[-1], args.cache / f"trace-{recipes[-1].key}", args.device)
        elif args.action == "verify":
            for recipe in recipes:
                kept_build(recipe, args.cache)
        elif args.action == "rebuild":
            for recipe, path in build_all(recipes, args.cache, args.device, fresh=True).items():
                print(json.dumps(compare_builds(path, SHIPPED / recipe.key)))
        else:
            for recipe, path in build_all(recipes, args.cache, args.device).items():
                print(json.dumps({"recipe": recipe.key, "path": str(path), **json.loads((path / RECORD).read_text())}))
    except PolicyRefused as refused:
        raise SystemExit(f"neural policy: {refused}") from None


if __name__ == "__main__":
    main()
