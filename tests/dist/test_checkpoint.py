"""tessera.checkpoint: trees of sharded tensors, arrays and numbers saved and loaded with their
bits, on the same mesh or resharded onto another, by one process or by MPI ranks each writing its
blocks; a save that fails leaves the previous checkpoint, a damaged one is an error naming it,
and a training run killed (SIGKILL) at a random moment resumes to the bits of a run never
interrupted."""
import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from tessera import checkpoint, dist, op
from tessera.errors import ArgumentError, RankFailure, ShardingError, TesseraError

ROW = dist.ShardSpec(("row",), ("dp",))
Pair = collections.namedtuple("Pair", "first second")


def same_bits(got, want):
    """The same dtype, shape and bytes (NaNs and bfloat16 included)."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


def listing(root: Path) -> dict:
    """Every file under ``root`` with its bytes: what a failed save must leave unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def manifest(path) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def block_dir(path) -> Path:
    return Path(path) / manifest(path)["blocks"]


# ---- on virtual devices --------------------------------------------------------------------------
def test_a_tree_of_sharded_tensors_arrays_and_numbers_round_trips(rng, tmp_path):
    mesh4 = dist.Mesh(axes=["dp"], devices=range(4))
    mesh22 = dist.Mesh(axes=["a", "b"], devices=range(4))
    w = rng.standard_normal((8, 6)).astype(np.float32)
    w[1, 2] = np.nan
    g = rng.standard_normal((8, 6))
    e = rng.standard_normal((4, 8)).astype(ts.bf16.np)
    r = rng.integers(-9, 9, 5).astype(np.int64)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 3)))
    params = {
        "w": dist.shard(w, ROW, mesh4),                                         # rows split
        "g": dist.shard(g, dist.ShardSpec(("row", "col"), ("a", "b")), mesh22),  # 2-D split
        "emb": dist.shard(e, dist.ShardSpec.per_dim(None, "b"), mesh22),    # bf16, half replicated
        "r": dist.shard(r, None, mesh4),                                       # replicated
        "layers": [{"k": rng.standard_normal((3, 3)), "s": np.float32(rng.standard_normal())},
                   (rng.standard_normal(2).astype(ts.bf16.np), np.int32(7), None)],
        "pair": Pair(rng.integers(0, 255, 4).astype(np.uint8), "relu"),
        "numbers": [3, -2.5e-300, float("inf"), True, 1 - 2j, 12345678901234567890],
        7: np.zeros((0, 3), np.float32),
    }
    opt_state = {"step": np.asarray(5, np.int64),
                 "m": {"w": dist.shard(w * 2, ROW, mesh4)},
                 "sum": dist.shard(a, dist.ShardSpec.per_dim(None, "dp"), mesh4) @
                 dist.shard(b, ROW, mesh4)}                                 # a pending sum
    assert opt_state["sum"].type_str == "f32[4, 3] +sum@dp"
    step = int(rng.integers(1 << 40))
    path = tmp_path / "ckpt"
    checkpoint.save(path, params, opt_state, step)
    assert checkpoint.latest_step(path) == step
    p2, o2, s2 = checkpoint.load(path)
    assert s2 == step and list(p2) == list(params)
    for k in ("w", "g", "emb", "r"):
        X, Y = params[k], p2[k]
        assert isinstance(Y, dist.DTensor) and Y.layout == X.layout and Y.mesh == X.mesh
        assert Y.type_str == X.type_str
        same_bits(dist.gather(Y), {"w": w, "g": g, "emb": e, "r": r}[k])
        for rank in range(4):
            same_bits(Y.blocks[rank], X.blocks[rank])
    k0, k1 = params["layers"], p2["layers"]
    same_bits(k1[0]["k"], k0[0]["k"])
    assert type(k1[0]["s"]) is np.float32 and k1[0]["s"] == k0[0]["s"]
    assert isinstance(k1[1], tuple) and k1[1][2] is None and type(k1[1][1]) is np.int32
    same_bits(k1[1][0], k0[1][0])
    assert isinstance(p2["pair"], Pair) and p2["pair"].second == "relu"
    same_bits(p2["pair"].first, params["pair"].first)
    assert p2["numbers"] == params["numbers"]
    assert [type(v) for v in p2["numbers"]] == [int, float, float, bool, complex, int]
    same_bits(p2[7], params[7])
    # the loaded arrays are the caller's to change
    k1[0]["k"][0, 0] = 1.0
    p2["w"].blocks[0][0, 0] = 1.0
    # the optimizer state; the pending sum was taken (the tree in rank order), its split kept
    same_bits(o2["step"], opt_state["step"])
    same_bits(dist.gather(o2["m"]["w"]), w * 2)
    assert o2["sum"].type_str == "f32[4, 3]"
    parts = [a[:, 2 * i:2 * i + 2] @ b[2 * i:2 * i + 2] for i in range(4)]
    same_bits(dist.gather(o2["sum"]), (parts[0] + parts[1]) + (parts[2] + parts[3]))
    np.testing.assert_allclose(dist.gather(o2["sum"]), a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)
    # each distinct block is one file, written by the lowest rank holding it
    man = manifest(path)
    by_path = {x["path"]: x for x in man["leaves"]}
    assert [blk["rank"] for blk in by_path["params/emb"]["blocks"]] == [0, 1]
    assert by_path["params/emb"]["dtype"] == "bfloat16"
    assert [blk["rank"] for blk in by_path["params/r"]["blocks"]] == [0]
    assert len(by_path["params/g"]["blocks"]) == 4
    files = {blk["file"] for x in man["leaves"] for blk in x.get("blocks", [x]) if "file" in blk}
    assert files == {p.name for p in block_dir(path).iterdir()}


