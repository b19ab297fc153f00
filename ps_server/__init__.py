"""Parameter-server shards (logic, store, gRPC service) and their client library."""
