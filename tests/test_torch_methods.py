"""The tensor and module API that PyTorch training scripts call, as PyTorch's: ``dim=`` and
``keepdim=`` on the ops whose own names are numpy's, ``x.size()``, ``x.transpose(d0, d1)``,
``x.split``, ``x.mT``, ``x.contiguous()``, ``x.to(...)``, ``x.float()``, ``x.dim()``,
``x.tolist()``, and ``Module.named_parameters/named_modules/named_buffers/state_dict`` with
PyTorch's keyword arguments; last, nanoGPT's attention written the way its users write it,
against torch with the same weights."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import parcl as pc
import parcl.tape as tp
from conftest import close, leaf, up
from parcl.errors import DeviceError, DTypeError, ShapeError


def _torch_grad(fn, *arrays):
    """``fn`` of float64 torch leaves, summed with fixed weights; (value, gradients)."""
    xs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*xs)
    w = torch.tensor(np.linspace(-1, 1, out.numel()).reshape(out.shape))
    (out * w).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in xs], w.numpy()


# -- dim= / keepdim= on the ops ---------------------------------------------------------------
@pytest.mark.parametrize("name, kwargs", [
    ("sum", dict(dim=1)), ("sum", dict(dim=(0, 2), keepdim=True)), ("mean", dict(dim=-1)),
    ("mean", dict(dim=1, keepdim=True)), ("softmax", dict(dim=1)),
    ("log_softmax", dict(dim=-1)), ("logsumexp", dict(dim=2, keepdim=True)),
    ("cumsum", dict(dim=1)), ("var", dict(dim=1)), ("std", dict(dim=(1, 2), keepdim=True)),
])
def test_reductions_and_softmax_take_dim_and_keepdim_as_pytorch(queue, rng, name, kwargs):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    x = leaf(queue, a)
    got = getattr(tp, name)(x, **kwargs)
    want, (grad,), w = _torch_grad(lambda t: getattr(torch, name)(t, **kwargs), a)
    close(got.to_host(), want)
    (got * up(queue, w)).sum().backward()
    close(x.grad.to_host(), grad)


def test_sum_over_dim_empty_reduces_every_dim_as_pytorch(queue, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    assert float(tp.sum(leaf(queue, a), dim=())) == pytest.approx(float(torch.sum(
        torch.tensor(a), dim=())), rel=1e-6)
    assert tp.sum(leaf(queue, a), axis=()).shape == (2, 3)       # numpy's axis=(): none


def test_joins_argmax_gather_flip_and_var_mean_take_pytorchs_names(queue, rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    x, t = leaf(queue, a), torch.tensor(a)
    close(tp.cat([x, x], dim=1).to_host(), torch.cat([t, t], dim=1).numpy())
    close(tp.stack([x, x], dim=-1).to_host(), torch.stack([t, t], dim=-1).numpy())
    assert [p.shape for p in tp.split(x, 2, dim=1)] == [(2, 2), (2, 1)]
    np.testing.assert_array_equal(np.asarray(tp.argmax(x, dim=1, keepdim=True)),
                                  torch.argmax(t, dim=1, keepdim=True).numpy())
    index = np.array([[0, 2], [1, 0]])
    close(tp.gather(x, dim=1, index=up(queue, index, np.int64)).to_host(),
          torch.gather(t, dim=1, index=torch.tensor(index)).numpy())
    close(tp.flip(x, dims=(1,)).to_host(), torch.flip(t, dims=(1,)).numpy())
    var, mean = tp.var_mean(x, dim=1, keepdim=True)
    want_var, want_mean = torch.var_mean(t, dim=1, keepdim=True)
    close(var.to_host(), want_var.numpy())
    close(mean.to_host(), want_mean.numpy())


def test_a_dim_given_under_both_names_is_a_type_error(queue):
    x = leaf(queue, np.ones((2, 3)))
    with pytest.raises(TypeError, match="softmax: axis and dim given both"):
        tp.softmax(x, axis=0, dim=1)
    with pytest.raises(TypeError, match="sum: keepdims and keepdim given both"):
        tp.sum(x, 1, keepdims=True, keepdim=True)


# -- shape methods ----------------------------------------------------------------------------
def test_transpose_of_two_dims_matches_pytorch_forward_and_gradient(queue, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for d0, d1 in ((1, 2), (-2, -1), (0, 2), (1, 1)):
        x = leaf(queue, a)
        got = x.transpose(d0, d1)
        want, (grad,), w = _torch_grad(lambda t, d0=d0, d1=d1: t.transpose(d0, d1), a)
        assert got.shape == want.shape
        close(got.to_host(), want)
        (got * up(queue, w)).sum().backward()
        close(x.grad.to_host(), grad)
    assert tp.transpose(leaf(queue, a), 0, -1).shape == (4, 3, 2)
    assert tp.transpose(leaf(queue, a), dim0=0, dim1=1).shape == (3, 2, 4)
    assert tp.transpose(leaf(queue, a)).shape == (4, 3, 2)      # numpy's: every dim reversed
    assert tp.gradcheck(lambda t: t.transpose(0, 2), [leaf(queue, a)])
    with pytest.raises(ShapeError, match="transpose: dim 3 is out of range"):
        leaf(queue, a).transpose(0, 3)


def test_split_mT_mH_and_contiguous_as_pytorch(queue, rng):
    a = rng.standard_normal((2, 3, 5)).astype(np.float32)
    x, t = leaf(queue, a), torch.tensor(a)
    pieces, want = x.split(2, dim=2), t.split(2, dim=2)
    assert [p.shape for p in pieces] == [tuple(w.shape) for w in want] == [(2, 3, 2)] * 2 + [
        (2, 3, 1)]
    for p, w in zip(x.split([1, 4], -1), t.split([1, 4], -1)):
        close(p.to_host(), w.numpy())
    close(x.mT.to_host(), t.mT.numpy())
    close(x.mH.to_host(), t.mH.numpy())
    assert x.contiguous() is x
    (sum(p.sum() * (i + 1) for i, p in enumerate(x.split(2, dim=2)))).backward()
    np.testing.assert_array_equal(x.grad.to_host()[0, 0], [1, 1, 2, 2, 3])
    with pytest.raises(ShapeError, match="mT: a tensor of at least 2 dims"):
        _ = leaf(queue, np.ones(3)).mT


def test_size_called_gives_the_shape_and_read_gives_the_element_count(queue):
    x = leaf(queue, np.zeros((2, 3, 4)))
    B, T, C = x.size()
    assert (B, T, C) == (2, 3, 4) == tuple(torch.zeros(2, 3, 4).size())
    assert x.size(1) == 3 and x.size(-1) == 4 and x.size(-3) == 2
    assert x.size == 24 and x.size + 1 == 25 and np.zeros(x.size).shape == (24,)
    assert leaf(queue, np.float32(2)).size() == ()
    with pytest.raises(ShapeError, match=r"size: dim 3 is out of range .* \(2, 3, 4\)"):
        x.size(3)
    with pytest.raises(TypeError, match="size: dim must be an int"):
        x.size(1.0)


def test_dim_tolist_numel_and_item_as_pytorch(queue):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = leaf(queue, a)
    assert x.dim() == 2 and x.numel() == 6
    assert x.tolist() == torch.tensor(a).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert x.sum().tolist() == 15.0 and x.sum().item() == 15.0


def test_to_float_long_and_type_as_convert_dtypes_and_take_devices_as_given(queue):
    x = leaf(queue, np.array([1.7, -2.2, 3.0]))
    assert x.to("cpu") is x and x.to(x.queue) is x and x.float() is x
    assert x.to(np.float32) is x and x.to("cuda:0", np.float32) is x
    n = x.long()
    assert n.dtype == np.int64 and n.tolist() == torch.tensor([1.7, -2.2, 3.0]).long().tolist()
    assert x.int().dtype == np.int32 and x.to(dtype="int64").dtype == np.int64
    assert n.float().dtype == np.float32 and n.float().tolist() == [1.0, -2.0, 3.0]
    assert x.type_as(n).dtype == np.int64 and n.type_as(x).dtype == np.float32
    assert x.to(n).dtype == np.int64
    copy = x.to("cpu", copy=True)
    assert copy is not x and copy.tolist() == x.tolist()
    with pytest.raises(DeviceError, match="is not this tensor's queue"):
        x.to(object())
    with pytest.raises(DTypeError, match="float32 to float64 is not supported"):
        x.to(np.float64)


# -- Module traversal and state dicts -----------------------------------------------------------
class _Tied:
    """A model with a tied weight and a child registered twice, in torch and in parcl."""

    @staticmethod
    def build(nn):
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(5, 3)
                self.norm = nn.BatchNorm1d(3)
                self.head = nn.Linear(3, 5, bias=False)
                self.head.weight = self.emb.weight
                self.again = self.norm
        return Model()


def test_named_parameters_modules_and_buffers_list_tied_ones_as_pytorch():
    mine, theirs = _Tied.build(pc.nn), _Tied.build(torch.nn)
    for method, kwargs in [("named_parameters", {}), ("named_parameters", dict(prefix="m")),
                           ("named_parameters", dict(remove_duplicate=False)),
                           ("named_parameters", dict(recurse=False)),
                           ("named_modules", {}), ("named_modules", dict(prefix="m")),
                           ("named_modules", dict(remove_duplicate=False)),
                           ("named_buffers", dict(remove_duplicate=False)),
                           ("named_buffers", dict(prefix="m"))]:
        got = [n for n, _ in getattr(mine, method)(**kwargs)]
        # parcl's BatchNorm keeps no num_batches_tracked buffer (load_state_dict drops it)
        want = [n for n, _ in getattr(theirs, method)(**kwargs)
                if not n.endswith("num_batches_tracked")]
        assert got == want, (method, kwargs)
    assert [n for n, _ in mine.named_parameters()] == ["emb.weight", "norm.weight", "norm.bias"]
    memo = {id(mine.norm)}
    assert [n for n, _ in mine.named_modules(memo)] == ["", "emb", "head"]
    assert len(mine.parameters(recurse=True)) == 3


def test_state_dict_takes_prefix_destination_and_keep_vars_as_pytorch():
    mine, theirs = _Tied.build(pc.nn), _Tied.build(torch.nn)
    assert list(mine.state_dict(prefix="model.")) == [
        k for k in theirs.state_dict(prefix="model.") if not k.endswith("num_batches_tracked")]
    into = OrderedDict(step=np.int64(3))
    out = mine.state_dict(destination=into)
    assert out is into and list(out)[:2] == ["step", "emb.weight"]
    kept = mine.state_dict(keep_vars=True)
    assert kept["emb.weight"] is mine.emb.weight is kept["head.weight"]
    assert kept["norm.running_mean"] is mine.norm.running_mean
    assert isinstance(mine.state_dict()["emb.weight"], np.ndarray)


# -- nanoGPT's attention, as its users write it ------------------------------------------------
def _causal_self_attention(x, c_attn, c_proj, bias, n_head, n_embd, softmax, is_zero):
    """nanoGPT's CausalSelfAttention.forward, the same text for torch and parcl."""
    B, T, C = x.size()
    q, k, v = c_attn(x).split(n_embd, dim=2)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(is_zero(bias[:, :, :T, :T]), float("-inf"))
    att = softmax(att, dim=-1)
    y = att @ v
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return c_proj(y)


