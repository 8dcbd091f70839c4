"""Checks a team runs on its own model before pointing alma-daemon at it (docs/your-model.md).

``check_model("mypkg.net:build", task, data)`` trains every learner that takes ``learner.model`` on
a few batches of the team's data and checks what the daemon relies on: valid probabilities, counted
FLOPs and parameters, a checkpoint that rebuilds the same answers, seeds that make members differ,
and the deployed weights loading back. The project's own contract tests run the same checks.
"""

from alma_daemon.testing.model_checks import MODEL_LEARNERS, ModelCheckError, check_learner, check_model

__all__ = ["MODEL_LEARNERS", "ModelCheckError", "check_learner", "check_model"]
