"""Server-side HTTP: reading request bodies within limits, and guarding connections."""
