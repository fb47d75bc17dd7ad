"""Helpers for tests/test_deploy.py: run deployment artefacts (entrypoint, unit command
line, rendered manifests) as directly as this machine allows, without a container engine
or systemd as PID 1."""
