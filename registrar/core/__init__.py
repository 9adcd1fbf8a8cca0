"""The engine: stdlib and `transitions` only (docs/architecture.md, "The layers")."""
