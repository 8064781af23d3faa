"""Can the backbone learn the check at all?  The supervised side of the judge benchmarks, on
PyTorch and transformers alone (no TRL, vLLM or database), so it runs the same on 2 CPU cores
and on one GPU in bf16 (``bench/experiments/judge_gpu.py``).

- ``pretrain_backbone``: a character-level Llama pretrained on correct synthetic solutions;
- ``teach_verdict``: the verdict (after its analysis, if any) taught by cross-entropy (stepq's
  ``sft`` method) on the
  answer tokens, the target either the Monte Carlo label or the synthetic step truth (the
  ceiling: what the backbone can learn from noise-free, unlimited labels);
- ``evaluate_capacity``: greedy verdicts and P(Positive) scores on a held-out ProcessBench
  file, the official F1 (greedy, and as a scorer with the threshold chosen on another file),
  the per-step accuracy against the truth, and balanced accuracy on the snapshot's validation
  split against its labels; 95% bootstrap intervals over problems.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.experiments.judge_format import JUDGE_TEMPLATE, drill_lines, judge_answer, judge_prompt, row_local_truth
from bench.experiments.lm_training import CPU, Device, fit_causal_lm
from bench.experiments.stats import balanced_accuracy, bootstrap, grouped, processbench_f1
from stepq.workers.seeds import derive_seed


def lm_train(
    model_dir: Path,
    examples: Sequence[tuple[str, str]],
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    group: int = 1,
    device: Device = CPU,
    log_every: int = 0,
) -> float:
    """Next-token training on (context, target) pairs, the loss on the target (and the end of
    text after it) only; the rate decaying linearly to 0, AdamW's default weight decay.  With
    ``group`` > 1 a batch is made of whole runs of ``group`` consecutive examples.  Saves the
    model in place; returns the last loss.  (The backbone's pretraining and the GRPO judge's
    format stage; a judge taught its verdicts trains through ``teach_verdict``.)"""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded: list[tuple[list[int], int]] = []
    for context, target in examples:
        c = tokenizer.encode(context, add_special_tokens=False)
        encoded.append(([*c, *tokenizer.encode(target, add_special_tokens=False), 0], len(c)))
    return fit_causal_lm(
        model_dir,
        encoded,
        steps,
        batch,
        seed,
        lr=lr,
        schedule="linear-decay",
        weight_decay=0.01,
        group=group,
        device=device,
        pad_id=0,
        log_every=log_every,
    )


def pretrain_backbone(
    path: Path,
    seed: int,
    *,
    layers: int,
    width: int,
    problems: int,
    steps: int,
    numbers: str,
    batch: int = 16,
    device: Device = CPU,
    drills: int = 0,
) -> float:
    """A character-level Llama (head dimension 64) pretrained on correct synthetic solutions,
    so it computes the steps it will judge, and on ``drills`` documents of arithmetic drills in
    the compact analysis's spelling (8 lines each), mixed in.  Returns the last loss."""
    from stepq.trainer.tiny_model import build_tiny_llama

    build_tiny_llama(path, seed=seed, max_positions=1024, hidden_size=width, num_layers=layers)
    solutions = backbone_texts(seed, problems, numbers, drills)
    return lm_train(path, solutions, steps, batch, 1e-3, seed, device=device, log_every=1000)


def backbone_texts(seed: int, problems: int, numbers: str, drills: int) -> list[tuple[str, str]]:
    """The pretraining documents: ``problems`` correct solutions and ``drills`` drill
    documents, shuffled under ``seed``."""
    from stepq.workers.backends.synthetic_policy import SyntheticPolicy, make_problem
    from stepq.workers.data.synthetic_set import NUMBERS

    policy = SyntheticPolicy(error_rate=0.0, recovery_rate=0.0)
    solutions = []
    for i in range(problems):
        problem = make_problem(derive_seed("judge-grpo-pretrain", seed, i), numbers=NUMBERS[numbers])
        solutions.append((problem.question + "\n", "".join(s.text for s in policy.solve(problem, i))))
    rng = random.Random(derive_seed("judge-drills", seed))
    solutions += [("Drill:\n", drill_lines(rng, 8)) for _ in range(drills)]
    random.Random(seed).shuffle(solutions)
    return solutions


