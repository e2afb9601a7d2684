"""Systems side by side: the same model on TPUs and GPUs."""
