"""wiregate: a reverse-proxy model gateway that enforces privacy checks on the wire."""

__version__ = "0.1.0"
