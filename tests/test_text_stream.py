"""Text streams: PTB and user corpora, contiguous chunks, the tokenizer saved with checkpoints, LM runs end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alma_daemon.config import build_config, learner_config
from alma_daemon.core.checkpoints import CheckpointStore
from alma_daemon.data.datasets import DatasetError, resolve_data_root
from alma_daemon.data.text import BPETokenizer, WordVocabulary, split_lines, text_stream, tokenizer_from_task
from alma_daemon.learners import build_learner
from alma_daemon.research.ablation import ablate_iid
from alma_daemon.research.simulate import run_simulation
from tests.helpers.text import TINY_LM, text_config

PTB = resolve_data_root(None) / "ptb"
needs_ptb = pytest.mark.skipif(not (PTB / "ptb.train.txt").is_file(), reason=f"PTB not found in {PTB}")


@pytest.fixture(scope="module")
def ptb_stream():
    if not (PTB / "ptb.train.txt").is_file():
        pytest.skip(f"PTB not found in {PTB}")
    config = build_config({"dataset": {"name": "ptb"}, "stream": {"megabatches": 4, "seq_len": 64}})
    return text_stream(config.dataset, config.stream)


def test_split_lines_is_contiguous_balanced_and_at_line_ends():
    text = "".join(f"line {i:03d}\n" for i in range(100))
    parts = split_lines(text, 4)
    assert "".join(parts) == text
    assert [len(p.splitlines()) for p in parts] == [25, 25, 25, 25]
    with pytest.raises(DatasetError):
        split_lines("one line\n", 2)


def test_word_vocabulary_marks_each_newline_and_maps_unknown_words():
    vocab = WordVocabulary.from_text("b a <unk>\nb b\n")
    assert vocab.words == ["b", "<eos>", "<unk>", "a"]  # most frequent first, ties alphabetical
    assert vocab.encode("a b\nzebra") == [3, 0, 1, 2]  # no <eos> after an unfinished last line
    assert vocab.decode(vocab.encode("a b\nb\n")) == "a b\nb\n"


@needs_ptb
def test_ptb_vocabulary_and_token_counts(ptb_stream):
    tokenizer = tokenizer_from_task(ptb_stream.task)
    assert ptb_stream.task.num_classes == tokenizer.vocab_size == 10_000
    train = (PTB / "ptb.train.txt").read_text()
    assert len(tokenizer.encode(train)) == 929_589  # words plus one <eos> per line, the published count
    tokens = sum(c.data.x.numel() for c in ptb_stream.chunks)
    assert 929_589 - 4 * 64 <= tokens + 4 <= 929_589  # each chunk drops at most one partial sequence
    assert len(ptb_stream.test) == (82_430 - 1) // 64


@needs_ptb
def test_ptb_chunks_are_the_training_text_cut_in_order(ptb_stream):
    tokenizer = tokenizer_from_task(ptb_stream.task)
    parts = split_lines((PTB / "ptb.train.txt").read_text(), 4)
    assert [c.index for c in ptb_stream.chunks] == [1, 2, 3, 4]
    for chunk, part in zip(ptb_stream.chunks, parts, strict=True):
        x, y = chunk.data.x, chunk.data.y
        tokens = torch.tensor(tokenizer.encode(part))
        assert x.shape[1] == 64
        assert torch.equal(x.flatten(), tokens[: x.numel()]) and torch.equal(y.flatten(), tokens[1 : x.numel() + 1])
        assert len(tokens) - x.numel() <= 64  # only the tail shorter than a sequence is dropped


@needs_ptb
def test_ptb_test_set_is_limited_by_test_examples():
    config = build_config({"dataset": {"name": "ptb", "test_examples": 10}, "stream": {"megabatches": 4}})
    assert len(text_stream(config.dataset, config.stream).test) == 10


def test_user_corpus_bpe_is_trained_on_the_first_chunk_only(tmp_path):
    config = text_config(tmp_path)
    stream = text_stream(config.dataset, config.stream)
    tokenizer = tokenizer_from_task(stream.task)
    assert stream.task.extra["tokenizer"]["kind"] == "bpe" and tokenizer.vocab_size <= 300
    assert len(tokenizer.encode("aaaa bbbb")) < len(tokenizer.encode("qqqq rrrr")) == 9  # bytes only
    assert len(stream.chunks) == 2 and len(stream.test) > 0
    text = "".join(Path(f).read_text() for f in config.dataset.files)
    assert tokenizer.decode(tokenizer.encode(text)) == text  # byte-level BPE is lossless


def test_user_tokenizer_file_is_used_as_is(tmp_path):
    trained = BPETokenizer.train("hello world\n" * 20 + "goodbye moon\n" * 20, 270)
    path = tmp_path / "tokenizer.json"
    trained.tokenizer.save(str(path))
    config = text_config(tmp_path, dataset={"tokenizer": str(path)})
    stream = text_stream(config.dataset, config.stream)
    tokenizer = tokenizer_from_task(stream.task)
    assert tokenizer.vocab_size == trained.vocab_size
    assert tokenizer.encode("hello moon") == trained.encode("hello moon")


@pytest.mark.parametrize("corpus_name", ["text", pytest.param("ptb", marks=needs_ptb)])
def test_tokenizer_is_saved_and_reloaded_with_every_checkpoint(tmp_path, corpus_name):
    if corpus_name == "ptb":
        config = build_config(
            {"dataset": {"name": "ptb", "test_examples": 1}, "stream": {"megabatches": 4, "seq_len": 16}}
        )
    else:
        config = text_config(tmp_path)
    stream = text_stream(config.dataset, config.stream)
    learner = build_learner("switch-lm", stream.task, learner_config(TINY_LM), seed=0)
    store = CheckpointStore(tmp_path / "store", "lm")
    path = store.save(learner, 1, {})
    assert json.loads((path / "spec.json").read_text())["task"]["extra"]["tokenizer"] == stream.task.extra["tokenizer"]
    sample = "the cat sat on the mat\n"
    original, reloaded = tokenizer_from_task(stream.task), tokenizer_from_task(store.load(1).task)
    assert reloaded.encode(sample) == original.encode(sample)
    assert reloaded.vocab_size == original.vocab_size


def test_lm_simulation_records_perplexity_not_error(tmp_path):
    config = text_config(tmp_path)
    results = run_simulation(config, tmp_path / "run", progress=False, checkpoint_dir=tmp_path / "store")
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert len(written["series"]) == 2
    for record in written["series"]:
        assert record["test_perplexity"] > 1 and record.get("test_error") is None
        assert record["steps"] == 3
    summary = written["summary"]
    assert summary["final_test_perplexity"] == written["series"][-1]["test_perplexity"]
    assert summary["average_test_perplexity"] == pytest.approx(sum(r["test_perplexity"] for r in written["series"]) / 2)
    assert results["summary"] == summary
    assert "tokenizer" in json.loads((tmp_path / "store" / "alma" / "2" / "spec.json").read_text())["task"]["extra"]


@pytest.mark.slow
def test_ablation_trains_sequentially_and_iid_with_the_same_steps(tmp_path):
    results = ablate_iid(text_config(tmp_path), chunks=2, progress=False)
    sequential, iid = results["sequential"], results["iid"]
    assert results["measure"] == "perplexity"
    assert sequential["steps"] == iid["steps"] == 6
    assert (sequential["stages"], iid["stages"]) == (2, 1)
    assert sequential["test_perplexity"] != iid["test_perplexity"]
    assert len(sequential["test_perplexity_per_chunk"]) == 2
