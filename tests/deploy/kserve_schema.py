"""Validate a manifest against KServe's InferenceService schema as the `kserve` Python SDK models it.

Run as a script (`python kserve_schema.py SDK_DIR MANIFEST.json`), so the SDK stays out of the test
process: the SDK (kserve 0.21.0, kubernetes 37 client) is installed by `make tools` with --no-deps into
.relctl-tools/kserve-sdk, and only its model modules are imported (the packages' __init__ files pull in
the model server and kubeconfig loaders, which validation does not need).

Checks, in the way `kubectl apply --validate=strict` would: every key is a field of the type at that
place (camelCase, as the API server reads it), every value has that field's type, and each model is
constructed, which runs the SDK's own field validation (required fields, enums, kubernetes' pydantic
models with extra="forbid"). Prints a JSON list of problems; exits 0 either way.
"""

from __future__ import annotations

import json
import re
import sys
import types
from typing import Any

SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object,
           "ResourceQuantity": (str, int, float), "datetime": str, "date": str}


def load_sdk(sdk: str) -> tuple[Any, Any]:
    sys.path.insert(0, sdk)
    for name, sub in (("kserve", "kserve"), ("kubernetes", "kubernetes"), ("kubernetes.client", "kubernetes/client")):
        package = types.ModuleType(name)
        package.__path__ = [f"{sdk}/{sub}"]
        sys.modules[name] = package
    import kserve.models as kserve_models
    import kubernetes.client.models as k8s_models

    return kserve_models, k8s_models


class Validator:
    def __init__(self, kserve_models: Any, k8s_models: Any) -> None:
        self.namespaces = (kserve_models, k8s_models)
        self.problems: list[str] = []

    def model(self, name: str) -> Any:
        # The SDK names some Kubernetes types by their Go package (K8sIoApiAppsV1DeploymentStrategy for
        # RawDeployment's deploymentStrategy): the kubernetes client calls it V1DeploymentStrategy.
        for candidate in (name, re.sub(r"^K8sIoApi[A-Z][a-z]+(?=V\d)", "", name)):
            for namespace in self.namespaces:
                if hasattr(namespace, candidate):
                    return getattr(namespace, candidate)
        raise KeyError(f"unknown type {name}")

    def check(self, value: Any, kind: str, where: str) -> None:
        kind = kind.strip()
        if kind.startswith("Optional[") and kind.endswith("]"):
            kind = kind[len("Optional["):-1]
        inner = re.fullmatch(r"(?:list|List)\[(.+)\]", kind)
        if inner:
            if not isinstance(value, list):
                self.problems.append(f"{where}: expected a list, got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self.check(item, inner.group(1), f"{where}[{i}]")
            return
        mapping = re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", kind)
        if mapping:
            if not isinstance(value, dict):
                self.problems.append(f"{where}: expected a map, got {type(value).__name__}")
                return
            for key, item in value.items():
                self.check(item, mapping.group(1) or mapping.group(2), f"{where}.{key}")
            return
        if kind in SCALARS:
            expected = SCALARS[kind]
            if (isinstance(value, bool) and kind != "bool") or not isinstance(value, expected):  # type: ignore[arg-type]
                self.problems.append(f"{where}: expected {kind}, got {value!r}")
            return
        self.check_model(value, self.model(kind), where)

    def check_model(self, value: Any, cls: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.problems.append(f"{where}: expected an object ({cls.__name__}), got {type(value).__name__}")
            return
        if hasattr(cls, "model_validate"):  # kubernetes 37's models: pydantic, extra="forbid", camelCase aliases
            try:
                cls.model_validate(value)
            except Exception as exc:  # every validation failure is a finding
                self.problems.append(f"{where}: {cls.__name__}: {' '.join(str(exc).split())[:1500]}")
            return
        by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
        for key, item in value.items():
            if key not in by_json:
                self.problems.append(f"{where}: unknown field '{key}' of {cls.__name__}")
                continue
            self.check(item, cls.openapi_types[by_json[key]], f"{where}.{key}")
        try:  # the SDK's own setters: required fields, enums, ranges
            cls(**{by_json[k]: v for k, v in value.items() if k in by_json})
        except ValueError as exc:
            self.problems.append(f"{where}: {cls.__name__}: {exc}")


def main() -> None:
    sdk, path = sys.argv[1], sys.argv[2]
    kserve_models, k8s_models = load_sdk(sdk)
    with open(path) as fh:
        manifest = json.load(fh)
    validator = Validator(kserve_models, k8s_models)
    validator.check_model(manifest, kserve_models.V1beta1InferenceService, "")
    print(json.dumps(validator.problems))


if __name__ == "__main__":
    main()
