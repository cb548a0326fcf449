"""The simulated vLLM + LMCache engine: a physics-based model (`model.py`) and an
OpenAI-compatible server over it (`server.py`). See `kvops.sim.model` for the Python API."""
