"""The seeds' ``MixtureOfExperts`` and ``TopKRouter``: top-k routing with a fixed capacity per
expert, written as dense dispatch and combine tensors (GShard's formulation).

Every token group (a sequence: the input's first axis) routes its tokens on its own: each
token's k best experts by the router's logits, its gates the softmax of those k logits
(GPT-OSS's), and each expert takes at most ``capacity`` tokens of a group, first choices
before second choices and in token order; the rest are dropped (their share of the output is
0, the residual carries them). Dispatch and combine are one-hot tensors [G, S, E, C], so the
whole layer is matmuls, elementwise operators and a cumsum: it compiles into a few fused
kernels, its gradient is ordinary autodiff, and, called with sharded tensors, the planner
shards it like any other graph: with the groups split over a mesh axis and the experts'
weights split over the same axis, the tokens travel to their experts' ranks by one all-to-all
and back by another (expert parallelism), no weight moves, and each token's output has the
single process's bits.
"""
from __future__ import annotations

import math

import numpy as np

from .. import op
from ..errors import ArgumentError
from .init import kaiming_uniform
from .attention import MultiHeadAttention
from .layers import LayerNorm, Module, _shape, activation


class TopKRouter(Module):
    """Logits x @ w [..., E]; ``route(params, x)`` gives the dispatch and combine tensors.

    params {"w": [dim, E]}. ``capacity(S)``: how many tokens of a group of S one expert takes,
    ceil(capacity_factor * S * k / E) (at most S)."""

    def __init__(self, dim: int, num_experts: int, top_k: int = 2,
                 capacity_factor: float = 1.25, dtype=np.float32):
        if not 1 <= top_k <= num_experts:
            raise ArgumentError(f"top_k={top_k} must be between 1 and num_experts="
                                f"{num_experts}")
        if capacity_factor <= 0:
            raise ArgumentError(f"capacity_factor must be positive, not {capacity_factor}")
        self.dim, self.num_experts, self.top_k = int(dim), int(num_experts), int(top_k)
        self.capacity_factor, self.dtype = float(capacity_factor), np.dtype(dtype)

    def init_params(self, key):
        return {"w": kaiming_uniform(key.child("w"), (self.dim, self.num_experts), self.dim,
                                     dtype=self.dtype)}

    def capacity(self, tokens: int) -> int:
        return min(int(tokens), math.ceil(self.capacity_factor * tokens * self.top_k /
                                          self.num_experts))

    def route(self, params, x):
        """x [G, S, dim] -> (dispatch, combine, probs): dispatch [G, S, E, C] is 1 where
        token s of group g sits in slot c of expert e; combine is dispatch times the token's
        gate for that expert; probs [G, S, E] the router's softmax (for a balancing loss)."""
        s = _shape(x)[-2]
        e, c = self.num_experts, self.capacity(s)
        logits = op.matmul(x, params["w"])
        top, idx = op.topk(logits, self.top_k, axis=-1)              # [G, S, k]
        gates = op.softmax(top, axis=-1)
        dispatch = combine = None
        before = None                          # [G, 1, E]: slots taken by earlier choices
        for j in range(self.top_k):
            mask = op.one_hot(idx[..., j], e, dtype=self.dtype.name)    # [G, S, E]
            # the slot: the running count of this expert's tokens, after earlier choices
            pos = op.cumsum(mask, axis=-2) - 1
            if before is not None:
                pos = pos + before
            slot = op.one_hot(op.cast(pos, "int64"), c, dtype=self.dtype.name)
            d = slot * op.expand_dims(mask, -1)        # [G, S, E, C]; beyond capacity: 0
            g = d * op.expand_dims(op.expand_dims(gates[..., j], -1), -1)
            dispatch = d if dispatch is None else dispatch + d
            combine = g if combine is None else combine + g
            taken = op.sum(mask, axis=-2, keepdim=True)
            before = taken if before is None else before + taken
        return dispatch, combine, op.softmax(logits, axis=-1)


