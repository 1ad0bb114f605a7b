"""Validation against public vLLM start-up reports, and the overhead fit."""
