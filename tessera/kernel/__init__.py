"""`tessera.kernel`: the kernel language, `@ts.kernel` (the seeds' second way to program Tessera).

A tile kernel is a Python function over `Tile["M", "K", bf16]` parameters whose body uses the
`tessera.tile` builtins (load, store, mma, reductions, elementwise math). Its body is traced once
per parameter dtypes into a `KernelBody`: a short list of typed statements over symbolic sizes
(the problem's dimensions M, K, N and the launch's knobs BM, BN, BK), checked as it is traced.
The kernel then becomes one Graph IR node, `tile_program` (operator.py), which the `tile`
strategy (lowering.py) lowers to Tile IR for the CPU and the GPUs: so a tile
kernel has a Program like any function, and the explorer, `%%tessera`, the profiler and the
autotuner work on it unchanged.

What a program computes. The kernel's output (the parameter it `tile.store`s into, or the tile
it returns) is cut into blocks; one program computes one block, and the programs run in
parallel. The block is the stored tile's shape: `tile.store(C, acc)` with acc of shape
(BM, BN) makes a grid of ceil(M/BM) x ceil(N/BN) programs. Every tile axis is tied to a
dimension of a parameter by its name, so the compiler places each load: an axis over a
dimension the grid blocks is the program's block of it, an axis over a whole dimension
(`ctx.K`) is all of it, and an axis over a dimension in blocks the grid does not walk is a
stream, read a block at a time by `tile.load_partition(stream, k)` in a `tile.range_k` loop.
A parameter used as a value without `tile.load` is its block of BM rows along its first axis
and all of its other axes (a rank-1 parameter: all of it). At ragged edges loads read zeros
beyond the tensor (`other=`), reductions and `mma` run over the valid part only, and stores
write only what lies inside the output.

The modules, in the order a kernel meets them:
  annotations   `Tile[...]`, a parameter's annotation
  index         `Ix`, the symbolic sizes and indices of a body (ctx.BM, program_id(0), k + 1)
  ir            the traced body: `KernelValue`, `KernelParam`, one statement class per kind
                (`LoadStmt`, `MmaStmt`, ...: not the Tile IR's `Load`, `Loop`),
                `KernelBody` (IR data: the compiler's `tile` strategy reads it)
  tracer        the tracer a body runs under, `tile.context()`
  builtins      the names `tessera.tile` gives a body (tile.load, tile.mma, ...)
  semantic      what they do: each checks its operands and appends its statement; the
                values a body holds (a parameter, a tile)
  placement     after tracing: the grid, and each load's placement against it
  interpreter   the body run with NumPy, program by program (the operator's reference)
  operator      the Graph IR operator `tile_program` a kernel call becomes
  lowering      the `tile` strategy: a body to Tile IR, registered with the compiler's strategies
  function      `KernelFunction`, what `@ts.kernel` makes; `kernel`, the decorator

Nothing is imported here. The compiler imports nothing of this package: the operator and its
strategy register themselves with it.
The name `ts.kernel` is the decorator (tessera/autotune.py), bound after this package is
imported: import its modules as `from tessera.kernel import ir` (`import tessera.kernel.ir as
m` looks the package up as the attribute `tessera.kernel`, the decorator, and fails).
"""
