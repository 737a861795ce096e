"""commitenv: energy-commitment tracking for LLM serving (Gymnasium environment, engine, controllers)."""

__version__ = "0.1.0"
