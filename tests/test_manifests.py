"""Static checks of the deployment manifests (config/deploy) and examples (config/examples).

Every YAML document must parse, and every object must be one the API server would accept
without "unknown field" warnings or "required value" errors:

* Built-in kinds are walked against the ``kubernetes`` Python client's models (``openapi_types``
  for the types, ``attribute_map`` for the JSON keys). The walk is strict: the client's own
  deserializer is not, it silently drops misspelt keys and even accepts snake_case aliases
  (``image_pull_policy``) that the API server rejects (``fieldValidation=Strict``) or ignores.
* Kinds that are not client models (PodGroup, JobSet, KubeSchedulerConfiguration, Kustomization)
  are walked against small structural schemas written here from the upstream Go types (cited at
  each schema); their embedded built-in types (ObjectMeta, JobTemplateSpec) go back to the
  client models.

Then the pieces must fit together: the extender URL and the sidecar's port, the profile name and
every example's ``schedulerName``, mounts and ConfigMap keys, probe ports, selectors, RBAC.

The ``kube`` test at the end asks a real API server (``KUBECONFIG``) to dry-run every built-in
object with strict field validation.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes.client
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "config" / "deploy"
EXAMPLES = REPO / "config" / "examples"
NAMESPACE = "topoplace-system"
SCHEDULER_CONFIG_MAP = "topoplace-scheduler-config"
POLICY_CONFIG_MAP = "topoplace-policy"
KUBE_SCHEDULER_SECURE_PORT = 10259  # kube-scheduler's default --secure-port

# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    """One YAML document of a manifest file."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}#{self.index}:{self.body.get('kind')}"


def _yaml_files() -> list[Path]:
    return sorted(DEPLOY.glob("*.yaml")) + sorted(EXAMPLES.glob("*.yaml"))


def _load(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as f:
        bodies = [b for b in yaml.safe_load_all(f) if b is not None]
    return [Doc(path, i, b) for i, b in enumerate(bodies)]


def _docs(*dirs: Path) -> list[Doc]:
    return [d for p in _yaml_files() if p.parent in dirs for d in _load(p)]


def _only(docs: list[Doc], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d.body
        for d in docs
        if d.body.get("kind") == kind and (name is None or d.body["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected exactly one {kind} {name or ''}, found {len(found)}"
    return found[0]


# --------------------------------------------------------------------------------------------
# The strict walker
# --------------------------------------------------------------------------------------------

# Schema language for the walk: a client type string ("V1ObjectMeta", "List[V1Container]",
# "Dict[str, str]", "list[V1Container]", "dict(str, str)", "int", "str", "object", ...) or one of
# the three structural nodes below, used for types that the client does not model.


@dataclass(frozen=True)
class Obj:
    """A JSON object with a closed set of keys (``fields``), some of them ``required``."""

    name: str
    fields: dict[str, Any]
    required: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


# Fields that the client types as "str" (or a map of "str") but that are resource.Quantity on
# the server, which also accepts JSON numbers ("nvidia.com/gpu: 8").
QUANTITY_FIELDS = frozenset(
    {
        "V1ResourceRequirements.limits",
        "V1ResourceRequirements.requests",
        "V1PodSpec.overhead",
        "V1EmptyDirVolumeSource.size_limit",
        "PodGroupSpec.minResources",
    }
)

_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "bytes": (str,),  # base64 text in YAML/JSON
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}
_LIST_RE = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT_RE = re.compile(r"^(?:Dict\[str, (.+)\]|dict\(str, (.+)\))$")


def required_attributes(cls: type) -> frozenset[str]:
    """Python attribute names that a client model cannot be built without.

    Two client generations are supported. The pydantic-based models (kubernetes >= 35) declare
    required fields in ``model_fields``. The classic models (``kubernetes`` <= 34) check in the
    property setters: with ``client_side_validation`` on, the setter of a required attribute
    raises ``ValueError`` when given ``None``; we probe every setter on a bare instance.
    """
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict):
        return frozenset(
            name
            for name, info in model_fields.items()
            if name in cls.openapi_types and info.is_required()
        )
    obj = cls.__new__(cls)
    configuration = kubernetes.client.Configuration()
    configuration.client_side_validation = True
    obj.local_vars_configuration = configuration
    required = set()
    for attr in cls.openapi_types:
        try:
            setattr(obj, attr, None)
        except ValueError:
            required.add(attr)
    return frozenset(required)


def _model_class(type_name: str) -> type | None:
    cls = getattr(kubernetes.client, type_name, None)
    if isinstance(cls, type) and hasattr(cls, "openapi_types") and hasattr(cls, "attribute_map"):
        return cls
    return None


def _unknown(path: str, key: str, known: list[str], where: str) -> str:
    hint = [k for k in known if k.lower() == key.lower().replace("_", "")]
    suffix = f' (did you mean "{hint[0]}"?)' if hint else ""
    return f'{path}: unknown field "{key}" in {where}{suffix}'


def walk(value: Any, schema: Any, path: str = "$", quantity: bool = False) -> list[str]:
    """Return every problem found in ``value`` against ``schema`` (empty list: clean).

    Problems are unknown keys (misspelt, wrong case, snake_case), missing required keys and
    values of the wrong JSON type. ``null`` is accepted anywhere, as the API server does.
    """
    if value is None:
        return []
    if isinstance(schema, Obj):
        return _walk_object(value, schema, path)
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in walk(v, schema.item, f"{path}[{i}]")]
    if isinstance(schema, MapOf):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in walk(v, schema.value, f"{path}.{k}")]
    return _walk_type(value, schema, path, quantity)


