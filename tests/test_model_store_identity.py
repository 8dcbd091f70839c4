"""Each config, and the embedded mode, keeps its own daemon folder and model store; a model store
records which Redis it belongs to, so that the start-up check tells a store of another Redis
(set daemon.checkpoint_dir) from a Redis that lost its data (restore it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alma_daemon.config import load_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.infra.redis_keys import REDIS_ID, StreamKeys
from alma_daemon.service.embedded_redis import EMBEDDED_OVERRIDES
from alma_daemon.service.stream_identity import (
    IDENTITY_FILE,
    ForeignModelStore,
    RedisLostTheStream,
    StreamIdentity,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

# -- each config its own folders --------------------------------------------------------------------


def folders(path: Path | None, *overrides: str) -> tuple[str, str]:
    daemon = load_config(path, list(overrides)).daemon
    return daemon.state_dir, daemon.checkpoint_dir


def test_the_service_example_and_the_embedded_mode_keep_their_own_state_and_model_store() -> None:
    service = ROOT / "examples" / "service.yaml"
    assert folders(service) == ("runs/service", "runs/service/model_store")
    assert folders(None, *EMBEDDED_OVERRIDES) == ("runs/embedded", "runs/embedded/model_store")
    assert folders(None) == ("runs/embedded", "runs/embedded/model_store")  # no redis.url: the embedded Redis
    assert folders(service, *EMBEDDED_OVERRIDES) == ("runs/service-embedded", "runs/service-embedded/model_store")
    assert folders(None, "redis.url=redis://127.0.0.1:6379/0") == ("runs/daemon", "runs/daemon/model_store")


def test_every_example_config_has_folders_of_its_own_with_and_without_embedded() -> None:
    seen: dict[tuple[str, bool], tuple[str, str]] = {("", True): folders(None, *EMBEDDED_OVERRIDES)}
    for path in EXAMPLES:
        for extra in ((), EMBEDDED_OVERRIDES):
            embedded = not load_config(path, list(extra)).redis.url
            seen[(path.stem, embedded)] = folders(path, *extra)
    assert ("service", False) in seen and ("service", True) in seen
    assert len({state for state, _ in seen.values()}) == len(seen)
    assert len({store for _, store in seen.values()}) == len(seen)


def test_a_folder_set_in_the_file_or_with_set_wins_and_the_model_store_follows_the_state_dir(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("redis: {url: redis://127.0.0.1:6379/0}\n")
    assert folders(path) == ("runs/mine", "runs/mine/model_store")
    assert folders(path, "daemon.state_dir=/srv/alma") == ("/srv/alma", "/srv/alma/model_store")
    assert folders(path, "daemon.checkpoint_dir=/srv/models") == ("runs/mine", "/srv/models")
    path.write_text("daemon: {state_dir: state, checkpoint_dir: null}\n")
    assert folders(path) == ("state", "state/model_store")


def test_config_yaml_leaves_the_derived_folders_commented_out_so_that_a_copy_derives_them_too() -> None:
    text = (ROOT / "config.yaml").read_text()
    assert "  #   state_dir: runs/<file name>" in text and "  #   checkpoint_dir: <state_dir>/model_store" in text
    assert folders(ROOT / "config.yaml") == ("runs/config-embedded", "runs/config-embedded/model_store")


# -- the model store's identity -------------------------------------------------------------------


class FakeRedis:
    """The few commands StreamIdentity sends: GET, SET (NX) and INFO's run_id."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.run_id = "run-1"

    def get(self, key: str) -> Any:
        value = self.data.get(key)
        return None if value is None else value.encode()

    def set(self, key: str, value: str, nx: bool = False) -> bool:
        if nx and key in self.data:
            return False
        self.data[key] = value
        return True

    def info(self, section: str) -> dict[str, str]:
        return {"run_id": self.run_id}


KEYS = StreamKeys("mnist")
EMBEDDED = "embedded:/work/runs/embedded/redis.db"
SERVER = "redis://127.0.0.1:6379/0"


def identity(client: FakeRedis, store: CheckpointStore, location: str) -> StreamIdentity:
    name = location.removeprefix("redis://").split("/")[0]
    return StreamIdentity(client, KEYS, store, name, location)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "model_store", "alma")


