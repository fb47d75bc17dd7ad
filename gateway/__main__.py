"""`python -m gateway` runs the wiregate CLI."""

from gateway.cli import main

raise SystemExit(main())
