"""One symbolic size (shapes.Sym) for the shape checker, the shape-generic programs'
DynamicSize and the printed IR: random expressions of +, -, *, // and % over symbols and ints,
checked against Python's own integer arithmetic at fresh sizes, and their C (compiled by the
system compiler) against the same."""
import operator
import subprocess

import numpy as np

from tessera.compiler.dynamic import C_HELPERS, DynamicSize, c_expr, evaluate, representative
from tessera.shapes import Sym, show

OPS = [operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod]
NAMES = ("B", "S", "D")


def _expression(rng, depth=0):
    """A random expression as a function of three operands (Python ints, Syms or
    DynamicSizes: each computes it its own way); divisors are positive."""
    if depth >= 3 or rng.random() < 0.25:
        if rng.random() < 0.6:
            name = NAMES[rng.integers(3)]
            return lambda env, name=name: env[name]
        c = int(rng.integers(-20, 21))
        return lambda env, c=c: c
    fn = OPS[rng.integers(len(OPS))]
    a = _expression(rng, depth + 1)
    if fn in (operator.floordiv, operator.mod):     # a divisor that is never 0
        if rng.random() < 0.2:                     # a sum of terms over itself (or a multiple)
            k = int(rng.integers(1, 3))
            return lambda env: fn(k * (a(env) * a(env) + 1), a(env) * a(env) + 1)
        if rng.random() < 0.5:
            c = int(rng.integers(1, 17))
            return lambda env: fn(a(env), c)
        name = NAMES[rng.integers(3)]
        return lambda env: fn(a(env), env[name] * 2 + 1)
    b = _expression(rng, depth + 1)
    return lambda env: fn(a(env), b(env))


def _sizes(rng):
    return {n: int(rng.integers(1, 40)) for n in NAMES}


def test_sym_and_dynamic_size_compute_what_python_computes(rng):
    for _ in range(300):
        e = _expression(rng)
        first, later = _sizes(rng), [_sizes(rng) for _ in range(4)]
        sym = e({n: Sym.var(n) for n in NAMES})
        dyn = e({n: DynamicSize.symbol(n, v) for n, v in first.items()})
        assert int(dyn) == e(first)
        for sizes in [first, *later]:
            want = e(sizes)
            assert (sym.evaluate(sizes) if isinstance(sym, Sym) else sym) == want, str(sym)
            assert evaluate(dyn, sizes) == want, show(dyn)


def test_equal_expressions_are_one_size():
    B, S = Sym.var("B"), Sym.var("S")
    assert (B * 32) // 16 == 2 * B and (B * S) // S == B and (4 * B) % 2 == 0
    assert hash((B + 1) // 2 * S) == hash(S * ((1 + B) // 2))
    assert str((B + 1) // 2) == "((B+1)//2)" and ((B + 1) // 2).evaluate({"B": 5}) == 3
    assert ((B + 1) // 2).atoms() == {"B"} and ((B + 1) // 2).opaque() and not (2 * B).opaque()
    d = DynamicSize.symbol("B", 12)
    assert show(d * 16) == "16*B" and show(-(-d // 4)) == "-((-B)//4)"
    assert representative(d * 3 + 1) == 16 * 3 + 1       # B at 16, the power of two above 12
    # a constant expression stays a size (its programs' structure is that of its neighbours)
    ones = -(-d // d)
    assert isinstance(ones, DynamicSize) and int(ones) == 1 and show(ones) == "1"
    # a sum of terms over itself is 1 (it was the sum: a size of value 1 whose expression said
    # 3*B+2*S, so a program's loop ran 3*B+2*S times where once was meant)
    assert (B + S) // (B + S) == 1 and (B + S) % (B + S) == 0
    w = 3 * d + 2 * DynamicSize.symbol("S", 5)
    for q in (w // w, w % w, divmod(w, w)[0]):
        assert show(q) == str(int(q)) and evaluate(q, {"B": 7, "S": 30}) == int(q)


def test_the_c_of_a_size_computes_what_python_computes(rng, tmp_path):
    cases = []
    for _ in range(120):
        e = _expression(rng)
        sizes = _sizes(rng)
        dyn = e({n: DynamicSize.symbol(n, int(rng.integers(1, 40))) for n in NAMES})
        if isinstance(dyn, DynamicSize):
            cases.append((c_expr(dyn), e(sizes), sizes))
    lines = [f'  {{ int64_t ts_size_B = {s["B"]}, ts_size_S = {s["S"]}, ts_size_D = {s["D"]};\n'
             f'    (void)ts_size_B; (void)ts_size_S; (void)ts_size_D;\n'
             f'    printf("%lld\\n", (long long)({text})); }}' for text, _, s in cases]
    src = tmp_path / "sizes.c"
    src.write_text("#include <stdint.h>\n#include <stdio.h>\n#define TS_INLINE static inline\n"
                   + C_HELPERS + "\nint main(void) {\n" + "\n".join(lines) + "\n  return 0;\n}\n")
    subprocess.run(["cc", "-O1", "-o", str(tmp_path / "sizes"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "sizes")], check=True, capture_output=True, text=True)
    got = [int(v) for v in out.stdout.split()]
    assert got == [want for _, want, _ in cases]
    assert len(cases) > 60 and any("ts_floordiv" in t for t, _, _ in cases) and \
        any("ts_floormod" in t for t, _, _ in cases)
