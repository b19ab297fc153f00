"""Who may call a shard: TLS credentials on both sides and the shared-token check."""
