"""Serving speaks the team's terms (docs/serving.md, "Asking the model"): the named-feature JSON that
events carry, class names and a regression's numbers back; the array form and its answer unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from alma_daemon.config import build_config
from alma_daemon.data.datasets import TaskInfo
from alma_daemon.data.events import EVENT_JSON, decode_event, encode_events
from alma_daemon.data.task_terms import configured_task
from alma_daemon.data.tensors import LabeledData
from alma_daemon.data.wire import StreamSchema
from serving.protocols.codecs import codec_for
from serving.protocols.requests import MAX_INSTANCES, RequestError
from tests.helpers.serving import new_learner
from tests.helpers.user_models import feature_data

NAMES = ("amount", "age", "hour")
FRAUD = TaskInfo(
    "classification", (3,), 2, normalization="standardize", classes=("ok", "fraud"), extra={"features": list(NAMES)}
)
AMOUNT = TaskInfo("regression", (3,), 1, normalization="standardize", extra={"features": list(NAMES)})


class FixedAnswers:
    """A stand-in learner whose answer for an example is a function of its first feature: a classifier's
    probabilities of ok and fraud, a regression's prediction."""

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        fraud = (x[:, 0] > 100).float() * 0.8 + 0.1
        return torch.stack([1 - fraud, fraud], 1)

    def predict_outputs(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0] * 2


FIRST, SECOND = {"amount": 250.0, "age": 31, "hour": 3}, {"amount": 12.5, "age": 40, "hour": 14}
EXPECTED = torch.tensor([[250.0, 31, 3], [12.5, 40, 14]])


def bodies() -> dict[str, object]:
    """A request in every form the endpoint takes, each asking about FIRST and SECOND (an event: FIRST)."""
    return {
        "one object": FIRST,
        "an event as sent, y included": {**FIRST, "y": "fraud"},
        "a list of objects": [FIRST, SECOND],
        "instances of objects": {"instances": [FIRST, SECOND]},
        "columns": {"amount": [250.0, 12.5], "age": [31, 40], "hour": [3, 14]},
        "arrays": {"instances": [[250.0, 31, 3], [12.5, 40, 14]]},
        "bytes": json.dumps([FIRST, SECOND]).encode(),
    }


@pytest.mark.parametrize("form", list(bodies()))
def test_named_features_are_read_in_every_form_the_wire_takes(form: str) -> None:
    x = codec_for(FRAUD).examples_from_json(bodies()[form])
    single = form in ("one object", "an event as sent, y included")
    assert torch.equal(x, EXPECTED[:1] if single else EXPECTED)


def test_serving_reads_an_event_exactly_as_ingest_does() -> None:
    x = torch.tensor([[250.5, 31.0, 3.0], [12.25, 40.0, 14.0]])
    schema = StreamSchema("labeled", (3,), num_classes=2, pixel_range=False, classes=("ok", "fraud"))
    for record in encode_events(x, torch.tensor([1, 0]), EVENT_JSON, NAMES, per_record=2):
        wire_x, _ = decode_event(record.value, record.headers, schema, NAMES)
        assert torch.equal(codec_for(FRAUD).examples_from_json(record.value), wire_x)


def test_a_classifier_with_named_classes_answers_the_class_and_probabilities_by_name() -> None:
    codec = codec_for(FRAUD)
    answer = codec.answer_json(FixedAnswers(), bodies()["a list of objects"])
    first, second = answer["predictions"]
    assert first["class"] == "fraud" and second["class"] == "ok"
    assert first["probabilities"] == pytest.approx({"ok": 0.1, "fraud": 0.9})
    assert json.loads(json.dumps(answer)) == answer  # plain JSON
    assert torch.allclose(codec.decode_json(answer), torch.tensor([[0.1, 0.9], [0.9, 0.1]]))


def test_without_class_names_the_answer_keeps_its_rows_of_probabilities() -> None:
    codec = codec_for(replace(FRAUD, classes=()))
    answer = codec.answer_json(FixedAnswers(), bodies()["arrays"])
    assert torch.allclose(torch.tensor(answer["predictions"]), torch.tensor([[0.1, 0.9], [0.9, 0.1]]))
    assert torch.equal(codec.decode_json(answer), torch.tensor(answer["predictions"]))