def _walk_type(value: Any, type_str: str, path: str, quantity: bool) -> list[str]:
    if m := _LIST_RE.match(type_str):
        if not isinstance(value, list):
            return [f"{path}: expected a list ({type_str}), got {type(value).__name__}"]
        return [
            p for i, v in enumerate(value) for p in _walk_type(v, m[1], f"{path}[{i}]", quantity)
        ]
    if m := _DICT_RE.match(type_str):
        if not isinstance(value, dict):
            return [f"{path}: expected a map ({type_str}), got {type(value).__name__}"]
        inner = m[1] or m[2]
        problems = [
            f"{path}: map key {k!r} is not a string" for k in value if not isinstance(k, str)
        ]
        return problems + [
            p for k, v in value.items() for p in _walk_type(v, inner, f"{path}.{k}", quantity)
        ]
    if type_str == "object":  # int-or-string, RawExtension, free-form JSON
        return []
    if type_str in _PRIMITIVES:
        allowed = _PRIMITIVES[type_str]
        if quantity and type_str == "str":
            allowed = (str, int, float)
        if isinstance(value, bool) and bool not in allowed:
            return [f"{path}: expected {type_str}, got bool"]
        if not isinstance(value, allowed):
            return [f"{path}: expected {type_str}, got {type(value).__name__}"]
        return []
    cls = _model_class(type_str)
    if cls is None:
        return [f"{path}: the walker does not know the type {type_str!r}"]
    return _walk_model(value, cls, path)


def _walk_model(value: Any, cls: type, path: str) -> list[str]:
    name = cls.__name__
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({name}), got {type(value).__name__}"]
    by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    problems = []
    for key in value:
        if key not in by_json:
            problems.append(_unknown(path, key, sorted(by_json), name))
    for attr in sorted(required_attributes(cls)):
        json_key = cls.attribute_map[attr]
        if value.get(json_key) is None:
            problems.append(f'{path}: missing required field "{json_key}" of {name}')
    for key, sub in value.items():
        if key in by_json:
            attr = by_json[key]
            problems += _walk_type(
                sub,
                cls.openapi_types[attr],
                f"{path}.{key}",
                quantity=f"{name}.{attr}" in QUANTITY_FIELDS,
            )
    return problems


