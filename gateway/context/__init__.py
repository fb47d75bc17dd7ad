"""Context preparation and reuse (PowerContext-compatible)."""
