"""Text streams (paper section 5, B = 4): a corpus cut into B chunks of contiguous text, one fixed tokenizer.

Corpora sit behind a registry keyed by ``dataset.name``:

* ``ptb``: Mikolov's word-level Penn Treebank. The tokenizer is the 10k-word vocabulary of
  ptb.train.txt (``<eos>`` ends every line); the stream is ptb.train.txt, the test set ptb.test.txt.
  ptb.valid.txt is not read: as on the vision streams, each chunk's validation set is the 10% of its
  sequences that the engine holds out, so a simulated chunk and one from Kafka are treated alike.
* ``text``: a user's plain-text files (``dataset.files``), concatenated and cut at line boundaries into
  B + 1 contiguous parts of about equal size: B chunks, then the test set (the paper's layout, with
  one more mega-batch for evaluation). The tokenizer is ``dataset.tokenizer`` (a ``tokenizers`` JSON
  file) or a byte-level BPE of ``dataset.vocab_size`` tokens trained once, on the first chunk's text.

Each part is encoded on its own and cut into non-overlapping sequences of ``stream.seq_len`` tokens
(``x`` = tokens t..t+L-1, ``y`` = t+1..t+L). The tokenizer travels in ``TaskInfo.extra["tokenizer"]``,
so every checkpoint's spec.json carries it; :func:`tokenizer_from_task` rebuilds it.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from alma_daemon.config import DatasetConfig, StreamConfig
from alma_daemon.data.datasets import DatasetError, TaskInfo, resolve_data_root
from alma_daemon.data.streams import Chunk
from alma_daemon.data.tensors import LabeledData

EOS, UNK = "<eos>", "<unk>"


class Tokenizer(Protocol):
    """Text <-> token ids; ``to_dict()`` is JSON that :func:`tokenizer_from_dict` turns back into it."""

    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class WordVocabulary:
    """Whitespace-separated words, ``<eos>`` for every newline; unknown words become ``<unk>``.

    A text that does not end with a newline gets no final ``<eos>``, so a prompt's next token is the
    continuation of its last line.
    """

    def __init__(self, words: list[str]):
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words)

    @classmethod
    def from_text(cls, text: str) -> WordVocabulary:
        """Every word of ``text`` plus ``<eos>``, most frequent first (ties alphabetical), so ids are stable."""
        counts = Counter(cls.words_of(text))
        return cls(sorted(counts, key=lambda w: (-counts[w], w)))

    @staticmethod
    def words_of(text: str) -> list[str]:
        return text.replace("\n", f" {EOS} ").split()

    def encode(self, text: str) -> list[int]:
        unknown = self.index.get(UNK)
        ids = []
        for word in self.words_of(text):
            i = self.index.get(word, unknown)
            if i is None:
                raise KeyError(f"word {word!r} is not in the vocabulary, which has no {UNK} token")
            ids.append(i)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return re.sub(f" ?{EOS} ?", "\n", " ".join(self.words[i] for i in ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "words", "words": self.words}


class BPETokenizer:
    """A ``tokenizers`` tokenizer (by default byte-level BPE: lossless on any text)."""

    def __init__(self, tokenizer: HFTokenizer):
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
        return cls(tokenizer)

    @classmethod
    def from_file(cls, path: str | Path) -> BPETokenizer:
        if not Path(path).is_file():
            raise DatasetError(f"dataset.tokenizer: file {path} not found")
        return cls(HFTokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "bpe", "json": self.tokenizer.to_str()}


_TOKENIZER_KINDS: dict[str, Callable[[dict[str, Any]], Tokenizer]] = {
    "words": lambda d: WordVocabulary(d["words"]),
    "bpe": lambda d: BPETokenizer(HFTokenizer.from_str(d["json"])),
}


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    return _TOKENIZER_KINDS[data["kind"]](data)


def tokenizer_from_task(task: TaskInfo) -> Tokenizer:
    """The stream's tokenizer, from the task saved in a learner's spec (and so in every checkpoint)."""
    if "tokenizer" not in task.extra:
        raise KeyError("this task carries no tokenizer (not a text stream)")
    return tokenizer_from_dict(task.extra["tokenizer"])


@dataclass(frozen=True)
class TextCorpus:
    """A stream's text before encoding: B contiguous training parts, the test text, the fixed tokenizer."""

    parts: list[str]
    test: str
    tokenizer: Tokenizer


_CORPORA: dict[str, Callable[[DatasetConfig, int], TextCorpus]] = {}


def register_corpus(
    name: str,
) -> Callable[[Callable[[DatasetConfig, int], TextCorpus]], Callable[[DatasetConfig, int], TextCorpus]]:
    def wrap(fn: Callable[[DatasetConfig, int], TextCorpus]) -> Callable[[DatasetConfig, int], TextCorpus]:
        _CORPORA[name] = fn
        return fn

    return wrap


def split_lines(text: str, parts: int) -> list[str]:
    """Cut ``text`` at line ends into ``parts`` contiguous pieces of about equal length (joined, they give it back)."""
    lines = text.splitlines(keepends=True)
    ends = list(itertools.accumulate(len(line) for line in lines))
    cuts = [0] + [bisect.bisect_left(ends, len(text) * k / parts) + 1 for k in range(1, parts)] + [len(lines)]
    pieces = ["".join(lines[a:b]) for a, b in zip(cuts, cuts[1:])]
    if any(not piece for piece in pieces):
        raise DatasetError(f"a text of {len(lines)} lines cannot be cut into {parts} non-empty parts")
    return pieces


