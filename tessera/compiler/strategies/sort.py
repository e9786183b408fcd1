"""sort: a stable sort of each line along one axis (sort, argsort), alone. Elements are ordered
by the entry's `better` (NaN last ascending, first descending); equal elements keep their index
order, so the result is one permutation on every target.
CPU: a bottom-up merge sort of the line's indices in a heap scratch of 2n (log2 n passes, each
merge taking from the left run unless the right one's element goes strictly before), the
lines in parallel; the last pass stores the indices or the values they pick.
GPU: a thread per element counts the elements that go before it (n comparisons: quadratic in
the line's length, meant for routing widths) and stores itself at that rank.
"""
from __future__ import annotations

from ... import dtypes as dt
from ...ops import registry as R
from ..emit import (Names, axis_groups, contiguous, finish, idx_min, launch_of, nest, read,
                    split_index)
from ..tile_ir import (Assign, Bin, Const, Decl, Load, Loop, OpCall, Scratch, Select, Store, Var,
                       idx_add, idx_mul, linear)
from .base import Strategy, register, worth_threads


class SortStrategy(Strategy):
    name = "sort"
    grows = False

    def claims(self, n) -> bool:
        return isinstance(n.opdef.lowering, R.Sort)

    def node_flops(self, n) -> int:               # comparisons of the merge sort
        t = n.inputs[0].type
        line = max(1, t.shape[n.attrs["axis"]])
        return t.numel() * max(1, (line - 1).bit_length())

    def cpu_knobs(self, k) -> dict:
        t = k.inputs[0].type
        lines = t.numel() // max(1, t.shape[k.attrs["axis"]])
        return {"parallel": lines >= 2 and worth_threads(t.numel())}

    def lower_cpu(self, k, code):
        return merge_sort(k, code)

    def lower_gpu(self, k, code, target, knobs):
        return rank_sort(k, knobs)


register(SortStrategy())


class _Line:
    """One line of the kernel's input along the axis: where its element i lies, whether one
    element goes before another, and what the output stores for element i."""

    def __init__(self, k):
        self.k, self.x = k, k.inputs[0]
        shape, axis = list(self.x.type.shape), k.attrs["axis"]
        self.n = shape[axis]
        # the lines' extents (for the loops or threads over them) and the strides of a line's
        # start and of its elements (input and output: one layout)
        self.lines, kept_st, _, _, _ = axis_groups(shape, {axis})
        self.strides = kept_st + [contiguous(shape)[axis]]
        self.kvars = []               # the line's indices, once the loops or threads give them

    def at(self, i):
        return linear([*self.kvars, i], self.strides)

    def before(self, i, j):
        """Element i goes strictly before element j."""
        a, b = read(self.x, self.at(i)), read(self.x, self.at(j))
        if self.k.attrs["descending"]:
            a, b = b, a
        return OpCall(self.k.op, "better", (), self.x.type.dtype, dt.bool_, (a, b))

    def store(self, pos, i):
        value = read(self.x, self.at(i)) if R.get(self.k.op).lowering.values else i
        return Store(self.k.output.name, self.at(pos), value)


def merge_sort(k, code):
    names, line = Names(), _Line(k)
    n = line.n
    outer, inner, line.kvars = nest(line.lines, names, k.knobs.get("parallel"), False)
    if n == 0:
        return []
    if n == 1:
        return finish(k, inner, outer, [line.store(Const(0), Const(0))])
    s, j = names("perm"), names("j")
    body = [Loop(j, n, "serial", [Store(s, Var(j), Var(j))])]
    width, src = 1, 0
    while width < n:
        last = 2 * width >= n
        body.append(_merge_pass(line, names, s, n, width, src, None if last else n - src))
        width, src = 2 * width, n - src
    return finish(k, inner, outer, [Scratch(s, dt.int64, 2 * n, code, body)])


def _merge_pass(line, names, s, n, width, src, dst):
    """Merge each pair of sorted runs of `width` indices at s[src:] into s[dst:] (the output
    when dst is None). The right run's element is taken only when it goes strictly before the
    left's: equal elements stay in index order."""
    t, e = names("run"), names("e")
    a0, a1, b1, ia, ib = (names(v) for v in ("a0", "a1", "b1", "ia", "ib"))
    ea, eb, right, pick = names("ea"), names("eb"), names("right"), names("pick")
    i64 = dt.int64
    start = idx_mul(Var(t), Const(2 * width))
    store = (line.store(idx_add(Var(a0), Var(e)), Var(pick)) if dst is None else
             Store(s, idx_add(Const(dst), idx_add(Var(a0), Var(e))), Var(pick)))
    merge = Loop(e, Bin("-", Var(b1), Var(a0)), "serial", [
        # the runs' heads, clamped to their last element once a run is used up
        Decl(ea, i64, Load(s, idx_add(Const(src), idx_min(Var(ia), Bin("-", Var(a1), Const(1)))))),
        Decl(eb, i64, Load(s, idx_add(Const(src), idx_min(Var(ib), Bin("-", Var(b1), Const(1)))))),
        Decl(right, dt.bool_, Bin("&&", Bin("<", Var(ib), Var(b1)),
                                  Bin("||", Bin(">=", Var(ia), Var(a1)),
                                      line.before(Var(eb), Var(ea))))),
        Decl(pick, i64, Select(Var(right), Var(eb), Var(ea))),
        store,
        Assign(ia, Bin("+", Var(ia), Select(Var(right), Const(0), Const(1)))),
        Assign(ib, Bin("+", Var(ib), Select(Var(right), Const(1), Const(0))))])
    return Loop(t, -(-n // (2 * width)), "serial", [
        Decl(a0, i64, start),
        Decl(a1, i64, idx_min(idx_add(Var(a0), Const(width)), Const(n))),
        Decl(b1, i64, idx_min(idx_add(Var(a0), Const(2 * width)), Const(n))),
        Decl(ia, i64, Var(a0)), Decl(ib, i64, Var(a1)),
        merge])


def rank_sort(k, knobs):
    names, line = Names(), _Line(k)
    g, j, rank = names("g"), names("j"), names("rank")
    *line.kvars, i = split_index(Var(g), line.lines + [line.n])
    # j goes before i: strictly, or equal with the lower index
    goes_before = Select(Bin("<", Var(j), i), Select(line.before(i, Var(j)), Const(0), Const(1)),
                         Select(line.before(Var(j), i), Const(1), Const(0)))
    body = [Decl(rank, dt.int64, Const(0)),
            Loop(j, line.n, "serial", [Assign(rank, Bin("+", Var(rank), goes_before))]),
            line.store(Var(rank), i)]
    total = k.output.type.numel()
    return [Loop(g, total, "grid", body)], launch_of(total, knobs["threads"])
