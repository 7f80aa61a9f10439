"""pc.nn.GPT: nanoGPT's model against a float64 numpy reference (forward, and every gradient
by finite differences), its state dict keys, the tied output head, generation, data-parallel
equivalence (eager and captured) and bit-identical repeats; the standard-library text corpus
and its loader."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import erf

import parcl as pc
import parcl.replica
import parcl.tape as tp
from parcl.testing import seeded, train_replicated, train_single

TINY = dict(vocab_size=11, block_size=6, n_layer=1, n_head=2, n_embd=8)


def nanogpt_keys(n_layer: int) -> list[str]:
    """nanoGPT's state_dict keys (bias=True, flash attention: no causal-mask buffer)."""
    keys = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            keys += [f"transformer.h.{i}.{part}.weight", f"transformer.h.{i}.{part}.bias"]
    return keys + ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]


# -- the float64 numpy reference (nanoGPT's forward) -------------------------------------------
def _ln(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def reference_logits(sd, idx, n_head, head=None):
    """nanoGPT's logits from a state dict; ``head`` replaces the tied ``lm_head.weight``
    (to vary one use of the tied weight on its own)."""
    b, t = idx.shape
    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:t]
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    causal = np.tril(np.ones((t, t), bool))
    for i in range(n_layer):
        def p(name, i=i):
            return sd[f"transformer.h.{i}.{name}"]
        h = _ln(x, p("ln_1.weight"), p("ln_1.bias"))
        qkv = h @ p("attn.c_attn.weight").T + p("attn.c_attn.bias")
        c = x.shape[-1]
        q, k, v = (qkv[..., j * c:(j + 1) * c].reshape(b, t, n_head, -1).transpose(0, 2, 1, 3)
                   for j in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(c // n_head)
        s = np.where(causal, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        y = (a / a.sum(-1, keepdims=True)) @ v
        y = y.transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + y @ p("attn.c_proj.weight").T + p("attn.c_proj.bias")
        h = _ln(x, p("ln_2.weight"), p("ln_2.bias"))
        h = h @ p("mlp.c_fc.weight").T + p("mlp.c_fc.bias")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))              # exact GELU
        x = x + h @ p("mlp.c_proj.weight").T + p("mlp.c_proj.bias")
    x = _ln(x, sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"])
    return x @ (sd["lm_head.weight"] if head is None else head).T


def reference_loss(sd, idx, targets, n_head, head=None):
    logits = reference_logits(sd, idx, n_head, head).reshape(-1, sd["lm_head.weight"].shape[0])
    m = logits.max(1, keepdims=True)
    logp = logits - m - np.log(np.exp(logits - m).sum(1, keepdims=True))
    return -logp[np.arange(len(logp)), targets.reshape(-1)].mean()


def random_state(model, rng):
    """Every entry random (biases and layer norms too), the tied keys equal."""
    sd = {k: rng.standard_normal(v.shape) * (0.3 if v.ndim > 1 else 0.2) + (k.endswith(
        ("ln_1.weight", "ln_2.weight", "ln_f.weight"))) for k, v in model.state_dict().items()}
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def numeric_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        up = f()
        a[i] = old - eps
        down = f()
        a[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


@pytest.fixture
def tiny(queue, rng):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(**TINY, queue=queue)
    sd = random_state(model, rng)
    model.load_state_dict(sd)
    idx = rng.integers(0, TINY["vocab_size"], (2, 5))
    targets = rng.integers(0, TINY["vocab_size"], (2, 5))
    return model, sd, idx, targets


def test_gpt_forward_matches_numpy(tiny):
    model, sd, idx, _ = tiny
    with tp.no_grad():
        got = model(idx).to_host()
    np.testing.assert_allclose(got, reference_logits(sd, idx, TINY["n_head"]), rtol=1e-4,
                               atol=1e-4)


def test_gpt_backward_matches_finite_differences(tiny, queue):
    """Every parameter's gradient (the tied one as the sum of both uses) against central
    differences of the float64 reference's loss."""
    model, sd, idx, targets = tiny
    with tp.Tape() as tape:
        loss = pc.nn.GPT.loss(model(idx), pc.Tensor.from_host(queue, targets))
    tape.backward(loss)
    np.testing.assert_allclose(loss.item(), reference_loss(sd, idx, targets, TINY["n_head"]),
                               rtol=1e-5)
    names = dict(model.named_parameters())
    assert "lm_head.weight" not in names           # the tied weight: listed once
    for name, p in names.items():
        want = numeric_grad(lambda: reference_loss(sd, idx, targets, TINY["n_head"]),
                            sd[name])
        np.testing.assert_allclose(p.grad.to_host(), want, rtol=1e-3, atol=2e-5, err_msg=name)


def test_tied_weight_gradient_is_the_sum_of_both_uses(tiny, queue):
    model, sd, idx, targets = tiny
    assert model.lm_head.weight is model.transformer.wte.weight
    params = model.parameters()
    assert sum(p is model.lm_head.weight for p in params) == 1
    assert len(params) == len({id(p) for p in params}) == len(nanogpt_keys(1)) - 1
    with tp.Tape() as tape:
        loss = pc.nn.GPT.loss(model(idx), pc.Tensor.from_host(queue, targets))
    tape.backward(loss)
    wte = sd["transformer.wte.weight"]
    head = wte.copy()                 # the head's use of the weight, varied on its own
    as_embedding = numeric_grad(lambda: reference_loss(sd, idx, targets, 2, head), wte)
    as_head = numeric_grad(lambda: reference_loss(sd, idx, targets, 2, head), head)
    assert np.abs(as_embedding).max() > 1e-3 and np.abs(as_head).max() > 1e-3
    np.testing.assert_allclose(model.lm_head.weight.grad.to_host(), as_embedding + as_head,
                               rtol=1e-3, atol=2e-5)


def test_a_tied_parameter_keeps_its_place_and_is_listed_once(queue):
    """Module-level tying (what GPT does): a Parameter assigned into a second module."""
    a, b = pc.nn.Linear(3, 3, queue=queue), pc.nn.Linear(3, 3, queue=queue)
    net = pc.nn.Sequential(a, b)
    b.weight = a.weight
    assert list(b.state_dict()) == ["weight", "bias"]
    assert [n for n, _ in net.named_parameters()] == ["0.weight", "0.bias", "1.bias"]
    assert list(net.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_state_dict_has_nanogpt_keys_and_round_trips(queue, rng):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=13, block_size=4, n_layer=2, n_head=2, n_embd=8, queue=queue)
    sd = model.state_dict()
    assert list(sd) == nanogpt_keys(2)
    np.testing.assert_array_equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    mine = random_state(model, rng)
    model.load_state_dict(mine)
    back = model.state_dict()
    assert list(back) == list(mine)
    for key, value in mine.items():
        np.testing.assert_array_equal(back[key], value.astype(np.float32), err_msg=key)
    pc.nn.manual_seed(1)
    other = pc.nn.GPT(vocab_size=13, block_size=4, n_layer=2, n_head=2, n_embd=8, queue=queue)
    other.load_state_dict(back)
    for key, value in other.state_dict().items():
        np.testing.assert_array_equal(value, back[key], err_msg=key)
    with pytest.raises(pc.nn.StateDictError, match="missing keys"):
        other.load_state_dict({k: v for k, v in back.items() if k != "lm_head.weight"})


def test_a_state_dict_whose_tied_entries_differ_is_refused(queue, rng):
    """An untied model's weights (a head of its own) loaded into the tied GPT: the embedding
    would silently become the head's weights (the later key wins, as in PyTorch)."""
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(**TINY, queue=queue)
    before = model.state_dict()
    untied = random_state(model, rng)
    untied["lm_head.weight"] = untied["transformer.wte.weight"] + 0.5
    with pytest.raises(pc.nn.StateDictError, match="transformer.wte.weight.*lm_head.weight"):
        model.load_state_dict(untied)
    for key, value in model.state_dict().items():       # nothing was loaded
        np.testing.assert_array_equal(value, before[key], err_msg=key)
    tied = random_state(model, rng)                      # equal entries, or only one: loads
    model.load_state_dict(tied)
    np.testing.assert_array_equal(model.transformer.wte.weight.value.to_host(),
                                  tied["transformer.wte.weight"].astype(np.float32))
    del tied["lm_head.weight"]
    model.load_state_dict(tied, strict=False)


def test_bias_false_drops_every_bias_as_nanogpt(queue):
    model = pc.nn.GPT(**{**TINY, "n_layer": 2}, bias=False, queue=queue)
    assert list(model.state_dict()) == [k for k in nanogpt_keys(2) if not k.endswith(".bias")]


def test_dropout_only_while_training(queue, rng):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(**TINY, dropout=0.3, queue=queue)
    idx = rng.integers(0, TINY["vocab_size"], (2, 6))
    tp.manual_seed(1)
    with tp.no_grad():
        a, b = model(idx).to_host(), model(idx).to_host()
        model.eval()
        c, d = model(idx).to_host(), model(idx).to_host()
    assert not np.allclose(a, b)               # fresh masks each forward
    np.testing.assert_array_equal(c, d)
    assert not np.allclose(a, c)


def test_nanogpt_initialisation(queue):
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=64, block_size=32, n_layer=3, n_head=2, n_embd=64,
                      queue=queue)
    sd = model.state_dict()
    for key, value in sd.items():
        if key.endswith("c_proj.weight"):
            assert abs(value.std() - 0.02 / math.sqrt(6)) < 0.002, key
        elif key.endswith("bias"):
            assert not value.any(), key
        elif ".ln_" in key or "ln_f" in key:
            assert (value == 1).all(), key
        else:
            assert abs(value.std() - 0.02) < 0.002 and abs(value.mean()) < 0.002, key
    pc.nn.manual_seed(0)
    again = pc.nn.GPT(vocab_size=64, block_size=32, n_layer=3, n_head=2, n_embd=64,
                      queue=queue).state_dict()
    assert all(np.array_equal(sd[k], again[k]) for k in sd)


def test_gpt_input_errors(queue):
    model = pc.nn.GPT(**TINY, queue=queue)
    with pytest.raises(pc.ShapeError, match="length 7.*block_size is 6"):
        model(np.zeros((1, 7), np.int64))
    with pytest.raises(pc.DTypeError, match="int64"):
        model(np.zeros((1, 3), np.float32))
    with pytest.raises(pc.ShapeError, match=r"\(B, T\)"):
        model(np.zeros(3, np.int64))
    with pytest.raises(pc.ShapeError, match="multiple of n_head"):
        pc.nn.CausalSelfAttention(10, 4, queue=queue)


def test_generate_is_reproducible_and_greedy_follows_the_argmax(tiny):
    model, sd, idx, _ = tiny
    model.eval()
    greedy = model.generate(idx[:, :2], 6, greedy=True)
    assert greedy.shape == (2, 8) and greedy.dtype == np.int64
    np.testing.assert_array_equal(greedy[:, :2], idx[:, :2])
    for t in range(2, 8):                     # each token the argmax given the (cropped) prefix
        context = greedy[:, max(0, t - TINY["block_size"]):t]
        want = reference_logits(sd, context, TINY["n_head"])[:, -1].argmax(1)
        np.testing.assert_array_equal(greedy[:, t], want)
    a = model.generate(idx[:, :1], 8, temperature=0.8, top_k=4, seed=3)
    b = model.generate(idx[:, :1], 8, temperature=0.8, top_k=4, seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, model.generate(idx[:, :1], 8, temperature=0.8, seed=4))
    one = model.generate(idx[:, :1], 8, top_k=1, seed=5)        # top_k=1 is greedy
    np.testing.assert_array_equal(one, model.generate(idx[:, :1], 8, greedy=True))


def _build(queue):
    return pc.nn.GPT(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, queue=queue)


def _batch():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 11, (6, 6))
    return x, np.roll(x, -1, axis=1)


def _adamw(params):
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return pc.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                           {"params": rest, "weight_decay": 0.0}], lr=1e-2)


