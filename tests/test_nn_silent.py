"""Layers and transformer pieces that once gave a wrong result without raising: each test is
the reproducer of one such case, with what PyTorch gives or the clear error parcl gives
instead."""

import numpy as np
import pytest

import parcl as pc
import parcl.tape as tp


# -- an out-of-range token id reaches the predictions of argmax/argmin -------------------------
@pytest.mark.parametrize("op", [tp.argmax, tp.argmin])
def test_argmax_of_logits_from_an_out_of_range_id_raises(queue, op):
    """``tp.argmax(model(idx), axis=-1)`` with a token id outside ``[0, V)``, read while grad
    mode was on, returned predictions (``[[0, 0, 0]]``) without the embedding's error: argmax
    and argmin dropped their input's pending index check. PyTorch raises ``IndexError`` in
    the embedding itself; parcl promises the error at the next host read of any value computed
    from the rows through ``tp`` ops."""
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, queue=queue)
    with tp.Tape():
        logits = model(np.array([[1, 2, 11]]))
        predicted = op(logits, axis=-1)
    with pytest.raises(pc.ShapeError, match="embedding: index 11"):
        predicted.to_host()


def test_argmax_keeps_a_check_through_a_view(queue):
    """The flattened form (``axis=None``, keepdims) is a view of the index tensor: it carries
    the check too."""
    weight = pc.nn.Parameter.from_host(queue, np.ones((4, 3), np.float32))
    with tp.Tape():
        rows = tp.embedding(pc.Tensor.from_host(queue, np.array([0, 4])), weight)
        flat = tp.argmax(rows, keepdims=True)
    with pytest.raises(pc.ShapeError, match="embedding: index 4"):
        flat.to_host()


# -- load_state_dict: a value that is not a number loaded NaN ---------------------------------
@pytest.mark.parametrize("value", [None, np.array([None, 1.0], dtype=object),
                                   np.array(["1.5", "2"])],
                         ids=["None", "object-array-with-None", "strings-of-numbers"])
def test_load_state_dict_refuses_values_that_are_not_numbers(queue, value):
    """``load_state_dict`` cast every value with ``np.array(value, dtype=float32)``: ``None``
    (and an object array holding one) became NaN and strings of digits became numbers, loaded
    without a word (a 0-d or matching-shape parameter took them). PyTorch refuses a value
    that is not a tensor ("expected torch.Tensor or Tensor-like object from checkpoint");
    parcl documents a ``StateDictError`` for non-numeric values, with nothing changed."""
    class Scale(pc.nn.Module):
        def __init__(self):
            super().__init__()
            self.s = pc.nn.Parameter.from_host(queue, np.ones(np.shape(value), np.float32))
            self.b = pc.nn.Parameter.from_host(queue, np.zeros(2, np.float32))

    m = Scale()
    with pytest.raises(pc.nn.StateDictError, match="'s' is not a numeric array"):
        m.load_state_dict({"s": value, "b": np.ones(2)})
    np.testing.assert_array_equal(m.s.to_host(), np.ones(np.shape(value)))
    np.testing.assert_array_equal(m.b.to_host(), np.zeros(2))      # nothing was loaded


def test_load_state_dict_still_casts_numeric_arrays(queue):
    """float64, integer and boolean arrays (and PyTorch-style nested lists) are numbers: cast
    to float32 as PyTorch's ``copy_`` does."""
    lin = pc.nn.Linear(2, 2, queue=queue)
    lin.load_state_dict({"weight": np.array([[0.5, 1], [2, 3]], np.float64),
                         "bias": np.array([True, False])})
    np.testing.assert_array_equal(lin.weight.to_host(), [[0.5, 1], [2, 3]])
    np.testing.assert_array_equal(lin.bias.to_host(), [1, 0])
    lin.load_state_dict({"weight": [[1, 2], [3, 4]], "bias": np.arange(2)})
    np.testing.assert_array_equal(lin.weight.to_host(), [[1, 2], [3, 4]])


