"""The HTTP API and page, on one machine (FastAPI) or on Ray Serve."""
