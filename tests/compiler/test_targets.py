"""Targets are registered objects (tessera/runtime/targets.py): a target added from outside the
compiler, as a user or a plug-in would, compiles and runs through the public API with no
compiler file changed. Two are added here: the CPU target built by another compiler driver
(clang), and a C dialect of our own (a renderer subclass)."""
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import tessera as ts
from tessera.compiler.driver import available_targets
from tessera.compiler.target.c import CRenderer, ShapeGenericC
from tessera.errors import BackendUnavailableError
from tessera.runtime import isa, targets


def _model(x, w):
    return ts.op.softmax(ts.op.matmul(x, w), axis=-1) + ts.op.tanh(x[:, :1])


@pytest.fixture
def registered():
    added = []

    def add(t):
        added.append(t.name)
        return targets.register(t)
    yield add
    for name in added:
        targets.unregister(name)


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not installed")
def test_the_cpu_target_built_by_clang(registered, rng):
    registered(replace(targets.of("cpu"), name="cpuclang", compiler="clang",
                       about="the CPU target's C built by clang"))
    x = rng.standard_normal((6, 40), dtype=np.float32)
    w = rng.standard_normal((40, 24), dtype=np.float32)
    by_gcc = ts.function(_model, target="cpu")
    by_clang = ts.function(_model, target="cpuclang")
    got, want = by_clang(x, w), by_gcc(x, w)
    level = isa.default_level()
    prog = by_clang.lower(x, w)
    assert prog.target == f"cpuclang:{level}" and prog.level == level
    assert prog.target_code == by_gcc.lower(x, w).target_code   # one renderer, two drivers
    # the library really is clang's: its .comment section names the compiler that built it
    assert b"clang version" in open(prog._lib._name, "rb").read()
    # written FMAs, no contraction: the same bits from either compiler
    np.testing.assert_array_equal(got, want)
    ref = x.astype(np.float64) @ w
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref = ref / ref.sum(-1, keepdims=True) + np.tanh(x[:, :1])
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-6)
    assert "cpuclang" in available_targets()


class BannerC(CRenderer):
    """A C dialect: the CPU's C with the test's banner first (a stand-in for a real dialect's
    own prelude, e.g. another C compiler's pragmas)."""
    BANNER = "/* rendered by a target registered from outside the compiler */"

    def prelude(self) -> str:
        return self.BANNER + "\n" + super().prelude()


class BannerGenericC(ShapeGenericC, BannerC):
    pass


def _render_banner(program, level=None, symbols=None):
    r = BannerC(level) if symbols is None else BannerGenericC(symbols, level)
    return r.render(program)


def _doubled_exp(x: ts.Tensor["N", 4]):
    return ts.op.exp(x) * 2


def test_a_c_dialect_with_its_own_renderer(registered, rng):
    cpu = targets.of("cpu")
    registered(targets.Target("bannerc", "c", ".c", render=_render_banner, build=cpu.build,
                              levels=True, about="a C dialect of the test's"))
    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((12, 7)).astype(np.float32)
    f = ts.function(_model, target="bannerc:x86-64-v2" if isa.runs_here("x86-64-v2")
                    else "bannerc")
    got = f(x, w)
    np.testing.assert_array_equal(got, ts.function(_model, target=f.lower(x, w).target
                                                   .replace("bannerc", "cpu"))(x, w))
    assert f.lower(x, w).target_code.startswith(BannerC.BANNER)
    # a shape-generic program goes through the same renderer
    g = ts.function(_doubled_exp, target="bannerc", dynamic=("N",))
    for n in (3, 9):
        a = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(g(a), np.exp(a) * 2, rtol=1e-6)
    assert g.lower(a).target_code.startswith(BannerC.BANNER)


def test_unknown_targets_name_every_registered_one(registered):
    with pytest.raises(BackendUnavailableError) as e:
        ts.function(_model, target="nosuch").lower(np.ones((2, 3), np.float32),
                                                   np.ones((3, 2), np.float32))
    assert "cuda" in str(e.value) and "cpu:LEVEL" in str(e.value)
    registered(replace(targets.of("cpu"), name="another"))
    with pytest.raises(BackendUnavailableError, match="another"):
        targets.resolve("nosuch")
    with pytest.raises(BackendUnavailableError, match="does not exist"):
        targets.resolve("cuda:x86-64-v3")            # only a levelled target takes a level
    with pytest.raises(BackendUnavailableError, match="unknown ISA level"):
        targets.resolve("cpu:pentium")
    with pytest.raises(BackendUnavailableError, match="name"):
        targets.register(replace(targets.of("cpu"), name="a:b"))


def test_the_builtin_targets():
    cpu, cuda, hip = targets.of("cpu"), targets.of("cuda"), targets.of("hip")
    assert (cpu.language, cuda.language, hip.language) == ("c", "cuda", "hip")
    assert (cuda.warp, hip.warp) == (32, 64) and cuda.gpu and hip.gpu and not cpu.gpu
    assert targets.resolve("cpu") == f"cpu:{isa.default_level()}"
    assert targets.resolve("cuda") == "cuda" and targets.level("cuda") is None


def test_import_tessera_registers_the_builtin_targets():
    """In a fresh process (this module imported the driver): `import tessera` is enough."""
    code = ("import tessera\nfrom tessera.runtime import targets\n"
            "print(sorted(targets.names()), targets.of('cpu').language)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["['cpu',", "'cuda',", "'hip']", "c"]