def test_none_trees_and_a_lone_array(rng, tmp_path):
    x = rng.standard_normal(4)
    checkpoint.save(tmp_path / "c", x)
    p, o, s = checkpoint.load(tmp_path / "c")
    same_bits(p, x)
    assert o is None and s == 0


def test_load_reshards_onto_other_meshes(rng, tmp_path):
    """Saved as 4 row blocks; loaded as 2 and 3 row blocks (blocks straddling the saved ones)
    and onto a 2x2 mesh split both ways, by a dict of paths or a function."""
    mesh4 = dist.Mesh(axes=["dp"], devices=range(4))
    w = rng.standard_normal((12, 6)).astype(np.float32)
    h = rng.standard_normal((12, 4)).astype(ts.bf16.np)
    path = tmp_path / "ckpt"
    checkpoint.save(path, {"w": dist.shard(w, ROW, mesh4)}, {"h": dist.shard(h, ROW, mesh4)}, 9)
    for n in (2, 3):
        mesh = dist.Mesh(axes=["dp"], devices=range(n))
        p, o, step = checkpoint.load(path, mesh=mesh)
        assert step == 9 and p["w"].mesh == mesh and p["w"].type_str == "f32[12@dp, 6]"
        rows = 12 // n
        for r in range(n):
            same_bits(p["w"].blocks[r], w[r * rows:(r + 1) * rows])
            same_bits(o["h"].blocks[r], h[r * rows:(r + 1) * rows])
    mesh22 = dist.Mesh(axes=["a", "b"], devices=range(4))
    both = dist.ShardSpec(("row", "col"), ("a", "b"))
    p, o, _ = checkpoint.load(path, mesh=mesh22, layouts={"params/w": both,
                                                         "opt_state/h": dist.ShardSpec(("col",),
                                                                                       ("b",))})
    assert p["w"].type_str == "f32[12@a, 6@b]" and o["h"].type_str == "bf16[12, 4@b]"
    same_bits(dist.gather(p["w"]), w)
    same_bits(p["w"].blocks[mesh22.rank_of({"a": 1, "b": 0})], w[6:, :3])
    same_bits(o["h"].blocks[mesh22.rank_of({"a": 1, "b": 1})], h[:, 2:])
    seen = []

    def choose(where, shape, saved):
        seen.append((where, shape, saved))
        return both if where == "params/w" else None
    p, o, _ = checkpoint.load(path, mesh=mesh22, layouts=choose)
    assert [s[:2] for s in seen] == [("params/w", (12, 6)), ("opt_state/h", (12, 4))]
    assert seen[0][2] == dist.Layout((("dp",), ()))
    assert o["h"].type_str == "bf16[12, 4]"
    same_bits(dist.gather(p["w"]), w)
    same_bits(o["h"].blocks[3], h)
    # the saved layout's axis is not in this mesh: an error that says how to give another
    with pytest.raises(ShardingError, match="'dp' is not in the mesh") as e:
        checkpoint.load(path, mesh=mesh22)
    assert "params/w" in str(e.value) and "layouts=" in str(e.value)
    with pytest.raises(ArgumentError, match="params/v"):
        checkpoint.load(path, mesh=mesh22, layouts={"params/v": both})


