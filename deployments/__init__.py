"""The HTTP layer: a FastAPI app per replica, served by Ray Serve."""
