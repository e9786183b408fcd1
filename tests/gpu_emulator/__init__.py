"""A CPU emulation of the CUDA (and HIP) thread model, to run generated GPU kernels in CI: test
infrastructure, not shipped in tessera/. cuda_emu.h describes the model; emulator.py the API."""
from .emulator import (KernelFault, Module, compile_source, device_empty, emulator_source, launch,
                       run_program, to_device)

__all__ = ["KernelFault", "Module", "compile_source", "device_empty", "emulator_source", "launch",
           "run_program", "to_device"]