def test_nanogpt_attention_written_with_torch_idioms_matches_torch(queue, rng):
    n_embd, n_head, block = 8, 2, 6
    pc.nn.manual_seed(0)
    attn, proj = pc.nn.Linear(n_embd, 3 * n_embd), pc.nn.Linear(n_embd, n_embd)
    t_attn, t_proj = torch.nn.Linear(n_embd, 3 * n_embd), torch.nn.Linear(n_embd, n_embd)
    for mine, theirs in ((attn, t_attn), (proj, t_proj)):
        theirs.load_state_dict({k: torch.tensor(v) for k, v in mine.state_dict().items()})
    bias = tp.tril(tp.ones(block, block)).view(1, 1, block, block)
    t_bias = torch.tril(torch.ones(block, block)).view(1, 1, block, block)
    a = rng.standard_normal((2, 5, n_embd)).astype(np.float32)
    x, tx = leaf(queue, a), torch.tensor(a, requires_grad=True)
    y = _causal_self_attention(x, attn, proj, bias, n_head, n_embd, tp.softmax,
                               lambda m: m.eq(0))
    ty = _causal_self_attention(tx, t_attn, t_proj, t_bias, n_head, n_embd, F.softmax,
                                lambda m: m == 0)
    close(y.to_host(), ty.detach().numpy())
    w = rng.standard_normal(y.shape).astype(np.float32)
    (y * up(queue, w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    close(x.grad.to_host(), tx.grad.numpy())
    close(attn.weight.grad.to_host(), t_attn.weight.grad.numpy())
    close(proj.bias.grad.to_host(), t_proj.bias.grad.numpy())


def test_a_nodes_cast_keeps_the_pending_check_of_a_bad_embedding_index(queue):
    """``node.long()`` (``.to``, ``.type_as``) made a Node of the cast value without the
    value's pending checks: an embedding row picked by an out-of-range id read back as a
    number through ``.long()`` with no error, where the raw Tensor's cast (and every op)
    raises at the host read."""
    w = tp.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    with tp.Tape():
        out = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 5])), w)
    for cast in (out.long(), out.to(np.int64), out.int()):
        with pytest.raises(ShapeError, match="index 5 .* out of range"):
            cast.to_host()
