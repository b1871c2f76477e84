"""The rank side: what runs in each worker (and in each XLA ordinal), and the tools a launched function calls.
It imports only the schema (``pyproject.toml``'s import contracts)."""
