"""Lay out a rendered pod's files the way the kubelet would, under a directory on this
machine, so the container's own command can be run against them.

For the first container of a Deployment: ConfigMap and Secret volumes become directories
of files (a `items` list selects and renames keys) with the volume's defaultMode or the
item's mode, to which the pod's fsGroup adds group read as the kubelet does for read-only
volumes; emptyDirs become empty directories. Mount paths are placed under `root`. The
container's environment is resolved (plain values; secretKeyRef/configMapKeyRef from the
rendered objects, optional refs skipped when the key is missing).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Pod:
    root: Path
    container: dict[str, Any]
    env: dict[str, str]
    mounts: dict[str, Path]  # volume name -> host directory

    def path(self, in_container: str) -> Path:
        return self.root / in_container.lstrip("/")


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"the rendered manifests have no {kind} {name}")


def _data(obj: dict[str, Any]) -> dict[str, bytes]:
    out = (
        {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        if obj["kind"] == "Secret"
        else {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    )
    for k, v in (obj.get("stringData") or {}).items():  # the API server folds stringData into data
        out[k] = v.encode()
    for k, v in (obj.get("binaryData") or {}).items():
        out[k] = base64.b64decode(v)
    return out


def materialise(objects: list[dict[str, Any]], deployment: str, root: Path) -> Pod:
    dep = _named(objects, "Deployment", deployment)
    spec = dep["spec"]["template"]["spec"]
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        mounts[mount["name"]] = target
        for kind, key in (("configMap", "ConfigMap"), ("secret", "Secret")):
            if kind not in volume:
                continue
            source = volume[kind]
            obj = _named(objects, key, source["name" if kind == "configMap" else "secretName"])
            data = _data(obj)
            default_mode = source.get("defaultMode", 0o644)
            items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
            for item in items:
                mode = item.get("mode", default_mode)
                if fs_group is not None:
                    mode |= 0o440  # kubelet: fsGroup gets read on read-only volumes
                path = target / item["path"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data[item["key"]])
                os.chmod(path, mode)
        if "emptyDir" in volume:
            os.chmod(target, 0o750)
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var.get("valueFrom", {})
        for kind, key in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if kind in ref:
                data = _data(_named(objects, key, ref[kind]["name"]))
                if ref[kind]["key"] in data:
                    env[var["name"]] = data[ref[kind]["key"]].decode()
                elif not ref[kind].get("optional"):
                    raise AssertionError(f"env {var['name']}: missing key {ref[kind]['key']}")
    return Pod(root=root, container=container, env=env, mounts=mounts)
