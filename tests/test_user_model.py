"""A team's own network (learner.model), started from its deployed weights, on any numeric features."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from alma_daemon.config import ConfigError, learner_config
from alma_daemon.data.wire import RejectedRecord, StreamSchema, decode_record, encode_chunk
from alma_daemon.learners import build_learner, learner_from_spec
from alma_daemon.testing import check_learner, check_model, yield_model_checks
from tests.helpers.contract import CIFAR_LIKE, linear_data
from tests.helpers.contract import FEATURES as AMOUNTS
from tests.helpers.data import separable_data
from tests.helpers.user_models import FEATURES, feature_data, tabular_mlp

MLP = "tests.helpers.user_models:tabular_mlp"
CONV = "tests.helpers.user_models:TinyConvNet"


def test_the_shipped_contract_passes_on_a_model_defined_outside_the_package():
    check_model(MLP, FEATURES, feature_data(160, seed=0))


def test_check_model_takes_numpy_arrays_and_vets_the_deployed_weights_file(tmp_path):
    data = feature_data(160, seed=0)
    deployed = tabular_mlp(FEATURES)
    with torch.no_grad():
        for p in deployed.parameters():
            p.add_(0.5)  # trained weights, unlike a fresh factory module's
    path = tmp_path / "deployed.safetensors"
    save_file({k: v.contiguous() for k, v in deployed.state_dict().items()}, path)
    check_model(MLP, FEATURES, (data.x.numpy(), data.y.numpy()), learners=("sm",), init_weights=str(path))
    other = tmp_path / "other.safetensors"
    save_file({"layer.weight": torch.zeros(2, 2)}, other)
    with pytest.raises(AssertionError, match="its keys are not those of"):
        check_model(MLP, FEATURES, (data.x.numpy(), data.y.numpy()), learners=("sm",), init_weights=str(other))


def test_the_shipped_contract_passes_on_a_regression_started_from_the_deployed_weights(tmp_path):
    deployed = tabular_mlp(AMOUNTS)
    with torch.no_grad():
        for p in deployed.parameters():
            p.add_(0.5)  # trained weights, answering far from the target's mean
    path = tmp_path / "deployed.safetensors"
    save_file({k: v.contiguous() for k, v in deployed.state_dict().items()}, path)
    names = [check.name for check in yield_model_checks(MLP, AMOUNTS, linear_data(160, seed=0), learners=("sm",))]
    assert "sm-numbers_are_finite" in names and "sm-probabilities_sum_to_one" not in names
    check_model(MLP, AMOUNTS, linear_data(160, seed=0), init_weights=str(path))


def test_a_module_that_is_not_a_sequential_trains_in_sm_and_ens_on_images():
    data = separable_data(CIFAR_LIKE, 48, seed=1)
    for name in ("sm", "ens"):
        check_learner(
            name,
            CIFAR_LIKE,
            data.subset(torch.arange(32)),
            data.subset(torch.arange(32, 48)),
            {"model": CONV, "members": 2} if name == "ens" else {"model": CONV},
            "sgd",
        )


def test_standardize_takes_the_first_chunks_statistics_into_the_spec():
    learner = build_learner("sm", FEATURES, learner_config({"model": MLP}, name="sm"), 0)
    assert FEATURES.awaits_statistics
    first = feature_data(200, seed=3)
    learner.take_input_statistics(first.x)
    mean = torch.tensor(learner.task.mean)
    torch.testing.assert_close(mean, first.x.double().mean(0).float())
    rebuilt = learner_from_spec(learner.spec())
    assert rebuilt.task == learner.task and not rebuilt.task.awaits_statistics
    rebuilt.load_state_dict(learner.state_dict())
    torch.testing.assert_close(rebuilt.predict_proba(first.x), learner.predict_proba(first.x))
    standardized = learner.model.normalize(first.x)
    assert standardized.abs().mean() < 2  # features of std 1000 around 5e4 come out near unit scale


@pytest.mark.parametrize(
    "keys,message",
    [
        ({"model": "no_such_module_here:build"}, r"learner\.model: cannot import 'no_such_module_here'"),
        ({"model": "tests.helpers.user_models"}, r"learner\.model: .* 'package\.module:function'"),
        ({"model": "tests.helpers.user_models:missing"}, r"learner\.model: .* has no callable 'missing'"),
        (
            {"model": "tests.helpers.user_models:wrong_classes"},
            r"learner\.model: .* to \[2, 4\]; expected logits of shape \[2, 3\]",
        ),
        (
            {"model": "tests.helpers.user_models:not_a_module"},
            r"learner\.model: .* returned a str, not a torch\.nn\.Module",
        ),
    ],
)
def test_a_factory_that_cannot_serve_is_refused_in_one_line_naming_the_key(keys, message):
    with pytest.raises(ConfigError, match=message) as refused:
        build_learner("sm", FEATURES, learner_config(keys, name="sm"), 0)
    assert "\n" not in str(refused.value)


def test_growth_that_needs_a_known_structure_says_so_in_one_line():
    with pytest.raises(ConfigError, match=r"learner\.model: firefly grows the paper's MLP"):
        learner_config({"model": MLP}, name="firefly")
    with pytest.raises(ConfigError, match=r"layer 0 \(Flatten\) without parameters"):
        build_learner(
            "gmoe", FEATURES, learner_config({"model": "tests.helpers.user_models:flat_first_layer"}, name="gmoe"), 0
        )
    with pytest.raises(ConfigError, match=r"learner\.init_weights: gmoe"):
        learner_config({"model": MLP, "init_weights": "w.safetensors"}, name="gmoe")


def test_weights_that_do_not_fit_the_model_are_refused_naming_the_keys(tmp_path):
    learner = build_learner("sm", FEATURES, learner_config({"model": MLP}, name="sm"), 0)
    state = {k: v.clone() for k, v in tabular_mlp(FEATURES).state_dict().items()}
    state["2.weight"] = torch.zeros(5, 16)
    state["extra"] = torch.zeros(1)
    del state["0.1.bias"]
    with pytest.raises(
        ConfigError, match=r"learner\.init_weights: .* missing 0\.1\.bias; unexpected extra; of another shape 2\.weight"
    ):
        learner.start_from(state, "deployed.safetensors")


def decoded(x: torch.Tensor, y: torch.Tensor, schema: StreamSchema) -> None:
    [record] = encode_chunk("features", 1, x, y)
    decode_record(record.key, record.value, record.headers, schema, "features")


def test_features_of_any_finite_value_pass_the_wire_and_non_finite_ones_do_not():
    schema = StreamSchema("labeled", (6,), num_classes=3, pixel_range=False)
    data = feature_data(8, seed=0)
    decoded(data.x, data.y, schema)
    bad = data.x.clone()
    bad[0, 0] = math.inf
    with pytest.raises(RejectedRecord) as rejected:
        decoded(bad, data.y, schema)
    assert rejected.value.reason == "non_finite"
    with pytest.raises(RejectedRecord) as rejected:
        decoded(data.x, data.y, StreamSchema("labeled", (6,), num_classes=3))
    assert rejected.value.reason == "value_range"


def test_a_stream_started_from_the_deployed_model_measures_that_model_first(tmp_path):
    from alma_daemon.config import build_config
    from alma_daemon.core.assembly import assemble_engine
    from alma_daemon.core.chunk_buffer import MemoryBuffer
    from alma_daemon.data.streams import Chunk
    from alma_daemon.models.backbones import Normalize

    deployed = tabular_mlp(FEATURES)
    path = tmp_path / "deployed.safetensors"
    save_file(deployed.state_dict(), str(path))
    config = build_config(
        {
            "learner": {"name": "ens", "members": 2, "model": MLP, "init_weights": str(path)},
            "policy": {"name": "fixed", "wait": 1},
            "train": {"epochs": 1, "batch_size": 32},
        }
    )
    test = feature_data(100, seed=9)
    engine = assemble_engine(config, FEATURES, MemoryBuffer(), test_set=test)
    first = feature_data(120, seed=4)
    record = engine.on_chunk(Chunk(1, first))
    with torch.no_grad():
        expected = (deployed(Normalize(FEATURES.with_statistics(first.x))(first.x)).argmax(1) != first.y).float().mean()
    assert record.prequential == pytest.approx(float(expected))
    assert record.trained and record.test is not None
    engine.on_chunk(Chunk(2, feature_data(120, seed=5)))
    assert engine.learner.spec()["task"]["mean"] == list(FEATURES.with_statistics(first.x).mean)


def test_init_weights_also_takes_a_model_store_versions_weights(tmp_path):
    from alma_daemon.config import build_config
    from alma_daemon.core.assembly import assemble_engine
    from alma_daemon.core.checkpoints import WEIGHTS, CheckpointStore
    from alma_daemon.core.chunk_buffer import MemoryBuffer

    task = FEATURES.with_statistics(feature_data(50, seed=0).x)
    live = build_learner("sm", task, learner_config({"model": MLP}, name="sm"), 3)
    folder = CheckpointStore(tmp_path, "alma").save(live, 4, {"val_error": 0.1})
    config = build_config({"learner": {"name": "sm", "model": MLP, "init_weights": str(folder / WEIGHTS)}})
    engine = assemble_engine(config, task, MemoryBuffer())
    x = feature_data(20, seed=1).x
    torch.testing.assert_close(engine.learner.predict_proba(x), live.predict_proba(x), rtol=0, atol=0)