class MixtureOfExperts(Module):
    """E expert MLPs (dim -> hidden -> dim, ``activation`` between) behind a `TopKRouter`.

    params {"router": {"w"}, "w1": [E, dim, hidden], "w2": [E, hidden, dim]}. x is [G, S, dim]
    (groups of S tokens, e.g. sequences). ``__call__(params, x)`` -> [G, S, dim];
    ``return_aux=True`` also gives the Switch Transformer's load-balancing loss,
    E * sum_e f_e P_e (f_e: the share of first choices going to expert e, P_e: its mean
    router probability), 1 when the load is even.

    To shard it: the groups over an axis (``ShardSpec.per_dim("dp", None, None)``) and w1, w2
    over the same axis by expert (``per_dim("dp", None, None)``); the hidden dimension may be
    split over another (tensor parallelism inside each expert)."""

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int = 2,
                 capacity_factor: float = 1.25, activation="silu", dtype=np.float32):
        self.dim, self.hidden, self.num_experts = int(dim), int(hidden), int(num_experts)
        self.activation, self.dtype = activation, np.dtype(dtype)
        self.router = TopKRouter(dim, num_experts, top_k, capacity_factor, dtype)

    def init_params(self, key):
        e, d, h = self.num_experts, self.dim, self.hidden
        return {"router": self.router.init_params(key.child("router")),
                "w1": kaiming_uniform(key.child("w1"), (e, d, h), d, dtype=self.dtype),
                "w2": kaiming_uniform(key.child("w2"), (e, h, d), h, dtype=self.dtype)}

    def __call__(self, params, x, return_aux: bool = False, **kw):
        shape = _shape(x)
        if len(shape) != 3 or shape[-1] != self.dim:
            raise ArgumentError(f"MixtureOfExperts takes x [groups, tokens, {self.dim}]",
                                received=f"shape {tuple(shape)}")
        dispatch, combine, probs = self.router.route(params["router"], x)
        # each expert's slots, gathered from the groups: [G, E, C, dim] -> [E, G, C, dim]
        xe = op.permute(op.einsum("gsec,gsd->gecd", dispatch, x), 1, 0, 2, 3)
        w1, w2 = (op.expand_dims(params[n], 1) for n in ("w1", "w2"))
        ye = op.matmul(activation(self.activation)(op.matmul(xe, w1)), w2)
        y = op.einsum("gsec,gecd->gsd", combine, op.permute(ye, 1, 0, 2, 3))
        if not return_aux:
            return y
        e = self.num_experts
        first = op.one_hot(op.argmax(probs, axis=-1), e, dtype=self.dtype.name)
        load = op.mean(op.stop_gradient(first), axis=(0, 1))
        return y, e * op.sum(load * op.mean(probs, axis=(0, 1)))


class SwitchTransformer(Module):
    """The seeds' SwitchTransformer layer (Fedus et al.): a pre-norm Transformer block whose MLP
    is a mixture of experts with top-1 routing, each token's expert output scaled by that
    expert's router probability,
        x = x + attn(norm1(x));   x = x + p_e(h) * expert_e(h),  h = norm2(x)
    params {"norm1", "attn", "norm2", "moe"}; x [G, S, dim] (each sequence routes its own
    tokens). ``return_aux=True`` also gives the router's load-balancing loss."""

    def __init__(self, dim: int, num_heads: int, hidden: int, num_experts: int,
                 capacity_factor: float = 1.25, causal: bool = False, activation="relu",
                 dtype=np.float32):
        self.norm1, self.norm2 = LayerNorm(dim, dtype=dtype), LayerNorm(dim, dtype=dtype)
        self.attn = MultiHeadAttention(dim, num_heads, causal=causal, dtype=dtype)
        self.moe = MixtureOfExperts(dim, hidden, num_experts, top_k=1,
                                    capacity_factor=capacity_factor, activation=activation,
                                    dtype=dtype)

    def init_params(self, key):
        return {n: getattr(self, n).init_params(key.child(n))
                for n in ("norm1", "attn", "norm2", "moe")}

    def __call__(self, params, x, mask=None, return_aux: bool = False, **kw):
        x = x + self.attn(params["attn"], self.norm1(params["norm1"], x), mask=mask)
        h = self.norm2(params["norm2"], x)
        out = self.moe(params["moe"], h, return_aux=return_aux)
        y, aux = out if return_aux else (out, None)
        # Switch's gate: the chosen expert's router probability (a top-1 softmax gate is 1),
        # through which the router learns
        gate = op.max(op.softmax(op.matmul(h, params["moe"]["router"]["w"]), axis=-1), axis=-1,
                      keepdim=True)
        x = x + y * gate
        return (x, aux) if return_aux else x
