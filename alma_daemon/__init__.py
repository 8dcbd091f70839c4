"""alma-daemon: keeps a deployed network fresh while labeled data arrives in large chunks.

The packages and how a record travels through them: docs/architecture.md.
"""