def _walk_object(value: Any, schema: Obj, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({schema.name}), got {type(value).__name__}"]
    problems = [
        _unknown(path, key, sorted(schema.fields), schema.name)
        for key in value
        if key not in schema.fields
    ]
    problems += [
        f'{path}: missing required field "{key}" of {schema.name}'
        for key in sorted(schema.required)
        if value.get(key) is None
    ]
    for key, sub in value.items():
        if key in schema.fields:
            quantity = f"{schema.name}.{key}" in QUANTITY_FIELDS
            problems += walk(sub, schema.fields[key], f"{path}.{key}", quantity=quantity)
    return problems


# --------------------------------------------------------------------------------------------
# Schemas of the kinds the client does not model
# --------------------------------------------------------------------------------------------

_TYPE_META = {"apiVersion": "str", "kind": "str"}

# scheduler-plugins apis/scheduling/v1alpha1/types.go (PodGroup, PodGroupSpec). minMember is
# `omitempty` in Go; it is required here because a gang without a size is meaningless.
POD_GROUP = Obj(
    "PodGroup",
    {
        **_TYPE_META,
        "metadata": "V1ObjectMeta",
        "spec": Obj(
            "PodGroupSpec",
            {"minMember": "int", "minResources": "Dict[str, str]", "scheduleTimeoutSeconds": "int"},
            frozenset({"minMember"}),
        ),
        "status": "object",
    },
    frozenset({"apiVersion", "kind", "metadata", "spec"}),
)

# kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (JobSetSpec, ReplicatedJob,
# Network, SuccessPolicy, FailurePolicy, FailurePolicyRule, StartupPolicy, Coordinator,
# DependsOn). The Job template is the built-in batch/v1 JobTemplateSpec.
_JOBSET_NAMES = "List[str]"
JOB_SET = Obj(
    "JobSet",
    {
        **_TYPE_META,
        "metadata": "V1ObjectMeta",
        "spec": Obj(
            "JobSetSpec",
            {
                "replicatedJobs": ListOf(
                    Obj(
                        "ReplicatedJob",
                        {
                            "name": "str",
                            "groupName": "str",
                            "template": "V1JobTemplateSpec",
                            "replicas": "int",
                            "dependsOn": ListOf(
                                Obj(
                                    "DependsOn",
                                    {"name": "str", "status": "str"},
                                    frozenset({"name", "status"}),
                                )
                            ),
                        },
                        frozenset({"name", "template"}),
                    )
                ),
                "network": Obj(
                    "Network",
                    {
                        "enableDNSHostnames": "bool",
                        "subdomain": "str",
                        "publishNotReadyAddresses": "bool",
                    },
                ),
                "successPolicy": Obj(
                    "SuccessPolicy",
                    {"operator": "str", "targetReplicatedJobs": _JOBSET_NAMES},
                    frozenset({"operator"}),
                ),
                "failurePolicy": Obj(
                    "FailurePolicy",
                    {
                        "maxRestarts": "int",
                        "restartStrategy": "str",
                        "rules": ListOf(
                            Obj(
                                "FailurePolicyRule",
                                {
                                    "name": "str",
                                    "action": "str",
                                    "onJobFailureReasons": "List[str]",
                                    "onJobFailureMessagePatterns": "List[str]",
                                    "targetReplicatedJobs": _JOBSET_NAMES,
                                },
                                frozenset({"name", "action"}),
                            )
                        ),
                    },
                ),
                "startupPolicy": Obj(
                    "StartupPolicy",
                    {"startupPolicyOrder": "str"},
                    frozenset({"startupPolicyOrder"}),
                ),
                "suspend": "bool",
                "coordinator": Obj(
                    "Coordinator",
                    {"replicatedJob": "str", "jobIndex": "int", "podIndex": "int"},
                    frozenset({"replicatedJob"}),
                ),
                "managedBy": "str",
                "ttlSecondsAfterFinished": "int",
                "volumeClaimPolicies": "object",
            },
            frozenset({"replicatedJobs"}),
        ),
        "status": "object",
    },
    frozenset({"apiVersion", "kind", "metadata", "spec"}),
)

# kubernetes staging/src/k8s.io/kube-scheduler/config/v1/types.go (v1.28.7, unchanged in the
# fields used here through v1.30) and component-base/config/v1alpha1/types.go for
# leaderElection / clientConnection / the inlined DebuggingConfiguration. Decoding is strict
# and case-sensitive: "enableHttps" is an error, not an alias.
_PLUGIN_SET = Obj(
    "PluginSet",
    {
        "enabled": ListOf(Obj("Plugin", {"name": "str", "weight": "int"}, frozenset({"name"}))),
        "disabled": ListOf(Obj("Plugin", {"name": "str", "weight": "int"}, frozenset({"name"}))),
    },
)
_EXTENSION_POINTS = [
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
    "multiPoint",
]
KUBE_SCHEDULER_CONFIGURATION = Obj(
    "KubeSchedulerConfiguration",
    {
        **_TYPE_META,
        "parallelism": "int",
        "leaderElection": Obj(
            "LeaderElectionConfiguration",
            {
                "leaderElect": "bool",
                "leaseDuration": "str",
                "renewDeadline": "str",
                "retryPeriod": "str",
                "resourceLock": "str",
                "resourceName": "str",
                "resourceNamespace": "str",
            },
        ),
        "clientConnection": Obj(
            "ClientConnectionConfiguration",
            {
                "kubeconfig": "str",
                "acceptContentTypes": "str",
                "contentType": "str",
                "qps": "float",
                "burst": "int",
            },
        ),
        "enableProfiling": "bool",
        "enableContentionProfiling": "bool",
        "percentageOfNodesToScore": "int",
        "podInitialBackoffSeconds": "int",
        "podMaxBackoffSeconds": "int",
        "profiles": ListOf(
            Obj(
                "KubeSchedulerProfile",
                {
                    "schedulerName": "str",
                    "percentageOfNodesToScore": "int",
                    "plugins": Obj("Plugins", dict.fromkeys(_EXTENSION_POINTS, _PLUGIN_SET)),
                    "pluginConfig": ListOf(
                        Obj("PluginConfig", {"name": "str", "args": "object"}, frozenset({"name"}))
                    ),
                },
            )
        ),
        "extenders": ListOf(
            Obj(
                "Extender",
                {
                    "urlPrefix": "str",
                    "filterVerb": "str",
                    "preemptVerb": "str",
                    "prioritizeVerb": "str",
                    "weight": "int",
                    "bindVerb": "str",
                    "enableHTTPS": "bool",
                    "tlsConfig": Obj(
                        "ExtenderTLSConfig",
                        {
                            "insecure": "bool",
                            "serverName": "str",
                            "certFile": "str",
                            "keyFile": "str",
                            "caFile": "str",
                            "certData": "str",
                            "keyData": "str",
                            "caData": "str",
                        },
                    ),
                    "httpTimeout": "str",
                    "nodeCacheCapable": "bool",
                    "managedResources": ListOf(
                        Obj(
                            "ExtenderManagedResource",
                            {"name": "str", "ignoredByScheduler": "bool"},
                            frozenset({"name"}),
                        )
                    ),
                    "ignorable": "bool",
                },
                frozenset({"urlPrefix"}),
            )
        ),
        "delayCacheUntilActive": "bool",
    },
    frozenset({"apiVersion", "kind"}),
)

# sigs.k8s.io/kustomize api/types/kustomization.go (the subset used here).
KUSTOMIZATION = Obj(
    "Kustomization",
    {
        **_TYPE_META,
        "resources": "List[str]",
        "labels": "object",
        "commonAnnotations": "Dict[str, str]",
        "images": "object",
        "patches": "object",
        "configMapGenerator": "object",
    },
    frozenset({"apiVersion", "kind", "resources"}),
)

# (apiVersion, kind) -> schema. Built-in kinds map to their client model.
SCHEMAS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): POD_GROUP,
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): JOB_SET,
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): KUSTOMIZATION,
}

# --------------------------------------------------------------------------------------------
# Helpers over the loaded manifests
# --------------------------------------------------------------------------------------------


def _pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    """Every PodSpec (a mapping with a "containers" list) nested anywhere in ``node``."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for v in node.values():
            yield from _pod_specs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _pod_specs(v)


def _pod_templates(node: Any) -> Iterator[dict[str, Any]]:
    """Every PodTemplateSpec (``{metadata, spec: PodSpec}``) nested anywhere in ``node``."""
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield node
        for v in node.values():
            yield from _pod_templates(v)
    elif isinstance(node, list):
        for v in node:
            yield from _pod_templates(v)


def _flag(argv: list[str], name: str) -> str | None:
    """Value of ``--name value`` or ``--name=value`` in an argument vector."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"container {name} not found"
    return found[0]