# ---- atomicity and damage ------------------------------------------------------------------------
def test_a_failed_save_leaves_the_previous_checkpoint(rng, tmp_path, monkeypatch):
    mesh4 = dist.Mesh(axes=["dp"], devices=range(4))
    w = rng.standard_normal((8, 4)).astype(np.float32)
    path = tmp_path / "ckpt"
    checkpoint.save(path, {"w": dist.shard(w, ROW, mesh4), "b": w[0]}, None, 1)
    before = listing(tmp_path)
    new = {"w": dist.shard(w + 1, ROW, mesh4), "b": w[1]}

    def still_the_old_one():
        assert listing(tmp_path) == before          # nothing left behind, nothing changed
        p, _, step = checkpoint.load(path)
        assert step == 1
        same_bits(dist.gather(p["w"]), w)
        same_bits(p["b"], w[0])

    # the third block file fails to write (a full disk, say)
    calls, real = [], checkpoint._write_npy

    def failing(where, arr):
        calls.append(where)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(where, arr)
    monkeypatch.setattr(checkpoint, "_write_npy", failing)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(path, new, None, 2)
    monkeypatch.undo()
    still_the_old_one()
    # the manifest cannot be put in place
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        checkpoint.save(path, new, None, 2)
    monkeypatch.undo()
    still_the_old_one()
    # a leaf that cannot be saved: refused before anything is written
    with pytest.raises(ArgumentError, match="params/bad: a leaf of type object cannot be saved"):
        checkpoint.save(path, {**new, "bad": object()}, None, 2)
    with pytest.raises(ArgumentError, match="step must be an integer"):
        checkpoint.save(path, new, None, 2.5)
    still_the_old_one()
    # a failed first save leaves no directory at all
    monkeypatch.setattr(checkpoint, "_write_npy", failing)
    calls.clear()
    with pytest.raises(OSError):
        checkpoint.save(tmp_path / "fresh", new, None, 2)
    monkeypatch.undo()
    assert not (tmp_path / "fresh").exists()
    # what a save killed midway leaves (blocks no manifest names, a manifest not yet renamed)
    # is ignored by load and removed by the next save
    (path / "blocks.0123456789abcdef").mkdir()
    (path / "blocks.0123456789abcdef" / "00000.0000.npy").write_bytes(b"half")
    (path / ".manifest.0123456789abcdef.tmp").write_text('{"format": "tess')
    p, _, _ = checkpoint.load(path)
    same_bits(dist.gather(p["w"]), w)
    checkpoint.save(path, new, None, 2)
    assert sorted(os.listdir(path)) == sorted(["manifest.json", manifest(path)["blocks"]])
    p, _, step = checkpoint.load(path)
    assert step == 2
    same_bits(dist.gather(p["w"]), w + 1)