def test_two_replicas_train_the_gpt_as_one(devices2):
    """Same global batch: 2 replicas (eager, captured) end where 1 replica does; the tied
    weight is one parameter in the buckets; repeated runs are bit-identical."""
    build = seeded(_build)
    ref = train_single(build, pc.nn.GPT.loss, _batch(), 3, _adamw, device=devices2[0])
    again = train_single(build, pc.nn.GPT.loss, _batch(), 3, _adamw, device=devices2[0])
    assert all(np.array_equal(a, b) for a, b in zip(ref, again))
    runs = {False: train_replicated(build, pc.nn.GPT.loss, _batch(), 3, 2, _adamw,
                                    devices=devices2)}
    with pc.replica.ReplicaGroup(build, devices2, capture=True) as group:
        opt = _adamw(group.parameters())
        for _ in range(3):
            group.step(*_batch(), pc.nn.GPT.loss, opt)
        assert [[s.replays for s in steps] for steps in group.captured_steps] == [[2], [2]]
        runs[True] = [p.value.to_host() for p in group.parameters()]
    for got in runs.values():
        assert len(got) == len(ref) == len(nanogpt_keys(2)) - 1
        for a, b in zip(ref, got):
            # atol: the key bias's gradient is zero but for rounding (softmax ignores a shift
            # of a row's scores), and Adam scales that noise up to lr * g / eps ~ 1e-6
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert all(np.array_equal(a, b) for a, b in zip(runs[False], runs[True]))
    initial = build(pc.new_queue(devices2[0])).state_dict()
    assert not np.allclose(ref[0], initial["transformer.wte.weight"])   # it trained


