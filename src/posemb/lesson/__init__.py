"""The lesson on positional embeddings, as checks (``claims``) the library runs."""