def test_a_damaged_checkpoint_is_an_error_naming_it(rng, tmp_path):
    mesh4 = dist.Mesh(axes=["dp"], devices=range(4))
    w = rng.standard_normal((8, 4)).astype(np.float32)
    path = tmp_path / "ckpt"
    with pytest.raises(TesseraError, match=f"no checkpoint at {path}"):
        checkpoint.load(path)
    assert checkpoint.latest_step(path) is None
    checkpoint.save(path, {"w": dist.shard(w, ROW, mesh4), "b": w[0]}, None, 3)
    text = (path / "manifest.json").read_bytes()
    blocks = block_dir(path)

    def damaged(match):
        with pytest.raises(checkpoint.CheckpointError, match=match) as e:
            checkpoint.load(path)
        assert str(path) in str(e.value)

    # a manifest truncated by hand
    (path / "manifest.json").write_bytes(text[:len(text) // 2])
    damaged("damaged manifest.json")
    (path / "manifest.json").write_bytes(b"[1, 2]")
    damaged("not a tessera checkpoint")
    (path / "manifest.json").write_bytes(text)
    # a block file missing, truncated, or changed in place
    one = blocks / "00000.0002.npy"
    data = one.read_bytes()
    one.unlink()
    damaged("00000.0002.npy of params/w is missing")
    one.write_bytes(data[:-4])
    damaged("00000.0002.npy of params/w is damaged")
    flipped = bytearray(data)
    flipped[-1] ^= 1
    one.write_bytes(bytes(flipped))
    damaged("is damaged")
    one.write_bytes(data)
    p, _, _ = checkpoint.load(path)
    same_bits(dist.gather(p["w"]), w)
    # a manifest that no longer matches its files (a shape changed): never a silent answer
    for leaf, shape, match in ((0, [8, 2], "lies outside its shape"),
                               (0, [16, 4], "hold 32 elements, its shape"),
                               (1, [3], "not the array the manifest names")):
        man = json.loads(text)
        man["leaves"][leaf]["shape"] = shape
        (path / "manifest.json").write_text(json.dumps(man))
        damaged(match)


# ---- real MPI ranks ------------------------------------------------------------------------------
def _save_on_ranks(path, seed, fail_rank=None):
    """Every rank saves the blocks it holds (its own plain array: rank 0's is the one kept)."""
    mesh = dist.Mesh(axes=["dp"], devices=range(4))
    X = dist.tensor((12, 6), ROW, mesh, init="uniform", seed=seed)
    E = dist.tensor((4, 8), dist.ShardSpec.per_dim(None, "dp"), mesh, dtype="bf16",
                    init="uniform", seed=seed + 1)
    R = dist.tensor((5,), None, mesh, init="uniform", seed=seed + 2)
    if fail_rank == dist.rank():
        def failing(where, arr):
            raise OSError(5, "Input/output error")
        checkpoint._write_npy = failing
    checkpoint.save(path, {"x": X, "e": E, "r": R, "mine": np.full(3, dist.rank())},
                    {"step": np.asarray(seed, np.int64)}, seed)
    return checkpoint.latest_step(path), sorted(X.blocks)


def _load_on_ranks(path):
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    p, o, step = checkpoint.load(path, mesh=mesh)
    return ({k: dist.gather(p[k]) for k in ("x", "e", "r")}, p["mine"], o["step"], step,
            p["x"].local.shape, mesh.engine.name)


def test_mpi_ranks_save_their_blocks_and_load_resharded(rng, tmp_path):
    pytest.importorskip("mpi4py", reason="the test extra installs mpi4py (pip install mpi4py "
                                         "mpich)")
    seed = int(rng.integers(1 << 30))
    path = str(tmp_path / "ckpt")
    results = dist.launch(_save_on_ranks, 4, path, seed, timeout=120)
    assert results == [(seed, [r]) for r in range(4)]       # each rank held only its block
    want = {"x": op.random_uniform((12, 6), seed),
            "e": op.random_uniform((4, 8), seed + 1).astype(ts.bf16.np),
            "r": op.random_uniform((5,), seed + 2)}
    assert [b["rank"] for b in manifest(path)["leaves"][1]["blocks"]] == [0, 1, 2, 3]
    # here, on virtual devices: the saved mesh, then resharded
    p, o, step = checkpoint.load(path)
    assert step == seed and p["x"].mesh.engine.name == "virtual"
    assert p["e"].type_str == "bf16[4, 8@dp]"
    for k in want:
        same_bits(dist.gather(p[k]), want[k])
    same_bits(p["mine"], np.zeros(3, np.int64))
    # on 2 MPI ranks, each reading the saved blocks that overlap its new one
    for got, mine, ostep, s, local, engine in dist.launch(_load_on_ranks, 2, path, timeout=120):
        assert (s, int(ostep), local, engine) == (seed, seed, (6, 6), "mpi")
        same_bits(mine, np.zeros(3, np.int64))
        for k in want:
            same_bits(got[k], want[k])
    # a rank that fails to write: the job fails, the checkpoint is still the old one, and the
    # next save removes what the failed one left
    with pytest.raises(RankFailure, match="Input/output error"):
        dist.launch(_save_on_ranks, 4, path, seed + 1, 2, timeout=120)
    assert checkpoint.latest_step(path) == seed
    same_bits(dist.gather(checkpoint.load(path)[0]["x"]), want["x"])
    checkpoint.save(path, {"x": 1}, None, 0)
    assert len(os.listdir(path)) == 2


# ---- a training run killed and resumed -----------------------------------------------------------
TRAIN = textwrap.dedent('''
    """A small MLP trained with Adam, checkpointed every step (its first layer as a sharded
    tensor), resumed from the checkpoint when there is one."""
    import sys, time
    import numpy as np
    import tessera as ts
    from tessera import checkpoint, dist, op, optim

    ckpt, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mesh = dist.Mesh(axes=["dp"], devices=range(2))
    ROW = dist.ShardSpec(("row",), ("dp",))
    opt = optim.Adam(0.01)

    def loss_fn(p, x, y):
        h = op.tanh(x @ p["w1"] + p["b1"])
        d = h @ p["w2"] - y
        return op.mean(d * d)

    def train_step(p, s, x, y):
        loss, g = ts.value_and_grad(loss_fn)(p, x, y)
        p, s = opt.update(g, s, p)
        return loss, p, s
    train_step = ts.function(train_step)

    r = np.random.default_rng(0)
    params = {"w1": (r.standard_normal((8, 16)) * 0.3).astype(np.float32),
              "b1": np.zeros(16, np.float32),
              "w2": (r.standard_normal((16, 1)) * 0.3).astype(np.float32)}
    state, start = opt.init(params), 0
    if checkpoint.latest_step(ckpt) is not None:
        saved, state, start = checkpoint.load(ckpt)
        params = {**saved, "w1": dist.gather(saved["w1"])}
        assert int(state["step"]) == start
        print("resumed at", start, flush=True)
    t0 = time.perf_counter()
    for i in range(start, steps):
        batch = np.random.default_rng(1000 + i)           # the data of step i, whenever it runs
        x = batch.standard_normal((32, 8)).astype(np.float32)
        y = np.sin(x[:, :1]) * 2 - x[:, 1:2]
        loss, params, state = train_step(params, state, x, y)
        checkpoint.save(ckpt, {**params, "w1": dist.shard(params["w1"], ROW, mesh)}, state, i + 1)
    print("step time", (time.perf_counter() - t0) / max(1, steps - start), flush=True)
    np.savez(out, **params)
''')


def test_a_run_killed_at_a_random_moment_resumes_to_the_same_bits(rng, tmp_path):
    steps = 80
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    root = str(Path(ts.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    env.pop("TESSERA_DIST", None)

    def run(ckpt, out):
        return subprocess.run([sys.executable, str(script), str(ckpt), str(out), str(steps)],
                              env=env, capture_output=True, text=True, timeout=120)

    whole = run(tmp_path / "whole", tmp_path / "whole.npz")
    assert whole.returncode == 0, whole.stderr
    step_time = float(whole.stdout.split("step time")[1])
    ckpt, out = tmp_path / "killed", tmp_path / "killed.npz"
    kills = []
    for _ in range(2):                  # killed twice, the second time after resuming
        proc = subprocess.Popen([sys.executable, str(script), str(ckpt), str(out), str(steps)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        before = checkpoint.latest_step(ckpt) or 0
        deadline = time.monotonic() + 60
        while (checkpoint.latest_step(ckpt) or 0) <= before:      # a checkpoint of this run
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 8) * step_time)                # any moment of a few steps
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        assert proc.returncode == -signal.SIGKILL and not out.exists()
        kills.append(checkpoint.latest_step(ckpt))               # loadable whenever it died
        checkpoint.load(ckpt)
    assert 0 < kills[0] < kills[1] < steps, kills
    done = run(ckpt, out)
    assert done.returncode == 0, done.stderr
    assert f"resumed at {kills[1]}" in done.stdout
    a, b = np.load(tmp_path / "whole.npz"), np.load(out)
    assert sorted(a.files) == ["b1", "w1", "w2"]
    for k in a.files:
        same_bits(b[k], a[k])
    # the last checkpoint holds the final parameters, and training moved them
    p, _, step = checkpoint.load(tmp_path / "whole")
    assert step == steps
    same_bits(dist.gather(p["w1"]), a["w1"])
    w1_0 = (np.random.default_rng(0).standard_normal((8, 16)) * 0.3).astype(np.float32)
    assert np.abs(a["w1"] - w1_0).max() > 0.01
