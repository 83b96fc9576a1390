"""Check a rendered manifest against the operators' published models before it is written.

- Kubeflow Trainer v2 (TrainJob, ClusterTrainingRuntime): ``kubeflow-trainer-api``'s pydantic
  models, whose fields are strict (a string where an int belongs is an error).
- Training Operator v1 (PyTorchJob): ``kubeflow-training``'s models, with the ``kubernetes``
  client's models for everything under the pod template. Those are plain classes with an
  ``openapi_types`` / ``attribute_map`` table; ``_check_classic`` walks a document against them.

Both generators silently drop a key they do not know, so each check also asks: does every key of
the document have a place in the model? The first one that does not is the error, by its path.
"""

from __future__ import annotations

import re
from typing import Any

from hpcpipe.errors import ConfigError

_TRAINER_KINDS = {  # kind -> module (under kubeflow_trainer_api.models).class
    "TrainJob": "trainer_v1alpha1_train_job.TrainerV1alpha1TrainJob",
    "ClusterTrainingRuntime": (
        "trainer_v1alpha1_cluster_training_runtime.TrainerV1alpha1ClusterTrainingRuntime"
    ),
}
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (object,),
    "datetime": (str,),
    "date": (str,),
}


def validate_manifest(doc: dict[str, Any]) -> None:
    """Raise ``ConfigError`` naming the first field the kind's model rejects."""
    kind = doc.get("kind", "")
    if kind in _TRAINER_KINDS:
        _check_trainer(doc, kind)
    elif kind == "PyTorchJob":
        from kubeflow.training.models import KubeflowOrgV1PyTorchJob

        _check_classic(doc, KubeflowOrgV1PyTorchJob, kind)
    elif kind == "ConfigMap":
        from kubernetes.client import V1ConfigMap

        _check_classic(doc, V1ConfigMap, kind)
    else:
        raise ConfigError(f"launch k8s: no model to validate kind {kind!r} against")


# -- Kubeflow Trainer v2: pydantic -------------------------------------------------------------


def _check_trainer(doc: dict[str, Any], kind: str) -> None:
    import importlib

    from pydantic import ValidationError

    module, cls_name = _TRAINER_KINDS[kind].split(".")
    model = getattr(importlib.import_module(f"kubeflow_trainer_api.models.{module}"), cls_name)
    try:
        parsed = model.from_dict(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        raise ConfigError(
            f"launch k8s: {kind} rejected by kubeflow-trainer-api ({exc.title}.{where}): {err['msg']}"
        ) from None
    dropped = _first_dropped(doc, parsed.to_dict(), "")
    if dropped:
        raise ConfigError(f"launch k8s: {kind} field {dropped} is not in the kubeflow-trainer-api model")


def _first_dropped(doc: Any, back: Any, path: str) -> str | None:
    """The path of the first key of ``doc`` that the model's round trip lost."""
    if isinstance(doc, dict):
        if not isinstance(back, dict):
            return path or "."
        for key, value in doc.items():
            where = f"{path}.{key}" if path else key
            if key not in back:
                return where
            found = _first_dropped(value, back[key], where)
            if found:
                return found
    elif isinstance(doc, list) and isinstance(back, list):
        for i, (item, item_back) in enumerate(zip(doc, back, strict=False)):
            found = _first_dropped(item, item_back, f"{path}[{i}]")
            if found:
                return found
    return None


# -- Training Operator v1 and core Kubernetes: openapi-generator classes ------------------------


def _check_classic(doc: Any, model: type, kind: str, path: str = "") -> None:
    table: dict[str, str] = model.openapi_types  # type: ignore[attr-defined]
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}  # type: ignore[attr-defined]
    if not isinstance(doc, dict):
        raise ConfigError(f"launch k8s: {kind} {path or '.'}: expected an object ({model.__name__})")
    for key, value in doc.items():
        where = f"{path}.{key}" if path else key
        if key not in by_json:
            raise ConfigError(f"launch k8s: {kind} field {where} is not in the {model.__name__} model")
        _check_value(value, table[by_json[key]], kind, where)
    try:  # the generated setters refuse a missing required field and values outside an enum
        model(**{by_json[key]: value for key, value in doc.items()})
    except ValueError as exc:
        raise ConfigError(f"launch k8s: {kind} {path or '.'}: {exc} ({model.__name__})") from None


def _check_value(value: Any, type_name: str, kind: str, path: str) -> None:
    if value is None:
        return
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            raise ConfigError(f"launch k8s: {kind} {path}: expected a list")
        for i, item in enumerate(value):
            _check_value(item, match.group(1), kind, f"{path}[{i}]")
    elif match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            raise ConfigError(f"launch k8s: {kind} {path}: expected a mapping")
        for key, item in value.items():
            _check_value(item, match.group(1), kind, f"{path}.{key}")
    elif type_name in _PRIMITIVES:
        wanted = _PRIMITIVES[type_name]
        if not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted):
            raise ConfigError(f"launch k8s: {kind} {path}: expected {type_name}, got {value!r}")
    else:
        _check_classic(value, _model_class(type_name), kind, path)


def _model_class(name: str) -> type:
    import kubeflow.training.models as training_models
    import kubernetes.client as core

    for module in (training_models, core):
        if hasattr(module, name):
            return getattr(module, name)
    raise ConfigError(f"launch k8s: no model class {name}")