def drill_accuracy(path: Path, seed: int, count: int = 300, device: Device = CPU) -> float:
    """How many of ``count`` fresh drills (``45-7=``) the backbone completes right, greedily:
    whether it computes in the compact spelling at all."""
    rng = random.Random(derive_seed("judge-drills-held-out", seed))
    lines = drill_lines(rng, count).split("\n")
    judge = LocalJudge(path, device)
    heads = ["Drill:\n" + line[: line.index("=") + 1] for line in lines]
    answers = judge.answers(heads, 5)
    return 100.0 * sum(a.split("\n")[0] == line.split("=")[1] for a, line in zip(answers, lines, strict=True)) / count


def teach_verdict(
    backbone: Path,
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    target: str,
    analysis: str,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    device: Device = CPU,
    check: Sequence[Mapping[str, Any]] = (),
    check_untaught: bool = False,
) -> tuple[Path, float]:
    """The verdict (after its analysis) taught by cross-entropy through stepq's supervised
    method (``stepq train --method sft``: TRL's SFT trainer, the loss on the answer only), as a
    training run recorded in a throwaway ``out/runs.db``; ``target`` one of
    ``TARGETS``.  ``check``: rows taught beside them with their ``local`` truth whatever the
    target (``judge_check_rows``: the check taught where copying the claim does not pay);
    ``check_untaught``: their verdicts read but not taught (``untaught_verdict``).  The
    judge is asked afterwards with the benchmark's prompt (``JUDGE_TEMPLATE``, kept beside it).
    Returns the judge's model folder and its last logged loss."""
    from stepq.migrations import upgrade
    from stepq.models import Database
    from stepq.trainer import methods
    from stepq.trainer.training.runs import TrainOptions

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    records: list[dict[str, str]] = [
        {"prompt": p, "completion": a} for p, a in verdict_examples(rows, target, analysis)
    ]
    for p, a in verdict_examples(check, "local", analysis):
        records.append({"prompt": p, **(untaught_verdict(a) if check_untaught else {"completion": a})})
    upgrade(f"sqlite:///{out / 'runs.db'}")
    db = Database(f"sqlite:///{out / 'runs.db'}")
    try:
        recipe = sft_recipe(backbone, out / "template.txt", steps, batch, lr, seed, device)
        data = methods.TrainingData(records=records, name=f"verdicts:{target}:{analysis}")
        result = methods.train(db, "sft", recipe, data, out / "sft", TrainOptions())
    finally:
        db.dispose()
    return kept_verdict(out) or (result.final_model, float("nan"))


def untaught_verdict(answer: str) -> dict[str, str]:
    """An answer as a record whose analysis is taught and whose verdict (``\\boxed{...}`` to
    the end) is read only (``stepq train --method sft``'s ``untaught`` text)."""
    at = answer.rindex("\\boxed{")
    return {"completion": answer[:at], "untaught": answer[at:]}


def kept_verdict(out: Path) -> tuple[Path, float] | None:
    """A judge ``teach_verdict`` taught into ``out`` earlier, with its last logged loss, to
    score again without teaching it again; None if ``out`` holds no finished one."""
    from stepq.models import Database, queries

    final = out / "sft" / "final"
    if not (final / "config.json").exists() or not (out / "runs.db").exists():
        return None
    db = Database(f"sqlite:///{out / 'runs.db'}")
    try:
        with db.session() as session:
            run = queries.run_by_output(session, str((out / "sft").resolve()))  # as the run recorded it
            logged = queries.run_metrics(session, run.id) if run else []
    finally:
        db.dispose()
    return final, float(next((m.loss for m in reversed(logged) if m.loss is not None), float("nan")))