def test_a_versions_threshold_decides_the_served_class_and_is_in_the_answer() -> None:
    # FixedAnswers: 0.9 fraud for the first example, 0.1 for the second; from 0.05 on, both are flagged.
    codec = codec_for(replace(FRAUD, decision="cost", threshold=0.05, calibration=(1.0, 0.0)))
    answer = codec.answer_json(FixedAnswers(), bodies()["a list of objects"])
    assert [row["class"] for row in answer["predictions"]] == ["fraud", "fraud"]
    assert answer["threshold"] == 0.05
    unnamed = codec_for(replace(FRAUD, classes=(), threshold=0.05)).answer_json(FixedAnswers(), bodies()["arrays"])
    assert unnamed["threshold"] == 0.05 and len(unnamed["predictions"]) == 2
    assert "threshold" not in codec_for(FRAUD).answer_json(FixedAnswers(), bodies()["arrays"])


def test_a_regression_answers_one_number_per_example() -> None:
    codec = codec_for(AMOUNT)
    answer = codec.answer_json(FixedAnswers(), bodies()["columns"])
    assert answer == {"predictions": [500.0, 25.0]}
    assert torch.equal(codec.decode_json(answer), torch.tensor([500.0, 25.0]))
    assert codec.answer_json(FixedAnswers(), codec.encode_json(EXPECTED)) == answer


def test_a_trained_learner_is_asked_by_name_as_by_array() -> None:
    task = replace(FRAUD, input_shape=(6,), num_classes=3, classes=("low", "mid", "high"))
    task = task.with_statistics(feature_data(200, seed=0).x)
    task = replace(task, extra={"features": [f"f{i:02d}" for i in range(6)]})
    learner, codec = new_learner("sm", task), codec_for(task)
    x = feature_data(5, seed=1).x
    named = [dict(zip(task.extra["features"], row)) for row in x.tolist()]
    by_name, by_array = codec.answer_json(learner, named), codec.answer_json(learner, codec.encode_json(x))
    assert by_name == by_array and [p["class"] for p in by_name["predictions"]] == [
        task.classes[i] for i in learner.predict_proba(x).argmax(1).tolist()
    ]


def test_a_regression_learner_is_served_its_predictions_in_the_targets_units() -> None:
    x = feature_data(50, seed=2).x[:, :3]
    learner = new_learner("sm", AMOUNT)
    learner.take_statistics(LabeledData(x, x[:, 0] * 3 + 1e4))  # features' and target's statistics
    codec = codec_for(learner.task)
    named = [dict(zip(NAMES, row)) for row in x[:4].tolist()]
    answer = codec.answer_json(learner, named)
    assert answer == codec.answer_json(learner, codec.encode_json(x[:4]))
    assert torch.equal(codec.decode_json(answer), learner.predict_outputs(x[:4]))


@pytest.mark.parametrize(
    "body,says",
    [
        ({"amount": "250", "age": 31, "hour": 3}, "field 'amount' is \"250\""),
        ({"amount": 250, "age": None, "hour": 3}, "field 'age' is null"),
        ({"amount": [1, 2], "age": [3], "hour": [4, 5]}, "field 'age'"),
        ({"amount": 250, "age": 31}, "fields missing ['hour']"),
        ({"amount": 250, "age": 31, "hour": 3, "city": 7}, "unexpected ['city']"),
        ([{"amount": 250, "age": 31, "hour": 3}, [1, 2, 3]], "all named-feature objects or all lists"),
        ({"amount": [], "age": [], "hour": []}, "1 to"),
        ({"amount": 1e300, "age": 31, "hour": 3}, "NaN or infinite"),
        ([], "at least one example"),
    ],
)
def test_a_bad_named_request_is_refused_naming_what_is_wrong(body: object, says: str) -> None:
    with pytest.raises(RequestError) as caught:
        codec_for(FRAUD).examples_from_json(body)
    assert says in str(caught.value)


def test_a_model_without_feature_names_says_to_send_arrays() -> None:
    with pytest.raises(RequestError, match="names no features"):
        codec_for(replace(FRAUD, extra={})).examples_from_json({"amount": 250, "age": 31, "hour": 3})


def test_too_many_named_examples_are_refused() -> None:
    columns = {name: [1.0] * (MAX_INSTANCES + 1) for name in NAMES}
    with pytest.raises(RequestError, match=f"at most {MAX_INSTANCES}"):
        codec_for(FRAUD).examples_from_json(columns)


def test_the_streams_feature_names_travel_in_the_task_to_the_checkpoint() -> None:
    config = build_config(
        {
            "dataset": {"name": "arrays", "input_shape": [3], "num_classes": 2, "normalization": "standardize"},
            "stream": {"chunk_examples": 10, "features": list(NAMES)},
        }
    )
    task = configured_task(TaskInfo("classification", (3,), 2, normalization="standardize"), config)
    assert task.extra["features"] == list(NAMES)
    assert TaskInfo.from_dict(json.loads(json.dumps(task.to_dict()))).extra["features"] == list(NAMES)
