"""A PyTorch-style ``TransformerEncoder`` learns the histogram task: for every token of a
sequence, how many times that token occurs in the sequence.

    python examples/train_transformer_histogram.py [--steps 500] [--no-progress]

Sequences of 4 to 10 tokens from a vocabulary of 6 are padded to 10; the padding is hidden
from attention with ``src_key_padding_mask`` (True = padding, torch's convention) and left out
of the loss with ``ignore_index``. Every position must look at the whole sequence, so a model
without attention cannot do better than guessing from the token alone. The model is
``pc.nn.Embedding`` -> ``pc.nn.TransformerEncoder`` (2 post-norm layers, width 32, 4 heads)
-> a ``Linear`` over the possible counts, trained with Adam. Prints the accuracy over the
non-padded positions of a fresh test set on its last line: about 0.88 after the default 500
steps (about 25 s on two CPU cores), against 0.38 for always answering the most common
count.
"""

from __future__ import annotations

import argparse

import numpy as np

import parcl as pc
import parcl.tape as tp

VOCAB, MAX_LEN, MIN_LEN, PAD = 6, 10, 4, 6          # token 6 is padding


def batch(rng: np.random.Generator, n: int):
    """Token ids ``(n, MAX_LEN)``, padding mask (True = padding) and count labels (-100 on
    padding)."""
    tokens = rng.integers(0, VOCAB, size=(n, MAX_LEN))
    lengths = rng.integers(MIN_LEN, MAX_LEN + 1, size=n)
    padding = np.arange(MAX_LEN)[None, :] >= lengths[:, None]
    tokens[padding] = PAD
    same = (tokens[:, :, None] == tokens[:, None, :]) & ~padding[:, None, :]
    labels = np.where(padding, -100, same.sum(-1))
    return tokens.astype(np.int64), padding, labels.astype(np.int64)


class HistogramModel(pc.nn.Module):
    def __init__(self, d_model: int = 32, nhead: int = 4, layers: int = 2):
        super().__init__()
        self.embed = pc.nn.Embedding(VOCAB + 1, d_model)
        layer = pc.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.0,
                                              batch_first=True)
        self.encoder = pc.nn.TransformerEncoder(layer, layers)
        self.head = pc.nn.Linear(d_model, MAX_LEN + 1)

    def forward(self, tokens, padding):
        return self.head(self.encoder(self.embed(tokens), src_key_padding_mask=padding))


def accuracy(model, queue, rng) -> float:
    tokens, padding, labels = batch(rng, 512)
    with tp.no_grad():
        logits = model(pc.Tensor.from_host(queue, tokens), padding).to_host()
    keep = labels != -100
    return float((logits.argmax(-1)[keep] == labels[keep]).mean())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--no-progress", action="store_true", help="no loss lines")
    args = p.parse_args(argv)
    # --steps 0 (or -2) printed the untrained model's "test accuracy: 0.097" as the result
    for name in ("steps", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    pc.nn.manual_seed(0)
    queue = pc.default_queue()
    model = HistogramModel()
    opt = pc.optim.Adam(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(0)
    for step in range(1, args.steps + 1):
        tokens, padding, labels = batch(rng, args.batch_size)
        opt.zero_grad()
        with tp.Tape() as tape:
            logits = model(pc.Tensor.from_host(queue, tokens), padding)
            loss = tp.cross_entropy(tp.reshape(logits, (-1, MAX_LEN + 1)),
                                    pc.Tensor.from_host(queue, labels.reshape(-1)))
        tape.backward(loss)
        opt.step()
        if not args.no_progress and step % 50 == 0:
            print(f"step {step}: loss {loss.value.item():.3f}")
    model.eval()
    print(f"test accuracy: {accuracy(model, queue, np.random.default_rng(1)):.3f}")


if __name__ == "__main__":
    main()
