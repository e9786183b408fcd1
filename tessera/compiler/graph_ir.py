"""Graph IR: SSA values with tensor types, nodes carrying an op, attributes and a source location.

Shape-polymorphic: dims may be symbols. ``str(graph)`` prints the stable text form and
``graph.verify()`` raises IRVerificationError on malformed IR.
"""
from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass

import numpy as np

from .. import dtypes as dt
from .. import ops
from ..errors import (ArgumentError, DTypeError, IRVerificationError, RuntimeFault,
                      SymbolicValueError, TesseraError, UnsupportedDTypeError)
from ..ops.regions import REGION_OPS
from ..types import TensorType
from .dynamic import is_dynamic, size_constant

_ids = itertools.count()


def _quietly_as(r, dtype):
    with np.errstate(over="ignore", invalid="ignore"):   # an IEEE inf is an answer here
        return np.asarray(r, dtype=dtype)


@dataclass(frozen=True)
class SourceLocation:
    filename: str
    lineno: int
    text: str = ""
    function: str = ""

    def __str__(self):
        name = self.filename
        if name.startswith("<ipython-input-") or "ipykernel_" in name:
            return f"{_cell_name(name)}:{self.lineno}"
        return f"{os.path.basename(name)}:{self.lineno}"


def _cell_name(filename: str) -> str:
    """A notebook cell's code as IPython names it in tracebacks: In[3] (the cell run third),
    from the running IPython's map of cell filenames (never imported here: a notebook has
    already); <cell> where that map does not know the file."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    number = getattr(getattr(shell, "compile", None), "_filename_map", {}).get(filename)
    return "<cell>" if number is None else f"In[{number}]"


class Value:
    """An SSA value: a graph parameter or a node's result."""
    __slots__ = ("id", "type", "node", "param_name")

    def __init__(self, type: TensorType, node=None, param_name=None):
        self.id = next(_ids)
        self.type = type
        self.node = node
        self.param_name = param_name

    def __repr__(self):
        return f"<Value {self.param_name or self.id}: {self.type}>"

    # what rules read of a value (as of a traced tensor)
    @property
    def dtype(self):
        return self.type.dtype

    @property
    def shape(self) -> tuple:
        return tuple(self.type.shape)

    @property
    def ndim(self) -> int:
        return len(self.type.shape)


