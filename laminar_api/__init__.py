"""Generated gRPC API of Laminar (package ``laminar.v1``); produced by ``make proto``."""