def test_optimizer_load_state_dict_refuses_a_none_moment(queue):
    """The optimizer's ``load_state_dict`` shares the cast: Adam's ``exp_avg`` given as an
    object array holding ``None`` loaded NaN moments (every later step NaN). Now the
    ``OptimizerError`` it has for non-numeric state."""
    lin = pc.nn.Linear(2, 1, bias=False, queue=queue)
    opt = pc.optim.Adam(lin.parameters(), lr=0.1)
    with tp.Tape() as tape:
        loss = tp.sum(lin(tp.tensor(np.ones((1, 2)))))
    tape.backward(loss)
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["exp_avg"] = np.array([[None, 1.0]], dtype=object)
    with pytest.raises(pc.optim.OptimizerError, match="exp_avg.*not a numeric array"):
        opt.load_state_dict(sd)


# -- a registered name with a dot made two state-dict entries one -----------------------------
def test_a_dotted_buffer_name_cannot_shadow_a_child_parameter(queue):
    """``m.register_buffer("a.weight", t)`` beside a child ``a`` with a ``weight`` was
    accepted: ``state_dict()`` had one ``a.weight`` key for two tensors (the buffer's value
    silently lost in a checkpoint), and ``load_state_dict`` wrote that one array into both.
    PyTorch refuses the name (``KeyError: buffer name can't contain "."``)."""
    m = pc.nn.Module()
    m.a = pc.nn.Linear(2, 2, queue=queue)
    with pytest.raises(pc.nn.StateDictError, match=r"register_buffer\('a.weight'\).*'\.'"):
        m.register_buffer("a.weight", pc.Tensor.zeros(queue, (2, 2)))
    assert list(m.state_dict()) == ["a.weight", "a.bias"]
    assert "a.weight" not in m._buffers


@pytest.mark.parametrize("how", ["register_parameter", "add_module", "setattr", "Sequential"])
@pytest.mark.parametrize("name", ["x.y", ""])
def test_names_with_a_dot_or_empty_are_refused_everywhere(queue, how, name):
    """The same for parameters and children (``add_module``, ``setattr``, an
    ``OrderedDict`` given to ``Sequential``): a dot makes keys ambiguous (``x.y.weight`` of a
    child ``x.y`` reads as child ``x``, grandchild ``y``) and an empty name gives keys
    ``.weight``; PyTorch raises ``KeyError`` for both. Nothing is registered."""
    from collections import OrderedDict
    m = pc.nn.Module()
    p = pc.nn.Parameter.from_host(queue, np.ones(1, np.float32))
    with pytest.raises(pc.nn.StateDictError, match="name"):
        if how == "register_parameter":
            m.register_parameter(name, p)
        elif how == "add_module":
            m.add_module(name, pc.nn.Identity())
        elif how == "setattr":
            setattr(m, name, p)
        else:
            m = pc.nn.Sequential(OrderedDict([(name, pc.nn.Linear(1, 1, queue=queue))]))
    assert m.state_dict() == {} and m.parameters() == []


# -- train()/eval() call each child's train(), as PyTorch's ----------------------------------
class _FrozenNormBackbone(pc.nn.Module):
    """The fine-tuning idiom: a ``train`` override that keeps batch norm in evaluation."""

    def __init__(self, queue):
        super().__init__()
        self.fc = pc.nn.Linear(3, 3, queue=queue)
        self.bn = pc.nn.BatchNorm1d(3, queue=queue)

    def train(self, mode=True):
        super().train(mode)
        self.bn.eval()
        return self

    def forward(self, x):
        return self.bn(self.fc(x))


def test_train_on_a_parent_runs_a_childs_train_override(queue):
    """``model.train()`` set ``training`` on every descendant directly, so a child's own
    ``train`` was never called: the frozen batch norm of the idiom above went back to batch
    statistics and its running statistics moved at every step. PyTorch's ``Module.train``
    calls ``child.train(mode)`` on each child: the override keeps ``bn`` in evaluation."""
    model = pc.nn.Sequential(_FrozenNormBackbone(queue), pc.nn.Linear(3, 2, queue=queue))
    model.eval()
    model.train()
    backbone = model[0]
    assert model.training and backbone.training and backbone.fc.training
    assert not backbone.bn.training                     # PyTorch: False
    x = tp.tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    with tp.no_grad():
        model(x)
    np.testing.assert_array_equal(backbone.bn.running_mean.to_host(), np.zeros(3))
    assert model.train(False) is model and not any(m.training for m in model.modules())


