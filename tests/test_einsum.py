"""tp.einsum: forward against np.einsum in float64, backward against finite differences
(tp.gradcheck) and against torch.einsum's gradients; equations it refuses name themselves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_reference import against_torch

import parcl as pc
import parcl.tape as tp
from conftest import leaf

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),                  # matmul
    ("ij,kj->ik", [(3, 4), (5, 4)]),                  # a @ b.T
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),         # bmm
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("bhqk,bhkd->bqhd", [(2, 3, 4, 6), (2, 3, 6, 5)]),  # output permuted
    ("ij->ji", [(3, 4)]),                             # transpose
    ("ijk->kij", [(2, 3, 4)]),
    ("ij->", [(3, 4)]),                               # total sum
    ("ij->j", [(3, 4)]),                              # column sums
    ("i,j->ij", [(3,), (4,)]),                        # outer product
    ("i,i->", [(5,), (5,)]),                          # dot
    ("ij,j->i", [(3, 4), (4,)]),                      # matrix-vector
    ("ij,ij->ij", [(3, 4), (3, 4)]),                  # elementwise
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),   # bilinear, three operands
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),       # chain
    ("ijk,ikl,j->il", [(2, 3, 4), (2, 4, 5), (3,)]),
    ("ij,jk", [(3, 4), (4, 5)]),                      # implicit: "ik"
    ("ba,ca", [(3, 4), (5, 4)]),                      # implicit: "bc"
    ("ij", [(3, 4)]),                                 # implicit: unchanged
    ("ji", [(3, 4)]),                                 # implicit: "ij", a transpose
    ("i,i", [(5,), (5,)]),                            # implicit: a scalar
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),   # ellipsis batch
    ("...ij,jk", [(2, 2, 3, 4), (4, 5)]),             # implicit with ellipsis: "...ik"
    ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)]),         # a size-1 batch dim broadcast
    ("ij,jk->ik", [(3, 1), (4, 5)]),                  # a size-1 summed dim broadcast
    (" ij , jk -> ik ", [(3, 4), (4, 5)]),            # spaces
    ("Ab,bC->CA", [(3, 4), (4, 2)]),                  # upper-case labels
]


def _ids():
    return [eq.replace(" ", "_") or "blank" for eq, _ in CASES]


@pytest.mark.parametrize("eq,shapes", CASES, ids=_ids())
def test_forward_matches_numpy_float64(queue, rng, eq, shapes):
    arrays = [rng.standard_normal(s) for s in shapes]
    got = tp.einsum(eq, *[leaf(queue, a) for a in arrays])
    want = np.einsum(eq.replace(" ", ""), *arrays)
    assert got.shape == want.shape
    np.testing.assert_allclose(got.to_host(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", CASES, ids=_ids())
def test_gradients_match_torch(queue, rng, eq, shapes):
    arrays = [rng.standard_normal(s) for s in shapes]
    against_torch(queue, rng, lambda *xs: tp.einsum(eq, *xs),
                  lambda *ts: torch.einsum(eq, *ts), arrays, tol=1e-5)


@pytest.mark.parametrize("eq,shapes", [CASES[i] for i in (2, 4, 9, 14, 16, 22, 24)],
                         ids=[CASES[i][0] for i in (2, 4, 9, 14, 16, 22, 24)])
def test_gradcheck(queue, rng, eq, shapes):
    nodes = [leaf(queue, rng.standard_normal(s)) for s in shapes]
    assert tp.gradcheck(lambda *xs: tp.einsum(eq, *xs), nodes)


def test_operands_as_a_list_and_raw_tensors(queue, rng):
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 2)))
    ta, tb = pc.Tensor.from_host(queue, a), pc.Tensor.from_host(queue, b)
    out = tp.einsum("ij,jk->ik", [ta, tb])
    assert isinstance(out, pc.Tensor)                 # raw inputs: no graph
    np.testing.assert_allclose(out.to_host(), a @ b, rtol=1e-5)


def test_records_only_existing_ops(queue, rng):
    a, b = (leaf(queue, rng.standard_normal(s)) for s in ((2, 3, 4), (2, 5, 4)))
    with tp.Tape() as tape:
        tp.einsum("bij,bkj->bik", a, b)
    assert {e.op_name for e in tape.nodes} <= {"permute", "reshape", "bmm", "mm", "sum"}


@pytest.mark.parametrize("eq,shapes,match", [
    ("ii->i", [(3, 3)], "repeats label 'i'"),
    ("ii", [(3, 3)], "diagonal or trace"),
    ("ij,jk->ik", [(3, 4)], "names 2 operand"),
    ("ijk->i", [(3, 4)], "has 2 dims"),
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j' has size 4"),
    ("ij->iz", [(3, 4)], "'z' is in no operand"),
    ("ij->ii", [(3, 4)], "repeats label 'i'"),
    ("i1->i", [(3, 4)], "not a letter"),
    ("i.j->ij", [(3, 4)], "'...'"),
])
def test_refusals_name_the_equation(queue, rng, eq, shapes, match):
    nodes = [leaf(queue, rng.standard_normal(s)) for s in shapes]
    with pytest.raises(pc.ShapeError, match=match) as err:
        tp.einsum(eq, *nodes)
    assert "einsum" in str(err.value)


def test_ellipsis_missing_from_the_output_is_summed_as_torch(queue, rng):
    # numpy refuses "...i->i"; torch sums the ellipsis dims, and so does parcl
    arrays = [rng.standard_normal((2, 3, 4))]
    against_torch(queue, rng, lambda x: tp.einsum("...i->i", x),
                  lambda x: torch.einsum("...i->i", x), arrays)


def test_random_equations_match_torch(queue):
    # 100 seeded equations of 1-3 operands (scalars, size-1 dims, implicit outputs among them)
    rng = np.random.default_rng(7)
    letters = list("abcde")
    size = {c: int(rng.integers(1, 4)) for c in letters}
    for _ in range(100):
        terms = ["".join(rng.choice(letters, int(rng.integers(0, 4)), replace=False))
                 for _ in range(int(rng.integers(1, 4)))]
        seen = sorted(set("".join(terms)))
        out = "".join(rng.permutation([c for c in seen if rng.random() < 0.5]))
        eq = ",".join(terms) + (f"->{out}" if rng.random() < 0.7 else "")
        arrays = [rng.standard_normal([size[c] for c in t]).astype(np.float32) for t in terms]
        want = torch.einsum(eq, *[torch.tensor(a) for a in arrays]).numpy()
        got = tp.einsum(eq, *[leaf(queue, a, False) for a in arrays]).to_host()
        assert got.shape == want.shape, eq
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=eq)


def test_einsum_over_a_slice_with_no_elements_gives_pytorchs_zeros(queue):
    """A label of size 0 (``x[:, 4:]`` of a (3, 4) ``x``) was taken for size 1 (the larger of
    the default 1 and 0), so the operand's reshape failed ('cannot view (3, 0) (0 elements)
    as (3, 1, 1)') where PyTorch's sum of no products is 0 and the gradient zero; a size-1
    dim broadcasts against the 0 as in PyTorch."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    x, xt = tp.tensor(a, requires_grad=True), torch.tensor(a)
    cases = [("ij,ij->i", lambda v: (v[:, 4:], v[:, 4:])),          # (3,) of zeros
             ("ij,ik->jk", lambda v: (v[2:2], v[2:2])),              # (4, 4) of zeros
             ("ij->", lambda v: (v[:, 4:],)),
             ("i,i->", lambda v: (v[0, 4:], v[0, :1]))]              # 1 broadcast to 0
    with tp.Tape() as tape:
        outs = [tp.einsum(eq, *pick(x)) for eq, pick in cases]
        loss = tp.sum(tp.stack([tp.sum(y) for y in outs]))
    tape.backward(loss)
    for (eq, pick), y in zip(cases, outs):
        want = torch.einsum(eq, *pick(xt)).numpy()
        assert y.shape == want.shape, eq
        np.testing.assert_array_equal(y.to_host(), want)
    np.testing.assert_array_equal(x.grad.to_host(), np.zeros((3, 4)))