def _argv(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


def _mounted_file(deployment: dict[str, Any], container: dict[str, Any], path: str) -> tuple:
    """(ConfigMap name, key) that provides the file ``path`` inside ``container``."""
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(prefix) or "subPath" in mount:
            continue
        relative = path[len(prefix) :]
        config_map = volumes[mount["name"]].get("configMap")
        if config_map is None:
            continue
        items = config_map.get("items")
        if items is None:
            return config_map["name"], relative
        for item in items:
            if item["path"] == relative:
                return config_map["name"], item["key"]
    raise AssertionError(f"{path} is not provided by a ConfigMap mount of {container['name']}")


@pytest.fixture(scope="module")
def deploy_docs() -> list[Doc]:
    return _docs(DEPLOY)


@pytest.fixture(scope="module")
def example_docs() -> list[Doc]:
    return _docs(EXAMPLES)


@pytest.fixture(scope="module")
def deployment(deploy_docs: list[Doc]) -> dict[str, Any]:
    return _only(deploy_docs, "Deployment", "topoplace")


@pytest.fixture(scope="module")
def scheduler_config(deploy_docs: list[Doc]) -> dict[str, Any]:
    config_map = _only(deploy_docs, "ConfigMap", SCHEDULER_CONFIG_MAP)
    return yaml.safe_load(config_map["data"]["scheduler-config.yaml"])


# --------------------------------------------------------------------------------------------
# 1. Every document parses and is schema-clean
# --------------------------------------------------------------------------------------------

ALL_DOCS = [d for p in _yaml_files() for d in _load(p)]


def test_manifest_directories_hold_the_expected_files() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _yaml_files()}
    for expected in (
        "config/deploy/kustomization.yaml",
        "config/deploy/deployment.yaml",
        "config/deploy/rbac.yaml",
        "config/deploy/scheduler-config.yaml",
        "config/examples/single-gpu-job.yaml",
        "config/examples/pytorchjob-gang.yaml",
        "config/examples/jobset-nvlink-gang.yaml",
    ):
        assert expected in names
    assert all(isinstance(d.body, dict) for d in ALL_DOCS)


@pytest.mark.parametrize("doc", ALL_DOCS, ids=lambda d: d.id)
def test_document_matches_its_schema(doc: Doc) -> None:
    key = (doc.body.get("apiVersion"), doc.body.get("kind"))
    assert key in SCHEMAS, f"{doc.id}: no schema for {key}; add one to SCHEMAS"
    problems = walk(doc.body, SCHEMAS[key])
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    "doc",
    [d for d in ALL_DOCS if isinstance(SCHEMAS.get((d.body["apiVersion"], d.body["kind"])), str)],
    ids=lambda d: d.id,
)
def test_builtin_document_deserializes_into_the_client_model(doc: Doc) -> None:
    model = getattr(kubernetes.client, SCHEMAS[(doc.body["apiVersion"], doc.body["kind"])])
    if hasattr(model, "from_dict"):  # pydantic-based client: also type-checks every field
        obj = model.from_dict(copy.deepcopy(doc.body))
    else:  # classic client
        obj = kubernetes.client.ApiClient()._ApiClient__deserialize(
            copy.deepcopy(doc.body), model.__name__
        )
    assert obj.kind == doc.body["kind"]
    assert obj.metadata.name == doc.body["metadata"]["name"]


def test_scheduler_configuration_matches_its_schema(scheduler_config: dict[str, Any]) -> None:
    assert walk(scheduler_config, KUBE_SCHEDULER_CONFIGURATION) == []


def test_kustomization_lists_every_deploy_file() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)
    # A kustomize `namespace:` would also move the RoleBinding that must stay in kube-system.
    assert "namespace" not in kustomization