def sft_recipe(
    backbone: Path, template: Path, steps: int, batch: int, lr: float, seed: int, device: Device = CPU
) -> Any:
    """The supervised judge's recipe: ``steps`` batches of ``batch`` records, the rate decaying
    linearly to 0 from the first step, AdamW's usual weight decay, the benchmark's prompt as
    plain text (written to ``template``)."""
    from stepq.trainer.training.recipe import Recipe

    template.write_text(JUDGE_TEMPLATE)
    return Recipe.parse(
        f"""method: sft
model: {backbone}
judge_template: {template}
conversational: false
trainer:
  max_steps: {steps}
  per_device_train_batch_size: {batch}
  learning_rate: {lr}
  lr_scheduler_type: linear
  warmup_steps: 0
  weight_decay: 0.01
  max_length: 1024
  logging_steps: {max(1, min(1000, steps // 4))}
  save_steps: {steps}
  save_only_model: true
  report_to: none
  disable_tqdm: true
  bf16: {str(device.bf16).lower()}
  use_cpu: {str(device.name == "cpu").lower()}
  seed: {seed}
"""
    )


TARGETS = ("label", "truth", "local")
"""What a judge may be taught: the snapshot's Monte Carlo ``label``; the synthetic ``truth`` of
the step and every step before it (a ceiling); the ``local`` truth of the step alone (the
same on every step ProcessBench scores, and the check a one-step analysis can make)."""


def verdict_examples(rows: Sequence[Mapping[str, Any]], target: str, analysis: str) -> list[tuple[str, str]]:
    """(prompt, answer) pairs; the answer's verdict is the row's ``target``."""
    if target not in TARGETS:
        raise ValueError(f"target is one of {TARGETS}, not {target!r}")

    def positive(r: Mapping[str, Any]) -> bool:
        if target == "label":
            return r["label"] == "Positive"
        return bool(r["truth"]) if target == "truth" else row_local_truth(r)

    return [
        (
            judge_prompt(r["problem"], r["history"], r["chunk"]),
            judge_answer(r, "Positive" if positive(r) else "Negative", analysis),
        )
        for r in rows
    ]


def answer_room(rows: Sequence[Mapping[str, Any]], analysis: str) -> int:
    """Tokens to let the judge write: the longest answer taught (one character a token, the end
    of text included) and a margin; an analysis of a longer problem may run longer."""
    longest = max(len(judge_answer(r, verdict, analysis)) for r in rows for verdict in ("Positive", "Negative"))
    return longest + 1 + (8 if analysis == "none" else 40)


class LocalJudge:
    """A causal LM asked greedily, in batches, as the benchmark judge is asked: the answer, its
    verdict, and P(Positive) at the verdict's first character after the judge's own analysis."""

    def __init__(self, model_dir: Path, device: Device = CPU, batch: int = 128) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.tokenizer.padding_side = "left"
        dtype = torch.bfloat16 if device.bf16 else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device.name).eval()
        self.device, self.batch = device, batch
        self.p_id, self.n_id = (self.tokenizer.encode(c, add_special_tokens=False)[0] for c in "PN")

    def _batches(self, texts: Sequence[str]) -> Iterator[list[int]]:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch):
            yield order[start : start + self.batch]

    def answers(self, prompts: Sequence[str], max_new: int) -> list[str]:
        import torch

        out = [""] * len(prompts)
        for idx in self._batches(prompts):
            enc = self.tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                gen = self.model.generate(
                    **{k: v.to(self.device.name) for k, v in enc.items()},
                    max_new_tokens=max_new,
                    do_sample=False,
                    pad_token_id=0,
                    eos_token_id=0,
                )
            for i, seq in zip(idx, gen[:, enc["input_ids"].shape[1] :].tolist(), strict=True):
                out[i] = self.tokenizer.decode([t for t in seq if t != 0])
        return out

    def p_positive(self, prompts: Sequence[str], answers: Sequence[str]) -> list[float]:
        """P(P) / (P(P) + P(N)) where the verdict's word begins, after the judge's own answer up
        to ``\\boxed{``; 0.5 for an answer that never opens a box."""
        import torch

        heads = [
            p + a[: a.index("\\boxed{") + len("\\boxed{")] if "\\boxed{" in a else None
            for p, a in zip(prompts, answers, strict=True)
        ]
        live = [i for i, h in enumerate(heads) if h is not None]
        out = [0.5] * len(prompts)
        texts = [heads[i] for i in live]
        for idx in self._batches(texts):  # type: ignore[arg-type]
            enc = self.tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            with torch.no_grad():
                logits = self.model(**{k: v.to(self.device.name) for k, v in enc.items()}).logits[:, -1, :].float()
            pair = torch.softmax(logits[:, [self.p_id, self.n_id]], dim=-1)[:, 0].tolist()
            for i, p in zip(idx, pair, strict=True):
                out[live[i]] = p
        return out

    def judge(self, items: Sequence[Mapping[str, Any]], max_new: int) -> tuple[list[bool | None], list[float]]:
        from stepq.trainer.generative_judge.prompt import parse_verdict

        prompts = [judge_prompt(r["problem"], r["history"], r["chunk"]) for r in items]
        answers = self.answers(prompts, max_new)
        return [parse_verdict(a) for a in answers], self.p_positive(prompts, answers)


