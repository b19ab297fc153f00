"""Generated gRPC code for the ember.v1 wire contract (see proto/). Do not edit."""
