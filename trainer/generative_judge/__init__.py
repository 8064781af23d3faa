"""The StepWiser judge: its prompt, verdict parsing and the rewards that train it."""

from stepq.trainer.generative_judge.prompt import JudgePrompt, parse_verdict, render_judge_prompt

__all__ = ["JudgePrompt", "parse_verdict", "render_judge_prompt"]
