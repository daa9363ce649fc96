"""``MultiHeadAttention``: the fast torch module, with every head open to inspection.

One module covers multi-head (MHA), grouped-query (GQA) and multi-query (MQA) attention:
``n_kv_heads`` key/value heads are shared by groups of ``G = n_heads // n_kv_heads`` query
heads. Queries, keys and values come from one fused input projection whose rows are laid out as
``[q heads | k heads | v heads]``; head ``h`` owns rows ``h*D .. (h+1)*D`` of its block, and
columns ``h*D .. (h+1)*D`` of the output projection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from headlab.attention.blocks import AttendResult
from headlab.attention.functional import attend
from headlab.attention.kv_cache import KVCache
from headlab.attention.masks import combine_masks, key_real_mask
from headlab.attention.surgery import head_rows, linear_columns, linear_rows, plan_removal
from headlab.errors import ConfigError, ShapeError


@dataclass(frozen=True, kw_only=True)
class AttentionOutput:
    """Everything :meth:`MultiHeadAttention.inspect` can return.

    Attributes:
        output: ``(B, T, E)``, the module's output.
        weights: ``(B, H, T, S)`` per-head attention weights, or ``None``.
        head_outputs: ``(B, H, T, D)`` each head's output before concatenation, or ``None``.
        contributions: ``(B, H, T, E)`` each head's share of the output after the output
            projection, or ``None``. ``contributions.sum(1) + out_proj.bias == output``.
    """

    output: torch.Tensor
    weights: torch.Tensor | None = None
    head_outputs: torch.Tensor | None = None
    contributions: torch.Tensor | None = None


class MultiHeadAttention(nn.Module):
    """Multi-head attention with GQA/MQA, masks, a KV cache, head gates and head pruning.

    Args:
        d_model: model width ``E``.
        n_heads: query heads ``H``.
        n_kv_heads: key/value heads ``Hkv`` (default ``n_heads``; fewer gives GQA, 1 gives MQA);
            must divide ``n_heads``.
        head_dim: head width ``D`` (default ``d_model // n_heads``, which must then divide).
        bias: biases on the input and output projections.
        dropout: dropout on the attention weights while training.

    Shape:
        query: ``(B, T, E)``; key_value: ``(B, S, E)`` (cross-attention) or ``None`` (self).
        output: ``(B, T, E)``.

    Masks are boolean. ``attn_mask`` and ``key_mask`` say True = may attend;
    ``key_padding_mask`` keeps torch's meaning, True = padding (see
    :mod:`headlab.attention.masks`).

    Example:
        >>> import torch
        >>> mha = MultiHeadAttention(d_model=32, n_heads=4, n_kv_heads=2)
        >>> x = torch.randn(2, 5, 32)
        >>> mha(x, is_causal=True).shape
        torch.Size([2, 5, 32])
        >>> mha.inspect(x, need_weights=True).weights.shape
        torch.Size([2, 4, 5, 5])
    """

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if not isinstance(n_kv_heads, int) or n_kv_heads < 1:
            raise ConfigError(f"n_kv_heads must be a positive integer, got {n_kv_heads!r}")
        if n_heads % n_kv_heads:
            raise ConfigError(f"n_heads ({n_heads}) must be divisible by n_kv_heads ({n_kv_heads})")
        if head_dim is None:
            if d_model % n_heads:
                raise ConfigError(
                    f"d_model ({d_model}) must be divisible by n_heads ({n_heads}), "
                    "or pass head_dim explicitly"
                )
            head_dim = d_model // n_heads
        if not isinstance(head_dim, int) or head_dim < 1:
            raise ConfigError(f"head_dim must be a positive integer, got {head_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.dropout = dropout
        # Original indices of the heads still present (changes after prune_heads).
        self.head_ids: list[int] = list(range(n_heads))
        factory = {"device": device, "dtype": dtype}
        self.in_proj = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * head_dim, bias, **factory)
        self.out_proj = nn.Linear(n_heads * head_dim, d_model, bias, **factory)
        # Why the fused kernel was not used in the last call (None when it was).
        self.why_not_fast_path: str | None = None

    # ------------------------------------------------------------------ layout
    @property
    def n_groups(self) -> int:
        """Query heads per key/value head, ``G``."""
        return self.n_heads // self.n_kv_heads

    @property
    def scale(self) -> float:
        """Score scale ``1 / sqrt(D)`` (Vaswani et al. 2017)."""
        return 1.0 / math.sqrt(self.head_dim)

    def _split_sizes(self) -> tuple[int, int, int]:
        d = self.head_dim
        return self.n_heads * d, self.n_kv_heads * d, self.n_kv_heads * d

    def _project(
        self, query: torch.Tensor, key_value: torch.Tensor | None, *, explicit: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """Project inputs to q ``(B, H, T, D)``, k and v ``(B, Hkv, S, D)``.

        The last item says whether q comes already multiplied by :attr:`scale`. For the
        ``explicit`` path (per-head weights) without autograd, MHA self-attention adds the bias,
        scales q and lays the three out head by head in one fused pass (torch's own
        ``_transform_bias_rescale_qkv``): its matrix products would copy strided head views.
        The fused kernel reads the strided views as they are, and its output then lies token by
        token, so the heads' concatenation costs no copy either.
        """
        q_size, k_size, v_size = self._split_sizes()
        weight, bias = self.in_proj.weight, self.in_proj.bias
        fused = getattr(torch, "_transform_bias_rescale_qkv", None)
        if (
            explicit
            and fused is not None
            and key_value is None
            and self.n_kv_heads == self.n_heads
            and not (torch.is_grad_enabled() and (query.requires_grad or weight.requires_grad))
        ):
            qkv = F.linear(query, weight)  # (B, T, 3 H D), bias added by the fused pass
            qkv_bias = bias if bias is not None else qkv.new_zeros(qkv.shape[-1])
            q, k, v = fused(qkv, qkv_bias, self.n_heads)  # (B, H, T, D) each, q * scale
            return q, k, v, True
        if key_value is None:
            qkv = F.linear(query, weight, bias)  # (B, T, (H + 2 Hkv) D)
            q, k, v = qkv.split([q_size, k_size, v_size], dim=-1)
        else:
            q = F.linear(query, weight[:q_size], None if bias is None else bias[:q_size])
            kv = F.linear(key_value, weight[q_size:], None if bias is None else bias[q_size:])
            k, v = kv.split([k_size, v_size], dim=-1)
        b = query.shape[0]
        q = q.view(b, -1, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(b, -1, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        v = v.view(b, -1, self.n_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, S, D)
        return q, k, v, False

    def _check_inputs(self, query: torch.Tensor, key_value: torch.Tensor | None) -> None:
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ShapeError(
                f"query must have shape (B, T, E={self.d_model}), got {tuple(query.shape)}"
            )
        if key_value is not None and (
            key_value.dim() != 3
            or key_value.shape[0] != query.shape[0]
            or key_value.shape[-1] != self.d_model
        ):
            raise ShapeError(
                f"key_value must have shape (B={query.shape[0]}, S, E={self.d_model}), "
                f"got {tuple(key_value.shape)}"
            )

    def _gate(self, head_outputs: torch.Tensor, head_mask: torch.Tensor) -> torch.Tensor:
        b, h = head_outputs.shape[:2]
        if head_mask.dim() == 1 and head_mask.shape[0] == h:
            gate = head_mask[None, :, None, None]  # (1, H, 1, 1)
        elif head_mask.dim() == 2 and tuple(head_mask.shape) == (b, h):
            gate = head_mask[:, :, None, None]  # (B, H, 1, 1)
        else:
            raise ShapeError(
                f"head_mask must have shape (H,)=({h},) or (B, H)=({b}, {h}), "
                f"got {tuple(head_mask.shape)}"
            )
        return head_outputs * gate.to(head_outputs.dtype)

    # ------------------------------------------------------------------ forward
    def _run(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None,
        *,
        attn_mask: torch.Tensor | None,
        key_padding_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
        is_causal: bool,
        head_mask: torch.Tensor | None,
        kv_cache: KVCache | None,
        need_weights: bool,
        need_head_outputs: bool,
        need_contributions: bool,
    ) -> AttentionOutput:
        self._check_inputs(query, key_value)
        # validates dtypes and refuses both spellings at once; shapes are checked once S is known
        key_real_mask(key_mask=key_mask, key_padding_mask=key_padding_mask)
        any_key_mask = key_mask is not None or key_padding_mask is not None
        if kv_cache is not None and key_value is not None:
            raise ShapeError("kv_cache is for self-attention; pass key_value=None with a cache")
        q, k, v, prescaled = self._project(query, key_value, explicit=need_weights)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, Hkv, past + T, D)
        b, _, t, _ = q.shape
        s = k.shape[2]
        # The fused kernel's own causal mode is top-left aligned: exact only when T == S.
        plain_causal = is_causal and attn_mask is None and not any_key_mask and t == s
        mask = None
        if not plain_causal:
            mask = combine_masks(
                batch=b,
                n_heads=self.n_heads,
                n_queries=t,
                n_keys=s,
                attn_mask=attn_mask,
                key_mask=key_mask,
                key_padding_mask=key_padding_mask,
                is_causal=is_causal,
                device=q.device,
            )
        result = attend(
            q,
            k,
            v,
            mask=mask,
            scale=1.0 if prescaled else self.scale,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
            causal_top_left=plain_causal,
        )
        return self._finish(
            result,
            head_mask=head_mask,
            need_head_outputs=need_head_outputs,
            need_contributions=need_contributions,
        )

    def _finish(
        self,
        result: AttendResult,
        *,
        head_mask: torch.Tensor | None,
        need_head_outputs: bool,
        need_contributions: bool,
    ) -> AttentionOutput:
        """Gate, concatenate and project the heads; per-head contributions on request."""
        self.why_not_fast_path = result.why_not_fast_path
        heads = result.head_outputs  # (B, H, T, D)
        b, _, t, _ = heads.shape
        if head_mask is not None:
            heads = self._gate(heads, head_mask)
        concat = heads.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim)  # (B, T, H D)
        output = self.out_proj(concat)  # (B, T, E)
        contributions = None
        if need_contributions:
            w_o = self.out_proj.weight.view(self.d_model, self.n_heads, self.head_dim)  # (E, H, D)
            contributions = torch.einsum("bhtd,ehd->bhte", heads, w_o)  # (B, H, T, E)
        return AttentionOutput(
            output=output,
            weights=result.weights,
            head_outputs=heads if need_head_outputs else None,
            contributions=contributions,
        )

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        """Attend and return the output ``(B, T, E)``.

        Args:
            query: ``(B, T, E)``.
            key_value: ``(B, S, E)`` for cross-attention; ``None`` attends to ``query`` itself.
            attn_mask: boolean ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``, True = may attend.
            key_padding_mask: boolean ``(B, S)``, True = padding (ignored), False = real token:
                the meaning of ``torch.nn.MultiheadAttention``'s argument of that name.
            key_mask: boolean ``(B, S)``, True = real token, False = padding: the meaning of
                Hugging Face's ``attention_mask``. Pass this or ``key_padding_mask``, not both.
            is_causal: each query attends only to keys at or before its own position (with a
                cache, positions count from the first cached token).
            head_mask: ``(H,)`` or ``(B, H)`` gate multiplying each head's output (0 removes it).
            kv_cache: a :class:`KVCache` to read and extend (self-attention only).
        """
        return self._run(
            query,
            key_value,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            key_mask=key_mask,
            is_causal=is_causal,
            head_mask=head_mask,
            kv_cache=kv_cache,
            need_weights=False,
            need_head_outputs=False,
            need_contributions=False,
        ).output

    def inspect(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        head_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        need_weights: bool = True,
        need_head_outputs: bool = True,
        need_contributions: bool = True,
    ) -> AttentionOutput:
        """Like :meth:`forward`, but also return per-head tensors (see :class:`AttentionOutput`).

        Per-head attention weights need the explicit path; head outputs and contributions do
        not, so ``need_weights=False`` keeps the fused kernel.
        """
        return self._run(
            query,
            key_value,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            key_mask=key_mask,
            is_causal=is_causal,
            head_mask=head_mask,
            kv_cache=kv_cache,
            need_weights=need_weights,
            need_head_outputs=need_head_outputs,
            need_contributions=need_contributions,
        )

    # ------------------------------------------------------------------ surgery
    @torch.no_grad()
    def prune_heads(self, heads: Iterable[int]) -> MultiHeadAttention:
        """Physically remove query heads (indices into the current heads), in place.

        MHA: any heads may go. GQA/MQA: the key/value heads must stay shared by equal groups, so
        either whole groups go (the key/value head goes with its query heads), or the same
        number of query heads goes from every remaining group. Anything else raises
        :class:`~headlab.errors.PruningError`, as does removing every head.

        The pruned module computes exactly what the unpruned one computes with those heads
        gated to zero by ``head_mask``.
        """
        remove = sorted(set(int(h) for h in heads))
        if not remove:
            return self
        keep, keep_kv = plan_removal(self.n_heads, self.n_kv_heads, remove, where="this module")
        d = self.head_dim
        q_size, k_size, _ = self._split_sizes()

        in_rows = torch.cat(
            [
                head_rows(keep, d),
                head_rows(keep_kv, d, offset=q_size),
                head_rows(keep_kv, d, offset=q_size + k_size),
            ]
        )
        self.in_proj = linear_rows(self.in_proj, in_rows)
        self.out_proj = linear_columns(self.out_proj, head_rows(keep, d))
        self.head_ids = [self.head_ids[h] for h in keep]
        self.n_heads, self.n_kv_heads = len(keep), len(keep_kv)
        return self

    # ------------------------------------------------------------------ interop
    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a module with the weights of a ``torch.nn.MultiheadAttention``.

        The result is batch-first whatever ``module.batch_first`` says. ``key_padding_mask``
        means what it means in torch (True = padding), so a ported call gives torch's answer;
        ``key_mask`` is the same mask inverted (True = real token).
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise ConfigError(
                f"from_torch expects torch.nn.MultiheadAttention, got {type(module).__name__}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ConfigError("from_torch does not support add_bias_kv or add_zero_attn")
        if module.kdim != module.embed_dim or module.vdim != module.embed_dim:
            raise ConfigError(
                f"from_torch needs kdim == vdim == embed_dim ({module.embed_dim}), "
                f"got kdim={module.kdim}, vdim={module.vdim}"
            )
        weight = module.in_proj_weight
        if weight is None:
            weight = torch.cat([module.q_proj_weight, module.k_proj_weight, module.v_proj_weight])
        has_bias = module.in_proj_bias is not None
        ours = cls(
            d_model=module.embed_dim,
            n_heads=module.num_heads,
            bias=has_bias,
            dropout=module.dropout,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            ours.in_proj.weight.copy_(weight)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                ours.in_proj.bias.copy_(module.in_proj_bias)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"head_dim={self.head_dim}"
        )