# -- the standard-library corpus ----------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus():
    return pc.data.text_corpus(max_chars=150_000)


def test_text_corpus_is_fixed_and_split_by_file(corpus):
    again = pc.data.text_corpus(max_chars=150_000)
    assert corpus.train_files == again.train_files and corpus.val_files == again.val_files
    np.testing.assert_array_equal(corpus.train, again.train)
    assert corpus.val_files and corpus.train_files
    assert not set(corpus.train_files) & set(corpus.val_files)
    assert all(f.endswith(".py") and "site-packages" not in f for f in corpus.train_files)
    assert len(corpus.train) + len(corpus.val) >= 150_000
    vocab = corpus.vocab
    assert vocab.size == 98 and corpus.train.dtype == np.uint8
    assert corpus.train.max() < vocab.size
    first = corpus.train_files[0]
    with open(f"{corpus.root}/{first}", encoding="utf-8", errors="replace") as f:
        text = f.read()
    head = corpus.train[:len(text)]
    assert vocab.decode(head) == "".join(c if c in vocab.chars else "?" for c in text)


def test_char_vocab_round_trips_and_refuses_what_it_cannot_encode():
    vocab = pc.data.CharVocab()
    text = "def f(x):\n\treturn x[-1] ~ {'a': 2}"
    ids = vocab.encode(text)
    assert ids.dtype == np.uint8 and vocab.decode(ids) == text
    assert vocab.decode(vocab.encode("\u00e9\r\U0001F600")) == "???"   # unknown: one id each
    small = pc.data.CharVocab("ab")
    assert small.encode("abc").tolist() == [0, 1, 2] and small.size == 3
    # non-ASCII characters failed in encode with an IndexError (a 128-entry table); a
    # character listed twice had two ids, encode giving only the last
    for chars in ("ab\u00e9", "aba"):
        with pytest.raises(ValueError, match="CharVocab: chars"):
            pc.data.CharVocab(chars)
    # a negative id indexed from the end: decode([-2]) gave 'b', a generated id of 3 an
    # IndexError
    for bad in ([-2], [0, 3]):
        with pytest.raises(ValueError, match=r"CharVocab.decode: id -?\d is outside \[0, 2\]"):
            small.decode(bad)


