"""``einsum``: PyTorch's ``torch.einsum`` built from other ops (``sum``, ``permute``, ``reshape``,
``mm``/``bmm``), so its gradient is theirs.

The operands are contracted left to right, two at a time. Before each product a label that no
later operand and not the output needs is summed out of the operand that alone holds it; the
two operands are then permuted to ``(batch, free, contracted)`` and ``(batch, contracted,
free)``, flattened to three dims and multiplied with one ``bmm`` (``mm`` when there is no batch
label). A dimension of size 1 where the same label is larger elsewhere is broadcast (dropped
from its operand), as PyTorch and numpy broadcast. A label repeated inside one operand (a
diagonal, a trace: ``"ii->i"``, ``"ii"``) is refused with a ShapeError naming the equation.

>>> a = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 3, 4), np.float32)), True)
>>> b = tp.tensor(pc.Tensor.from_host(q, np.ones((2, 4, 5), np.float32)), True)
>>> tp.einsum("bij,bjk->bik", a, b).shape
(2, 3, 5)
>>> tp.einsum("bij->ji", a).shape
(4, 3)
"""

from __future__ import annotations

from math import prod

from ...errors import ShapeError
from .linalg import bmm, mm
from .reduce import sum
from .shape import permute, reshape

__all__ = ["einsum"]

_ELLIPSIS = "."          # ellipsis dims are labelled (".", k), k counting from the right


def _split_terms(equation: str, count: int):
    """The input terms and the output term (None when implicit), spaces removed."""
    eq = equation.replace(" ", "")
    inputs, arrow, output = eq.partition("->")
    if arrow and "->" in output:
        raise ShapeError(f"einsum: equation {equation!r} has more than one '->'")
    terms = inputs.split(",")
    if len(terms) != count:
        raise ShapeError(f"einsum: equation {equation!r} names {len(terms)} operand(s), got "
                         f"{count} operand(s)")
    return terms, (output if arrow else None)


def _labels(equation: str, term: str, where: str, ndim: int | None):
    """The labels of one term, an ellipsis expanded to ``ndim - explicit`` labels (all of
    them when ``ndim`` is None: the output's, filled in later)."""
    head, dots, tail = term.partition("...")
    if "." in head or "." in tail or (dots and "..." in tail):
        raise ShapeError(f"einsum: {where} of {equation!r}: '.' only as one '...'")
    for ch in head + tail:
        if not ch.isascii() or not ch.isalpha():
            raise ShapeError(f"einsum: {where} of {equation!r}: label {ch!r} is not a letter "
                             "(a-z, A-Z)")
    explicit = len(head) + len(tail)
    if ndim is None:
        return list(head), bool(dots), list(tail)
    if (not dots and explicit != ndim) or (dots and explicit > ndim):
        raise ShapeError(f"einsum: {where} of {equation!r} is {term!r} ({explicit} labels"
                         f"{' and ...' if dots else ''}) but the operand has {ndim} dims")
    extra = ndim - explicit
    return list(head) + [(_ELLIPSIS, extra - i) for i in range(extra)] + list(tail)


def _parse(equation: str, shapes):
    terms, out_term = _split_terms(equation, len(shapes))
    labels = [_labels(equation, t, f"operand {i}", len(s))
              for i, (t, s) in enumerate(zip(terms, shapes))]
    for i, ls in enumerate(labels):
        repeated = sorted({x for x in ls if ls.count(x) > 1 and isinstance(x, str)})
        if repeated:
            raise ShapeError(f"einsum: {equation!r}: operand {i} repeats label "
                             f"{''.join(repeated)!r} (a diagonal or trace), which parcl's einsum "
                             "does not take; take it with tp.diagonal or tp.trace first")
    dots = sorted({x for ls in labels for x in ls if isinstance(x, tuple)},
                  key=lambda x: -x[1])               # leftmost ellipsis dim first
    if out_term is None:                             # implicit: ellipsis, then labels seen once
        seen = [x for ls in labels for x in ls if isinstance(x, str)]
        return labels, dots + sorted({x for x in seen if seen.count(x) == 1})
    head, has_dots, tail = _labels(equation, out_term, "the output", None)
    out = head + (dots if has_dots else []) + tail
    named = [x for x in head + tail]
    for x in named:
        if named.count(x) > 1:
            raise ShapeError(f"einsum: {equation!r}: the output repeats label {x!r}")
        if not any(x in ls for ls in labels):
            raise ShapeError(f"einsum: {equation!r}: output label {x!r} is in no operand")
    return labels, out


