"""The products and where they run: the kernels, their timing on this machine, the device and
precision policy, threads and memory."""
