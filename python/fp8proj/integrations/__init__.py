"""Integrations with model libraries: fp8proj.integrations.transformers (imported on use)."""
