"""Pipeline parallelism: the model's stages on the ranks of one mesh axis, micro-batches flowing
through them in the 1F1B order.

``dist.Pipeline(stages, mesh=mesh, axis="pp", loss=loss)`` with ``stages[s](params_s, x) -> y``;
``pipe.value_and_grad(params, x, target, micro_batches=M)`` returns the mean loss over the M
micro-batches and every stage's gradient. Rank s of the axis runs stage s: after P-s-1 forwards
(the warm-up) it alternates one forward and one backward, sending activations to rank s+1 and
cotangents to rank s-1 (MPI point-to-point, each send posted without waiting, so neighbours
never wait on each other's sends), so at most P-s micro-batches' inputs are kept. A backward
recomputes its stage's forward from the kept input (``ts.vjp``): the memory of activation
checkpointing. On virtual devices the stages run in turn in this process.

The numbers: each stage's gradient is its micro-batches' gradients combined by the fixed tree
in micro-batch order and divided by M, the loss likewise, so a pipeline gives the same bits on
virtual devices and on MPI ranks, and the mean over micro-batches is `dist.batch_mean`'s.
"""
from __future__ import annotations

import numpy as np

from ..errors import ShardingError
from ..function import function
from ..pytree import tree_map
from .data_parallel import tree_sum
from .layout import at_user_line


class Pipeline:
    """``stages``: functions ``f(params, x) -> y``, one per rank of ``axis`` (in order);
    ``loss(y, target) -> scalar`` after the last."""

    @at_user_line
    def __init__(self, stages, mesh, axis="pp", loss=None):
        (self.axis,) = mesh.check_axis(axis)
        if len(stages) != mesh.shape[self.axis]:
            raise ShardingError(f"{len(stages)} stages on a mesh axis of "
                                f"{mesh.shape[self.axis]} ranks", hint="one stage per rank")
        if loss is None:
            raise ShardingError("a Pipeline needs loss=: the scalar its backward starts from")
        self.mesh = mesh
        self.stages = [s if hasattr(s, "signature") else function(s) for s in stages]
        self.loss = loss

    @at_user_line
    def value_and_grad(self, params, x, target, micro_batches: int):
        """(mean loss, per-stage gradients) over ``micro_batches`` equal parts of the batch.
        Under MPI each rank gets the loss and its own stage's gradients (None for the others);
        on virtual devices every stage's."""
        from ..autodiff import value_and_grad, vjp
        m = int(micro_batches)
        n = np.shape(x)[0]
        if n % m or np.shape(target)[0] != n:
            raise ShardingError(f"a batch of {n} (targets {np.shape(target)[0]}) does not split "
                                f"into {m} equal micro-batches")
        size = n // m
        xs = [x[i * size:(i + 1) * size] for i in range(m)]
        ts_ = [target[i * size:(i + 1) * size] for i in range(m)]
        loss_grad = value_and_grad(self.loss)
        eng = self.mesh.engine
        p = len(self.stages)
        mine = sorted({self.mesh.coords(r)[self.axis] for r in eng.ranks})
        losses, grads = [None] * m, {s: [None] * m for s in mine}

        def forward(s, i, inp):
            y, back = vjp(self.stages[s], params[s], inp)
            if s == p - 1:
                losses[i], dy = loss_grad(y, ts_[i])
                return y, back, dy
            return y, back, None

        def backward(s, i, back, dy):
            dp, dx = back(dy)
            grads[s][i] = dp
            return dx

        if eng.name == "virtual":          # every stage here: in turn, micro-batch by batch
            for i in range(m):
                pulls, h = [], xs[i]
                for s in range(p):
                    h, back, dy = forward(s, i, h)
                    pulls.append(back)
                for s in reversed(range(p)):
                    dy = backward(s, i, pulls[s], dy)
        else:
            (s,) = mine
            self._one_f_one_b(s, m, xs, forward, backward)
        loss = self._loss_everywhere(losses, m, mine)
        out = [None] * p
        for s in mine:
            out[s] = _tree_mean(grads[s])
        return loss, out

    def _one_f_one_b(self, s, m, xs, forward, backward):
        eng, p = self.mesh.engine, len(self.stages)
        group = self.mesh.group(eng.rank, (self.axis,))
        prev, nxt = (group[s - 1] if s else None), (group[s + 1] if s < p - 1 else None)
        pending, kept = [], {}
        warm = min(p - s - 1, m)

        def fwd(i):
            inp = xs[i] if prev is None else eng.recv(prev, tag=1)
            y, back, dy = forward(s, i, inp)
            kept[i] = (back, dy)
            if nxt is not None:
                pending.append(eng.isend(y, nxt, tag=1))

        def bwd(i):
            back, dy = kept.pop(i)
            if nxt is not None:
                dy = eng.recv(nxt, tag=2)
            dx = backward(s, i, back, dy)
            if prev is not None:
                pending.append(eng.isend(dx, prev, tag=2))
        for i in range(warm):
            fwd(i)
        for i in range(m - warm):
            fwd(warm + i)
            bwd(i)
        for i in range(m - warm, m):
            bwd(i)
        for req in pending:
            req.wait()

    def _loss_everywhere(self, losses, m, mine):
        """The mean loss (the tree over micro-batches), sent from the last stage to all."""
        p, eng = len(self.stages), self.mesh.engine
        loss = _tree_mean(losses) if p - 1 in mine else None
        if eng.name == "virtual":
            return loss
        return eng.bcast(loss, root=self.mesh.group(eng.rank, (self.axis,))[p - 1])


def _tree_mean(parts):
    """Micro-batch results (pytrees) summed leaf by leaf by the fixed tree, over their count."""
    total = tree_sum(parts)
    return tree_map(lambda t: t / np.asarray(len(parts), t.dtype), total)