class Node:
    __slots__ = ("op", "inputs", "attrs", "out", "loc", "origin")

    def __init__(self, op: str, inputs, attrs, type: TensorType, loc=None, origin=None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.loc = loc
        self.origin = origin          # "%2:softmax" for nodes a decomposition made
        self.out = Value(type, node=self)

    @property
    def opdef(self):
        return ops.get(self.op)


def make_attrs(opdef, given: dict, types) -> dict:
    unknown = set(given) - set(opdef.attrs)
    if unknown:
        raise TesseraError(f"{opdef.name} has no attribute {sorted(unknown)[0]!r}",
                           expected=", ".join(opdef.attrs) or "no attributes")
    attrs = {**opdef.attrs, **given}
    if opdef.normalize is not None:
        attrs = opdef.normalize(types, attrs)
    return attrs


def check_op(opdef, attrs: dict, types):
    """Normalised attrs and the result type, or a TesseraError saying what is wrong.

    A TypeError or ValueError from an operator's rules means attributes of the wrong kind; with
    symbolic sizes involved it means Python asked a symbol for a number, which the caller may
    answer by tracing with concrete sizes instead."""
    try:
        attrs = make_attrs(opdef, attrs, types)
        out = opdef.infer(types, attrs)
        if (out.dtype.is_complex or any(t.dtype.is_complex for t in types)) and \
                opdef.name not in ops.complex.RULES and not opdef.takes_complex:
            raise UnsupportedDTypeError(f"{opdef.name} does not take complex tensors yet",
                                        received=", ".join(str(t) for t in types),
                                        hint="compute on op.real(z) and op.imag(z)")
        return attrs, out
    except (TypeError, ValueError) as e:
        if any(not t.is_static for t in types):
            raise SymbolicValueError(f"{opdef.name} cannot work out its result with symbolic "
                                     f"sizes: {e}") from None
        raise ArgumentError(f"invalid arguments to {opdef.name}: {e}",
                            expected=_signature(opdef)) from None


def _signature(opdef) -> str:
    operands = "tensors" if opdef.nin == -1 else ", ".join(f"x{i}" for i in range(opdef.nin))
    return f"{opdef.name}({operands}" + "".join(f", {k}={v!r}" for k, v in opdef.attrs.items()) \
        + ")"


class Region:
    """The nested graphs of a structured control-flow operator: ``fori_loop`` (a body over a
    counter), ``while_loop`` (a cond and a body), ``scan`` (a body over slices of xs) or ``cond``
    (a true and a false branch). Graph IR nodes have one result each, so a region's results are
    sibling nodes, one per value it makes, each with attrs {"region": R, "result": i}, placed
    one after another. The node's operands are the kind's own (the carries; for scan then the
    xs; for cond first the predicate) followed by each body's captured tensors, in body order.

    Each body graph's parameters are what the kind passes it (fori_loop: the counter, then the
    carries; while_loop's cond and body: the carries; scan: the carries, then one slice of each
    x; cond: the operands), then its own captures (tensors of the enclosing function it used)."""

    def __init__(self, kind: str, bodies: dict, operands: int, captures: dict, types: list,
                 attrs: dict | None = None, loc=None):
        self.kind = kind
        self.bodies = dict(bodies)              # role -> Graph ("body", "cond", "true", "false")
        self.operands = operands                # how many leading node operands are the kind's
        self.captures = dict(captures)          # role -> how many captured operands it adds
        self.types = list(types)                # the result types, in order
        self.attrs = dict(attrs or {})          # fori_loop: lo, hi (save, carries: it also
                                                # stacks each step's carries); scan: length,
                                                # reverse, carries
        self.loc = loc

    def __repr__(self):
        return f"<region {self.kind} {id(self):#x}>"

    def body_operands(self, role: str, operands: list) -> list:
        """The captured operands of body `role` among a node's operands."""
        start = self.operands
        for r in self.bodies:
            if r == role:
                return operands[start:start + self.captures[r]]
            start += self.captures[r]
        raise KeyError(role)

    def run(self, arrays) -> list:
        """The results on NumPy arrays: the bodies evaluated with the operators' references."""
        arrays = [np.asarray(a) for a in arrays]
        own = arrays[:self.operands]
        caps = {r: self.body_operands(r, arrays) for r in self.bodies}

        def call(role, *args):
            return self.bodies[role].evaluate([*args, *caps[role]])
        if self.kind == "fori_loop":
            carry, saved = own, []
            for i in range(self.attrs["lo"], self.attrs["hi"]):
                saved.append(carry)
                carry = call("body", np.asarray(i, self.bodies["body"].params[0].type.dtype.np),
                             *carry)
            if not self.attrs.get("save"):
                return carry
            # save=true (what differentiating it makes): also the carries each step began with
            return carry + [_stack([s[j] for s in saved], t)
                            for j, t in enumerate(self.types[len(carry):])]
        if self.kind == "while_loop":
            carry = own
            while bool(call("cond", *carry)[0]):
                carry = call("body", *carry)
            return carry
        if self.kind == "scan":
            carries = self.attrs["carries"]
            carry, xs = own[:carries], own[carries:]
            length = self.attrs["length"]
            steps = range(length - 1, -1, -1) if self.attrs["reverse"] else range(length)
            out = [None] * length
            for t in steps:
                res = call("body", *carry, *(x[t] for x in xs))
                carry, out[t] = res[:carries], res[carries:]
            return carry + [_stack([row[j] for row in out], t)
                            for j, t in enumerate(self.types[carries:])]
        if self.kind == "cond":
            return call("true" if bool(own[0]) else "false", *own[1:])
        raise ValueError(self.kind)


def _stack(rows, t) -> np.ndarray:
    """Per-step values stacked along a new first axis (of type t, which says its shape when
    there are no steps)."""
    return np.stack(rows) if rows else np.zeros(tuple(t.shape), t.dtype.np)


class Graph:
    def __init__(self, name: str, params=(), bindings=None):
        self.name = name
        self.params: list[Value] = list(params)
        self.nodes: list[Node] = []
        self.outputs: list[Value] = []
        self.bindings = dict(bindings or {})    # symbol -> size, once specialised
        self.output_structure = "single"        # how the function returned: single | tuple | list
        self.output_tree = None                 # or, for a pytree of results, its structure

    # -- building -------------------------------------------------------------------------------
    def add_param(self, name: str, type: TensorType) -> Value:
        v = Value(type, param_name=name)
        self.params.append(v)
        return v

    def apply(self, opname: str, inputs, attrs=None, loc=None, origin=None) -> Value:
        """Add a node for a registered operator; normalises attrs and infers the result type."""
        opdef = ops.get(opname)
        types = [v.type for v in inputs]
        if opdef.nin >= 0 and len(inputs) != opdef.nin:
            raise TesseraError(f"{opname} takes {opdef.nin} tensor operand(s), got {len(inputs)}")
        attrs, out_type = check_op(opdef, attrs or {}, types)
        node = Node(opname, inputs, attrs, out_type, loc, origin)
        self.nodes.append(node)
        return node.out

    def const(self, value, dtype=None, loc=None, origin=None) -> Value:
        try:
            arr = np.array(value if dtype is None else dt.convert(value, dtype), order="C")
        except OverflowError as e:
            raise DTypeError(f"the constant {value!r} does not fit in {dt.get(dtype).name}: {e}",
                             hint="cast the tensor to a wider dtype first") from None
        arr = dt.native(arr)
        if is_dynamic(value) and arr.dtype.kind in "fi" and arr.dtype.itemsize >= 4:
            # a count of a dynamic size, computed in the C: converted there as NumPy did here
            # (to float32 or float64 rounding to nearest; 16-bit floats keep the number)
            arr = size_constant(arr, value)
        arr.setflags(write=False)
        t = TensorType(dt.from_numpy(arr.dtype), tuple(arr.shape))
        node = Node("const", [], {"value": arr}, t, loc, origin)
        self.nodes.append(node)
        return node.out

    # -- queries --------------------------------------------------------------------------------
    def names(self) -> dict:
        """Display names: parameters by name, node results numbered in order."""
        names = {p.id: f"%{p.param_name}" for p in self.params}
        for i, n in enumerate(self.nodes):
            names[n.out.id] = f"%{i}"
        return names

    def siblings(self, n: "Node") -> list:
        """The nodes of a control-flow operator's results (n one of them), in graph order."""
        region = n.attrs["region"]
        return [m for m in self.nodes if m.op == n.op and m.attrs["region"] is region]

    def move_before(self, v: Value, n: "Node") -> Value:
        """Move the node making v to just before node n (a rewrite's new node goes where the
        node it replaces was); returns v."""
        self.nodes.remove(v.node)
        self.nodes.insert(self.nodes.index(n), v.node)
        return v

    def replace_uses(self, old: Value, new: Value):
        for n in self.nodes:
            n.inputs = [new if v is old else v for v in n.inputs]
        self.outputs = [new if v is old else v for v in self.outputs]

    def clone(self) -> "Graph":
        g = Graph(self.name, bindings=self.bindings)
        vmap = {}
        for p in self.params:
            vmap[p.id] = g.add_param(p.param_name, p.type)
        for n in self.nodes:
            m = Node(n.op, [vmap[v.id] for v in n.inputs], n.attrs, n.out.type, n.loc, n.origin)
            g.nodes.append(m)
            vmap[n.out.id] = m.out
        g.outputs = [vmap[v.id] for v in self.outputs]
        g.output_structure = self.output_structure
        g.output_tree = self.output_tree
        return g

    def evaluate(self, arrays, keep=None) -> list:
        """The graph evaluated node by node with the NumPy references (an index out of range is
        a RuntimeFault naming the node); a result nobody uses is not computed. `keep(array,
        node)`: what is kept of a node's result and of a constant (default: the result in the
        node's dtype, the constant as it is)."""
        as_is = keep is None
        keep = keep or (lambda r, n: _quietly_as(r, n.out.type.dtype.np))
        env = {p.id: np.asarray(a) for p, a in zip(self.params, arrays)}
        live = {v.id for v in self.outputs}
        for n in reversed(self.nodes):
            if n.out.id in live:
                live.update(v.id for v in n.inputs)
        done = {}                       # a region's results, computed once for its siblings
        for n in self.nodes:
            if n.out.id not in live:
                continue
            if n.op == "const":
                env[n.out.id] = n.attrs["value"] if as_is else keep(n.attrs["value"], n)
                continue
            args = [env[v.id] for v in n.inputs]
            try:
                if n.op in REGION_OPS:
                    region = n.attrs["region"]
                    if region not in done:
                        done[region] = region.run(args)
                    r = done[region][n.attrs["result"]]
                else:
                    r = ops.registry.run_reference(n.opdef, args, n.attrs)
            except IndexError as e:
                raise RuntimeFault(str(e), function=self.name, location=n.loc,
                                   op=n.op) from None
            env[n.out.id] = keep(r, n)
        return [np.array(env[v.id]) for v in self.outputs]

    # -- checking -------------------------------------------------------------------------------
    def verify(self):
        defined = {p.id for p in self.params}
        names = [p.param_name for p in self.params]
        if len(defined) != len(self.params) or len(set(names)) != len(names):
            raise IRVerificationError(f"graph @{self.name}: a parameter is defined twice")
        if not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise IRVerificationError(f"graph @{self.name}: parameter names must be identifiers")
        if not self.outputs:
            raise IRVerificationError(f"graph @{self.name}: the graph returns nothing")
        for n in self.nodes:
            if n.op != "const" and n.op not in ops.REGISTRY:
                raise IRVerificationError(f"graph @{self.name}: unknown operator {n.op!r}")
            if n.op == "const" and not isinstance(n.attrs.get("value"), np.ndarray):
                raise IRVerificationError(f"graph @{self.name}: a const without an array value")
            nin = -1 if n.op == "const" else n.opdef.nin
            if nin >= 0 and len(n.inputs) != nin or n.op == "const" and n.inputs:
                raise IRVerificationError(f"graph @{self.name}: {n.op} has {len(n.inputs)} "
                                          "operands")
            for v in n.inputs:
                if v.id not in defined:
                    raise IRVerificationError(f"graph @{self.name}: {n.op} uses a value before "
                                              f"it is defined")
            if n.out.id in defined:
                raise IRVerificationError(f"graph @{self.name}: value defined twice by {n.op}")
            if n.op == "const":
                arr = n.attrs["value"]
                ok = n.out.type == TensorType(dt.from_numpy(arr.dtype), tuple(arr.shape))
            else:
                try:
                    ok = n.opdef.infer([v.type for v in n.inputs], n.attrs) == n.out.type
                except TesseraError as e:
                    raise IRVerificationError(f"graph @{self.name}: {n.op} no longer type-checks: "
                                              f"{e.summary}") from None
            if not ok:
                raise IRVerificationError(f"graph @{self.name}: the type of {n.op}'s result "
                                          f"({n.out.type}) disagrees with its operands")
            if n.op in REGION_OPS and n.attrs["result"] == 0:
                for body in n.attrs["region"].bodies.values():
                    body.verify()
            defined.add(n.out.id)
        for v in self.outputs:
            if v.id not in defined:
                raise IRVerificationError(f"graph @{self.name}: an output is never defined")
        return self

    # -- text form ------------------------------------------------------------------------------
    def __str__(self):
        names = self.names()
        head = f"graph @{self.name}"
        if self.bindings:
            head += " [" + ", ".join(f"{k}={v}" for k, v in self.bindings.items()) + "]"
        params = ", ".join(f"{names[p.id]}: {p.type}" for p in self.params)
        rets = ", ".join(str(v.type) for v in self.outputs)
        lines = [f"{head}({params}) -> {rets} {{"]
        rows, printed = [], set()
        for n in self.nodes:
            args = ", ".join(names[v.id] for v in n.inputs)
            attrs = format_attrs(n.attrs)
            left = f"{names[n.out.id]} = {n.op}({args})" + (f" {attrs}" if attrs else "")
            if n.op in REGION_OPS:      # its sibling results on one line, then its bodies
                region = n.attrs["region"]
                if region in printed:
                    continue
                printed.add(region)
                sibs = self.siblings(n)
                attrs = format_attrs({k: v for k, v in region.attrs.items() if k != "carries"})
                left = (", ".join(names[m.out.id] for m in sibs) + f" = {n.op}({args})"
                        + (f" {attrs}" if attrs else ""))
                n = sibs[0]
            note = []
            if n.loc is not None:
                note.append(str(n.loc))
            if n.origin:
                note.append(f"from {n.origin}")
            if n.op in REGION_OPS:
                types = ", ".join(str(m.out.type) for m in sibs)
                rows.append((left, f": {types}", ("# " + ", ".join(note)) if note else "",
                             [f"{role} = {body}" for role, body in region.bodies.items()]))
                continue
            rows.append((left, f": {n.out.type}", ("# " + ", ".join(note)) if note else "", ()))
        w1 = min(max((len(r[0]) for r in rows), default=0), 56)
        w2 = min(max((len(r[1]) for r in rows), default=0), 28)
        for left, ty, note, bodies in rows:
            lines.append(f"  {left:<{w1}}  {ty:<{w2}}  {note}".rstrip())
            for body in bodies:       # nested graphs, indented under their operator
                lines += ["      " + line for line in body.split("\n")]
        lines.append("  return " + ", ".join(names[v.id] for v in self.outputs))
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<Graph @{self.name}: {len(self.nodes)} nodes>"

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def format_value(v) -> str:
    if isinstance(v, bool) or isinstance(v, np.bool_):
        return "true" if v else "false"
    if isinstance(v, np.ndarray):
        if v.ndim == 0:
            return format_value(v.item()) if v.dtype.kind in "biu" else str(v[()])
        if v.size <= 4:
            return "[" + ",".join(format_value(x) for x in v.ravel().tolist()) + "]"
        return f"<{dt.from_numpy(v.dtype).short}{list(v.shape)}>".replace(" ", "")
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v
    return str(v)


def format_attrs(attrs: dict) -> str:
    if not attrs:
        return ""
    return "{" + ", ".join(f"{k}={format_value(v)}" for k, v in attrs.items()) + "}"


class Builder:
    """What decompositions and adjoint rules write Graph IR with: operators added to one graph at
    one location, marked with their origin. Python numbers among the operands become constants
    and operands are converted as the operator's promotion rule asks, as in a traced call."""

    def __init__(self, graph: Graph, loc=None, origin=None):
        self.graph, self.loc, self.origin = graph, loc, origin

    def op(self, name, *args, **attrs) -> Value:
        opdef = ops.get(name)
        listed = opdef.nin == -1 and len(args) == 1 and isinstance(args[0], (list, tuple))
        items = [v if isinstance(v, Value) or ops.registry.is_scalar(v) else
                 self.graph.const(v, loc=self.loc, origin=self.origin)
                 for v in (args[0] if listed else args)]
        want = ops.registry.operand_dtypes(
            opdef, [v.type.dtype if isinstance(v, Value) else v for v in items], attrs)
        values = []
        for k, v in enumerate(items):
            if not isinstance(v, Value):
                v = self.graph.const(v, want[k] if want is not None else None, loc=self.loc,
                                     origin=self.origin)
            elif want is not None and v.type.dtype != want[k]:
                v = self.graph.apply("cast", [v], {"dtype": want[k].name}, loc=self.loc,
                                     origin=self.origin)
            values.append(v)
        return self.add(name, values, attrs)

    def add(self, name, values, attrs) -> Value:
        """Add the operator on its converted operands (a decomposition expands it here)."""
        return self.graph.apply(name, values, attrs, loc=self.loc, origin=self.origin)

    def scan(self, body, init: list, xs: list, reverse: bool = False) -> list:
        """A scan region a rule writes (an adjoint that is a recurrence): body(builder,
        carries, x slices) -> (new carries, ys), over the first axis of xs; returns the final
        carries and the stacked ys. The body sees only its parameters (and constants)."""
        g = Graph("body")
        cs = [g.add_param(f"a{j}", v.type) for j, v in enumerate(init)]
        ts = [g.add_param(f"a{len(init) + j}", TensorType(v.type.dtype, tuple(v.type.shape[1:])))
              for j, v in enumerate(xs)]
        carries, ys = body(Builder(g, self.loc, self.origin), cs, ts)
        g.outputs = [*carries, *ys]
        n = xs[0].type.shape[0]
        types = [v.type for v in init] + [TensorType(y.type.dtype, (n, *y.type.shape))
                                          for y in ys]
        region = Region("scan", {"body": g}, len(init) + len(xs), {"body": 0}, types,
                        {"length": n, "reverse": bool(reverse), "carries": len(init)}, self.loc)
        return [self.graph.apply("scan", [*init, *xs], {"region": region, "result": i},
                                 loc=self.loc, origin=self.origin) for i in range(len(types))]

    def const(self, value, dtype) -> Value:
        return self.graph.const(value, dtype, loc=self.loc, origin=self.origin)

    def const_like(self, value, like: Value) -> Value:
        """A rank-0 constant in ``like``'s dtype."""
        return self.const(dt.convert(value, like.type.dtype), None)

    @staticmethod
    def type(v: Value) -> TensorType:
        return v.type