def test_train_reaches_a_shared_child_and_returns_self(queue):
    """A child registered under two names is switched once either way; ``eval()`` is
    ``train(False)`` (an override of ``train`` sees it), as PyTorch's."""
    calls = []

    class Counting(pc.nn.Module):
        def train(self, mode=True):
            calls.append(mode)
            return super().train(mode)

    shared = Counting()
    model = pc.nn.Sequential(shared, pc.nn.ReLU(), shared)
    assert model.eval() is model
    assert calls and set(calls) == {False} and not shared.training


@pytest.mark.parametrize("mode", ["eval", "False", 0, None], ids=repr)
def test_train_with_a_mode_that_is_not_a_bool_is_refused(queue, mode):
    """``model.train("eval")`` switched the model to training (any non-empty string is true),
    silently; PyTorch raises ``ValueError`` for a mode that is not a bool. Nothing changes."""
    model = pc.nn.Sequential(pc.nn.Dropout(0.5)).eval()
    with pytest.raises(pc.ParclError, match="mode must be a bool"):
        model.train(mode)
    assert not any(m.training for m in model.modules())
    assert model.train(np.bool_(True)).training      # a numpy bool is a bool


# -- scaled_dot_product_attention: the mask's gradient at scale=0 -----------------------------
def test_attention_mask_gradient_with_scale_zero(queue, rng):
    """``scale=0.0`` (scores ignore q and k; the mask alone shapes the weights) raised a
    ``ZeroDivisionError`` in the backward: the mask's gradient was the scores' gradient divided
    by the scale. PyTorch gives ``p * (dp - rowsum(p * dp))`` summed over the batch (here in
    numpy float64); q and k get zero."""
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    m = rng.standard_normal((3, 3)).astype(np.float32)
    nodes = [tp.tensor(x, requires_grad=True) for x in (q, k, v, m)]
    with tp.Tape() as tape:
        y = tp.scaled_dot_product_attention(*nodes[:3], attn_mask=nodes[3], scale=0.0)
        loss = tp.sum(y * y)
    tape.backward(loss)
    e = np.exp(m - m.max(-1, keepdims=True).astype(np.float64))
    p = np.broadcast_to(e / e.sum(-1, keepdims=True), (2, 3, 3))
    dy = 2 * (p @ v)
    dp = dy @ v.transpose(0, 2, 1)
    dm = (p * (dp - (p * dp).sum(-1, keepdims=True))).sum(0)
    want = [np.zeros_like(q), np.zeros_like(k), p.transpose(0, 2, 1) @ dy, dm]
    for node, w in zip(nodes, want):
        np.testing.assert_allclose(node.grad.to_host(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", ["Conv1d", "Conv2d"])
@pytest.mark.parametrize("groups", [2.5, 2.0, True])
def test_a_convolutions_groups_that_is_not_an_int_is_refused(queue, cls, groups):
    """``Conv1d(4, 4, 3, groups=2.5)`` was built as a 2-group convolution (``int(2.5)``,
    weight (4, 2, 3)) and ``groups=True`` as an ordinary one, silently: PyTorch refuses 2.5
    (in_channels must be divisible by groups) and fails on 2.0. Refused, naming groups."""
    with pytest.raises(pc.errors.ShapeError, match=f"{cls}: groups must be a positive integer, got "
                                         f"{groups!r}"):
        getattr(pc.nn, cls)(4, 4, 3, groups=groups, queue=queue)


@pytest.mark.parametrize("sizes", [(10.7, 4), (10, 4.5), (0, 4), (10, True)])
def test_an_embedding_size_that_is_not_a_positive_int_is_refused(queue, sizes):
    """``Embedding(10.7, 4)`` built a table of 10 rows (``int(10.7)``), so index 10 was then
    "out of range" for a table the user asked to hold it; PyTorch refuses a float size.
    Refused at construction, naming the argument, as Linear and Conv2d do."""
    with pytest.raises(pc.errors.ShapeError, match="Embedding: (num_embeddings|embedding_dim) "
                                                   "must be a positive integer"):
        pc.nn.Embedding(*sizes, queue=queue)


@pytest.mark.parametrize("sizes", [(2.7, 8), (2, 8.0), (2.0, 8), (0, 8), (-2, 8), (True, 8)],
                         ids=repr)
def test_a_group_norm_size_that_is_not_a_positive_int_is_refused(queue, sizes):
    """``GroupNorm(2.7, 8)`` normalised over 2 groups (``int(2.7)``) and ``GroupNorm(2, 8.0)``
    built 8 channels, silently; PyTorch refuses both (8 is not divisible by 2.7; a float
    size in its weight's allocation). Refused at construction, naming the argument."""
    with pytest.raises(pc.errors.ShapeError, match="GroupNorm: (num_groups|num_channels) "
                                                   "must be a positive integer, got"):
        pc.nn.GroupNorm(*sizes, queue=queue)


def test_a_group_norm_whose_groups_do_not_divide_the_channels_is_still_refused(queue):
    with pytest.raises(pc.errors.ShapeError, match="num_channels=8 is not divisible by "
                                                   "num_groups=3"):
        pc.nn.GroupNorm(3, 8, queue=queue)


@pytest.mark.parametrize("kwargs", [{"kdim": 4.5}, {"vdim": 6.0}, {"kdim": 0}, {"vdim": True}],
                         ids=repr)
def test_attention_kdim_or_vdim_that_is_not_a_positive_int_is_refused(queue, kwargs):
    """``MultiheadAttention(8, 2, kdim=4.5)`` built a key projection of 4 input features
    (``int(4.5)``), silently; PyTorch refuses the float in its weight's allocation. Refused,
    naming the argument, as embed_dim and num_heads are."""
    name, value = next(iter(kwargs.items()))
    with pytest.raises(pc.errors.ShapeError, match=f"MultiheadAttention: {name} must be a "
                                                   f"positive integer, got {value!r}"):
        pc.nn.MultiheadAttention(8, 2, queue=queue, **kwargs)


@pytest.mark.parametrize("sizes", [(8.0, 2), (8, 2.0), (0, 2), (8, True)], ids=repr)
def test_attention_embed_dim_or_num_heads_that_is_not_a_positive_int_is_refused(queue, sizes):
    with pytest.raises(pc.errors.ShapeError, match="MultiheadAttention: (embed_dim|num_heads) "
                                                   "must be a positive integer"):
        pc.nn.MultiheadAttention(*sizes, queue=queue)


@pytest.mark.parametrize("stack", ["Encoder", "Decoder"])
@pytest.mark.parametrize("num_layers", [2.7, 2.0, -1], ids=repr)
def test_a_transformer_stacks_num_layers_that_is_not_an_int_is_refused(queue, stack,
                                                                       num_layers):
    """``TransformerEncoder(layer, 2.7)`` stacked 2 layers (``range(int(2.7))``), silently;
    PyTorch's ``range(2.7)`` raises TypeError. A negative count (torch: an empty stack) is
    refused too; zero layers stays allowed."""
    layer = getattr(pc.nn, f"Transformer{stack}Layer")(8, 2, 16, queue=queue)
    with pytest.raises(pc.errors.ShapeError, match=f"Transformer{stack}: num_layers must be a "
                                                   f"non-negative integer, got {num_layers!r}"):
        getattr(pc.nn, f"Transformer{stack}")(layer, num_layers)
    assert len(getattr(pc.nn, f"Transformer{stack}")(layer, 0).layers) == 0


def test_a_transformers_layer_counts_and_sizes_that_are_not_ints_are_refused(queue):
    """``Transformer(num_encoder_layers=1.5)`` built one encoder layer; ``d_model=8.5`` with a
    custom encoder and decoder became 8 (no layer of parcl's checked it)."""
    with pytest.raises(pc.errors.ShapeError, match="num_layers must be a non-negative integer, "
                                                   "got 1.5"):
        pc.nn.Transformer(8, 2, num_encoder_layers=1.5, num_decoder_layers=1,
                          dim_feedforward=16, queue=queue)
    identity = pc.nn.Identity()
    with pytest.raises(pc.errors.ShapeError, match="Transformer: d_model must be a positive "
                                                   "integer, got 8.5"):
        pc.nn.Transformer(8.5, 2, custom_encoder=identity, custom_decoder=identity,
                          queue=queue)


@pytest.mark.parametrize("layer", ["Softmax", "GLU", "CosineSimilarity"])
@pytest.mark.parametrize("dim", [1.5, 0.9, True], ids=repr)
def test_a_dim_that_is_not_an_int_is_refused_not_truncated(queue, layer, dim):
    """``Softmax(1.5)`` normalised along dim 1 (``int(1.5)``) and ``GLU(0.9)`` halved dim 0,
    silently; PyTorch's ops refuse a float dim (TypeError). Refused at construction, naming
    the layer and the value."""
    with pytest.raises(pc.errors.ShapeError, match=f"{layer}: dim must be an int, got "
                                                   f"{dim!r}"):
        getattr(pc.nn, layer)(dim)


def test_a_numpy_integer_dim_still_works(queue, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    with tp.no_grad():
        got = pc.nn.Softmax(np.int64(0))(pc.Tensor.from_host(queue, x)).to_host()
    np.testing.assert_allclose(got, np.exp(x) / np.exp(x).sum(0), rtol=1e-5)


@pytest.mark.parametrize("name", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
def test_a_gpt_size_that_is_not_a_positive_int_is_refused(queue, name):
    """``GPT(vocab_size=16.5, ...)`` built a 16-token vocabulary (``int()`` before the
    embedding could check it), so token 16 was "out of range"; ``n_layer=1.9`` built one
    block. nanoGPT's torch layers refuse the float. Refused, naming the argument."""
    sizes = {"vocab_size": 16, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 8}
    sizes[name] += 0.5 if name != "n_layer" else -0.1
    with pytest.raises(pc.errors.ShapeError, match=f"GPT: {name} must be a positive integer, "
                                                   f"got {sizes[name]!r}"):
        pc.nn.GPT(**sizes, queue=queue)


def test_causal_self_attention_refuses_a_float_head_count(queue):
    with pytest.raises(pc.errors.ShapeError, match="CausalSelfAttention: n_head must be a "
                                                   "positive integer, got 2.0"):
        pc.nn.CausalSelfAttention(8, 2.0, queue=queue)


def test_max_pool2d_takes_pytorchs_positional_arguments(queue, rng):
    """PyTorch's fifth argument of ``MaxPool2d`` is ``return_indices``, its sixth
    ``ceil_mode``; parcl's fifth was ``ceil_mode``, so ``MaxPool2d(2, 2, 0, 1, True)``
    (PyTorch: also return the indices) pooled with ceil_mode, silently, and PyTorch's
    ``MaxPool2d(3, 2, 1, 1, False, True)`` was a TypeError. Now the places match: a fifth
    True returns PyTorch's indices too, a sixth ceil_mode gives PyTorch's output."""
    import torch        # the test extra installs it: PyTorch's layer is the reference

    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    with tp.no_grad():
        got, where = pc.nn.MaxPool2d(2, 2, 0, 1, True)(pc.Tensor.from_host(queue, x))
    want, want_where = torch.nn.MaxPool2d(2, 2, 0, 1, True)(torch.tensor(x))
    np.testing.assert_array_equal(got.to_host(), want.numpy())
    np.testing.assert_array_equal(where.to_host(), want_where.numpy())
    with tp.no_grad():
        got = pc.nn.MaxPool2d(3, 2, 1, 1, False, True)(pc.Tensor.from_host(queue, x)).to_host()
    want = torch.nn.MaxPool2d(3, 2, 1, 1, False, True)(torch.tensor(x)).numpy()
    assert got.shape == want.shape == (2, 3, 5, 5)        # ceil_mode: 5, not 4
    np.testing.assert_array_equal(got, want)


def test_conv_transpose2d_takes_pytorchs_positional_arguments(queue):
    """PyTorch's seventh argument of ``ConvTranspose2d`` is ``groups``, its eighth ``bias``;
    parcl's seventh was ``bias``, so ``ConvTranspose2d(4, 2, 3, 1, 0, 0, 2)`` (PyTorch: two
    groups) built an ordinary one-group layer with a bias, silently. Now groups sits seventh
    (and dilation ninth), as PyTorch's; ``bias`` eighth keeps its meaning."""
    grouped = pc.nn.ConvTranspose2d(4, 2, 3, 1, 0, 0, 2, queue=queue)
    assert grouped.groups == 2 and grouped.weight.shape == (4, 1, 3, 3)
    with pytest.raises(pc.errors.ShapeError, match="groups must be a positive integer, got "
                                                   "1.5"):
        pc.nn.ConvTranspose2d(4, 2, 3, groups=1.5, queue=queue)
    assert pc.nn.ConvTranspose2d(4, 2, 3, 1, 0, 0, 1, True, 2, queue=queue).dilation == (2, 2)
    with pytest.raises(pc.errors.ShapeError, match="padding_mode='reflect'"):
        pc.nn.ConvTranspose2d(4, 2, 3, padding_mode="reflect", queue=queue)
    assert pc.nn.ConvTranspose2d(4, 2, 3, 1, 0, 0, 1, False, queue=queue).bias is None


@pytest.mark.parametrize("index", [1.5, 0.9, "1"], ids=repr)
def test_a_module_list_index_that_is_not_an_int_is_refused(index):
    """``ModuleList.__getitem__`` and ``__setitem__`` converted the index with ``int()``, so
    ``layers[1.5]`` returned (and ``layers[0.9] = m`` replaced) another layer than the one a
    caller could mean, and ``layers["1"]`` worked; PyTorch, like a Python list, raises
    TypeError."""
    layers = pc.nn.ModuleList([pc.nn.ReLU(), pc.nn.Tanh()])
    with pytest.raises(TypeError, match=f"ModuleList: index must be an int or a slice, got "
                                        f"{index!r}"):
        layers[index]
    with pytest.raises(TypeError, match="ModuleList: index must be an int"):
        layers[index] = pc.nn.Sigmoid()
    assert [type(m).__name__ for m in layers] == ["ReLU", "Tanh"]
    assert type(layers[np.int64(-1)]).__name__ == "Tanh"


def test_gpt_generate_refuses_float_token_ids_and_a_float_count(queue):
    """``GPT.generate`` cast its prompt with ``np.array(idx, dtype=np.int64)``, so token ids
    ``[[1.7, 2.2]]`` became ``[[1, 2]]``, and ran ``range(int(max_new_tokens))``, so 2.7 new
    tokens were 2, silently; nanoGPT's embedding refuses float ids and its ``range`` a float
    count (the model's own forward already refused float ids)."""
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8,
                      queue=queue).eval()
    with pytest.raises(pc.DTypeError, match="GPT.generate: token ids must be integers, got "
                                            "dtype float64"):
        model.generate([[1.7, 2.2]], 2, greedy=True)
    for count in (2.7, 2.0, -1, True):
        with pytest.raises(pc.ShapeError, match=f"GPT.generate: max_new_tokens must be a "
                                                f"non-negative int, got {count!r}"):
            model.generate(np.array([[1, 2]]), count, greedy=True)
    out = model.generate([[1, 2]], np.int64(3), greedy=True)     # a list of ints still works
    assert out.shape == (1, 5) and out.dtype == np.int64


def test_assigning_a_non_module_over_a_submodule_is_refused(queue):
    """``model.fc = 5`` (or a Tensor, a function) replaced the submodule ``fc`` and dropped
    it from ``parameters()`` and ``state_dict()`` silently, so an optimizer built afterwards
    never trained it and a checkpoint lost it; PyTorch raises TypeError. ``None`` still
    empties the slot (kept in its place), and after ``del`` the name is a plain attribute
    again."""
    model = pc.nn.Sequential(pc.nn.Linear(2, 2, queue=queue), pc.nn.ReLU())
    for value in (5, pc.Tensor.zeros(queue, (2, 2)), tp.relu):
        with pytest.raises(TypeError, match="Sequential.0 is a submodule: assign a "
                                            "pc.nn.Module or None"):
            setattr(model, "0", value)
    assert list(model.state_dict()) == ["0.weight", "0.bias"]
    assert type(model[0]).__name__ == "Linear"
    delattr(model, "1")
    setattr(model, "1", tp.relu)                    # a plain attribute now, as in PyTorch
    setattr(model, "0", None)                       # an empty slot, as PyTorch's
    assert model.parameters() == [] and len(model) == 1 and model[0] is None


def test_a_layer_registered_twice_is_one_child_and_apply_visits_it_once(queue):
    """``Sequential(layer, layer)`` (one layer run twice) listed the layer twice in
    ``children()`` and ``named_children()``, so ``apply(fn)`` called ``fn`` on it twice: an
    initialiser that scales the weights scaled them by 4 instead of 2, silently. PyTorch's
    ``named_children`` yields each child once, under its first name, and ``apply`` and
    ``train`` go through it."""
    layer = pc.nn.Linear(3, 3, queue=queue)
    before = layer.weight.value.to_host()
    model = pc.nn.Sequential(layer, layer)

    def double(m):
        if isinstance(m, pc.nn.Linear):
            m.weight.value.copy_(pc.Tensor.from_host(queue, 2 * m.weight.value.to_host()))

    assert model.apply(double) is model
    np.testing.assert_array_equal(layer.weight.value.to_host(), 2 * before)
    assert model.children() == [layer]
    assert [name for name, _ in model.named_children()] == ["0"]
    assert len(model) == 2                      # still run twice by the forward
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_a_module_list_insert_that_is_refused_leaves_the_list_as_it_was():
    """``ModuleList.insert(0, 5)`` took every module out, then raised on re-adding the 5:
    the TypeError left an empty ModuleList, so a caller that caught it went on with a model
    whose layers (and parameters) were gone. The module is checked first now."""
    layers = pc.nn.ModuleList([pc.nn.Linear(2, 2), pc.nn.Tanh()])
    with pytest.raises(TypeError, match="ModuleList.insert: expected an nn.Module, got int"):
        layers.insert(0, 5)
    assert [type(m).__name__ for m in layers] == ["Linear", "Tanh"]
    assert [k for k, _ in layers.named_parameters()] == ["0.weight", "0.bias"]


def test_a_parameter_slot_set_to_none_keeps_its_place_and_takes_only_a_parameter(queue):
    """``Linear(bias=False)`` forgot its bias slot, so ``lin.bias = t`` (a Tensor) made a plain
    attribute the forward added as a bias while ``parameters()``, the optimizer and
    checkpoints never saw it; PyTorch keeps the slot (None) and raises. And ``lin.weight =
    None`` then back put ``weight`` after ``bias`` in ``state_dict`` (optimizer states and
    checkpoints are matched by that order); PyTorch keeps its place."""
    import torch
    lin = pc.nn.Linear(3, 2, bias=False, queue=queue)
    with pytest.raises(TypeError, match=r"Linear.bias is a parameter: assign a "
                                        r"pc.nn.Parameter or None, not Tensor"):
        lin.bias = pc.Tensor.zeros(queue, (2,))
    with pytest.raises(TypeError):
        torch.nn.Linear(3, 2, bias=False).bias = torch.zeros(2)
    assert list(lin.state_dict()) == ["weight"]
    lin.bias = pc.nn.Parameter(pc.Tensor.zeros(queue, (2,)))
    assert [k for k, _ in lin.named_parameters()] == ["weight", "bias"]
    full = pc.nn.Linear(3, 2, queue=queue)
    weight = full.weight
    full.weight = None
    assert list(full.state_dict()) == ["bias"]
    full.weight = weight
    assert list(full.state_dict()) == ["weight", "bias"]


# -- Hardshrink zeroed NaN ----------------------------------------------------------------------
def test_hardshrink_keeps_nan_and_its_gradient_as_pytorch(queue):
    """``tp.hardshrink`` (and ``pc.nn.Hardshrink``) kept ``x`` where ``|x| > lambd``, a test a
    NaN fails, so a NaN activation came out 0 with gradient 0, silently hiding a diverged
    layer: [nan, inf, -inf, 0.3, -2] gave [0, inf, -inf, 0, -2] where PyTorch's zeros only
    ``|x| <= lambd`` and gives [nan, inf, -inf, 0, -2]. The gradient at a NaN is 1, as
    PyTorch's scalar loop and parcl's softshrink (PyTorch's vectorised loop gives 0 there)."""
    import torch

    a = np.array([np.nan, np.inf, -np.inf, 0.3, -2.0, 0.5, -0.5], np.float32)
    xt = torch.from_numpy(a.copy()).requires_grad_()
    want = torch.nn.functional.hardshrink(xt, 0.5)
    want.sum().backward()
    x = tp.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        y = pc.nn.Hardshrink(0.5)(x)
    tape.backward(tp.sum(y))
    np.testing.assert_array_equal(y.to_host(), [np.nan, np.inf, -np.inf, 0, -2, 0, 0])
    np.testing.assert_array_equal(y.to_host(), want.detach().numpy())
    np.testing.assert_array_equal(x.grad.to_host(), [1, 1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(x.grad.to_host(), xt.grad.numpy())


# -- an infinite positive activation made PReLU's slope gradient NaN --------------------------
def test_an_infinite_positive_activation_leaves_prelus_slope_gradient_as_pytorch(queue):
    """``tp.prelu`` formed ``weight * x`` over every element, so an activation that overflowed
    to +inf (``x > 0``: the slope is not used there) added ``inf * 0 = NaN`` into the slope's
    gradient: ``tanh(PReLU(10 * x))`` with x [[[3e38, -1, 2]], [[-2, 0.5, -0.3]]] had a finite
    loss 0.378 but ``weight.grad`` [nan] where PyTorch's is [-2.0593], and the next optimizer
    step wrote NaN into the slope, silently."""
    import torch

    a = np.array([[[3e38, -1.0, 2.0]], [[-2.0, 0.5, -0.3]]], np.float32)
    layer, theirs = pc.nn.PReLU(), torch.nn.PReLU()
    x = tp.tensor(a, requires_grad=True)
    with tp.Tape() as tape:
        loss = tp.sum(tp.tanh(layer(tp.mul(x, 10.0))))
    tape.backward(loss)
    xt = torch.tensor(a, requires_grad=True)
    want = torch.tanh(theirs(xt * 10.0)).sum()
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)
    np.testing.assert_allclose(layer.weight.grad.to_host(), [-2.059311], rtol=1e-5)
    np.testing.assert_allclose(layer.weight.grad.to_host(), theirs.weight.grad.numpy(),
                               rtol=1e-5)
    np.testing.assert_allclose(x.grad.to_host(), xt.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kwargs", [{}, {"top_k": 3, "temperature": 0.8}])
def test_gpt_generate_refuses_to_sample_from_nan_logits_as_pytorch(queue, kwargs):
    """A diverged model's logits are NaN, and so were the probabilities ``GPT.generate``
    sampled from by inverse CDF, which read them as token 0: the prompt ``[[1, 2]]`` went on
    ``[[1, 2, 0, 0, 0, 0]]`` with no error, where nanoGPT's ``torch.multinomial`` raises
    'probability tensor contains either inf, nan or element < 0'."""
    pc.nn.manual_seed(0)
    model = pc.nn.GPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=8,
                      queue=queue).eval()
    state = model.state_dict()
    state["transformer.ln_f.bias"] = np.full(8, np.nan, np.float32)
    model.load_state_dict(state)
    with pytest.raises(pc.ParclError, match=r"GPT.generate: the next-token logits of row 0 "
                                            r"\(of \(1, 16\)\) hold NaN or inf"):
        model.generate([[1, 2]], 4, seed=0, **kwargs)
    # greedy decoding keeps torch.argmax's answer, the first NaN
    np.testing.assert_array_equal(model.generate([[1, 2]], 2, greedy=True), [[1, 2, 0, 0]])
# -- get_extra_state: PyTorch's '_extra_state' entry was left out -----------------------------
def test_a_module_with_extra_state_is_refused_in_state_dicts_not_dropped(queue):
    """A module defining PyTorch's ``get_extra_state``/``set_extra_state`` has its state in
    PyTorch's state dict (``'_extra_state'``) and back through ``load_state_dict``; parcl's
    state dicts left it out, so a checkpoint round trip kept ``scale`` 1.0 where PyTorch's
    restores 3.0. Both are a ``StateDictError`` naming the module now."""
    import torch

    def model(lib):
        class Scaled(lib.Module):
            def __init__(self):
                super().__init__()
                self.fc, self.scale = lib.Linear(2, 2), 1.0

            def get_extra_state(self):
                return {"scale": self.scale}

            def set_extra_state(self, state):
                self.scale = state["scale"]

        return lib.Sequential(lib.ReLU(), Scaled())

    saved, fresh = model(torch.nn), model(torch.nn)
    saved[1].scale = 3.0
    assert list(saved.state_dict()) == ["1._extra_state", "1.fc.weight", "1.fc.bias"]
    fresh.load_state_dict(saved.state_dict())
    assert fresh[1].scale == 3.0
    net = model(pc.nn)
    with pytest.raises(pc.nn.StateDictError, match="its module '1' .Scaled. defines "
                                                   "get_extra_state"):
        net.state_dict()
    before = net[1].fc.bias.to_host().copy()
    with pytest.raises(pc.nn.StateDictError, match="'_extra_state'"):
        net.load_state_dict({"1.fc.weight": np.zeros((2, 2)), "1.fc.bias": np.zeros(2)})
    np.testing.assert_array_equal(net[1].fc.bias.to_host(), before)     # nothing loaded