def test_unigram_baseline(corpus):
    base = corpus.unigram_baseline()
    counts = np.bincount(corpus.train, minlength=98) + 1.0
    p = counts / counts.sum()
    want = -np.log(p[corpus.val]).mean()
    assert base.nats == pytest.approx(want) and base.bits == pytest.approx(want / math.log(2))
    assert 3.0 < base.bits < math.log2(98)


def test_text_loader_windows_are_deterministic_and_sharded(corpus):
    tokens = corpus.train
    full = pc.data.TextLoader(tokens, block_size=16, batch_size=4, seed=3)
    shards = [pc.data.TextLoader(tokens, block_size=16, batch_size=2, seed=3, rank=r,
                                 world_size=2) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == (len(tokens) - 1) // 16 // 2 // 2
    starts = full.indices()[:4] * 16              # the first batch's windows
    (x, y), (x0, _), (x1, _) = (next(iter(loader)) for loader in (full, *shards))
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == np.int64
    for row, s in enumerate(starts):
        np.testing.assert_array_equal(x[row], tokens[s:s + 16])
        np.testing.assert_array_equal(y[row], tokens[s + 1:s + 17])
    # the two ranks' windows together are the full loader's (DistributedSampler's cut)
    np.testing.assert_array_equal(np.concatenate([x0, x1]), x[[0, 2, 1, 3]])
    a = [x for x, _ in pc.data.TextLoader(tokens[:2000], 16, 4, seed=3)]
    b = [x for x, _ in pc.data.TextLoader(tokens[:2000], 16, 4, seed=3)]
    c = [x for x, _ in pc.data.TextLoader(tokens[:2000], 16, 4, seed=4)]
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert not all(np.array_equal(u, v) for u, v in zip(a, c))


def test_text_loader_resumes_and_checks_its_input():
    tokens = np.arange(100)
    loader = pc.data.TextLoader(tokens, block_size=4, batch_size=3, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [x for x, _ in it]
    resumed = pc.data.TextLoader(tokens, block_size=4, batch_size=3, seed=1)
    resumed.load_state_dict(state)
    assert all(np.array_equal(u, v) for u, v in zip(rest, [x for x, _ in resumed]))
    with pytest.raises(pc.ShapeError, match="no window"):
        pc.data.TextLoader(np.arange(4), block_size=4, batch_size=1)
    with pytest.raises(pc.ShapeError, match="1-D integer"):
        pc.data.TextLoader(np.zeros((3, 3), np.int64), block_size=2, batch_size=1)
