"""The research front door: ``alma simulate`` (a replayed stream through the engine, in process),
``alma grid`` (one simulation per combination), ``alma study`` (the paper's findings, judged by rules)
and ``alma ablate-iid`` (sequential against i.i.d. training). They run the service's engine, so a
research result is the service's result. ``run_pool`` runs many streams for ``alma study`` and the
benchmarks, and resumes them.
"""
