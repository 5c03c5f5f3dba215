"""Why a head attends where it does: its attention scores split exactly over the residual stream's sources.

The residual stream entering block ``l`` of a pre-norm transformer is a sum of **sources**:

* ``embed``: block 0's input (the token embedding, Gemma's √d scale and learned positions included);
* ``LjHm``: head ``m`` of attention layer ``j < l``, its output through its slice of ``W_O`` (and, in
  Gemma 2/3 and OLMo 2, through the post-attention norm with its statistic frozen);
* ``mlpj``: everything block ``j < l`` adds besides its attention (its MLP): block ``j+1``'s input
  minus block ``j``'s input minus its attention write, so the sources sum to the stream exactly;
* ``bias``: the attention output biases of the blocks below, the pre-attention norm's bias, and the
  query/key projections' biases.

With each token's normalisation statistic frozen at its actual value (the pre-attention norm, and the
per-head q/k norms of Gemma 3, OLMo 2 and Qwen 3), the map from a source to its part of a query or a
key is linear; RoPE is linear at each position. In a post-norm block (BERT and kin) the stream is
renormalised after each sublayer; each such norm, its statistic frozen, is linear too, so every
source below it is carried through it (:meth:`Decomposer._post_block`) and the sum still holds. So the pre-softmax score of a head is exactly a sum
over (query source, key source) pairs: ``s(q, k) = Σ_a Σ_b q_a(q) · k_b(k) · scaling``.

The query/key projections are applied here as matrices (``q_proj``/``k_proj`` weights), and what
follows them (the reshape into heads, the q/k norms, RoPE, the scaling) is the attention module's own
code: a float64 copy of the module runs on the projected parts, its q/k norms replaced by their
frozen-statistic linear maps and its attention function by one that only takes the queries and keys.
Whatever a family does after the projections, its own code does it; where the parts do not add up
to the model's own scores (ALiBi, soft-capping, attention sinks, differential attention) the check
in :meth:`Decomposer.layer` fails and nothing is reported.

Nothing is projected source by source (:meth:`Decomposer.prepare` and :meth:`Decomposer.flush`): a
source's part of a head's margin is linear in its write, ``Σ_t x_b(t) · r(t)``, where ``r`` is the
head's cotangent pulled back (autograd, float64) through that module code, the projection and the
frozen input norm; the writes are rebuilt a block at a time from the recorded heads' outputs and one
pass over them serves several layers. :meth:`Decomposer.decompose`, which projects every source,
is the oracle the tests hold it to.

:class:`SourceWrites` is the read of a pass that records what the decomposition needs (blocks'
inputs, attention inputs and call arguments, heads' outputs), and :class:`KeyOnly` in
:mod:`headscope.capture.edits` removes a source from one layer's key input, the causal check.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headscope.errors import RunFailure, Unsupported
from headscope.models import anatomy, projections

from .batch import Batch
from .dla import FrozenNorm, attention_layers, post_norms, residual_parts
from .hooks import hooked

PROBE_IMPLEMENTATION = "headscope_qk_probe"
# What qk may record for one window (a pre-norm model's blocks' inputs, heads' outputs and attention
# inputs; a post-norm model's every source's write): past this, it refuses before any pass.
MAX_SOURCE_BYTES = 3 << 30
CHUNK_ELEMENTS = 1 << 24  # sources x tokens x d_model per projection chunk (128 MB in float64)
# The pull-back's working set: the heads whose r is held at once, and the heads of one backward.
PULLBACK_BYTES = 128 << 20
# One block's rebuilt writes held at once (float64); a wider block is rebuilt a few heads at a time.
BLOCK_BYTES = 256 << 20


@dataclass(frozen=True)
class Source:
    """One component that writes into the residual stream."""

    name: str  # "embed", "L3H2", "mlp3", "bias"
    kind: str  # "embed", "head", "mlp", "bias"
    layer: int | None = None
    head: int | None = None


def source_names(loaded: Any, layer: int) -> list[Source]:
    """The sources of block ``layer``'s input, in order: embed, then per block below its heads and
    its MLP, then bias."""
    attention = set(attention_layers(loaded))
    found = [Source("embed", "embed")]
    for below in range(layer):
        if below in attention:
            found += [Source(f"L{below}H{h}", "head", below, h) for h in range(loaded.layout.n_heads)]
        found.append(Source(f"mlp{below}", "mlp", below))
    found.append(Source("bias", "bias"))
    return found


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def refusal(loaded: Any) -> str | None:
    """Why this model's scores are not a sum over sources, or None: what the layout shows before any
    forward pass (the numeric check catches the rest)."""
    config = anatomy.text_config(loaded.model.config)
    lower = sorted(
        {str(p.dtype).removeprefix("torch.") for p in loaded.model.parameters() if p.dtype in _LOW_PRECISION}
    )
    if lower:
        return (
            f"the model runs in {', '.join(lower)}: its attention weights carry about 3 significant "
            "digits, so no source's share can be told from rounding; load it in float32 (--dtype "
            "float32, or hs.load(..., dtype='float32'))"
        )
    if getattr(config, "attn_logit_softcapping", None):
        return "attention logits are soft-capped (tanh), so a score is not a sum over sources"
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", "") == "alibi":
        return "ALiBi adds a distance bias to every score that no residual source writes"
    if config.model_type in {"bloom", "mpt"}:
        return "ALiBi adds a distance bias to every score that no residual source writes"
    if loaded.layout.non_attention_layers:
        return "hybrid model: its recurrent or linear-attention layers are not decomposed"
    blocks = anatomy.blocks(loaded.model)
    for index in attention_layers(loaded):
        block = blocks[index]
        attention = projections.attention_module(block)
        if hasattr(attention, "lambda_q1"):
            return "differential attention: a head's map is the difference of two softmaxes"
        if getattr(attention, "sinks", None) is not None:
            return "learned attention sinks join every softmax as a key no source writes"
        try:
            post = post_block_norms(block)
            if post is not None and getattr(config, "chunk_size_feed_forward", 0):
                return (
                    "the feed-forward runs in chunks (chunk_size_feed_forward), so its norm runs once "
                    "per chunk; load the model with chunk_size_feed_forward=0"
                )
            qk_layout(attention, loaded.layout.n_heads)
        except Unsupported as exc:
            return str(exc)
    return None


@dataclass
class QKLayout:
    """Where an attention module's queries and keys come from: the projection module (``q_proj``
    and ``k_proj``, or one fused projection), and which of its output rows are the queries
    ``[H * d]`` and the keys ``[KV * d]``."""

    q_module: str
    k_module: str
    q_rows: torch.Tensor
    k_rows: torch.Tensor
    fused_width: int = 0  # the fused projection's output width (0: separate projections)
    others: tuple[str, ...] = ()  # projections whose output the probe replaces by zeros (v_proj)

    def weights(self, attention: nn.Module) -> tuple[torch.Tensor, Any, torch.Tensor, Any]:
        """``(W_Q [H*d, D], b_Q, W_K [KV*d, D], b_K)`` in float64."""
        out = []
        for name, rows in ((self.q_module, self.q_rows), (self.k_module, self.k_rows)):
            proj = attention.get_submodule(name)
            weight = projections._rows(proj).double()[rows]
            bias = projections._bias(proj)
            out += [weight, None if bias is None else bias.double()[rows]]
        return out[0], out[1], out[2], out[3]


def qk_layout(attention: nn.Module, n_heads: int) -> QKLayout:
    """The query and key rows of separate projections (Llama and kin) or of a fused one (GPT-2's
    ``c_attn``: q | k | v; GPT-BigCode's ``c_attn``: q | k | v with one KV head, or per head q, k,
    v; Phi-3's ``qkv_proj``: q | k | v with GQA; CodeGen's ``qkv_proj``: ``mp_num`` blocks of q, v,
    k slices; GPT-NeoX's and Persimmon's ``query_key_value``: per head q, k, v); any other layout
    is refused with its reason (Falcon's, whose attention does not go through the interface)."""
    name = type(attention).__name__
    separate = projections.separate_qkv(attention)
    if separate is not None:
        q_name, k_name, v_name = separate
        query, key = attention.get_submodule(q_name), attention.get_submodule(k_name)
        others = (v_name,) if projections._submodule(attention, v_name) is not None else ()
        rows = [projections._rows(p).shape[0] for p in (query, key)]  # an adapter layer's too
        return QKLayout(q_name, k_name, torch.arange(rows[0]), torch.arange(rows[1]), 0, others)
    width = projections._rows(projections.output_module(attention)).shape[1]
    d = width // n_heads
    # Per head [q, k, v] (GPT-NeoX, Persimmon, GPT-BigCode without multi-query): rows.
    per_head = 3 * d * torch.arange(n_heads)[:, None] + torch.arange(d)[None, :]
    fused = getattr(attention, "c_attn", None)
    if projections._is_projection(fused) and getattr(attention, "is_cross_attention", False):
        raise Unsupported(f"{name}: cross-attention reads its keys from the encoder")
    if projections._is_projection(fused) and not hasattr(attention, "multi_query"):  # GPT-2
        return QKLayout("c_attn", "c_attn", torch.arange(width), width + torch.arange(width), 3 * width)
    if projections._is_projection(fused) and name == "GPTBigCodeAttention":
        out = projections._rows(fused).shape[0]
        if attention.multi_query:  # q | k | v, one KV head
            return QKLayout("c_attn", "c_attn", torch.arange(width), width + torch.arange(d), out)
        return QKLayout("c_attn", "c_attn", per_head.flatten(), (per_head + d).flatten(), out)
    fused = getattr(attention, "qkv_proj", None)
    mp_num = getattr(attention, "mp_num", None)
    if projections._is_projection(fused) and mp_num is None:  # Phi-3
        out = projections._rows(fused).shape[0]
        kv = (out - width) // 2
        return QKLayout("qkv_proj", "qkv_proj", torch.arange(width), width + torch.arange(kv), out)
    if projections._is_projection(fused) and name == "CodeGenAttention":
        # mp_num blocks of [q, v, k], each a slice of every head's width: q and k concatenated over blocks
        local = width // mp_num
        block = 3 * local * torch.arange(mp_num)[:, None] + torch.arange(local)[None, :]
        return QKLayout("qkv_proj", "qkv_proj", block.flatten(), (block + 2 * local).flatten(), 3 * width)
    fused = getattr(attention, "query_key_value", None)
    known = {"GPTNeoXAttention", "PersimmonAttention"}
    if projections._is_projection(fused) and name in known:
        return QKLayout(
            "query_key_value", "query_key_value", per_head.flatten(), (per_head + d).flatten(), 3 * width
        )
    fused = getattr(attention, "Wqkv", None)
    if projections._is_projection(fused) and name == "ModernBertAttention":  # q | k | v
        return QKLayout("Wqkv", "Wqkv", torch.arange(width), width + torch.arange(width), 3 * width)
    if name == "FalconAttention":  # checked on transformers 5.24: SDPA or its own matmul, no interface
        raise Unsupported(
            f"{name} computes attention itself, not through transformers' attention interface, so "
            "its queries and keys cannot be taken from its own code"
        )
    raise Unsupported(
        f"{name}: qk reads queries and keys from q_proj and k_proj, or from the fused projection of "
        "GPT-2, GPT-BigCode, Phi-3, CodeGen, GPT-NeoX or Persimmon; this layout is not one of them"
    )


# --- the read: what one pass records ---------------------------------------------------------------


@dataclass
class Recording:
    """One batch row's recordings: ``x[j]`` block j's input ``[T, D]`` (float32), ``attn[l]`` the
    attention module's input ``[T, D]`` and its other call arguments, ``heads[j]`` the output
    projection's input ``[T, H * dv]``."""

    x: dict[int, torch.Tensor]
    attn: dict[int, tuple[torch.Tensor, dict[str, Any]]]
    heads: dict[int, torch.Tensor]
    # Post-norm blocks (BERT and kin): the inputs ``[T, D]`` of block j's two norms, the one after
    # the attention's residual add and the one after the MLP's.
    norm_in: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def post_block_norms(block: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """A post-norm block's two norms in the order it runs them (BERT: the attention output's
    LayerNorm after its residual add, then the MLP output's); None for a block with a norm before
    its attention. A block with neither is refused: its residual stream is not read here."""
    if projections.input_norm(block) is not None or anatomy.post_attention_norm(block) is not None:
        return None
    if any(isinstance(getattr(block, name, None), nn.Identity) for name in projections.PRE_NORM_NAMES):
        return None  # a pre-norm block whose norm is the identity (ModernBERT's first)
    found = [module for module in block.modules() if _is_norm(module)]
    if len(found) != 2:
        raise Unsupported(
            f"{type(block).__name__} has no norm before its attention and {len(found)} norms in all; "
            "qk reads pre-norm blocks and post-norm blocks with two norms (after the attention, "
            "after the MLP)"
        )
    return found[0], found[1]


def _row(value: Any, row: int, batch: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch:
        return value[row : row + 1]
    if isinstance(value, tuple):
        return tuple(_row(v, row, batch) for v in value)
    return value


class SourceWrites:
    """A read of a pass: what :class:`Decomposer` needs for the blocks up to ``last`` and the
    attention layers ``layers``: each block's input, each of ``layers``' attention module input
    and call arguments (RoPE's cos/sin), and each attention layer's heads' outputs (the output
    projection's input). After each batch (``finish``), ``recorded[b]`` is row b's :class:`Recording`.
    """

    def __init__(self, loaded: Any, layers: Sequence[int]) -> None:
        self.layers = sorted(set(layers))
        self.last = max(self.layers)
        self.blocks = anatomy.blocks(loaded.model)
        self.attention = {
            index: projections.attention_module(self.blocks[index]) for index in attention_layers(loaded)
        }
        self.outputs = {
            index: projections.output_module(module)
            for index, module in self.attention.items()
            if index < self.last
        }
        self.post_blocks = {
            index: pair
            for index in range(self.last)
            if (pair := post_block_norms(self.blocks[index])) is not None
        }
        self.recorded: list[Recording] = []
        self._x: dict[int, torch.Tensor] = {}
        self._attn: dict[int, tuple[torch.Tensor, dict[str, Any]]] = {}
        self._heads: dict[int, torch.Tensor] = {}
        self._norm_in: dict[tuple[int, int], torch.Tensor] = {}

    def begin(self, batch: Batch) -> None:
        self._x, self._attn, self._heads, self.recorded = {}, {}, {}, []
        self._norm_in = {}

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        def block_hook(index: int) -> Callable[..., None]:
            def hook(_module: Any, args: tuple, kwargs: dict) -> None:
                hidden = args[0] if args else kwargs["hidden_states"]
                self._x[index] = hidden.detach().float().clone()

            return hook

        def attention_hook(index: int) -> Callable[..., None]:
            def hook(_module: Any, args: tuple, kwargs: dict) -> None:
                hidden = args[0] if args else kwargs["hidden_states"]
                named = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                self._attn[index] = (hidden.detach().clone(), named)

            return hook

        def heads_hook(index: int) -> Callable[..., None]:
            def hook(_module: Any, args: tuple) -> None:
                self._heads[index] = args[0].detach().float().clone()

            return hook

        def norm_hook(index: int, which: int) -> Callable[..., None]:
            def hook(_module: Any, args: tuple) -> None:
                self._norm_in[(index, which)] = args[0].detach().float().clone()

            return hook

        with hooked() as hooks:
            for index in range(self.last + 1):
                hooks.before(self.blocks[index], block_hook(index), with_kwargs=True)
            for index in self.layers:
                hooks.before(self.attention[index], attention_hook(index), with_kwargs=True)
            for index, module in self.outputs.items():
                hooks.before(module, heads_hook(index))
            for index, pair in self.post_blocks.items():
                for which, norm in enumerate(pair):
                    hooks.before(norm, norm_hook(index, which))
            yield

    def current(self, row: int) -> Recording:
        """Batch row ``row``'s recordings so far: during a pass (an ``on_layer_done`` of layer l),
        everything the decomposition of layer l needs is already there."""
        rows = next(iter(self._x.values())).shape[0]
        return Recording(
            {i: x[row] for i, x in self._x.items()},
            {
                i: (h[row], {k: _row(v, row, rows) for k, v in kw.items()})
                for i, (h, kw) in self._attn.items()
            },
            {i: h[row] for i, h in self._heads.items()},
            {
                i: (self._norm_in[(i, 0)][row], self._norm_in[(i, 1)][row])
                for i in self.post_blocks
                if (i, 0) in self._norm_in and (i, 1) in self._norm_in
            },
        )

    def finish(self) -> None:
        missing = [i for i in range(self.last + 1) if i not in self._x]
        missing += [i for i in self.layers if i not in self._attn]
        missing += [i for i in self.post_blocks if (i, 0) not in self._norm_in or (i, 1) not in self._norm_in]
        if missing:
            raise RunFailure(f"qk: blocks {sorted(set(missing))} were not seen in the forward pass")
        rows = self._x[0].shape[0]
        self.recorded = [self.current(b) for b in range(rows)]
        self._x, self._attn, self._heads, self._norm_in = {}, {}, {}, {}


# --- the attention module's own code after the projections ----------------------------------------


class _Probed(Exception):
    """Raised by the probe attention function once it has the queries and keys."""


@dataclass
class _Taken:
    query: torch.Tensor | None = None
    key: torch.Tensor | None = None
    scaling: float | None = None
    extra: list[str] = field(default_factory=list)


_TAKEN: ContextVar[_Taken | None] = ContextVar("headscope_qk_taken", default=None)
_registered = False


def probe_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> Any:
    """An attention function that keeps the queries and keys it is given and stops the module."""
    taken = _TAKEN.get()
    if taken is None:
        raise RunFailure("the qk probe attention ran outside a probe")
    taken.query, taken.key = query, key
    taken.scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    if softcap:
        taken.extra.append("soft-capped logits")
    if kwargs.get("s_aux") is not None:
        taken.extra.append("attention sinks")
    raise _Probed


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(PROBE_IMPLEMENTATION, probe_attention)
    _registered = True


class _Slice(nn.Module):
    """Stands in for a separate projection: its output is the query or key slice of the (already
    projected) input, at the widths the probe sets for the call (0: that side is not wanted), or
    zeros (the values)."""

    def __init__(self, widths: list[int], side: str, zeros: int = 0) -> None:
        super().__init__()
        self.widths, self.side, self.zeros = widths, side, zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.side == "v":
            return x.new_zeros(*x.shape[:-1], self.zeros)
        q_width, k_width = self.widths
        return x[..., :q_width] if self.side == "q" else x[..., q_width : q_width + k_width]


class _Fused(nn.Module):
    """Stands in for a fused q/k/v projection: its output holds the (already projected) queries and
    keys at their rows, and zeros at the values'."""

    def __init__(self, layout: QKLayout) -> None:
        super().__init__()
        self.width = layout.fused_width
        self.q_rows, self.k_rows = layout.q_rows, layout.k_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(*x.shape[:-1], self.width)
        q_width = len(self.q_rows)
        out[..., self.q_rows] = x[..., :q_width]
        out[..., self.k_rows] = x[..., q_width:]
        return out


class _FrozenModule(nn.Module):
    """Stands in for a q/k norm: records its input's statistic on the actual input, then applies the
    norm with that statistic frozen (a linear map plus the norm's bias). A norm the module calls more
    than once per forward (Llama 4's one ``qk_norm`` for queries and keys) keeps one statistic per
    call, in call order."""

    def __init__(self, norm: FrozenNorm) -> None:
        super().__init__()
        self.norm = norm
        self.scales: list[torch.Tensor] = []
        self.recording = True
        self.calls = 0
        self.rows: torch.Tensor | None = None  # a probe call over these positions only
        self.length = 0

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.recording:
            self.scales.append(self.norm.scale(y))
            return self.norm.apply(y)
        scale = self.scales[self.calls % len(self.scales)]
        self.calls += 1
        if y.numel() == 0:  # the side a probe call does not want
            return y
        if self.rows is not None:
            scale = _at_rows(scale, y, self.rows, self.length)
        return self.norm.linear(y, scale) + self.norm.bias.to(y.device)


class _NoFastPath(Exception):
    """A frozen statistic whose position axis cannot be told: the probe runs every position."""


def _at_rows(scale: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
    """The statistic ``scale`` (recorded over ``length`` positions) at ``rows``, for an input ``y`` that
    holds only those positions: the one axis where the statistic has ``length`` and ``y`` ``len(rows)``."""
    axes = [
        a
        for a in range(scale.dim())
        if scale.shape[a] == length and a < y.dim() - 1 and y.shape[a] == len(rows)
    ]
    if len(axes) != 1:
        raise _NoFastPath
    return scale.index_select(axes[0], rows)


def _positions_at(value: Any, rows: torch.Tensor, length: int) -> Any:
    """A call argument cut to ``rows`` where it runs over the positions (RoPE's cos and sin
    ``[1, T, d]``, position ids ``[1, T]``, cache positions ``[T]``)."""
    if isinstance(value, tuple):
        return tuple(_positions_at(v, rows, length) for v in value)
    if isinstance(value, torch.Tensor):
        if value.dim() >= 2 and value.shape[1] == length:
            return value.index_select(1, rows.to(value.device))
        if value.dim() == 1 and value.shape[0] == length:
            return value.index_select(0, rows.to(value.device))
    return value


class Post:
    """What an attention module does after its query and key projections (reshape, q/k norms, RoPE),
    run by a float64 copy of the module on projected inputs ``[n, T, q_width + k_width]``."""

    def __init__(self, attention: nn.Module, layout: QKLayout) -> None:
        _register()
        inner, _, _ = layout.q_module.rpartition(".")
        if inner and inner == layout.k_module.rpartition(".")[0]:
            # The projections live in a submodule that does the attention (BERT's ``.self``; its
            # parent adds the output projection and the norm after the residual add): run that one.
            attention = attention.get_submodule(inner)
            layout = dataclasses.replace(
                layout,
                q_module=layout.q_module[len(inner) + 1 :],
                k_module=layout.k_module[len(inner) + 1 :],
                others=tuple(o[len(inner) + 1 :] for o in layout.others if o.startswith(inner + ".")),
            )
        if not hasattr(attention, "config"):
            raise Unsupported(
                f"qk: {type(attention).__name__} computes attention itself, without transformers' "
                "attention interface, so its queries and keys cannot be taken from its own code"
            )
        module = copy.deepcopy(attention).double()
        module._forward_hooks.clear()
        module._forward_pre_hooks.clear()
        config = copy.copy(module.config)
        config._attn_implementation = PROBE_IMPLEMENTATION
        module.config = config
        self.q_width, self.k_width = len(layout.q_rows), len(layout.k_rows)
        self.widths = [self.q_width, self.k_width]
        # Separate projections can be run on one side at a time, the queries at the rows read only
        # (checked against the whole call on the actual input in record); a fused one always whole.
        self.fast: bool = not layout.fused_width
        if layout.fused_width:
            _replace(module, layout.q_module, _Fused(layout))
        else:
            _replace(module, layout.q_module, _Slice(self.widths, "q"))
            _replace(module, layout.k_module, _Slice(self.widths, "k"))
            for other in layout.others:
                width = projections._rows(attention.get_submodule(other)).shape[0]
                _replace(module, other, _Slice(self.widths, "v", zeros=width))
        # Every norm inside the module (q/k norms, also per-head ModuleLists of them, as StableLM's)
        # is frozen at its statistic of the actual input.
        self.norms: list[_FrozenModule] = []
        for name, child in list(module.named_modules()):
            if not name or isinstance(child, _Slice | _Fused) or not _is_norm(child):
                continue
            parent_name, _, attribute = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            frozen = _FrozenModule(_frozen_norm(child, f"{name} of {type(attention).__name__}"))
            setattr(parent, attribute, frozen)
            self.norms.append(frozen)
        for parameter in module.parameters():
            parameter.requires_grad_(False)  # the pull-back differentiates the inputs only
        self.module = module
        self.kwargs: dict[str, Any] = {}

    def record(
        self, projected: torch.Tensor, kwargs: dict[str, Any], rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """The queries and keys of the actual projected input ``[1, T, w]``; freezes the q/k norms,
        and checks the one-side-at-a-time calls against the whole one (else they are not used)."""
        keep = {"position_embeddings", "position_ids", "cache_position"}
        self.kwargs = {
            k: _double(v) for k, v in kwargs.items() if k in keep or not isinstance(v, torch.Tensor | tuple)
        }
        self.kwargs.pop("past_key_values", None)
        self.kwargs.pop("cache", None)
        self.kwargs.pop("attention_mask", None)
        for norm in self.norms:
            norm.recording, norm.scales = True, []
        taken = self._run(projected)
        for norm in self.norms:
            norm.recording = False
            norm.scales = [_plain(scale) for scale in norm.scales]
        self.kwargs = _plain(self.kwargs)
        if taken.extra:
            raise Unsupported(f"qk: the attention function was given {' and '.join(taken.extra)}")
        assert taken.query is not None and taken.key is not None and taken.scaling is not None
        if self.fast:
            try:
                query, key = self._sides(projected, rows)
                scale = max(float(taken.query.abs().max()), float(taken.key.abs().max()), 1e-30)
                error = max(
                    float((query - taken.query[:, :, rows]).abs().max()),
                    float((key - taken.key).abs().max()),
                )
                self.fast = error <= 1e-9 * scale
            except (_NoFastPath, RuntimeError, IndexError):
                self.fast = False
        return taken.query, taken.key, float(taken.scaling)

    def __call__(self, projected: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries at ``rows`` ``[n, H, R, d]`` and keys ``[n, KV, T, d]`` of projected parts
        ``[n, T, w]`` (frozen norms; affine: subtract the call on zeros for a linear part)."""
        if self.fast:
            return self._sides(projected, rows)
        taken = self._run(projected)
        assert taken.query is not None and taken.key is not None
        return taken.query[:, :, rows], taken.key

    def _sides(self, projected: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys from a call with no queries, the queries from a call over ``rows`` with no keys."""
        key = self._keys(projected[..., self.q_width :])
        query = self._queries(projected[:, rows, : self.q_width], rows, projected.shape[1])
        return query, key

    def _keys(self, projected: torch.Tensor) -> torch.Tensor:
        try:
            self.widths[:] = [0, self.k_width]
            key = self._run(projected).key
        finally:
            self.widths[:] = [self.q_width, self.k_width]
        assert key is not None
        return key

    def _queries(self, projected: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
        kwargs = self.kwargs
        try:
            self.widths[:] = [self.q_width, 0]
            self.kwargs = {k: _positions_at(v, rows, length) for k, v in kwargs.items()}
            for norm in self.norms:
                norm.rows, norm.length = rows, length
            query = self._run(projected).query
        finally:
            self.kwargs = kwargs
            self.widths[:] = [self.q_width, self.k_width]
            for norm in self.norms:
                norm.rows = None
        assert query is not None
        return query

    def keys(self, projected: torch.Tensor) -> torch.Tensor:
        """Keys ``[n, KV, T, d]`` of projected keys alone ``[n, T, k_width]``."""
        if self.fast:
            return self._keys(projected)
        full = projected.new_zeros(*projected.shape[:-1], self.q_width + self.k_width)
        full[..., self.q_width :] = projected
        taken = self._run(full)
        assert taken.key is not None
        return taken.key

    def queries(self, projected: torch.Tensor, rows: torch.Tensor, length: int) -> torch.Tensor:
        """Queries ``[n, H, R, d]`` at ``rows`` of projected queries at those rows alone ``[n, R, q_width]``."""
        if self.fast:
            return self._queries(projected, rows, length)
        full = projected.new_zeros(projected.shape[0], length, self.q_width + self.k_width)
        full[:, rows, : self.q_width] = projected
        taken = self._run(full)
        assert taken.query is not None
        return taken.query[:, :, rows]

    def _run(self, projected: torch.Tensor) -> _Taken:
        for norm in self.norms:
            norm.calls = 0
        taken = _Taken()
        token = _TAKEN.set(taken)
        try:
            self.module(hidden_states=projected, attention_mask=None, **self.kwargs)
        except _Probed:
            pass
        finally:
            _TAKEN.reset(token)
        if taken.query is None:
            raise Unsupported("qk: the attention module never called its attention function")
        return taken


def _replace(module: nn.Module, path: str, new: nn.Module) -> None:
    """Set the submodule at ``path`` (``q_proj``, ``self.query``) to ``new``."""
    parent, _, attribute = path.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attribute, new)


def _is_norm(module: nn.Module) -> bool:
    """A norm with a gain (RMSNorm, LayerNorm), or a weightless one (Llama 4's L2 norm of q and k)."""
    if anatomy.is_norm(module):
        return True
    name = type(module).__name__.lower()
    return "norm" in name and not list(module.parameters()) and not list(module.children())


def _frozen_norm(module: nn.Module, what: str) -> FrozenNorm:
    if list(module.parameters(recurse=False)):
        return FrozenNorm.of(module, what)
    # No gain: read the epsilon and check the RMS reading on random input.
    eps = next(
        (float(getattr(module, n)) for n in ("variance_epsilon", "eps", "epsilon") if hasattr(module, n)),
        1e-6,
    )
    found = FrozenNorm(torch.ones(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), eps, False)
    probe = torch.randn(3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        actual = module(probe.float()).double()
    if not torch.allclose(actual, found.apply(probe), rtol=1e-3, atol=1e-3):
        raise Unsupported(f"qk: the {what} ({type(module).__name__}) is not an RMS norm")
    return found


def _plain(value: Any) -> Any:
    """``value`` with its tensors copied out of inference mode (a pass records under
    ``torch.inference_mode``; the pull-back saves them for its backward)."""
    if isinstance(value, torch.Tensor):
        if not value.is_inference():
            return value
        with torch.inference_mode(False):
            return value.clone()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _double(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_double(v) for v in value)
    return value


# --- the decomposition --------------------------------------------------------------------------------


@dataclass
class LayerParts:
    """One window's decomposition at one attention layer.

    ``query``/``key``: the actual queries at the read rows ``[H, R, d]`` and keys ``[KV, T, d]``
    (float64, from the module's own code); ``scaling``; ``sources``. ``q_parts(chunk)`` and
    ``k_parts(chunk)`` are yielded chunk by chunk by :meth:`Decomposer.parts`.
    """

    layer: int
    rows: torch.Tensor  # [R] the query positions read
    query: torch.Tensor  # [H, R, d]
    key: torch.Tensor  # [KV, T, d]
    scaling: float
    sources: list[Source]


@dataclass
class _TopPlan:
    """Which of a head's top sources the evaluation split reads one by one (the first
    ``individual`` of each side) and which it reads as groups (the ranks between the cuts above)."""

    key_individual: list[int]
    key_groups: list[list[int]]
    query_individual: list[int]
    query_groups: list[list[int]]
    individual: int
    bounds: list[tuple[int, int]]  # each group's ranks [a, b)

    @classmethod
    def of(cls, top: tuple[list[int], list[int]], cuts: Sequence[int], individual: int) -> _TopPlan:
        top_key, top_query = top
        edges = sorted({individual, *(c for c in cuts if c > individual)})
        bounds = list(zip(edges, edges[1:], strict=False))
        return cls(
            list(top_key[:individual]),
            [list(top_key[a:b]) for a, b in bounds],
            list(top_query[:individual]),
            [list(top_query[a:b]) for a, b in bounds],
            individual,
            bounds,
        )


@dataclass
class HeadTops:
    """One head's top sources in one window: each of the first few sources' key part ``[T, d]`` and
    query part at the rows ``[R, d]`` (the bias with its constants), and the moves of its keys and
    queries when its top sources leave their means, one by one and then by groups of ranks."""

    key: dict[int, torch.Tensor] = field(default_factory=dict)
    query: dict[int, torch.Tensor] = field(default_factory=dict)
    key_moves: list[torch.Tensor] = field(default_factory=list)
    query_moves: list[torch.Tensor] = field(default_factory=list)
    key_all: torch.Tensor | None = None  # the move when every source leaves its mean
    query_all: torch.Tensor | None = None
    plan: _TopPlan | None = None

    def moved(self, side: str, k: int) -> torch.Tensor | None:
        """The move of the head's keys (or queries) when its top ``k`` sources of that side leave
        their means (None for k = 0). ``k`` is ``individual`` or less, or a cut."""
        assert self.plan is not None
        moves = self.key_moves if side == "key" else self.query_moves
        count = len(self.plan.key_individual if side == "key" else self.plan.query_individual)
        if k <= 0 or not moves:
            return None
        total = sum(moves[: min(k, count)], torch.zeros_like(moves[0]))
        for slot, (_, b) in enumerate(self.plan.bounds):
            if b <= k:
                total = total + moves[count + slot]
        return total


@dataclass
class WindowParts:
    """:meth:`Decomposer.explain_window`'s answer for one window of one layer."""

    key: torch.Tensor  # [h, S] each source's part of each head's margin, keys side
    query: torch.Tensor  # [h, S] queries side
    margin: torch.Tensor  # [h]
    heads: list[HeadTops] = field(default_factory=list)  # the evaluation split's tops, per head
    value: torch.Tensor | None = None  # [h, S] each source's part of sum_q <o_b(q), o(q)> (values side)
    output: torch.Tensor | None = None  # [h] sum_q |o(q)|^2, what the value parts sum to


@dataclass
class Prepared:
    """One window of one layer, a chunk of its heads, pulled back and waiting for the pass over the
    blocks' writes (:meth:`Decomposer.flush`), which fills the rest."""

    decomposer: Decomposer
    parts: LayerParts
    chosen: torch.Tensor  # [h] the heads
    groups: torch.Tensor  # [h] their KV groups
    g_key: torch.Tensor  # [h, T, d] the key-side cotangents
    g_query: torch.Tensor  # [h, R, d]
    margin: torch.Tensor  # [h]
    x: torch.Tensor  # [T, D] the block's input (float64)
    scale: torch.Tensor | None  # [T] the input norm's statistic
    r_key: torch.Tensor  # [h, T * D] the pull-backs, flat
    r_query: torch.Tensor  # [h, R * D]
    plans: list[_TopPlan]
    # the value side (None: not asked): the pull-back [h, T * D], each head's c(k) [h, T, dv] (its
    # output pulled back through W_O and its attention) and sum_q |o(q)|^2 [h]
    r_value: torch.Tensor | None = None
    c_value: torch.Tensor | None = None
    output: torch.Tensor | None = None
    value_num: torch.Tensor | None = field(init=False, default=None)
    key_num: torch.Tensor = field(init=False)
    query_num: torch.Tensor = field(init=False)
    bias: torch.Tensor = field(init=False)
    full: dict[int, torch.Tensor] = field(default_factory=dict)  # kept key-side writes [T, D]
    at_rows: dict[int, torch.Tensor] = field(default_factory=dict)  # kept query-side writes [R, D]
    key_member: torch.Tensor = field(init=False)  # [groups, S] which sources each group sums
    query_member: torch.Tensor = field(init=False)
    key_acc: torch.Tensor = field(init=False)  # [groups, T, D] the groups' sums
    query_acc: torch.Tensor = field(init=False)  # [groups, R, D]

    @property
    def nbytes(self) -> int:
        """What it holds through the pass (float64): the pull-backs, and the evaluation's writes."""
        length, d_model = self.x.shape
        rows = len(self.parts.rows)
        held = self.r_key.numel() + self.r_query.numel()
        if self.r_value is not None:
            held += self.r_value.numel()
        if self.plans:
            groups = sum(len(plan.bounds) for plan in self.plans)
            singles = len({s for plan in self.plans for s in plan.key_individual})
            held += (groups + singles) * length * d_model + 2 * groups * rows * d_model
        return 8 * held

    def start(self) -> None:
        count = len(self.decomposer.sources)
        n = len(self.chosen)
        length, d_model = self.x.shape
        rows = len(self.parts.rows)
        self.key_num = torch.zeros(n, count, dtype=torch.float64)
        self.query_num = torch.zeros_like(self.key_num)
        self.value_num = None if self.r_value is None else torch.zeros_like(self.key_num)
        self.bias = torch.zeros_like(self.x)
        groups = sum(len(plan.bounds) for plan in self.plans)
        self.key_member = torch.zeros(groups, count, dtype=torch.float64)
        self.query_member = torch.zeros(groups, count, dtype=torch.float64)
        slot = 0
        for plan in self.plans:
            for a, b in zip(plan.key_groups, plan.query_groups, strict=True):
                self.key_member[slot, a] = 1.0
                self.query_member[slot, b] = 1.0
                slot += 1
        self.key_acc = torch.zeros(slot, length, d_model, dtype=torch.float64)
        self.query_acc = torch.zeros(slot, rows, d_model, dtype=torch.float64)
        self._keep_key = {s for plan in self.plans for s in plan.key_individual}
        self._keep_query = {s for plan in self.plans for s in plan.query_individual}

    def read(self, columns: list[int], write: torch.Tensor, flat: torch.Tensor, bias: torch.Tensor) -> None:
        """One block's writes ``[c, T, D]`` (``flat``: ``[c, T * D]``) and its bias part."""
        rows = self.parts.rows
        at_rows = write[:, rows]
        # the key side is read by the pass a few blocks at a time (Decomposer.flush), in one product
        self.query_num[:, columns] = self.r_query @ at_rows.reshape(len(columns), -1).T
        self.bias += bias
        if not self.plans:
            return
        for slot, source in enumerate(columns):
            # copies: a view would keep the whole block's writes alive through the pass
            if source in self._keep_key:
                self.full[source] = write[slot].clone()
            if source in self._keep_query:
                self.at_rows[source] = at_rows[slot].clone()
        # each group sums a few sources: added where they are members, not a product over the block
        slots, which = self.key_member[:, columns].nonzero(as_tuple=True)
        if len(slots):
            self.key_acc.view(len(self.key_member), -1).index_add_(0, slots, flat[which])
        slots, which = self.query_member[:, columns].nonzero(as_tuple=True)
        if len(slots):
            self.query_acc.view(len(self.query_member), -1).index_add_(
                0, slots, at_rows.reshape(len(columns), -1)[which]
            )


_Index = slice | torch.Tensor  # columns: a slice where they are contiguous (a view, not a copy)


def _contiguous(columns: torch.Tensor) -> _Index:
    if len(columns) and bool(
        (columns == torch.arange(int(columns[0]), int(columns[0]) + len(columns))).all()
    ):
        return slice(int(columns[0]), int(columns[0]) + len(columns))
    return columns


def _shifted(columns: _Index, by: int) -> _Index:
    if isinstance(columns, slice):
        return slice(columns.start + by, columns.stop + by)
    return columns + by


class _Items:
    """What one call of :meth:`Decomposer._head_linear` projects: each item once, by its key (a
    head or KV group first, then what it is)."""

    def __init__(self) -> None:
        self.index: dict[tuple, int] = {}
        self.tensors: list[torch.Tensor] = []

    def add(self, key: tuple, tensor: torch.Tensor) -> int:
        """The item's row (the tensor is stored only the first time its key is seen)."""
        if key not in self.index:
            self.index[key] = len(self.tensors)
            self.tensors.append(tensor)
        return self.index[key]

    def stacked(self) -> torch.Tensor:
        return torch.stack(self.tensors)

    def which(self) -> torch.Tensor:
        return torch.tensor([key[0] for key in self.index])


class Decomposer:
    """The decomposition of one layer's scores over its sources, for one recorded window."""

    def __init__(self, loaded: Any, layer: int, shared: dict[int, Any] | None = None) -> None:
        """``shared``: the output projections by layer, one copy for every decomposer of a run."""
        reason = refusal(loaded)
        if reason is not None:
            raise Unsupported(f"qk: {loaded.name}: {reason}")
        self.loaded = loaded
        self.layer = layer
        model = loaded.model
        blocks = anatomy.blocks(model)
        attention = projections.attention_module(blocks[layer])
        norm = projections.input_norm(blocks[layer])
        self.norm = FrozenNorm.of(norm, f"input norm of layer {layer}") if norm is not None else None
        layout = qk_layout(attention, loaded.layout.n_heads)
        self.w_q, self.b_q, self.w_k, self.b_k = layout.weights(attention)  # [H*d, D], [KV*d, D]
        self.post = Post(attention, layout)
        self.sources = source_names(loaded, layer)
        self.columns: tuple[list[_Index], list[_Index]] | None = None
        self._value: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None
        self._disjoint = {"query": False, "key": False}  # whether the heads' columns are disjoint
        layers = [j for j in attention_layers(loaded) if j < layer]
        shared = {} if shared is None else shared
        for j in layers:
            if j not in shared:
                attention_j = projections.attention_module(blocks[j])
                shared[j] = projections.output_projection(attention_j, loaded.layout.n_heads)
        self.w_o = {j: shared[j] for j in layers}
        self.post_norms = post_norms(loaded, layers)
        self.multiplier = anatomy.residual_multiplier(model.config)
        # Post-norm blocks below: both norms, read as LayerNorms with each token's statistic frozen.
        self.post_blocks = {
            j: (
                FrozenNorm.of(pair[0], f"norm after the attention of block {j}"),
                FrozenNorm.of(pair[1], f"norm after the MLP of block {j}"),
            )
            for j in range(layer)
            if (pair := post_block_norms(blocks[j])) is not None
        }
        # Pre-norm: a source's write is the same for every layer above it, so one pass over the
        # blocks' writes serves several layers (:meth:`flush`); post-norm renormalises it per layer.
        self.shares_writes = all(post_block_norms(block) is None for block in blocks)

    # the residual sources, as [T, D] float64 writes
    def writes(self, recording: Recording) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each source's write ``[T, D]`` (the sources but ``bias``) and the bias ``[T, D]``, float64;
        they sum to block ``layer``'s input exactly."""
        x = {j: recording.x[j].double() for j in range(self.layer + 1)}
        out = [x[0]]
        bias = torch.zeros_like(x[0])
        for j in range(self.layer):
            if j in self.post_blocks:
                out, bias = self._post_block(j, recording, out, bias)
                continue
            if j in self.w_o:
                each, b = self._heads_write(j, recording)
                each, b = residual_parts(each, b, self.post_norms.get(j), self.multiplier)
                out += list(each.unbind(1))
                bias = bias + b
                attention_write = each.sum(1) + b
            else:
                attention_write = torch.zeros_like(x[0])
            out.append(x[j + 1] - x[j] - attention_write)
        return out, bias

    def _heads_write(self, j: int, recording: Recording) -> tuple[torch.Tensor, torch.Tensor]:
        """Block j's heads' writes ``[T, H, D]`` through their slices of ``W_O``, and the output bias."""
        w_o, b_o = self.w_o[j]
        heads = recording.heads[j].double()
        heads = heads.reshape(heads.shape[0], w_o.shape[0], -1)  # [T, H, dv]
        each = torch.einsum("thd,hde->the", heads, w_o.double().to(heads.device))
        b = (
            b_o.detach().double().to(heads.device).expand(heads.shape[0], -1)
            if b_o is not None
            else torch.zeros(heads.shape[0], each.shape[-1], dtype=torch.float64, device=heads.device)
        )
        return each, b

    def _post_block(
        self, j: int, recording: Recording, out: list[torch.Tensor], bias: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A post-norm block (BERT and kin): ``y1 = x + attention``, ``h = norm1(y1)``, ``y2 = h +
        MLP(h)``, output ``norm2(y2)``. Each norm, its statistic frozen at the token's actual value,
        is linear in every source (the LayerNorm's centring and gain over the statistic; its bias
        joins ``bias``), so the sources stay a sum: the heads' writes join them before the first
        norm, the MLP's (``y2 - h``, what it adds) before the second. Both norms' inputs are the
        ones the model computed, and the sum is checked against the first's."""
        first, second = self.post_blocks[j]
        y1, y2 = (t.double() for t in recording.norm_in[j])
        if j in self.w_o:
            each, b = self._heads_write(j, recording)
            out = [*out, *each.unbind(1)]
            bias = bias + b
        else:
            out = [*out]
        total = bias + torch.stack(out).sum(0)
        error = float((total - y1).abs().max() / y1.abs().max().clamp(min=1e-30))
        if error > 1e-4:
            raise Unsupported(
                f"qk: block {j}'s first norm does not read its input plus its attention's output "
                f"(relative error {error:.1e}): not a post-norm block qk can read"
            )
        scale = first.scale(y1)
        out = [first.linear(w, scale) for w in out]
        bias = first.linear(bias, scale) + first.bias.to(bias.device)
        out.append(y2 - first.apply(y1))  # what the MLP adds
        scale = second.scale(y2)
        return [second.linear(w, scale) for w in out], second.linear(bias, scale) + second.bias.to(
            bias.device
        )

    def _normed(self, parts: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        if self.norm is None:
            return parts
        assert scale is not None
        return self.norm.linear(parts, scale)

    # --- the actual queries and keys, and each source's part by pull-back ---------------------------

    def actual(self, recording: Recording, rows: torch.Tensor) -> LayerParts:
        """The actual queries at ``rows`` and keys of one recorded window, from the module's own
        code on the recorded attention input (this also freezes the q/k norms' statistics for the
        window: call it first)."""
        actual_in, kwargs = recording.attn[self.layer]
        query, key, scaling = self.post.record(
            self._project(actual_in.double()[None], None)[0:1], kwargs, rows
        )
        parts = LayerParts(self.layer, rows, query[0][:, rows], key[0], scaling, self.sources)
        self._zeros: dict[str, torch.Tensor | None] = {}  # the module's code on zeros, this window
        if self.columns is None:
            self.columns = self._head_columns(parts)
        return parts

    def _head_columns(self, parts: LayerParts) -> tuple[list[_Index], list[_Index]]:
        """Which projected columns reach each query head and each KV group's keys (the support of
        the module's code after the projections, probed once by a backward with random cotangents):
        a top source's part in one head is projected through those columns only."""
        n_q, n_kv, length = parts.query.shape[0], parts.key.shape[0], parts.key.shape[1]
        q_width, width = self.w_q.shape[0], self.w_q.shape[0] + self.w_k.shape[0]
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode(False), torch.enable_grad():
            inputs = torch.zeros(n_q + n_kv, length, width, dtype=torch.float64, requires_grad=True)
            q, k = self.post(inputs, _plain(parts.rows))
            cot_q = torch.zeros(n_q, *q.shape[1:], dtype=torch.float64)
            cot_k = torch.zeros(n_kv, *k.shape[1:], dtype=torch.float64)
            for h in range(n_q):
                cot_q[h, h] = torch.randn(q.shape[2:], generator=generator, dtype=torch.float64)
            for g in range(n_kv):
                cot_k[g, g] = torch.randn(k.shape[2:], generator=generator, dtype=torch.float64)
            total = (q[:n_q] * cot_q).sum() + (k[n_q:] * cot_k).sum()
            (grad,) = torch.autograd.grad(total, inputs)
        used = grad.abs().amax(1) > 0  # [H + KV, w]
        q_cols = [used[h, :q_width].nonzero().squeeze(1) for h in range(n_q)]
        k_cols = [used[n_q + g, q_width:].nonzero().squeeze(1) for g in range(n_kv)]
        if bool(used[:n_q, q_width:].any()) or bool(used[n_q:, :q_width].any()):
            # the queries read the keys' columns or the reverse: no restriction
            q_cols = [torch.arange(q_width)] * n_q
            k_cols = [torch.arange(width - q_width)] * n_kv

        def disjoint(columns: list[torch.Tensor]) -> bool:
            return sum(len(c) for c in columns) == len(torch.cat(columns).unique())

        self._disjoint = {"query": disjoint(q_cols), "key": disjoint(k_cols)}
        return [_contiguous(c) for c in q_cols], [_contiguous(c) for c in k_cols]

    def prepare(
        self,
        recording: Recording,
        parts: LayerParts,
        heads: Sequence[int],
        centred: torch.Tensor,
        tops: Sequence[tuple[list[int], list[int]]] | None = None,
        cuts: Sequence[int] = (),
        individual: int = 0,
        attention: torch.Tensor | None = None,
    ) -> list[Prepared]:
        """One window of this layer for the heads ``heads``, ready for the pass over the blocks'
        writes (:meth:`flush`): each head's cotangents pulled back to the block's input (one
        backward for every head and side). ``centred [h, R, T]`` is each head's attention minus the
        uniform over the keys it sees, at the rows read. With ``tops`` (per head, its top key and
        query sources, ranked on the fit split), the evaluation split's reading of them: the first
        ``individual`` of each side one by one, the ranks between the ``cuts`` above as groups.
        Heads come in chunks whose held pull-backs fit :data:`PULLBACK_BYTES`.

        ``attention`` (the heads' attention ``[h, R, T]`` at the rows read): also the value side,
        each source's part of ``sum_q <o_b(q), o(q)>`` where ``o(q) = sum_k A[q,k] v(k) W_O`` is the
        head's output at query q (before any post-attention norm) and ``o_b`` the part of it that
        source b's write carries through the frozen input norm and ``W_V``. It is linear in the
        write: ``sum_k x_b(k) . r(k)``, ``r(k)`` the pull-back of ``c(k) = sum_q A[q,k] W_O o(q)``
        through ``W_V`` of the head's KV group and the frozen norm; the parts sum to ``sum_q |o(q)|^2``."""
        chosen = torch.tensor(list(heads))
        group = parts.query.shape[0] // parts.key.shape[0]
        groups = chosen // group
        query = parts.query[chosen]  # [h, R, d]
        kbar = torch.einsum("hrt,htd->hrd", centred, parts.key[groups])
        margin = parts.scaling * (query * kbar).sum((-1, -2))
        rows = parts.rows
        length, d_model = parts.key.shape[1], self.w_q.shape[1]
        g_key = parts.scaling * torch.einsum("hrt,hrd->htd", centred, query)  # [h, T, d]
        g_query = parts.scaling * kbar  # [h, R, d]
        x = recording.x[self.layer].double()
        scale = self.norm.scale(x) if self.norm is not None else None
        width = self.w_q.shape[0] + self.w_k.shape[0]
        sides = 2 if attention is None else 3
        held = max(1, PULLBACK_BYTES // (8 * length * ((sides - 1) * d_model + len(rows))))
        per_backward = max(1, PULLBACK_BYTES // (8 * 2 * length * 4 * width))
        values = None
        if attention is not None:
            w_v, b_v, w_o = self._value_weights()
            values = torch.einsum("td,gde->gte", recording.attn[self.layer][0].double(), w_v)
            if b_v is not None:
                values = values + b_v[:, None]
        out = []
        for start in range(0, len(heads), held):
            part = slice(start, min(len(heads), start + held))
            r_key, r_query = self._pull_back(parts, chosen[part], g_key[part], g_query[part], per_backward)
            r_value = c_value = output = None
            if attention is not None:
                assert values is not None
                r_value, c_value, output = self._value_pull_back(chosen[part], attention[part], values)
            if scale is not None:
                assert self.norm is not None
                r_key = self.norm.fold(r_key) / scale[None, :, None]
                r_query = self.norm.fold(r_query) / scale[None, rows, None]
                if r_value is not None:
                    r_value = self.norm.fold(r_value) / scale[None, :, None]
            plans = [_TopPlan.of(top, cuts, individual) for top in tops[part]] if tops is not None else []
            out.append(
                Prepared(
                    self,
                    parts,
                    chosen[part],
                    groups[part],
                    g_key[part],
                    g_query[part],
                    margin[part],
                    x,
                    scale,
                    r_key.reshape(r_key.shape[0], -1),
                    r_query.reshape(r_query.shape[0], -1),
                    plans,
                    None if r_value is None else r_value.reshape(r_value.shape[0], -1),
                    c_value,
                    output,
                )
            )
        return out

    def _value_weights(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """This layer's ``(W_V [KV, D, dv], b_V [KV, dv] or None, W_O [H, dv, D])``, float64, read
        once (the value side)."""
        if self._value is None:
            blocks = anatomy.blocks(self.loaded.model)
            attention = projections.attention_module(blocks[self.layer])
            path = projections.value_path(attention, anatomy.text_config(self.loaded.model.config))
            if path.linear is None:
                raise Unsupported(
                    f"{self.loaded.name} layer {self.layer}: its values are not linear in the attention's "
                    "input (latent or clipped values), so the value side cannot be split over sources"
                )
            w_o, _ = projections.output_projection(attention, self.loaded.layout.n_heads)
            bias = None if path.bias is None else path.bias.detach().double()
            self._value = (path.linear.detach().double(), bias, w_o.detach().double())
        return self._value

    def _value_pull_back(
        self, chosen: torch.Tensor, attention: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(r [h, T, D] before the input norm, c [h, T, dv], sum_q |o(q)|^2 [h])`` for heads
        ``chosen`` with attention ``[h, R, T]`` over ``values [KV, T, dv]`` (see :meth:`prepare`)."""
        w_v, _, w_o = self._value_weights()
        value_groups = chosen // (self.loaded.layout.n_heads // w_v.shape[0])
        head_out = torch.einsum("hrt,hte->hre", attention.double(), values[value_groups])  # [h, R, dv]
        written = torch.einsum("hre,hed->hrd", head_out, w_o[chosen])  # o(q) [h, R, D]
        output = written.pow(2).sum((-1, -2))
        back = torch.einsum("hrd,hed->hre", written, w_o[chosen])  # W_O o(q) [h, R, dv]
        c_value = torch.einsum("hrt,hre->hte", attention.double(), back)  # [h, T, dv]
        r_value = torch.einsum("hte,hde->htd", c_value, w_v[value_groups])  # [h, T, D]
        return r_value, c_value, output

    def flush(self, recording: Recording, prepared: Sequence[Prepared]) -> list[WindowParts]:
        """The pass over the blocks' writes for every prepared layer below or at this one (this
        decomposer is the deepest's): each block's writes are rebuilt once and read by every layer
        above it: each source's part of each head's margin (its write against the pull-back), and
        what the evaluation split keeps. A post-norm model renormalises each source for the layer
        it enters, so there each layer has its own pass (:attr:`shares_writes` is False)."""
        assert self.shares_writes or all(p.decomposer is self for p in prepared)
        means = torch.zeros(len(self.sources), self.w_q.shape[1], dtype=torch.float64)
        length = recording.x[0].shape[0]
        for p in prepared:
            p.start()
        # Each waiting layer's key-side pull-backs against a few blocks' writes at once: one product
        # of [heads, T * D] by [T * D, sources] (a product per block would read the pull-backs again
        # for every ten sources).
        buffered: list[tuple[list[int], torch.Tensor]] = []

        def drain() -> None:
            if not buffered:
                return
            columns = [c for cols, _ in buffered for c in cols]
            flat = torch.cat([w.reshape(len(cols), -1) for cols, w in buffered])
            for p in prepared:
                # the columns ascend: the sources below this layer's are a prefix (a view, no copy)
                valid = sum(1 for c in columns if c < len(p.decomposer.sources) - 1)
                if valid:
                    p.key_num[:, columns[:valid]] = p.r_key @ flat[:valid].T
                    if p.r_value is not None:
                        assert p.value_num is not None
                        p.value_num[:, columns[:valid]] = p.r_value @ flat[:valid].T
            buffered.clear()

        for columns, write, b in self._writes_by_block(recording):
            flat = write.reshape(len(columns), -1)
            for p in prepared:
                if columns[-1] < len(p.decomposer.sources) - 1:
                    p.read(columns, write, flat, b)
            if length > 1:
                means[columns] = write[:, 1:].mean(1)
            buffered.append((columns, write))
            if sum(w.numel() for _, w in buffered) * 8 >= BLOCK_BYTES // 4:
                drain()
        drain()
        return [p.decomposer._finish(p, means) for p in prepared]

    def _finish(self, p: Prepared, block_means: torch.Tensor) -> WindowParts:
        rows, length = p.parts.rows, p.x.shape[0]
        bias_index = len(self.sources) - 1
        # The bias source (the biases of the blocks below, the input norm's, the projections'):
        # affine, so its part is one call of the module's code, constants included.
        normed = self._normed(p.bias[None], p.scale)
        if self.norm is not None:
            normed = normed + self.norm.bias.to(normed.device)
        q_bias, k_bias = self.post(self._project(normed, rows, [True]), rows)
        p.key_num[:, -1] = (k_bias[0][p.groups] * p.g_key).sum((-1, -2))
        p.query_num[:, -1] = (q_bias[0][p.chosen] * p.g_query).sum((-1, -2))
        found = WindowParts(p.key_num, p.query_num, p.margin)
        if p.r_value is not None:
            assert p.value_num is not None and p.c_value is not None
            # the bias source's values: the constant part of each value (its bias and the norm's)
            w_v, b_v, _ = self._value_weights()
            value_groups = p.chosen // (self.loaded.layout.n_heads // w_v.shape[0])
            values = torch.einsum("td,gde->gte", normed[0], w_v[value_groups])
            if b_v is not None:
                values = values + b_v[value_groups, None]
            p.value_num[:, -1] = (values * p.c_value).sum((-1, -2))
            found.value, found.output = p.value_num, p.output
        if not p.plans:
            return found
        means = block_means[: len(self.sources)].clone()
        if length > 1:
            means[bias_index] = p.bias[1:].mean(0)
        p.full[bias_index], p.at_rows[bias_index] = p.bias, p.bias[rows]
        p.key_acc += p.key_member[:, bias_index, None, None] * p.bias
        p.query_acc += p.query_member[:, bias_index, None, None] * p.bias[rows]
        constant = self._constant_parts(rows, length)
        # every source at its mean: the block's input less its mean, one more item per side
        everything = p.x - (p.x[1:].mean(0) if length > 1 else p.x[0])
        found.heads = self._tops(p, means, constant, everything)
        return found

    def _constant_parts(self, rows: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The module's code on the constant input (the input norm's bias through the projections,
        with their biases): ``(queries [H, R, d], keys [KV, T, d])``, constants included: the bias
        source's parts are its linear part plus these."""
        constant = torch.zeros(1, length, self.w_q.shape[1], dtype=torch.float64)
        if self.norm is not None:
            constant[0] += self.norm.bias
        q, k = self.post(self._project(constant, rows, [True]), rows)
        return q[0], k[0]

    def _tops(
        self,
        p: Prepared,
        means: torch.Tensor,
        constant: tuple[torch.Tensor, torch.Tensor],
        everything: torch.Tensor,
    ) -> list[HeadTops]:
        """Each head's top sources through its own query columns and its KV group's key columns: the
        first few one by one (their parts, and their moves from their means), the groups' moves, and
        every source's (the block input's move from its mean); one call of the module's code per side
        for every head of the chunk.

        The module's code after the projections acts position by position and is linear once the
        norms are frozen, so a source's move is its part less its mean's part, and a mean (one
        vector) goes through the projection once, not once per position. A KV group's heads share
        their keys: a key-side item asked for by several heads of one group is computed once."""
        bias_index = len(self.sources) - 1
        rows, length = p.parts.rows, p.x.shape[0]
        outs = [HeadTops(plan=plan) for plan in p.plans]
        slot = 0
        accumulated: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        for plan in p.plans:
            count = len(plan.bounds)
            accumulated.append((list(p.key_acc[slot : slot + count]), list(p.query_acc[slot : slot + count])))
            slot += count
        for side in ("key", "query"):
            first = torch.zeros(length if side == "key" else len(rows), dtype=torch.bool)
            first[0 if side == "key" else rows == 0] = True  # the first position keeps its actual write
            full, mean = _Items(), _Items()  # the writes and the (one-vector) means to project
            asked = []
            everything_at = everything if side == "key" else everything[rows]
            for i, plan in enumerate(p.plans):
                which = int(p.groups[i]) if side == "key" else int(p.chosen[i])
                individual = plan.key_individual if side == "key" else plan.query_individual
                grouped = accumulated[i][0 if side == "key" else 1]
                members = plan.key_groups if side == "key" else plan.query_groups
                writes = [
                    full.add((which, "source", s), p.full[s] if side == "key" else p.at_rows[s])
                    for s in individual
                ]
                means_at = [mean.add((which, s), means[s]) for s in individual]
                moves = []
                for slot, (g, m) in enumerate(zip(grouped, members, strict=True)):
                    move = g - sum((means[s] for s in m), torch.zeros_like(means[0]))
                    move[first] = 0.0
                    moves.append(full.add((which, "group", i, slot), move))  # this head's own accumulator
                if (which, "everything") not in full.index:
                    move = everything_at.clone()
                    move[first] = 0.0
                    full.add((which, "everything"), move)
                moves.append(full.index[(which, "everything")])
                asked.append((individual, writes, means_at, moves))
            partial = self._head_linear(full.stacked(), full.which(), side, p.scale, rows, length)
            at_means = None
            if mean.tensors:
                at_means = self._head_linear(
                    mean.stacked()[:, None], mean.which(), side, p.scale, rows, length
                )
            for i, (individual, writes, means_at, moves) in enumerate(asked):
                out = outs[i]
                head, group = int(p.chosen[i]), int(p.groups[i])
                extra = constant[1][group] if side == "key" else constant[0][head]
                found, individual_moves = {}, []
                for s, w, m in zip(individual, writes, means_at, strict=True):
                    found[s] = partial[w] + extra if s == bias_index else partial[w]
                    assert at_means is not None
                    move = partial[w] - at_means[m]
                    move[first] = 0.0
                    individual_moves.append(move)
                all_moves = individual_moves + [partial[k] for k in moves]
                if side == "key":
                    out.key, out.key_moves, out.key_all = found, all_moves[:-1], all_moves[-1]
                else:
                    out.query, out.query_moves, out.query_all = found, all_moves[:-1], all_moves[-1]
        return outs

    def _head_linear(
        self,
        writes: torch.Tensor,
        which: torch.Tensor,
        side: str,
        scale: torch.Tensor | None,
        rows: torch.Tensor,
        length: int,
    ) -> torch.Tensor:
        """The linear parts ``[n, P, d]`` of writes ``[n, P, D]`` (P: every position for the keys,
        the rows read for the queries; a write ``[n, 1, D]`` is one vector at every position), each
        in its own query head or its KV group's keys ``which[i]``: the frozen input norm, the
        projection through that head's columns only, the module's code, less its call on zeros."""
        assert self.columns is not None
        q_cols, k_cols = self.columns
        positions = length if side == "key" else len(rows)
        at = None if scale is None else (scale if side == "key" else scale[rows])
        # the norm's statistic divides each position: after the projection, so that a vector is
        # projected once
        normed = writes if at is None else self._normed(writes, torch.ones((), dtype=torch.float64))
        columns = k_cols if side == "key" else q_cols
        weight = self.w_k if side == "key" else self.w_q
        # Items of different heads share a row of the module's call where the heads' columns are
        # disjoint (each head reads only its own): one call for every head's first item, and so on.
        slots = torch.zeros(len(which), dtype=torch.long)
        packed = self._disjoint[side]
        for value in which.unique().tolist():
            chosen = (which == value).nonzero().squeeze(1)
            slots[chosen] = torch.arange(len(chosen)) if packed else chosen
        projected = torch.zeros(int(slots.max()) + 1, positions, weight.shape[0], dtype=torch.float64)
        for value in which.unique().tolist():
            chosen = (which == value).nonzero().squeeze(1)
            cols = columns[value]
            if isinstance(cols, slice):
                projected[slots[chosen], :, cols] = normed[chosen] @ weight[cols].T
            else:
                projected[slots[chosen][:, None, None], torch.arange(positions)[:, None], cols] = (
                    normed[chosen] @ weight[cols].T
                )
        if at is not None:
            projected = projected / at[None, :, None]
        if self._zeros.get(side) is None:
            zeros = torch.zeros_like(projected[:1])
            self._zeros[side] = (
                self.post.keys(zeros) if side == "key" else self.post.queries(zeros, rows, length)
            )[0]
        found = self.post.keys(projected) if side == "key" else self.post.queries(projected, rows, length)
        return found[slots, which] - self._zeros[side][which]

    def _pull_back(
        self,
        parts: LayerParts,
        chosen: torch.Tensor,
        g_key: torch.Tensor,
        g_query: torch.Tensor,
        per_backward: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads' cotangents (keys ``[c, T, d]`` in their KV group, queries ``[c, R, d]``) back
        through the module's code after the projections, then the projections: ``(r_key [c, T, D],
        r_query [c, R, D])`` before the input norm. Autograd runs outside the pass's inference mode,
        float64."""
        rows = parts.rows
        group = parts.query.shape[0] // parts.key.shape[0]
        length, d_model = parts.key.shape[1], self.w_q.shape[1]
        weight = torch.cat([self.w_q, self.w_k])  # [w, D]
        r_key = torch.zeros(len(chosen), length, d_model, dtype=torch.float64)
        r_query = torch.zeros(len(chosen), len(rows), d_model, dtype=torch.float64)
        plain_rows = _plain(rows)
        for start in range(0, len(chosen), per_backward):
            some = range(start, min(len(chosen), start + per_backward))
            c = len(some)
            with torch.inference_mode(False), torch.enable_grad():
                cot_key = torch.zeros(c, *parts.key.shape, dtype=torch.float64)
                cot_query = torch.zeros(c, *parts.query.shape, dtype=torch.float64)
                for slot, i in enumerate(some):
                    head = int(chosen[i])
                    cot_key[slot, head // group] = g_key[i]
                    cot_query[slot, head] = g_query[i]
                inputs = torch.zeros(2 * c, length, weight.shape[0], dtype=torch.float64, requires_grad=True)
                q, k = self.post(inputs, plain_rows)
                total = (k[:c] * cot_key).sum() + (q[c:] * cot_query).sum()
                (grad,) = torch.autograd.grad(total, inputs)
            # Back through the projections, each head through the columns that reach it (a KV
            # group's heads share their keys' columns: one product per group).
            assert self.columns is not None
            q_cols, k_cols = self.columns
            q_width = self.w_q.shape[0]
            heads_here = [int(chosen[i]) for i in some]
            for g in sorted({h // group for h in heads_here}):
                slots = [s for s, h in enumerate(heads_here) if h // group == g]
                cols = _shifted(k_cols[g], q_width)
                r_key[[start + s for s in slots]] = grad[slots][:, :, cols] @ weight[cols]
            for s, h in enumerate(heads_here):
                cols = q_cols[h]
                r_query[start + s] = grad[c + s, rows][:, cols] @ weight[cols]
        return r_key, r_query

    def _writes_by_block(
        self, recording: Recording
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
        """The sources' writes ``[c, T, D]`` (float64), a block at a time, with their indices in
        :attr:`sources` and the block's part of the bias source: the embedding first, then each
        block's heads and MLP (rebuilt from the recorded heads' outputs, so only one block's writes
        are held). Post-norm blocks renormalise every source below them, so there every write is
        built first (:meth:`writes`)."""
        if self.post_blocks:
            writes, bias = self.writes(recording)
            for start in range(0, len(writes), 16):
                stop = min(len(writes), start + 16)
                yield (
                    list(range(start, stop)),
                    torch.stack(writes[start:stop]),
                    (bias if start == 0 else torch.zeros_like(bias)),
                )
            return
        before = recording.x[0].double()
        zero = torch.zeros_like(before)
        yield [0], before[None], zero
        at = 1
        for j in range(self.layer):
            after = recording.x[j + 1].double()
            if j not in self.w_o:
                yield [at], (after - before)[None], zero
                at += 1
            else:
                n_heads = self.w_o[j][0].shape[0]
                per = max(1, BLOCK_BYTES // (8 * before.numel()))
                if per > n_heads:
                    each, b = self._heads_write(j, recording)
                    each, b = residual_parts(each, b, self.post_norms.get(j), self.multiplier)
                    each = each.transpose(0, 1)  # [H, T, D]
                    mlp = after - before - each.sum(0) - b
                    yield list(range(at, at + n_heads + 1)), torch.cat([each, mlp[None]]), b
                else:
                    yield from self._block_in_chunks(j, recording, at, before, after, per)
                at += n_heads + 1
            before = after

    def _block_in_chunks(
        self, j: int, recording: Recording, at: int, before: torch.Tensor, after: torch.Tensor, per: int
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor]]:
        """Block ``j``'s heads' writes ``per`` heads at a time, then its MLP's (a block whose writes
        would pass :data:`BLOCK_BYTES` at once): the attention output's statistic (a post-attention
        norm's) from its total, which is one product through ``W_O``."""
        w_o, b_o = self.w_o[j]
        w_o = w_o.double()
        heads = recording.heads[j].double()
        heads = heads.reshape(heads.shape[0], w_o.shape[0], -1)  # [T, H, dv]
        total = torch.einsum("thd,hde->te", heads, w_o)
        raw_bias = b_o.detach().double().expand_as(total) if b_o is not None else torch.zeros_like(total)
        post = self.post_norms.get(j)
        scale = post.scale(total + raw_bias) if post is not None else None

        def through(write: torch.Tensor) -> torch.Tensor:
            if post is not None:
                assert scale is not None
                write = post.linear(write, scale.expand(write.shape[:-1]))
            return write * self.multiplier

        b = through(raw_bias) + (post.bias * self.multiplier if post is not None else 0.0)
        for start in range(0, w_o.shape[0], per):
            stop = min(w_o.shape[0], start + per)
            each = torch.einsum("thd,hde->hte", heads[:, start:stop], w_o[start:stop])
            yield list(range(at + start, at + stop)), through(each), torch.zeros_like(total)
        mlp = after - before - through(total) - b
        yield [at + w_o.shape[0]], mlp[None], b

    # --- the projection path: every source projected (the oracle of the pull-back, in tests) --------

    def decompose(
        self, recording: Recording, rows: torch.Tensor, means_from: int = 1
    ) -> Iterator[tuple[LayerParts, list[int], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield, chunk by chunk of sources: ``(parts, indices, q [c, H, R, d], k [c, KV, T, d],
        q_mean, k_mean)``: each source's part of the queries at ``rows`` and of every key, and the
        same with its write replaced by its mean over positions ``>= means_from`` (position 0 keeps
        its actual write: the first token's residual is atypical, and most heads rest on it).
        The first yield's ``parts`` carries the actual queries and keys; the parts of every chunk,
        with the bias part (last index), sum to them.
        """
        writes, bias = self.writes(recording)
        x = recording.x[self.layer].double()
        length = x.shape[0]
        scale = self.norm.scale(x) if self.norm is not None else None
        actual_in, kwargs = recording.attn[self.layer]
        q_width = self.w_q.shape[0]
        query, key, scaling = self.post.record(
            self._project(actual_in.double()[None], None)[0:1], kwargs, rows
        )
        zero_q, zero_k = self.post(
            torch.zeros(1, length, q_width + self.w_k.shape[0], dtype=torch.float64), rows
        )
        parts = LayerParts(self.layer, rows, query[0][:, rows], key[0], scaling, self.sources)
        # Check the sum of the writes against the block's input before anything else.
        total = bias.clone()
        for write in writes:
            total += write
        error = float((total - x).abs().max() / x.abs().max().clamp(min=1e-30))
        if error > 1e-5:
            raise Unsupported(
                f"qk: layer {self.layer}: the sources do not sum to the residual stream "
                f"(relative error {error:.1e})"
            )
        count = len(writes)
        chunk = max(1, CHUNK_ELEMENTS // max(1, length * x.shape[1]))
        for start in range(0, count + 1, chunk):
            indices = list(range(start, min(count + 1, start + chunk)))
            stack = []
            for i in indices:
                stack.append(writes[i] if i < count else bias)
            src = torch.stack(stack)  # [c, T, D]
            is_bias = [i == count for i in indices]
            normed = self._normed(src, scale)
            if any(is_bias) and self.norm is not None:
                normed[is_bias.index(True)] += self.norm.bias.to(normed.device)
            projected = self._project(normed, rows, is_bias)
            mean = self._mean_projected(src, projected, scale, is_bias, means_from)
            q, k = self._parts(projected, rows, is_bias, zero_q, zero_k)
            q_mean, k_mean = self._parts(mean, rows, is_bias, zero_q, zero_k)
            yield parts, indices, q, k, q_mean, k_mean

    def _project(
        self, normed: torch.Tensor, rows: torch.Tensor | None, bias: Sequence[bool] = ()
    ) -> torch.Tensor:
        """Projected parts ``[c, T, q_width + k_width]``: the queries only at ``rows`` (zeros elsewhere),
        with the projections' biases on the rows of ``bias`` (all rows when ``bias`` is empty)."""
        c, length, _ = normed.shape
        q_width, k_width = self.w_q.shape[0], self.w_k.shape[0]
        out = torch.zeros(c, length, q_width + k_width, dtype=torch.float64)
        source = normed if rows is None else normed[:, rows]
        q = source @ self.w_q.T
        k = normed @ self.w_k.T
        add = list(bias) if bias else [True] * c
        for i, yes in enumerate(add):
            if yes:
                if self.b_q is not None:
                    q[i] += self.b_q
                if self.b_k is not None:
                    k[i] += self.b_k
        if rows is None:
            out[..., :q_width] = q
        else:
            out[:, rows, :q_width] = q
        out[..., q_width:] = k
        return out

    def _mean_projected(
        self,
        src: torch.Tensor,
        projected: torch.Tensor,
        scale: torch.Tensor | None,
        is_bias: Sequence[bool],
        means_from: int,
    ) -> torch.Tensor:
        """``projected`` with each source's write replaced by its mean over positions >= ``means_from``.
        Per position the map is linear up to the frozen statistic: the mean's projection is one
        projection of the mean, divided by each position's statistic (plus the constant terms for
        the bias source)."""
        mean = projected.clone()
        length = src.shape[1]
        if length <= means_from:
            return mean
        average = src[:, means_from:].mean(1, keepdim=True)  # [c, 1, D]
        ones = torch.ones(1, dtype=torch.float64)
        unit = self._normed(average, ones) if self.norm is not None else average
        once = self._project(unit, None, [False] * len(is_bias))  # [c, 1, w]
        inverse = (1.0 / scale[means_from:]) if scale is not None else torch.ones(length - means_from)
        mean[:, means_from:] = once * inverse.to(torch.float64)[None, :, None]
        if any(is_bias):
            constant = torch.zeros(1, 1, src.shape[-1], dtype=torch.float64)
            if self.norm is not None:
                constant[0, 0] = self.norm.bias
            mean[is_bias.index(True), means_from:] += self._project(constant, None, [True])[0, 0]
        return mean

    def _parts(
        self,
        projected: torch.Tensor,
        rows: torch.Tensor,
        is_bias: Sequence[bool],
        zero_q: torch.Tensor,
        zero_k: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = self.post(projected, rows)
        linear = torch.tensor([not b for b in is_bias])
        # The module after the projections is affine (frozen norms' biases): a source's part is its
        # call minus the call on zeros; the bias source keeps the constant.
        q = q - zero_q * linear[:, None, None, None]
        k = k - zero_k * linear[:, None, None, None]
        return q, k


__all__ = [
    "MAX_SOURCE_BYTES",
    "Decomposer",
    "LayerParts",
    "Recording",
    "Source",
    "SourceWrites",
    "refusal",
    "source_names",
]
