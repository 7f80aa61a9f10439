"""Real text with no download: the Python standard library's own source files, as characters.

``text_corpus()`` reads ``.py`` files of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, ``site-packages`` left out) in a fixed order, up to a cap,
and splits them **by file** into a training and a validation set; ``TextLoader`` cuts a token
array into ``(B, T)`` windows and their next-character targets, seeded and sharded by rank
like ``DataLoader`` (it is one, over the windows' start positions).

The vocabulary is fixed, so it is the same on every machine: tab, newline and the 95
printable ASCII characters, plus one id for anything else (``CharVocab``).

>>> import parcl as pc
>>> corpus = pc.data.text_corpus(max_chars=200_000)
>>> loader = pc.data.TextLoader(corpus.train, block_size=8, batch_size=4)
>>> x, y = next(iter(loader))
>>> x.shape, y.shape, x.dtype
((4, 8), (4, 8), dtype('int64'))
>>> bool((x[:, 1:] == y[:, :-1]).all())
True
"""

from __future__ import annotations

import math
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .data import DataLoader
from .errors import ShapeError

__all__ = ["CharVocab", "TextCorpus", "TextLoader", "UnigramBaseline", "text_corpus"]

_CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127))


@dataclass(frozen=True)
class CharVocab:
    """A character vocabulary of distinct ASCII ``chars`` (else a ``ValueError``):
    ``chars[i]`` has id ``i``; every other character has id
    ``unknown`` (``len(chars)``), decoded as ``"?"``. ``size`` counts the unknown id too.

    >>> vocab = CharVocab()
    >>> vocab.size, vocab.decode(vocab.encode("a\\u00e9"))
    (98, 'a?')
    """

    chars: str = _CHARS

    def __post_init__(self) -> None:
        # encode's table covers ASCII, and one id per character keeps decode(encode(t)) == t
        odd = sorted({c for c in self.chars if ord(c) > 127 or self.chars.count(c) > 1})
        if odd:
            raise ValueError(f"CharVocab: chars must be distinct ASCII characters; "
                             f"{''.join(odd)!r} are not (non-ASCII or listed twice)")

    @property
    def unknown(self) -> int:
        return len(self.chars)

    @property
    def size(self) -> int:
        return len(self.chars) + 1

    def encode(self, text: str) -> np.ndarray:
        """The ids of ``text``'s characters, uint8 ``(len(text),)``."""
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        table = np.full(128, self.unknown, np.uint8)     # every known character is ASCII
        table[[ord(c) for c in self.chars]] = np.arange(len(self.chars), dtype=np.uint8)
        return np.where(codes < 128, table[np.minimum(codes, 127)], np.uint8(self.unknown))

    def decode(self, ids) -> str:
        """The text of ``ids`` (the unknown id, ``len(chars)``, as ``"?"``); an id outside
        ``[0, len(chars)]`` is a ValueError (a negative one would index from the end)."""
        chars = self.chars + "?"
        ids = np.asarray(ids).reshape(-1)
        bad = ids[(ids < 0) | (ids >= len(chars))]
        if bad.size:
            raise ValueError(f"CharVocab.decode: id {bad[0]} is outside [0, {len(chars) - 1}] "
                             f"({len(self.chars)} characters and the unknown id)")
        return "".join(chars[int(i)] for i in ids)


@dataclass(frozen=True)
class UnigramBaseline:
    """What a model that knows only character frequencies scores: the cross-entropy of the
    validation text under the training text's character frequencies (add-one smoothed)."""

    nats: float          # per character
    bits: float          # per character: nats / ln 2


@dataclass(frozen=True)
class TextCorpus:
    """Token ids of the training and validation text (uint8), the files each came from
    (relative to ``root``) and the vocabulary."""

    train: np.ndarray
    val: np.ndarray
    train_files: tuple[str, ...]
    val_files: tuple[str, ...]
    root: str
    vocab: CharVocab

    def unigram_baseline(self) -> UnigramBaseline:
        """The unigram model's validation loss, the figure a language model must beat.

        >>> base = corpus.unigram_baseline()
        >>> round(base.bits / base.nats, 4)
        1.4427
        """
        counts = np.bincount(self.train, minlength=self.vocab.size).astype(np.float64) + 1.0
        logp = np.log(counts / counts.sum())
        nats = float(-np.mean(logp[self.val]))
        return UnigramBaseline(nats=nats, bits=nats / math.log(2.0))


def _file_order(path: str) -> tuple[int, str]:
    # A hash of the relative path spreads the capped selection over the whole library (not
    # the alphabet's first packages) and is the same on every machine with this stdlib.
    return zlib.crc32(path.encode()), path


