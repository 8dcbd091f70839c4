"""The daemon under torchrun: rank 0 is the daemon, the other ranks follow its steps.

``torchrun --nproc_per_node N -m alma_daemon run ...`` starts N ranks. Rank 0 is the whole daemon
(transport consumer, ingest, the Redis buffer, the policy, the step commit, checkpoints,
publishing, metrics, health). The other ranks own nothing: no transport, no Redis, no publisher, no
HTTP. Each holds an engine over an in-memory copy of rank 0's buffer and runs the same
``Engine.on_chunk`` as rank 0, so that the collectives of a training stage (the gradient all-reduce
of :mod:`alma_daemon.training.data_parallel`, the member exchange of
:mod:`alma_daemon.training.distributed`) meet on every rank. Rank 0 broadcasts, in this order:

- the engine (at start-up and after every reload of the committed state): the learner's spec and
  weights, the engine's counters and the chunks its buffer holds, so a follower starts where the
  last committed step left the stream without reading Redis;
- each chunk, before rank 0 runs the step on it;
- inside the step, the policy's decision: a follower's policy (:class:`FollowedPolicy`) returns it,
  so every rank trains, or waits, exactly when rank 0 does;
- ``stop``, when the daemon stops without a step in progress.

A follower measures nothing on the test set and writes nothing; rank 0 records, commits and
publishes. A step that fails on rank 0 after the followers joined it cannot be ridden out (they are
inside it): :class:`RankStepFailed` ends the process, torchrun stops the others, and the step, never
committed, is redone when the command is started again. A rank that dies fails rank 0's next
collective the same way.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from alma_daemon.config import Config, PolicyConfig
from alma_daemon.core.chunk_buffer import MemoryBuffer
from alma_daemon.core.engine import Engine, EngineObserver
from alma_daemon.core.engine_state import EngineState
from alma_daemon.data.streams import Chunk, SplitChunk
from alma_daemon.data.tensors import LabeledData
from alma_daemon.learners import learner_from_spec
from alma_daemon.logs import error_text
from alma_daemon.runtime import resolve_device
from alma_daemon.service.engine_store import state_fields
from alma_daemon.service.redis_buffer import RedisBuffer
from alma_daemon.training.ranks import World
from policies import Decision, Policy, PolicyState

log = logging.getLogger(__name__)


class RankStepFailed(BaseException):
    """A rank cannot go on with the steps the ranks run together: every rank must stop.

    A BaseException: the daemon's loop rides out Redis outages and restarts by redoing the step, but
    the followers are already inside it, and only a restart of every rank puts them in step again.
    """


class RankChannel:
    """Messages from rank 0 to the other ranks: a JSON header, then the tensors it describes."""

    def __init__(self, device: torch.device):
        # NCCL moves CUDA tensors only; gloo moves CPU ones.
        self.device = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def send(self, header: dict[str, Any], tensors: tuple[torch.Tensor, ...] = ()) -> None:
        header = {**header, "tensors": [[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in tensors]}
        payload = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8).to(self.device)
        dist.broadcast(torch.tensor([len(payload)], device=self.device), src=0)
        dist.broadcast(payload, src=0)
        for tensor in tensors:
            dist.broadcast(tensor.contiguous().to(self.device), src=0)

    def receive(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The next header and its tensors, on the CPU."""
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        dist.broadcast(length, src=0)
        payload = torch.empty(int(length), dtype=torch.uint8, device=self.device)
        dist.broadcast(payload, src=0)
        header = json.loads(bytes(payload.cpu().numpy()))
        tensors = []
        for shape, dtype in header.pop("tensors"):
            tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            dist.broadcast(tensor, src=0)
            tensors.append(tensor.cpu())
        return header, tensors

    @staticmethod
    def weights(engine: Engine) -> None:
        """The learner's weights and buffers, rank 0's everywhere, in place."""
        for tensor in engine.learner.state_dict().values():
            dist.broadcast(tensor, src=0)


