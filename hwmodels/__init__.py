"""Hardware models: pydantic chip/system schemas and a YAML catalog with sources."""
