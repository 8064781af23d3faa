"""Grading final answers against the reference: math-verify in a child process with a limit that holds on any thread."""