@register_corpus("ptb")
def ptb_corpus(config: DatasetConfig, chunks: int) -> TextCorpus:
    root = resolve_data_root(config.root)
    train, test = (_read_ptb(root, split) for split in ("train", "test"))
    return TextCorpus(split_lines(train, chunks), test, WordVocabulary.from_text(train))


def _read_ptb(root: Path, split: str) -> str:
    name = f"ptb.{split}.txt"
    for path in (root / "ptb" / name, root / name):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise DatasetError(
        f"PTB: {name} not found in {root / 'ptb'} or {root}; point dataset.root or "
        f"$ALMA_DATA_DIR at the folder holding Mikolov's ptb.*.txt files"
    )


@register_corpus("text")
def user_corpus(config: DatasetConfig, chunks: int) -> TextCorpus:
    if not config.files:
        raise DatasetError("dataset.name=text needs dataset.files: one or more plain-text files")
    texts = []
    for name in config.files:
        if not Path(name).is_file():
            raise DatasetError(f"dataset.files: {name} not found")
        text = Path(name).read_text(encoding="utf-8")
        texts.append(text if text.endswith("\n") else text + "\n")
    *parts, test = split_lines("".join(texts), chunks + 1)
    if config.tokenizer:
        tokenizer = BPETokenizer.from_file(config.tokenizer)
    else:
        tokenizer = BPETokenizer.train(parts[0], config.vocab_size)
    return TextCorpus(parts, test, tokenizer)


def sequences(tokens: Sequence[int] | torch.Tensor, seq_len: int) -> LabeledData:
    """Non-overlapping inputs of ``seq_len`` tokens and their next tokens; the tail that does not fit is dropped."""
    t = torch.as_tensor(tokens, dtype=torch.long)
    n = (len(t) - 1) // seq_len
    if n < 1:
        raise DatasetError(f"a text of {len(t)} tokens is shorter than one sequence of {seq_len} + 1")
    return LabeledData(t[: n * seq_len].view(n, seq_len), t[1 : n * seq_len + 1].view(n, seq_len))


def token_run(data: LabeledData) -> torch.Tensor:
    """The contiguous tokens that :func:`sequences` cut into ``data`` (so ``sequences`` gives ``data`` back)."""
    return torch.cat([data.x.reshape(-1), data.y.reshape(-1)[-1:]])


@dataclass(frozen=True)
class TextStream:
    """The task (with its tokenizer), the chunks in order and the test sequences."""

    task: TaskInfo
    chunks: list[Chunk]
    test: LabeledData


def text_stream(dataset: DatasetConfig, stream: StreamConfig) -> TextStream:
    """Load ``dataset.name``'s corpus and encode it into ``stream.megabatches`` chunks of contiguous sequences.

    ``stream.train_examples`` keeps the first ``train_examples // B`` sequences of each chunk and
    ``dataset.test_examples`` the first test sequences (quick runs, cheap evaluation).
    """
    corpus = _load_corpus(dataset, stream)
    encode = corpus.tokenizer.encode
    parts = [sequences(encode(part), stream.seq_len) for part in corpus.parts]
    if stream.train_examples is not None:
        parts = [p.subset(slice(0, max(1, stream.train_examples // len(parts)))) for p in parts]
    chunks = [Chunk(i, p) for i, p in enumerate(parts, start=1)]
    return TextStream(_task(corpus, stream), chunks, _test_sequences(corpus, dataset, stream))


def text_task(dataset: DatasetConfig, stream: StreamConfig) -> tuple[TaskInfo, LabeledData]:
    """The task and the test sequences of :func:`text_stream`, without encoding the training text.

    The corpus is still read whole: its tokenizer is built from the training text (PTB's vocabulary,
    or a BPE trained on the first chunk) and a user's test text is the last part of the files.
    """
    corpus = _load_corpus(dataset, stream)
    return _task(corpus, stream), _test_sequences(corpus, dataset, stream)


def _load_corpus(dataset: DatasetConfig, stream: StreamConfig) -> TextCorpus:
    if dataset.name not in _CORPORA:
        raise DatasetError(f"unknown text corpus {dataset.name!r}; known: {', '.join(sorted(_CORPORA))}")
    return _CORPORA[dataset.name](dataset, stream.megabatches)


def _task(corpus: TextCorpus, stream: StreamConfig) -> TaskInfo:
    vocab = corpus.tokenizer.vocab_size
    return TaskInfo(
        "language_model", (stream.seq_len,), vocab, extra={"vocab_size": vocab, "tokenizer": corpus.tokenizer.to_dict()}
    )


def _test_sequences(corpus: TextCorpus, dataset: DatasetConfig, stream: StreamConfig) -> LabeledData:
    test = sequences(corpus.tokenizer.encode(corpus.test), stream.seq_len)
    if dataset.test_examples is not None:
        test = test.subset(slice(0, dataset.test_examples))
    return test
