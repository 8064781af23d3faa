"""``python -m stepq``; guarded because engines (vLLM) start worker processes by spawn, which
imports this module again in each child."""

from stepq.cli import main

if __name__ == "__main__":
    main()
