"""Operators say what, targets say how: tessera/ops/ holds no C, and the C-style targets' table
(tessera/compiler/spelling/) has a row for every operator they compute from templates."""
from pathlib import Path

import pytest

import tessera
from tessera.compiler import spelling
from tessera.compiler.spelling import libm
from tessera.errors import CompileError
from tessera.ops import registry as R

TEMPLATED = (R.Elementwise, R.Reduce, R.Scan, R.ArgReduce, R.Sort)
ROLES = {R.Elementwise: ("elem",), R.Reduce: ("init", "combine"), R.Scan: ("init", "combine"),
         R.ArgReduce: ("better",), R.Sort: ("better",)}


def test_every_templated_operator_has_its_row():
    for name, opdef in R.REGISTRY.items():
        if isinstance(opdef.lowering, TEMPLATED):
            row = spelling.C.get(name)
            assert row is not None, f"{name} has no row in tessera/compiler/spelling"
            for role in ROLES[type(opdef.lowering)]:
                assert getattr(row, role) is not None, f"{name} has no {role} spelling"
    assert set(spelling.C) <= set(R.REGISTRY), "a row for an operator the registry lacks"


def test_a_missing_spelling_is_a_compile_error_that_names_it():
    with pytest.raises(CompileError, match="left_shift for dtype kind 'f'"):
        spelling.template("left_shift", "elem", {}, "f")
    with pytest.raises(CompileError, match="no spelling of matmul"):
        spelling.template("matmul", "elem", {}, "f")
    assert spelling.template("left_shift", "elem", {}, "u").startswith("((({U}){1}")  # u: i's
    assert spelling.helpers("matmul", "f", False) == ()


def test_the_ops_package_holds_no_c():
    ops = Path(tessera.__file__).parent / "ops"
    for path in sorted(ops.rglob("*")):
        if path.suffix in (".c", ".h", ".cuh"):
            pytest.fail(f"C source in tessera/ops/: {path.name}")
        if path.suffix == ".py":
            text = path.read_text()
            for mark in ("TS_INLINE", "{F}(", "{T})", "{acc}", "{best}", "uint64_t"):
                assert mark not in text, f"{path.name} spells C ({mark})"


def test_libm_chunks_come_after_what_they_need():
    assert [c.split("\n")[0] for c in libm.F32["erf"]] == [
        "/* ts_self(c, a, b) = c ? a : b for float, without a branch (c is 0 or 1) */",
        libm.CHUNKS["ts_expf"][0].split("\n")[0], libm.CHUNKS["ts_erff"][0].split("\n")[0]]
    for name, (text, needs) in libm.CHUNKS.items():
        assert f" {name}(" in text and text.endswith("}") and "// ---- " not in text
        assert all(n in libm.CHUNKS for n in needs)