def test_objects_are_unique_and_namespaced_where_they_must_be(deploy_docs: list[Doc]) -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding", "Kustomization"}
    seen = set()
    for doc in deploy_docs:
        body = doc.body
        if body["kind"] == "Kustomization":
            continue
        namespace = body["metadata"].get("namespace")
        key = (body["kind"], namespace, body["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        if body["kind"] in cluster_scoped:
            assert namespace is None, doc.id
        elif key != ("RoleBinding", "kube-system", body["metadata"]["name"]):
            assert namespace == NAMESPACE, doc.id


# --------------------------------------------------------------------------------------------
# 2. The walker itself catches what it must (negative tests)
# --------------------------------------------------------------------------------------------


def _deployment_body() -> dict[str, Any]:
    return copy.deepcopy(_only(_docs(DEPLOY), "Deployment", "topoplace"))


def _first_container(body: dict[str, Any]) -> dict[str, Any]:
    return body["spec"]["template"]["spec"]["containers"][0]


def test_walker_accepts_the_unmodified_deployment() -> None:
    assert walk(_deployment_body(), "V1Deployment") == []


def test_walker_catches_a_misspelt_key() -> None:
    body = _deployment_body()
    _first_container(body)["imagePulPolicy"] = "Always"
    problems = walk(body, "V1Deployment")
    assert len(problems) == 1
    assert 'unknown field "imagePulPolicy" in V1Container' in problems[0]
    assert "$.spec.template.spec.containers[0]" in problems[0]


@pytest.mark.parametrize("key", ["ImagePullPolicy", "imagepullpolicy", "image_pull_policy"])
def test_walker_catches_a_wrong_case_key(key: str) -> None:
    body = _deployment_body()
    _first_container(body)[key] = "Always"
    problems = walk(body, "V1Deployment")
    assert len(problems) == 1
    assert f'unknown field "{key}"' in problems[0]
    assert 'did you mean "imagePullPolicy"' in problems[0]


def test_client_deserializer_alone_would_miss_those_keys() -> None:
    """Why the walker exists: the client drops unknown keys without a word."""
    body = _deployment_body()
    _first_container(body)["imagePulPolicy"] = "Always"
    model = kubernetes.client.V1Deployment
    if not hasattr(model, "from_dict"):
        pytest.skip("classic client: its deserializer also drops unknown keys, untested here")
    model.from_dict(body)  # no exception


def test_walker_catches_a_missing_required_field() -> None:
    body = _deployment_body()
    del _first_container(body)["name"]
    del body["spec"]["selector"]
    problems = walk(body, "V1Deployment")
    assert sorted(problems) == [
        '$.spec.template.spec.containers[0]: missing required field "name" of V1Container',
        '$.spec: missing required field "selector" of V1DeploymentSpec',
    ]


def test_walker_catches_a_wrong_type() -> None:
    body = _deployment_body()
    body["spec"]["replicas"] = "2"
    _first_container(body)["args"] = "--v=2"
    body["spec"]["template"]["spec"]["automountServiceAccountToken"] = "true"
    problems = walk(body, "V1Deployment")
    assert len(problems) == 3, problems


def test_walker_accepts_numeric_quantities_only_where_the_server_does() -> None:
    body = _deployment_body()
    _first_container(body)["resources"]["limits"]["nvidia.com/gpu"] = 8
    assert walk(body, "V1Deployment") == []
    body["metadata"]["labels"]["app.kubernetes.io/version"] = 1
    assert len(walk(body, "V1Deployment")) == 1


def test_walker_catches_mistakes_in_custom_schemas(scheduler_config: dict[str, Any]) -> None:
    config = copy.deepcopy(scheduler_config)
    config["extenders"][0]["enableHttps"] = True  # the pre-v1beta1 spelling
    del config["extenders"][0]["urlPrefix"]
    problems = walk(config, KUBE_SCHEDULER_CONFIGURATION)
    assert len(problems) == 2, problems
    assert (
        'unknown field "enableHttps"' in problems[0] and 'did you mean "enableHTTPS"' in problems[0]
    )
    assert 'missing required field "urlPrefix" of Extender' in problems[1]

    pod_group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "labelz": {}},
        "spec": {"minmember": 4},
    }
    problems = walk(pod_group, POD_GROUP)
    assert len(problems) == 3, problems  # metadata.labelz, spec.minmember, missing minMember


def test_required_attribute_detection_on_the_installed_client() -> None:
    c = kubernetes.client
    assert required_attributes(c.V1Container) == {"name"}
    assert required_attributes(c.V1PolicyRule) == {"verbs"}
    assert {"selector", "template"} <= required_attributes(c.V1DeploymentSpec)
    assert required_attributes(c.V1ObjectMeta) == frozenset()
    assert required_attributes(c.V1ConfigMap) == frozenset()


def test_required_attribute_detection_on_a_classic_setter_model() -> None:
    """The fallback for kubernetes <= 34: required setters raise ValueError on None."""

    class V1Classic:
        openapi_types = {"name": "str", "note": "str"}
        attribute_map = {"name": "name", "note": "note"}

        @property
        def name(self) -> str | None:
            return self._name

        @name.setter
        def name(self, name: str | None) -> None:
            if self.local_vars_configuration.client_side_validation and name is None:
                raise ValueError("Invalid value for `name`, must not be `None`")
            self._name = name

        @property
        def note(self) -> str | None:
            return self._note

        @note.setter
        def note(self, note: str | None) -> None:
            self._note = note

    assert required_attributes(V1Classic) == {"name"}


def test_walker_understands_both_type_string_dialects() -> None:
    assert walk({"a": ["x"]}, "dict(str, list[str])") == []
    assert walk({"a": ["x"]}, "Dict[str, List[str]]") == []
    assert len(walk({"a": [1]}, "dict(str, list[str])")) == 1
    assert walk([{"name": "c", "image": "i"}], "list[V1Container]") == []


# --------------------------------------------------------------------------------------------
# 3. The pieces fit together
# --------------------------------------------------------------------------------------------


def test_scheduler_configuration_values(scheduler_config: dict[str, Any]) -> None:
    assert scheduler_config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config["kind"] == "KubeSchedulerConfiguration"
    assert scheduler_config["leaderElection"] == {
        "leaderElect": True,
        "resourceLock": "leases",
        "resourceName": "topoplace-scheduler",
        "resourceNamespace": NAMESPACE,
    }
    assert scheduler_config["percentageOfNodesToScore"] == 100
    assert [p["schedulerName"] for p in scheduler_config["profiles"]] == ["topoplace"]
    assert scheduler_config["clientConnection"] == {"qps": 500, "burst": 1000}
    profile = scheduler_config["profiles"][0]
    # In-tree scores that fight packing are off or turned around (docs/deploy.md).
    assert profile["plugins"] == {
        "score": {
            "disabled": [{"name": "NodeResourcesBalancedAllocation"}, {"name": "ImageLocality"}]
        }
    }
    args = {c["name"]: c["args"] for c in profile["pluginConfig"]}
    assert args["NodeResourcesFit"]["scoringStrategy"]["type"] == "MostAllocated"
    assert args["PodTopologySpread"] == {"defaultingType": "List"}
    (extender,) = scheduler_config["extenders"]
    assert extender == {
        "urlPrefix": "http://127.0.0.1:8888/scheduler",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 20,
        "enableHTTPS": False,
        "httpTimeout": "5s",
        "nodeCacheCapable": True,
        "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
        "ignorable": False,
    }


