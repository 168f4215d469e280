"""KempnerForge DCP training runs (read without torch.distributed, configs from the training TOML)."""
