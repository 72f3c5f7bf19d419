"""`python -m orchestrator.inference.llama_server`: the bundled llama-server compatible
launcher (see `_llama_server`)."""

from orchestrator.inference._llama_server import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
