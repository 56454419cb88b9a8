//! kbench-cuda: CUDA device and kernels.