def processbench_steps(samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every step of a ProcessBench file's samples as a judged item (its sample, index and history)."""
    return [
        {"sample": s["id"], "k": k, "problem": s["problem"], "history": s["steps"][:k], "chunk": s["steps"][k]}
        for s in samples
        for k in range(len(s["steps"]))
    ]


def _per_sample(items: Sequence[Mapping[str, Any]], values: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for item, v in zip(items, values, strict=True):
        out.setdefault(item["sample"], []).append(v)
    return out


def evaluate_capacity(
    model_dir: Path,
    val_rows: Sequence[Mapping[str, Any]],
    heldout: Sequence[Mapping[str, Any]],
    tune: Sequence[Mapping[str, Any]],
    *,
    max_new: int,
    seed: int,
    device: Device = CPU,
    batch: int = 128,
) -> dict[str, Any]:
    from stepq.trainer.evaluation.processbench import choose_threshold, predictions_at

    judge = LocalJudge(model_dir, device, batch)
    items, tune_items = processbench_steps(heldout), processbench_steps(tune)
    verdicts, scores = judge.judge(items, max_new)
    _, tune_scores = judge.judge(tune_items, max_new)
    val_verdicts, _ = judge.judge(val_rows, max_new) if val_rows else ([], [])
    # greedy: the first step not judged Positive (no verdict is a rejection, as stepq scores it)
    by_sample = _per_sample(items, verdicts)
    labels = {s["id"]: s["label"] for s in heldout}
    greedy = [(labels[sid], next((k for k, v in enumerate(vs) if v is not True), -1)) for sid, vs in by_sample.items()]
    threshold = choose_threshold(_per_sample(tune_items, tune_scores), {s["id"]: s["label"] for s in tune})
    at_t = predictions_at(_per_sample(items, scores), threshold)
    thresholded = [(labels[sid], at_t[sid]) for sid in by_sample]
    # every step up to the first wrong one, against the truth: what ProcessBench needs right
    upto = [
        (it["sample"], it["k"] < labels[it["sample"]] or labels[it["sample"]] == -1, v is True)
        for it, v in zip(items, verdicts, strict=True)
        if labels[it["sample"]] == -1 or it["k"] <= labels[it["sample"]]
    ]
    val = [(r["problem_id"], r["label"] == "Positive", v) for r, v in zip(val_rows, val_verdicts, strict=True)]
    step_acc = 100.0 * sum(t == v for _, t, v in upto) / len(upto)
    validation = (
        {
            "validation_balanced_accuracy": balanced_accuracy(val),
            "validation_balanced_accuracy_ci": bootstrap(
                grouped(val), lambda g: balanced_accuracy([r for grp in g for r in grp]), seed
            ),
        }
        if val
        else {}
    )
    return {
        "processbench_f1": processbench_f1(greedy),
        "processbench_f1_ci": bootstrap(greedy, processbench_f1, seed),
        "thresholded_f1": processbench_f1(thresholded),
        "thresholded_f1_ci": bootstrap(thresholded, processbench_f1, seed),
        "threshold": threshold,
        "step_accuracy": step_acc,
        "step_accuracy_ci": bootstrap(
            grouped(upto), lambda g: 100.0 * sum(t == v for grp in g for _, t, v in grp) / sum(len(x) for x in g), seed
        ),
        "step_balanced_accuracy": balanced_accuracy(upto),
        **validation,
        "no_verdict": sum(v is None for v in verdicts),
        "steps_judged": len(items),
    }
