"""The hand-written routines strategies call: C for the CPU, CUDA and HIP for GPUs."""
