"""Policy sampling: K trajectories per problem, stored with text, answer, outcome, chunks.

Incremental like everything else: sample t of a problem has a fixed seed and a fixed
source key, so raising K samples only the missing ones and a rerun adds nothing.  The
paper's prompt filter (``filter_mixed``) keeps only problems whose K outcomes are neither
all right nor all wrong: the others are marked ``excluded`` and never annotated.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stepq.models import Database, queries
from stepq.models.errors import ConfigError
from stepq.workers.backends import GenerationBackend, GenerationRequest, SamplingParams, generator_id
from stepq.workers.backends.synthetic import require_synthetic_problems
from stepq.workers.data.llm_segment import segment_with_model
from stepq.workers.data.prompts import render
from stepq.workers.data.segmentation import Segmentation, segment
from stepq.workers.grading.grader import Grader, extract_boxed
from stepq.workers.seeds import derive_seed


@dataclass(frozen=True)
class GenerateReport:
    problems: int
    new_trajectories: int
    excluded_problems: int
    segmentation: dict[str, int]


def set_policy(db: Database, set_name: str, override: GenerationBackend | None = None) -> tuple[GenerationBackend, str]:
    """The backend that samples a set's trajectories (``override``, else the set's own, built
    from its stored config) and the name of the template it writes in by default."""
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        name, config = pset.backend, dict(pset.backend_config)
    from stepq.workers.backends import make_backend

    policy = override if override is not None else make_backend(name, config)
    return policy, "synthetic" if policy.name == "synthetic" else "chunk"


def generate_trajectories(
    db: Database,
    set_name: str,
    backend: GenerationBackend,
    *,
    samples: int,
    template: str,
    params: SamplingParams,
    segmentation: str = "auto",
    segmenter: GenerationBackend | None = None,
    filter_mixed: bool = False,
    problems_per_call: int = 32,
    grader: Grader | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> GenerateReport:
    grader = grader or Grader()
    generator = generator_id(backend, params)
    format_prompt = getattr(backend, "format_prompt", None)
    with db.session() as s:
        pset = queries.get_set(s, set_name)
        set_id, set_seed = pset.id, pset.seed
        require_synthetic_problems(s, set_id, backend.name, set_name)
        problems = queries.set_problems(s, set_id)
        have = queries.trajectory_keys(s, set_id)
    methods: dict[str, int] = {}
    new = 0
    for start in range(0, len(problems), problems_per_call):
        part = problems[start : start + problems_per_call]
        requests, wanted = [], []
        for pid, ext, question, _ in part:
            missing = [t for t in range(samples) if f"policy:{t}" not in have.get(pid, set())]
            if not missing:
                continue
            user = render(template, question)
            prompt = format_prompt(user) if format_prompt else user
            requests.append(GenerationRequest(prompt, tuple(derive_seed(set_seed, ext, "policy", t) for t in missing)))
            wanted.append((pid, missing))
        if not requests:
            continue
        outputs = backend.generate(requests, params)
        texts = [c.text for comps in outputs for c in comps]
        segs = _segment(texts, segmentation, segmenter)
        answers = {pid: ref for pid, _, _, ref in part}
        i = 0
        with db.session() as s:
            for req, (pid, missing), comps in zip(requests, wanted, outputs, strict=True):
                for t, seed, comp in zip(missing, req.seeds, comps, strict=True):
                    seg = segs[i]
                    i += 1
                    if not comp.text:
                        continue
                    methods[seg.method] = methods.get(seg.method, 0) + 1
                    grade = grader.grade(comp.text, answers[pid]) if answers[pid] else None
                    tid = queries.add_trajectory(
                        s,
                        {
                            "problem_id": pid,
                            "source_key": f"policy:{t}",
                            "prompt": req.context,
                            "text": comp.text,
                            "final_answer": extract_boxed(comp.text),
                            "outcome": None if grade is None else bool(grade.reward),
                            "n_chunks": len(seg.chunks),
                            "segmentation": seg.method,
                            "generator": generator,
                            "seed": seed,
                        },
                        [{"idx": k + 1, "text": c, "ground_truth": None} for k, c in enumerate(seg.chunks)],
                    )
                    new += tid is not None
        if on_progress:
            on_progress(len(part))
    excluded = apply_prompt_filter(db, set_id, samples) if filter_mixed else 0
    return GenerateReport(len(problems), new, excluded, methods)


def _segment(texts: list[str], method: str, segmenter: GenerationBackend | None) -> list[Segmentation]:
    if method == "llm":
        if segmenter is None:
            raise ValueError("llm segmentation needs a segmenter backend")
        nonempty = [t for t in texts if t]
        by_text = dict(zip(nonempty, segment_with_model(nonempty, segmenter), strict=True))
        return [by_text.get(t, Segmentation("empty", ())) for t in texts]
    return [segment(t, method) if t else Segmentation("empty", ()) for t in texts]


def apply_prompt_filter(db: Database, set_id: int, samples: int) -> int:
    """Exclude problems with at least ``samples`` policy trajectories that are all right or
    all wrong; every other problem of the set is included again."""
    with db.session() as s:
        outcomes = queries.policy_outcomes(s, set_id)
        excluded = [pid for pid, o in outcomes.items() if len(o) >= samples and len(set(o)) == 1]
        queries.set_excluded(s, set_id, excluded)
    return len(excluded)


@dataclass(frozen=True)
class ResegmentReport:
    resegmented: int
    skipped_annotated: int
    """Left alone: planned for annotation or annotated (work items, rollouts or labels)."""
    segmentation: dict[str, int]
    exported: int = 0
    """Trajectories whose given steps (or per-step truth) were written to ``export_old`` first."""


def resegment_set(
    db: Database,
    set_name: str,
    method: str,
    *,
    segmenter: GenerationBackend | None = None,
    batch: int = 32,
    export_old: Path | None = None,
) -> ResegmentReport:
    """Segment a set's trajectories again (e.g. with a model) before they are annotated.

    Only trajectories never planned for annotation are touched: a rollout continues a
    prefix that depends on the chunk boundaries, and labels (and snapshots) point at chunks,
    so re-cutting an annotated trajectory would orphan them.  A trajectory that the adaptive
    budget finished without a single rollout is annotated too (its labels stand on its own
    outcome): having a work item, not having rollouts, is what counts.

    Steps that came with the data (ProcessBench, PRM800K) or chunks that carry per-step truth
    are the data: re-cutting them drops the truth.  Such a set is refused unless
    ``export_old`` names a new file, to which the old chunks and their truth are written
    (JSON lines, one trajectory each) before anything is replaced.
    """
    with db.session() as s:
        todo, skipped = queries.unannotated_trajectories(s, queries.get_set(s, set_name).id)
        given = queries.given_chunks(s, [tid for tid, _ in todo])
    if given and export_old is None:
        raise ConfigError(
            f"set '{set_name}': {len(given)} trajectories hold steps given with the data or per-step truth, "
            "which a new segmentation would drop; pass --export-old FILE to write the old chunks and their "
            "truth there first"
        )
    if export_old is not None and export_old.exists():
        raise ConfigError(f"{export_old} exists: --export-old writes a new file, it never overwrites one")
    if given and export_old is not None:
        with export_old.open("x", encoding="utf-8") as f:
            for entry in given.values():
                f.write(json.dumps({"set": set_name, **entry}) + "\n")
    methods: dict[str, int] = {}
    cut = 0
    for start in range(0, len(todo), batch):
        part = todo[start : start + batch]
        segs = _segment([t for _, t in part], method, segmenter)
        with db.session() as s:
            for (tid, _), seg in zip(part, segs, strict=True):
                if not queries.replace_chunks(s, tid, seg.chunks, seg.method):
                    skipped += 1  # planned for annotation while the segmenter ran
                    continue
                cut += 1
                methods[seg.method] = methods.get(seg.method, 0) + 1
    return ResegmentReport(cut, skipped, methods, len(given))