def _sizes(equation: str, labels, shapes) -> dict:
    """Each label's size; a label's sizes must agree or be 1 (broadcast), as PyTorch's."""
    size: dict = {}
    for i, (ls, shape) in enumerate(zip(labels, shapes)):
        for x, n in zip(ls, shape):
            m = size.get(x, 1)
            if n != m and n != 1 and m != 1:
                name = "..." if isinstance(x, tuple) else repr(x)
                raise ShapeError(f"einsum: {equation!r}: label {name} has size {m} in an "
                                 f"earlier operand and {n} in operand {i} (shape "
                                 f"{tuple(shape)}); sizes must agree or be 1")
            size[x] = n if m == 1 else m      # a 1 broadcasts to the other, 0 included
    return size


def _arrange(x, ls: list, order: list, tape):
    """``x`` (labels ``ls``) with its dims in the order ``order``; no op when already so."""
    if ls == order:
        return x
    return permute(x, [ls.index(a) for a in order], tape=tape)


def _shaped(x, shape: tuple, tape):
    return x if tuple(x.shape) == tuple(shape) else reshape(x, shape, tape=tape)


def _sum_out(x, ls: list, keep: set, tape):
    """``x`` summed over the labels not in ``keep``; returns the node and its labels."""
    gone = [i for i, a in enumerate(ls) if a not in keep]
    if not gone:
        return x, ls
    return sum(x, axis=tuple(gone), tape=tape), [a for a in ls if a in keep]


def _contract(a, la: list, b, lb: list, keep: set, size: dict, tape):
    """The product of two operands over their shared labels not in ``keep``."""
    batch = [x for x in la if x in lb and x in keep]
    inner = [x for x in la if x in lb and x not in keep]
    free_a = [x for x in la if x not in lb]
    free_b = [x for x in lb if x not in la]
    nb, m, k, n = (prod(size[x] for x in g) for g in (batch, free_a, inner, free_b))
    a = _arrange(a, la, batch + free_a + inner, tape)
    b = _arrange(b, lb, batch + inner + free_b, tape)
    if batch:
        y = bmm(_shaped(a, (nb, m, k), tape), _shaped(b, (nb, k, n), tape), tape=tape)
    else:
        y = mm(_shaped(a, (m, k), tape), _shaped(b, (k, n), tape), tape=tape)
    labels = batch + free_a + free_b
    return _shaped(y, tuple(size[x] for x in labels), tape), labels


def einsum(equation: str, *operands, tape=None):
    """``torch.einsum(equation, *operands)``: explicit (``"ij,jk->ik"``) and implicit
    (``"ij,jk"``: the labels seen once, in alphabetical order) outputs, any number of
    operands (also given as one list), labels summed when they are not in the output, batch
    labels, transposes, outer products, ``...`` for broadcast leading dims, and size-1 dims
    broadcast. Diagonals and traces (a label twice in one operand) are a ShapeError. Built
    from ``sum``, ``permute``, ``reshape`` and ``mm``/``bmm``: their gradients are its own.

    >>> tp.einsum("ij,kj->ik", a, b).shape      # a (2, 3), b (4, 3): a @ b.T
    (2, 4)
    >>> tp.einsum("i,j", u, v).shape            # outer product: u (2,), v (5,)
    (2, 5)
    """
    if not isinstance(equation, str):
        raise ShapeError(f"einsum: the equation must be a string, got {type(equation).__name__}"
                         " (the sublist form is not supported)")
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ShapeError(f"einsum: {equation!r} needs at least one operand")
    shapes = [tuple(x.shape) for x in operands]
    labels, out = _parse(equation, shapes)
    size = _sizes(equation, labels, shapes)
    # broadcast: a size-1 dim whose label is larger elsewhere leaves its operand
    ops, lbls = [], []
    for x, ls, shape in zip(operands, labels, shapes):
        kept = [a for a, n in zip(ls, shape) if not (n == 1 and size[a] != 1)]
        if len(kept) != len(ls):
            x = reshape(x, tuple(size[a] for a in kept), tape=tape)
        ops.append(x)
        lbls.append(kept)
    want = set(out)
    y, ly = _sum_out(ops[0], lbls[0], want.union(*lbls[1:]), tape)
    for i in range(1, len(ops)):
        later = want.union(*lbls[i + 1:])
        y, ly = _sum_out(y, ly, later.union(lbls[i]), tape)
        b, lb = _sum_out(ops[i], lbls[i], later.union(ly), tape)
        y, ly = _contract(y, ly, b, lb, later, size, tape)
    y, ly = _sum_out(y, ly, want, tape)
    y = _arrange(y, ly, [a for a in out if a in ly], tape)
    return _shaped(y, tuple(size[a] for a in out), tape)