def test_the_model_store_records_the_redis_it_belongs_to(store: CheckpointStore) -> None:
    client = FakeRedis()
    value = identity(client, store, EMBEDDED).establish()
    record = json.loads((store.folder / IDENTITY_FILE).read_text())
    assert record["identity"] == value and record["stream"] == "mnist"
    assert record["redis"] == EMBEDDED and record["redis_id"] == client.data[REDIS_ID]
    # A restart on the same Redis agrees.
    assert identity(client, store, EMBEDDED).establish() == value


def test_a_model_store_of_another_redis_is_foreign_and_names_the_key_to_set(store: CheckpointStore) -> None:
    """The issue's case: the embedded mode's store, then a config with a Redis server on the same store."""
    identity(FakeRedis(), store, EMBEDDED).establish()
    with pytest.raises(ForeignModelStore) as raised:
        identity(FakeRedis(), store, SERVER).establish()
    message = str(raised.value)
    assert message.startswith("daemon.checkpoint_dir: the model store")
    assert "belongs to stream 'mnist' on the embedded Redis of /work/runs/embedded/redis.db" in message
    assert "Redis at 127.0.0.1:6379 holds no such stream" in message
    assert "Set daemon.checkpoint_dir to a new directory" in message
    assert "lost" not in message


def test_another_redis_at_the_same_address_is_foreign_too(store: CheckpointStore) -> None:
    identity(FakeRedis(), store, SERVER).establish()
    other = FakeRedis()
    other.set(REDIS_ID, "f" * 32)  # another server, which another stream has used
    with pytest.raises(ForeignModelStore, match=r"another Redis at this address \(Redis id \w+; this one's is f+\)"):
        identity(other, store, SERVER).establish()


def test_a_redis_that_lost_its_data_is_told_from_a_foreign_store(store: CheckpointStore) -> None:
    identity(FakeRedis(), store, SERVER).establish()
    empty = FakeRedis()  # restarted without persistence: nothing left, not even its Redis id
    with pytest.raises(RedisLostTheStream) as raised:
        identity(empty, store, SERVER).establish()
    message = str(raised.value)
    assert "records it on this same Redis" in message and "Redis has lost its data" in message
    assert "Restore its data (AOF or RDB)" in message and "set daemon.checkpoint_dir to a new directory" in message
    assert not isinstance(raised.value, ForeignModelStore)
    assert KEYS.identity not in empty.data and REDIS_ID not in empty.data  # nothing started over


def test_the_streams_keys_deleted_from_the_same_redis_are_said_so(store: CheckpointStore) -> None:
    client = FakeRedis()
    identity(client, store, SERVER).establish()
    del client.data[KEYS.identity]
    with pytest.raises(RedisLostTheStream, match="its keys were deleted"):
        identity(client, store, SERVER).establish()


def test_a_record_without_its_redis_keeps_both_stories_and_is_completed_on_the_next_good_start(
    store: CheckpointStore,
) -> None:
    client = FakeRedis()
    value = identity(client, store, SERVER).establish()
    marker = store.folder / IDENTITY_FILE
    marker.write_text(json.dumps({"stream": "mnist", "identity": value, "created_at": 1.0}))  # an older record
    assert identity(client, store, SERVER).establish() == value
    record = json.loads(marker.read_text())
    assert record["redis"] == SERVER and record["redis_id"] == client.data[REDIS_ID] and record["created_at"] == 1.0
    marker.write_text(json.dumps({"stream": "mnist", "identity": value, "created_at": 1.0}))
    with pytest.raises(RedisLostTheStream, match="or daemon.checkpoint_dir is another deployment's model store"):
        identity(FakeRedis(), store, SERVER).establish()


def test_a_redis_moved_with_its_data_is_the_same_stream_and_the_record_follows_it(store: CheckpointStore) -> None:
    client = FakeRedis()
    value = identity(client, store, SERVER).establish()
    moved = "redis://10.0.0.7:6379/0"
    assert identity(client, store, moved).establish() == value
    assert json.loads((store.folder / IDENTITY_FILE).read_text())["redis"] == moved