def test_extender_url_reaches_the_sidecar(
    scheduler_config: dict[str, Any], deployment: dict[str, Any]
) -> None:
    url = urlsplit(scheduler_config["extenders"][0]["urlPrefix"])
    sidecar = _container(deployment, "topoplace")
    argv = _argv(sidecar)
    assert argv[:2] == ["topoplace", "serve"]
    assert url.scheme == "http" and url.hostname == "127.0.0.1"
    assert str(url.port) == _flag(argv, "--port")
    # 0.0.0.0 includes loopback (kube-scheduler) and the pod IP (kubelet probes).
    assert _flag(argv, "--host") in {"0.0.0.0", "127.0.0.1"}
    assert url.port in {p["containerPort"] for p in sidecar["ports"]}


def test_sidecar_command_is_accepted_by_the_cli_in_cluster_mode(deployment: dict[str, Any]) -> None:
    """The sidecar's argv parses with the real `topoplace` parser, and selects the in-cluster
    Kubernetes source: no --cluster / --kubeconfig flag and no KUBECONFIG variable, so the
    client falls back to the ServiceAccount (KUBERNETES_SERVICE_HOST, set by kubelet)."""
    main = pytest.importorskip("scheduler.cli.main")
    sidecar = _container(deployment, "topoplace")
    argv = _argv(sidecar)
    try:
        parser = main.build_parser()
    except ModuleNotFoundError as exc:  # a sub-command's own dependencies are not importable
        pytest.skip(f"topoplace CLI parser unavailable: {exc}")
    args = parser.parse_args(argv[1:])
    assert args.command == "serve"
    assert (args.host, args.port) == ("0.0.0.0", 8888)
    assert args.config == "/etc/topoplace/policy/policy.yaml"
    assert not getattr(args, "cluster", None) and not getattr(args, "kubeconfig", None)
    assert "KUBECONFIG" not in {e["name"] for e in sidecar.get("env", [])}
    assert deployment["spec"]["template"]["spec"].get("automountServiceAccountToken", True)


def test_scheduler_and_sidecar_read_the_mounted_configuration(
    deploy_docs: list[Doc], deployment: dict[str, Any]
) -> None:
    scheduler = _container(deployment, "kube-scheduler")
    assert scheduler["image"] == "registry.k8s.io/kube-scheduler:v1.30.4"
    config_path = _flag(_argv(scheduler), "--config")
    assert config_path == "/etc/topoplace/scheduler-config.yaml"
    assert _mounted_file(deployment, scheduler, config_path) == (
        SCHEDULER_CONFIG_MAP,
        "scheduler-config.yaml",
    )

    sidecar = _container(deployment, "topoplace")
    assert sidecar["image"] == "ghcr.io/topoplace/topoplace:0.1.0"
    policy_path = _flag(_argv(sidecar), "--config")
    assert policy_path == "/etc/topoplace/policy/policy.yaml"
    config_map, key = _mounted_file(deployment, sidecar, policy_path)
    assert (config_map, key) == (POLICY_CONFIG_MAP, "policy.yaml")
    assert key in _only(deploy_docs, "ConfigMap", config_map)["data"]


def test_policy_config_map_holds_a_minimal_policy(deploy_docs: list[Doc]) -> None:
    policy = yaml.safe_load(
        _only(deploy_docs, "ConfigMap", POLICY_CONFIG_MAP)["data"]["policy.yaml"]
    )
    assert policy == {
        "scoring": {"weights": {"topology": 4, "health": 2, "packing": 4}},
        "gang": {
            "plan_ttl_seconds": 60,
            "solver_time_limit_seconds": 1.0,
            "seed": 7,
            "workers": 1,
        },
        "fabric": {"levels": "default"},
    }
    repository_policy = REPO / "config" / "policy.yaml"
    if repository_policy.exists():  # same structure as the repository's default policy
        default = yaml.safe_load(repository_policy.read_text(encoding="utf-8")) or {}
        assert set(policy) <= set(default), (
            f"keys unknown to config/policy.yaml: {set(policy) - set(default)}"
        )


def test_policy_config_map_loads_with_the_project_loader(
    deploy_docs: list[Doc], tmp_path: Path
) -> None:
    """The policy the sidecar will read passes the same loader as `topoplace serve --config`
    (which rejects unknown keys at start-up)."""
    main = pytest.importorskip("scheduler.cli.main")
    path = tmp_path / "policy.yaml"
    path.write_text(
        _only(deploy_docs, "ConfigMap", POLICY_CONFIG_MAP)["data"]["policy.yaml"], encoding="utf-8"
    )
    try:
        params = main.load_params(str(path))
    except ModuleNotFoundError as exc:  # the loader's own dependencies are not importable
        pytest.skip(f"policy loader unavailable: {exc}")
    assert params is not None


def test_every_example_uses_the_topoplace_profile(
    scheduler_config: dict[str, Any], example_docs: list[Doc]
) -> None:
    profile = scheduler_config["profiles"][0]["schedulerName"]
    specs = [(d.id, s) for d in example_docs for s in _pod_specs(d.body)]
    assert len(specs) >= 4  # single Job, gang Job, 2 JobSet ReplicatedJobs
    for doc_id, spec in specs:
        assert spec.get("schedulerName") == profile, doc_id
        gpus = [
            c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            for c in spec["containers"]
        ]
        assert any(g is not None for g in gpus), f"{doc_id}: no container asks for nvidia.com/gpu"
        assert any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])), doc_id


def test_probes_point_at_declared_ports(deployment: dict[str, Any]) -> None:
    probes = 0
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        ports = container.get("ports", [])
        names = {p["name"]: p["containerPort"] for p in ports if "name" in p}
        numbers = {p["containerPort"] for p in ports}
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            for handler in ("httpGet", "tcpSocket", "grpc"):
                if handler in probe:
                    port = probe[handler]["port"]
                    resolved = names.get(port) if isinstance(port, str) else port
                    assert resolved in numbers, f"{container['name']}.{kind} -> {port}"
                    probes += 1
    assert probes >= 4  # liveness + readiness on both containers


