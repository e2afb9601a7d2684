"""The schedule: the contract between the simulator and the kernel, and its VMEM accounting."""
