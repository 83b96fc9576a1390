"""Check Kubernetes objects offline against Kubernetes' own schemas, as an API server would.

- Core objects (ConfigMap, PersistentVolumeClaim, ...): ``kubernetes-validate``, Kubernetes'
  published OpenAPI schemas at ``KUBE_VERSION``, strict (an unknown field is an error).
- Custom resources (TrainJob, ClusterTrainingRuntime, PyTorchJob, Experiment, PodMonitor,
  PrometheusRule): the operators' CRDs vendored in ``tests/data/crds`` (SOURCES.md), their
  ``openAPIV3Schema`` with ``jsonschema``. A structural CRD prunes unknown fields silently, so
  every object schema that lists properties (and neither allows more nor preserves unknown
  fields) is closed here: an unknown field is an error, as with ``kubectl apply``'s strict
  server-side field validation.

``check(doc)`` raises ``SchemaError`` naming the kind, the field's path and what is wrong.
"""

from __future__ import annotations

import copy
import functools
import gzip
from pathlib import Path
from typing import Any

import yaml

KUBE_VERSION = "1.33"  # a version every pinned operator release supports
CRD_DIR = Path(__file__).parent / "data" / "crds"
_CRD_FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml.gz",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): (
        "trainer.kubeflow.org_clustertrainingruntimes.yaml.gz"
    ),
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml.gz",
    ("kubeflow.org/v1beta1", "Experiment"): "experiment.yaml.gz",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml.gz",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml.gz",
}
_OBJECT_META = {"name", "namespace", "labels", "annotations", "generateName", "finalizers", "ownerReferences"}


class SchemaError(AssertionError):
    """An object its kind's schema rejects."""


def check(doc: dict[str, Any]) -> None:
    """Raise SchemaError unless ``doc`` passes its kind's schema (core or CRD)."""
    key = (doc.get("apiVersion", ""), doc.get("kind", ""))
    if key in _CRD_FILES:
        _check_custom(doc, key)
    else:
        _check_core(doc)


def check_all(docs: list[dict[str, Any]]) -> list[str]:
    """Check every document; returns their kinds (so a test can say what it covered)."""
    for doc in docs:
        check(doc)
    return [doc["kind"] for doc in docs]


def _check_core(doc: dict[str, Any]) -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path)
        raise SchemaError(f"{doc.get('kind')} {where or '.'}: {exc.message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise SchemaError(f"no schema for {exc.kind} {exc.api_version}: {exc.message}") from None


def _check_custom(doc: dict[str, Any], key: tuple[str, str]) -> None:
    validator = _validator(key)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = ".".join(str(p) for p in first.absolute_path)
        raise SchemaError(f"{key[1]} {where or '.'}: {first.message} ({len(errors)} error(s))")
    meta = doc.get("metadata", {})
    unknown = set(meta) - _OBJECT_META
    if unknown:
        raise SchemaError(f"{key[1]} metadata: unknown field(s) {sorted(unknown)}")


@functools.cache
def _validator(key: tuple[str, str]) -> Any:
    import jsonschema

    api_version, _kind = key
    crd = yaml.safe_load(gzip.decompress((CRD_DIR / _CRD_FILES[key]).read_bytes()))
    version = api_version.split("/")[1]
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    _close(schema)
    # apiVersion, kind and metadata are the API server's own; the CRD leaves metadata open.
    schema.setdefault("properties", {})
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": key[1]}
    return jsonschema.Draft7Validator(schema)


def _close(schema: dict[str, Any]) -> None:
    """Refuse unknown fields where the CRD lists an object's fields; int-or-string fields take both."""
    if schema.get("x-kubernetes-int-or-string"):
        schema.pop("type", None)
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and "additionalProperties" not in schema and not preserve:
        schema["additionalProperties"] = False
    children = list(schema.get("properties", {}).values())
    for key in ("items", "additionalProperties"):  # not "not": closing it would invert it
        if isinstance(schema.get(key), dict):
            children.append(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        children += schema.get(key, [])
    for child in children:
        _close(child)


def load_docs(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of ``text``."""
    return [doc for doc in yaml.safe_load_all(text) if doc]