def test_probes_match_what_each_process_serves(deployment: dict[str, Any]) -> None:
    scheduler = _container(deployment, "kube-scheduler")
    secure_port = int(_flag(_argv(scheduler), "--secure-port") or KUBE_SCHEDULER_SECURE_PORT)
    for kind in ("livenessProbe", "readinessProbe"):
        get = scheduler[kind]["httpGet"]
        assert (get["port"], get["scheme"], get["path"]) == (secure_port, "HTTPS", "/healthz")

    sidecar = _container(deployment, "topoplace")
    sidecar_port = int(_flag(_argv(sidecar), "--port"))
    named = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    for kind in ("livenessProbe", "readinessProbe"):
        get = sidecar[kind]["httpGet"]
        assert named.get(get["port"], get["port"]) == sidecar_port
        assert get.get("scheme", "HTTP") == "HTTP"
        assert "host" not in get  # kubelet probes the pod IP: the sidecar listens on 0.0.0.0
    assert _flag(_argv(sidecar), "--host") == "0.0.0.0"


def test_service_and_network_policy_ports_exist(
    deploy_docs: list[Doc], deployment: dict[str, Any]
) -> None:
    pod = deployment["spec"]["template"]
    names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    service = _only(deploy_docs, "Service", "topoplace-metrics")
    assert service["spec"]["ports"] == [
        {"name": "http-metrics", "port": 8888, "targetPort": "http-metrics", "protocol": "TCP"}
    ]
    assert "http-metrics" in names

    policy = _only(deploy_docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for rule in policy["spec"]["ingress"]:
        assert rule.get("from"), "an ingress rule without `from` admits every source"
        for port in rule["ports"]:
            assert port["port"] in names or isinstance(port["port"], int)


def test_selectors_match_the_pod_labels(deploy_docs: list[Doc], deployment: dict[str, Any]) -> None:
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects(match_labels: dict[str, str]) -> bool:
        return bool(match_labels) and all(labels.get(k) == v for k, v in match_labels.items())

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    assert selects(_only(deploy_docs, "Service", "topoplace-metrics")["spec"]["selector"])
    assert selects(_only(deploy_docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert selects(_only(deploy_docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"])
    assert deployment["spec"]["replicas"] == 2
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    terms = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        t["topologyKey"] == "kubernetes.io/hostname" and selects(t["labelSelector"]["matchLabels"])
        for t in terms
    )


def test_containers_are_locked_down(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "topoplace"
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for container in pod["containers"]:
        ctx = container["securityContext"]
        assert ctx["runAsNonRoot"] is True, container["name"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
        assert ctx["allowPrivilegeEscalation"] is False, container["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}, container["name"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert {"cpu", "memory"} <= set(resources["limits"]), container["name"]


# --------------------------------------------------------------------------------------------
# 4. RBAC
# --------------------------------------------------------------------------------------------

BUILT_IN_ROLES = {
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}


@dataclass
class Grants:
    """Everything the topoplace ServiceAccount may do, per (namespace or "*")."""

    rules: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def allows(self, verb: str, group: str, resource: str, namespace: str, name: str = "") -> bool:
        for scope, rule in self.rules:
            if scope not in ("*", namespace):
                continue
            if group not in rule.get("apiGroups", []) or resource not in rule.get("resources", []):
                continue
            if verb not in rule["verbs"]:
                continue
            if rule.get("resourceNames") and name not in rule["resourceNames"]:
                continue
            return True
        return False


def _rbac(deploy_docs: list[Doc]) -> Grants:
    roles = {
        (d.body["kind"], d.body["metadata"].get("namespace"), d.body["metadata"]["name"]): d.body
        for d in deploy_docs
        if d.body["kind"] in ("ClusterRole", "Role")
    }
    account = _only(deploy_docs, "ServiceAccount")["metadata"]
    grants = Grants()
    for doc in deploy_docs:
        binding = doc.body
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ], doc.id
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        namespace = binding["metadata"].get("namespace")
        role_namespace = None if ref["kind"] == "ClusterRole" else namespace
        role = roles.get((ref["kind"], role_namespace, ref["name"]))
        if role is None:
            assert (ref["kind"], ref["name"]) in BUILT_IN_ROLES, f"{doc.id}: unknown role {ref}"
            continue
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else namespace
        grants.rules += [(scope, rule) for rule in role["rules"]]
    return grants


def test_rbac_has_no_wildcards(deploy_docs: list[Doc]) -> None:
    for doc in deploy_docs:
        for rule in (
            doc.body.get("rules", []) if doc.body["kind"] in ("ClusterRole", "Role") else []
        ):
            for key in ("verbs", "resources", "apiGroups", "resourceNames"):
                assert "*" not in rule.get(key, []), f"{doc.id}: '*' in {key}"
            assert "nonResourceURLs" not in rule, doc.id
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), doc.id
            assert not {"secrets", "clusterroles", "roles"} & set(rule.get("resources", [])), doc.id


def test_rbac_grants_what_the_scheduler_and_sidecar_need(
    deploy_docs: list[Doc], scheduler_config: dict[str, Any]
) -> None:
    grants = _rbac(deploy_docs)
    anywhere = "some-namespace"
    assert grants.allows("create", "", "pods/binding", anywhere)
    for verb in ("get", "list", "watch"):
        assert grants.allows(verb, "", "nodes", "")
        assert grants.allows(verb, "", "pods", anywhere)
        for group in ("scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.run.ai"):
            assert grants.allows(verb, group, "podgroups", anywhere), group
    assert grants.allows("create", "", "events", anywhere)
    assert grants.allows("create", "events.k8s.io", "events", anywhere)
    assert grants.allows("patch", "", "pods/status", anywhere)
    assert grants.allows("delete", "", "pods", anywhere)  # preemption
    assert grants.allows("create", "authentication.k8s.io", "tokenreviews", "")
    assert grants.allows("create", "authorization.k8s.io", "subjectaccessreviews", "")

    election = scheduler_config["leaderElection"]
    lease_ns, lease = election["resourceNamespace"], election["resourceName"]
    assert grants.allows("create", "coordination.k8s.io", "leases", lease_ns)
    assert grants.allows("get", "coordination.k8s.io", "leases", lease_ns, lease)
    assert grants.allows("update", "coordination.k8s.io", "leases", lease_ns, lease)
    # ...and no other Lease, and nowhere else
    assert not grants.allows("update", "coordination.k8s.io", "leases", lease_ns, "kube-scheduler")
    assert not grants.allows("update", "coordination.k8s.io", "leases", "kube-system", lease)
    # waking parked gang members (scheduler/kube/waker.py) patches one pod annotation
    assert grants.allows("patch", "", "pods", anywhere)
    assert not grants.allows("update", "", "pods", anywhere)
    # nothing the extender does not need
    assert not grants.allows("update", "", "nodes", "")
    assert not grants.allows("get", "", "secrets", anywhere)


# --------------------------------------------------------------------------------------------
# 5. Examples
# --------------------------------------------------------------------------------------------


def test_pytorch_gang_is_one_pod_group_of_four(example_docs: list[Doc]) -> None:
    docs = [d.body for d in example_docs if d.path.name == "pytorchjob-gang.yaml"]
    pod_group = _only([Doc(Path(), 0, b) for b in docs], "PodGroup")
    job = _only([Doc(Path(), 0, b) for b in docs], "Job")
    service = _only([Doc(Path(), 0, b) for b in docs], "Service")
    assert pod_group["spec"]["minMember"] == 4
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    template = job["spec"]["template"]
    assert (
        template["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"]
        == pod_group["metadata"]["name"]
    )
    assert service["spec"]["clusterIP"] == "None"
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    (container,) = template["spec"]["containers"]
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "8"


def test_jobset_gang_annotations_cover_every_pod(example_docs: list[Doc]) -> None:
    job_set = _only([d for d in example_docs if d.path.name == "jobset-nvlink-gang.yaml"], "JobSet")
    replicated = job_set["spec"]["replicatedJobs"]
    assert len(replicated) == 2
    total = 0
    for rjob in replicated:
        job_spec = rjob["template"]["spec"]
        total += rjob.get("replicas", 1) * job_spec["parallelism"]
        annotations = job_spec["template"]["metadata"]["annotations"]
        assert annotations["topoplace.io/gang"] == job_set["metadata"]["name"]
        assert annotations["topoplace.io/topology-required"] == "nvlink-domain"
        (container,) = job_spec["template"]["spec"]["containers"]
        assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "4"  # one GB200 tray
    sizes = {
        rjob["template"]["spec"]["template"]["metadata"]["annotations"]["topoplace.io/gang-size"]
        for rjob in replicated
    }
    assert sizes == {str(total)} == {"16"}


# --------------------------------------------------------------------------------------------
# 6. Against a real API server (opt-in)
# --------------------------------------------------------------------------------------------


@pytest.mark.kube
@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs KUBECONFIG (a real API server)")
def test_api_server_accepts_every_builtin_object_strictly() -> None:
    """Server-side dry run with fieldValidation=Strict (unknown or duplicate fields are errors).

    Creates the Namespace topoplace-system if it is missing (a dry run cannot create objects in
    a namespace that does not exist) and leaves it in place. CRD kinds are checked only when
    their CRD is installed.
    """
    from kubernetes import config, dynamic
    from kubernetes.client.rest import ApiException

    config.load_kube_config()
    api = kubernetes.client.ApiClient()
    client = dynamic.DynamicClient(api)
    core = kubernetes.client.CoreV1Api(api)
    try:
        core.read_namespace(NAMESPACE)
    except ApiException as e:
        assert e.status == 404
        core.create_namespace({"metadata": {"name": NAMESPACE}})

    def dry_run_create(body: dict[str, Any]) -> None:
        resource = client.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        namespace = body["metadata"].get("namespace") if resource.namespaced else None
        # The dynamic client drops a `field_validation=` keyword without a word: pass the
        # query parameter itself.
        client.create(
            resource,
            body=body,
            namespace=namespace,
            query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
        )

    # The server must be strict for this test to mean anything.
    misspelt = _deployment_body()
    _first_container(misspelt)["imagePulPolicy"] = "Always"
    with pytest.raises(ApiException) as rejected:
        dry_run_create(misspelt)
    assert rejected.value.status in (400, 422) and "imagePulPolicy" in rejected.value.body

    checked = 0
    for doc in ALL_DOCS:
        if doc.body["kind"] == "Kustomization":
            continue
        try:
            dry_run_create(doc.body)
        except dynamic.exceptions.ResourceNotFoundError:
            continue  # CRD not installed
        except ApiException as e:
            if e.status != 409:  # AlreadyExists: the dry run got past validation
                raise AssertionError(f"{doc.id}: {e.status} {e.body}") from e
        checked += 1
    assert checked >= 15
