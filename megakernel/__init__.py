"""The Pallas megakernel for a whole MoE decode step, its pure-JAX reference and layout."""