def text_corpus(max_chars: int = 4_000_000, val_every: int = 10, root: str | None = None
                ) -> TextCorpus:
    """The standard library's ``.py`` files as a character corpus, split by file.

    Files (``site-packages`` excluded) are taken in a fixed pseudo-random order (a CRC-32 of
    their relative path) until ``max_chars`` characters are read; every ``val_every``-th of
    them goes to the validation set, the others to training. ``root`` defaults to
    ``sysconfig.get_paths()["stdlib"]`` of the running interpreter.

    >>> corpus = text_corpus(max_chars=100_000)
    >>> len(corpus.train) + len(corpus.val) >= 100_000, len(corpus.val_files) >= 1
    (True, True)
    """
    if max_chars < 1:
        raise ShapeError(f"text_corpus: max_chars={max_chars} must be >= 1")
    if isinstance(val_every, bool) or not isinstance(val_every, (int, np.integer)):
        # i % 2.5 == 0 holds at every 5th file: a float would be another split, silently
        raise TypeError(f"text_corpus: val_every must be an int, got {val_every!r}")
    if val_every < 2:
        raise ShapeError(f"text_corpus: val_every={val_every} must be >= 2 (one file in "
                         f"val_every goes to validation)")
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    # the site-packages below the root are left out (a stdlib's holds third-party code), not
    # the root's own place: a root inside a virtual environment's would give no file at all
    relative = (p.relative_to(base) for p in base.rglob("*.py"))
    names = sorted((r.as_posix() for r in relative
                    if "site-packages" not in r.parts and "dist-packages" not in r.parts),
                   key=_file_order)
    if not names:
        raise FileNotFoundError(f"text_corpus: no .py files under {base}")
    vocab = CharVocab()
    parts: dict[bool, list[np.ndarray]] = {True: [], False: []}
    files: dict[bool, list[str]] = {True: [], False: []}
    total = 0
    for i, name in enumerate(names):
        # the cap stops the reading once validation holds text, not just a file: its first
        # file may be empty (an __init__.py), and an empty validation text has no loss
        if total >= max_chars and any(len(ids) for ids in parts[True]):
            break
        text = (base / name).read_text(encoding="utf-8", errors="replace")
        is_val = i % val_every == 0
        parts[is_val].append(vocab.encode(text))
        files[is_val].append(name)
        total += len(text)
    if not files[False]:
        raise ShapeError(f"text_corpus: max_chars={max_chars} leaves no training file")

    def joined(key: bool) -> np.ndarray:
        return np.concatenate(parts[key]) if parts[key] else np.zeros(0, np.uint8)

    return TextCorpus(train=joined(False), val=joined(True), train_files=tuple(files[False]),
                      val_files=tuple(files[True]), root=str(base), vocab=vocab)


class TextLoader(DataLoader):
    """``(x, y)`` batches of ``batch_size`` windows of ``block_size`` tokens from the 1-D
    ``tokens``: ``x`` int64 ``(B, T)`` and ``y = tokens`` shifted by one.

    The windows are the non-overlapping ``tokens[s : s + T]`` at ``s = 0, T, 2T, ...`` (each
    with its target window, so ``(len(tokens) - 1) // T`` of them). It is a ``DataLoader`` over
    their start positions: seeded shuffling per epoch, ``rank``/``world_size`` shards, resumable
    ``state_dict()``; ``drop_last`` defaults to True, so every batch is full.

    >>> tokens = np.arange(20)
    >>> loader = TextLoader(tokens, block_size=4, batch_size=2, shuffle=False)
    >>> x, y = next(iter(loader))
    >>> x.tolist(), y.tolist()
    ([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    """

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, rank: int = 0,
                 world_size: int = 1):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ShapeError(f"TextLoader: tokens must be a 1-D integer array, got shape "
                             f"{tokens.shape} and dtype {tokens.dtype}")
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
            # int() would truncate 2.5 to windows of 2 tokens, silently
            raise TypeError(f"TextLoader: block_size must be an int, got {block_size!r}")
        if block_size < 1:
            raise ShapeError(f"TextLoader: block_size={block_size} must be >= 1")
        windows = (len(tokens) - 1) // int(block_size)
        if windows < 1:
            raise ShapeError(f"TextLoader: {len(tokens)} tokens hold no window of "
                             f"block_size={block_size} plus its target")
        self.tokens, self.block_size = tokens, int(block_size)
        starts = np.arange(windows, dtype=np.int64) * self.block_size
        super().__init__((starts,), batch_size, shuffle=shuffle, seed=seed,
                         drop_last=drop_last, rank=rank, world_size=world_size)

    def state_dict(self) -> dict:
        """``DataLoader.state_dict()`` plus what the windows are cut by (``block_size``) and
        from (``num_tokens``): a position means nothing over other windows."""
        return {**super().state_dict(), "block_size": self.block_size,
                "num_tokens": len(self.tokens)}

    def load_state_dict(self, state: dict) -> None:
        """As ``DataLoader.load_state_dict``; a state of other windows (another block size,
        another number of tokens, even with as many windows) is refused."""
        for key, mine in (("block_size", self.block_size), ("num_tokens", len(self.tokens))):
            if key in state and state[key] != mine:     # states saved before: not checked
                raise ShapeError(f"TextLoader.load_state_dict: the state was saved with "
                                 f"{key}={state[key]!r} but this loader has {key}={mine!r} "
                                 f"({'tokens' if key == 'num_tokens' else 'windows'} of "
                                 f"another size); resume with the same tokens and settings")
        super().load_state_dict(state)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        offsets = np.arange(self.block_size, dtype=np.int64)
        for (starts,) in super().__iter__():
            # Two arrays, not two views of one (B, T + 1): x[:, 1:] would be y[:, :-1], and
            # changing the inputs in place (an augmentation) would change the targets.
            at = starts[:, None] + offsets
            yield self.tokens[at].astype(np.int64), self.tokens[at + 1].astype(np.int64)