class RankLeader(EngineObserver):
    """Rank 0's side: hands the other ranks what their engines need. Alone (one rank) it does nothing."""

    def __init__(self, world: World | None = None):
        self.world = world or World()
        self._channel: RankChannel | None = None
        self._mid_step = False

    @property
    def alone(self) -> bool:
        """Whether this is the only rank (the followers then take no part)."""
        return self.world.size == 1

    def _open(self, engine: Engine) -> RankChannel:
        if self._channel is None:
            self._channel = RankChannel(engine.device)
        return self._channel

    def engine_restored(self, engine: Engine, buffer: RedisBuffer) -> None:
        """Give the followers this engine: learner, counters and buffered chunks (start-up, reload)."""
        if self.world.size == 1:
            return
        kept, pending = buffer.kept_chunks(), buffer.pending_chunks()
        splits = [buffer.split(chunk_id) for chunk_id in kept + pending]
        header = {
            "kind": "engine",
            "spec": engine.learner.spec(),
            "state": state_fields(engine.state),
            "kept": kept,
            "pending": pending,
        }
        channel = self._open(engine)
        channel.send(header, tuple(t for s in splits for t in (s.train.x, s.train.y, s.val.x, s.val.y)))
        channel.weights(engine)

    @contextmanager
    def step(self, engine: Engine, chunk: Chunk) -> Iterator[None]:
        """Around ``engine.on_chunk(chunk)``: the followers run the step too; a failure in it ends every rank."""
        if self.world.size == 1:
            yield
            return
        self._mid_step = True
        try:
            self._open(engine).send({"kind": "chunk", "index": chunk.index}, (chunk.data.x, chunk.data.y))
            yield
        except Exception as error:
            raise RankStepFailed(
                f"the step on chunk {chunk.index} failed on rank 0 while the other ranks ran it "
                f"({error_text(error)}); torchrun stops every rank, and the step, not "
                f"committed, is redone when the command is started again"
            ) from error
        self._mid_step = False

    def on_decision(self, decision: Decision, engine: Engine) -> None:
        if self.world.size == 1:
            return
        header = {
            "kind": "decision",
            "action": decision.action,
            "reason": decision.reason,
            "estimates": decision.estimates,
        }
        self._open(engine).send(header)

    def stop(self) -> None:
        """The followers leave; not after a step that did not end (they are inside it)."""
        if self._channel is not None and not self._mid_step:
            self._channel.send({"kind": "stop"})


class FollowedPolicy(Policy):
    """A follower's policy: the decision rank 0's policy made on the same step."""

    name = "rank 0's decision"

    def __init__(self, config: PolicyConfig, channel: RankChannel):
        super().__init__(config)
        self.channel = channel

    def decide_within_bounds(self, state: PolicyState) -> Decision:
        # Rank 0's decision already honours the freshness bound, read from its own clock.
        return self.decide(state)

    def decide(self, state: PolicyState) -> Decision:
        header, _ = self.channel.receive()
        expect(header, "decision")
        return Decision(header["action"], header["reason"], header["estimates"])


def expect(header: dict[str, Any], kind: str) -> None:
    if header["kind"] != kind:
        raise RuntimeError(f"rank 0 sent {header['kind']!r} where {kind!r} was due: the ranks are out of step")


def follow(config: Config) -> None:
    """A rank other than 0: run rank 0's steps until it says stop (or dies, which fails a collective)."""
    leave_stops_to_rank_0()
    try:
        follow_steps(config)
    except Exception as error:
        raise RankStepFailed(
            f"rank {dist.get_rank()} stopped following rank 0 ({error_text(error)}); torchrun "
            f"stops every rank, and the command started again resumes from the last committed step"
        ) from error


def follow_steps(config: Config) -> None:
    device = resolve_device(config.device)
    channel = RankChannel(device)
    engine: Engine | None = None
    while True:
        header, tensors = channel.receive()
        if header["kind"] == "stop":
            return
        if header["kind"] == "engine":
            engine = follower_engine(config, device, channel, header, tensors)
            continue
        expect(header, "chunk")
        if engine is None:
            raise RuntimeError("rank 0 sent a chunk before its engine")
        engine.on_chunk(Chunk(header["index"], LabeledData(*tensors)))
        # A follower records nothing (rank 0 does): its rows would only grow with the stream.
        engine.state.series.clear()


def follower_engine(
    config: Config, device: torch.device, channel: RankChannel, header: dict[str, Any], tensors: list[torch.Tensor]
) -> Engine:
    """An engine as rank 0's: its learner (architecture, then weights), counters and buffered chunks."""
    ids = header["kept"] + header["pending"]
    splits = {
        chunk_id: SplitChunk(
            chunk_id, LabeledData(*tensors[4 * i : 4 * i + 2]), LabeledData(*tensors[4 * i + 2 : 4 * i + 4])
        )
        for i, chunk_id in enumerate(ids)
    }
    buffer = MemoryBuffer.holding(
        kept=[splits[chunk_id] for chunk_id in header["kept"]],
        pending=[splits[chunk_id] for chunk_id in header["pending"]],
    )
    engine = Engine(
        learner_from_spec(header["spec"]),
        FollowedPolicy(config.policy, channel),
        buffer,
        config,
        device,
        state=EngineState(**header["state"]),
    )
    channel.weights(engine)
    log.info("following rank 0", extra={"chunks_seen": engine.state.chunks_seen, "buffered": len(ids)})
    return engine


def leave_stops_to_rank_0() -> None:
    """torchrun passes a stop signal to every rank; rank 0 finishes its step, then tells the others to stop."""

    def ignore(signum: int, frame: Any) -> None:
        log.info("stop signal: rank 0 stops the ranks", extra={"signal": signal.Signals(signum).name})

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, ignore)
