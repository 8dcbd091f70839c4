"""The contracts as named checks, shipped so a team runs on its own model exactly what the project's
tests run on every built-in learner and policy (docs/your-model.md).

``yield_learner_checks``, ``yield_policy_checks`` and ``yield_publisher_checks`` (a serving backend's:
publish, guard, rollback, release) yield the checks (each a :class:`Check`: a name,
and a call that raises :class:`ContractError` naming what failed); ``check_learner``, ``check_policy``
and ``check_model`` run them all. ``check_model("mypkg.net:build", task, data)`` trains every learner
that takes ``learner.model`` on a few batches of the team's data and checks what the daemon relies on:
valid answers (probabilities, or a regression's numbers), counted FLOPs and parameters, a spec and a
checkpoint that rebuild the same answers, seeds that make models differ and one seed that trains one
model, and the deployed weights loading back.
"""

from alma_daemon.testing.checks import Check, ContractError
from alma_daemon.testing.learner_checks import check_learner, yield_learner_checks
from alma_daemon.testing.model_checks import MODEL_LEARNERS, check_model, yield_model_checks
from alma_daemon.testing.policy_checks import check_policy, yield_policy_checks
from alma_daemon.testing.publisher_checks import Backend, check_publisher, yield_publisher_checks

__all__ = [
    "MODEL_LEARNERS",
    "Backend",
    "Check",
    "ContractError",
    "check_learner",
    "check_model",
    "check_policy",
    "check_publisher",
    "yield_learner_checks",
    "yield_model_checks",
    "yield_policy_checks",
    "yield_publisher_checks",
]
