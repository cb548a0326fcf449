"""TEST DOUBLE of the ONTAP REST API: request → (status, body), over an in-memory cluster.

It follows the published API for every endpoint kvops and the `ontap_export` role use
(https://docs.netapp.com/us-en/ontap-automation/rest/input_variables.html ,
https://docs.netapp.com/us-en/ontap-automation/rest/interpret_api_response.html ,
https://docs.netapp.com/us-en/ontap-automation/rest/asynchronous_processing.html):

- collections answer `{"records", "num_records", "_links"}`; without `fields=` only the key
  fields come back (a single record: all of them), `fields=*`/`**` give all, `fields=a,b.c`
  exactly those (plus the keys);
- any other query parameter is a filter on a (dotted) field: `*` wildcards, `!`, `<`/`>`,
  `null`/`!null`, `a|b`; lists match when any element matches (`clients.match=10.0.0.1`);
- `max_records` pages with `_links.next.href`: the full path with every original parameter
  and a `start.<key>=` cursor, which clients re-issue verbatim;
- volume POST/PATCH/DELETE are asynchronous: 202 + `job` (200/201 + `job` with
  `return_timeout` > 0), and the job has already succeeded on the first poll;
- errors are `{"error": {"message", "code" (a string), "target"?}}`; a field the simulated
  release does not have is 400 / "262197" in `fields=` (what harvest and netapp.ontap hit on
  older clusters: https://github.com/NetApp/harvest/issues/2237) and 400 / "262179" in a body;
- bodies may use dotted keys (`"svm.name"`) and string booleans (`"true"`), and collection
  paths may end in `/`, as the netapp.ontap collection sends them.

Every write (POST/PATCH/DELETE, accepted or not) is recorded, so tests assert what a client
changed, or that it changed nothing.
"""

from __future__ import annotations

import copy
import json
import re
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

Version = tuple[int, int, int]
Response = tuple[int, dict[str, Any]]

# Fields that appeared in a later release than 9.10.1 (the first with NFS over RDMA), from
# the netapp-ontap client versions that mirror each release's REST schema (PyPI
# netapp-ontap 9.10.1.0 … 9.19.1.0). transport.rdma_enabled: absent in 9.10.1, present in
# 9.12.1 (9.11.1 was never published, so the double takes the conservative 9.12.1).
GATED: dict[str, dict[str, Version]] = {
    "protocols/nfs/services": {
        "transport.rdma_enabled": (9, 12, 1),
        "protocol.v42_enabled": (9, 19, 1),
    },
    "storage/volumes": {"nodes": (9, 17, 1)},
    "protocols/nfs/export-policies": {"are_rules_truncated": (9, 18, 1)},
    "protocols/nfs/export-policies/rules": {"allow_nfs_tls_only": (9, 19, 1)},
}


@dataclass(frozen=True)
class Collection:
    path: str
    key: str
    identity: tuple[str, ...]
    fields: frozenset[str]
    asynchronous: bool = False


def _fields(text: str) -> frozenset[str]:
    return frozenset(text.split())


COLLECTIONS = {
    c.path: c
    for c in (
        Collection(
            "cluster/nodes",
            "uuid",
            ("uuid", "name"),
            _fields(
                "_links name uuid model state membership ha version serial_number location "
                "uptime cluster_interfaces management_interfaces controller system_id"
            ),
        ),
        Collection(
            "svm/svms",
            "uuid",
            ("uuid", "name"),
            _fields("_links name uuid state subtype language nfs ipspace aggregates comment"),
        ),
        Collection(
            "storage/aggregates",
            "uuid",
            ("uuid", "name"),
            _fields("_links name uuid node home_node state space block_storage"),
        ),
        Collection(
            "storage/volumes",
            "uuid",
            ("uuid", "name"),
            _fields(
                "_links _tags access_time_enabled activity_tracking aggregates analytics "
                "anti_ransomware application autosize clone comment consistency_group "
                "constituents constituents_per_aggregate create_time efficiency encryption "
                "error_state files flexcache_endpoint_type granular_data guarantee "
                "is_object_store is_svm_root language max_dir_size metric movement msid "
                "name nas nodes qos queue_for_encryption quota rebalancing "
                "scheduled_snapshot_naming_scheme size snaplock snapmirror snapshot_count "
                "snapshot_directory_access_enabled snapshot_locking_enabled snapshot_policy "
                "space state statistics status style svm tiering type "
                "use_mirrored_aggregates uuid"
            ),
            asynchronous=True,
        ),
        Collection(
            "protocols/nfs/services",
            "svm.uuid",
            ("svm",),
            _fields(
                "_links access_cache_config auth_sys_extended_groups_enabled credential_cache "
                "enabled exports extended_groups_limit file_session_io_grouping_count "
                "file_session_io_grouping_duration metric protocol protocol_access_rules "
                "qtree root rquota_enabled security showmount_enabled state statistics svm "
                "transport vstorage_enabled windows"
            ),
        ),
        Collection(
            "protocols/nfs/export-policies",
            "id",
            ("id", "name"),
            _fields("_links id name rules svm are_rules_truncated"),
        ),
        Collection(
            "protocols/nfs/export-policies/rules",
            "index",
            ("index",),
            _fields(
                "_links index clients protocols ro_rule rw_rule superuser anonymous_user "
                "allow_suid allow_device_creation chown_mode ntfs_unix_security policy "
                "svm allow_nfs_tls_only"
            ),
        ),
        Collection(
            "network/ip/interfaces",
            "uuid",
            ("uuid", "name"),
            _fields(
                "_links ddns_enabled dns_zone enabled ip ipspace location metric name "
                "probe_port rdma_protocols scope service_policy services state statistics "
                "subnet svm uuid vip"
            ),
        ),
        Collection("network/fc/interfaces", "uuid", ("uuid", "name"), _fields("_links name uuid")),
        Collection(
            "cluster/jobs",
            "uuid",
            ("uuid",),
            _fields("_links uuid description state message code start_time end_time"),
        ),
    )
}

PAGING_PARAMS = {"fields", "max_records", "return_records", "return_timeout", "order_by"}
MISSING = object()


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, target: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.target = status, message, code, target

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "code": self.code}
        if self.target:
            error["target"] = self.target
        return {"error": error}


def not_found() -> ApiError:
    # Code 4 "entry doesn't exist": netapp.ontap modules test for that substring.
    return ApiError(404, "entry doesn't exist", "4")


def parse_version(text: str) -> Version:
    gen, major, minor = [*(int(p) for p in re.findall(r"\d+", text)[:3]), 0, 0, 0][:3]
    return gen, major, minor


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def values_at(value: Any, parts: list[str]) -> list[Any]:
    """Every leaf value at a dotted path, walking through lists (`clients.match`)."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in values_at(item, parts)]
    if not parts:
        return [value]
    if not isinstance(value, dict) or parts[0] not in value:
        return []
    return values_at(value[parts[0]], parts[1:])


def _match_one(expr: str, values: list[Any]) -> bool:
    if expr == "null":
        return all(v is None for v in values)
    if expr == "!null":
        return any(v is not None for v in values)
    negate = expr.startswith("!")
    expr = expr[1:] if negate else expr
    for op in ("<=", ">=", "<", ">"):
        if expr.startswith(op):
            try:
                bound = float(expr[len(op) :])
                nums = [float(v) for v in values if isinstance(v, int | float)]
            except ValueError:
                return False
            hit = any(
                {"<=": n <= bound, ">=": n >= bound, "<": n < bound, ">": n > bound}[op]
                for n in nums
            )
            return hit != negate
    pattern = re.compile("^" + ".*".join(re.escape(p) for p in expr.split("*")) + "$")
    hit = any(pattern.match(_text(v)) for v in values)
    return hit != negate


def matches(expr: str, values: list[Any]) -> bool:
    return any(_match_one(alt, values) for alt in expr.split("|"))


def project(value: Any, parts: list[str]) -> Any:
    """The sub-document holding only the dotted path (MISSING when absent)."""
    if not parts or parts[0] in ("*", "**"):
        return copy.deepcopy(value)
    if isinstance(value, list):
        items = [project(item, parts) for item in value]
        return [item for item in items if item is not MISSING]
    if not isinstance(value, dict) or parts[0] not in value:
        return MISSING
    inner = project(value[parts[0]], parts[1:])
    return MISSING if inner is MISSING else {parts[0]: inner}


def merge(base: Any, extra: Any) -> Any:
    """Deep merge of two projections of the same record (dicts by key, lists by position)."""
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for key, value in extra.items():
            out[key] = merge(out[key], value) if key in out else value
        return out
    if isinstance(base, list) and isinstance(extra, list) and len(base) == len(extra):
        return [merge(a, b) for a, b in zip(base, extra, strict=True)]
    return extra


def expand(body: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys → nested objects, "true"/"false" → booleans, as ONTAP reads bodies."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        leaf, value = parts[-1], _normalise(value)
        node[leaf] = merge(node[leaf], value) if leaf in node else value
    return out


def _normalise(value: Any) -> Any:
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    if isinstance(value, dict):
        return expand(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


@dataclass
class Cluster:
    """The simulated cluster: its release, its users and one record list per collection."""

    version: Version
    name: str
    users: dict[str, str]
    tables: dict[str, list[dict[str, Any]]]
    writes: list[dict[str, Any]] = field(default_factory=list)
    _serial: int = 0

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Cluster:
        tables = {path: copy.deepcopy(list(state.get(path, []))) for path in COLLECTIONS}
        return cls(
            version=parse_version(str(state["version"])),
            name=str(state.get("name", "cluster1")),
            users=dict(state.get("users", {"admin": "netapp1!"})),
            tables=tables,
        )

    @classmethod
    def from_file(cls, path: Path) -> Cluster:
        return cls.from_state(json.loads(path.read_text(encoding="utf-8")))

    # ------------------------------------------------------------------ dispatch
    def handle(
        self, method: str, raw_path: str, query: list[tuple[str, str]], body: Any
    ) -> Response:
        path = raw_path.split("?", 1)[0]
        if not path.startswith("/api/"):
            return 404, not_found().body()
        path = path[len("/api/") :].rstrip("/")
        params = dict(query)
        if method != "GET":
            self.writes.append({"method": method, "path": path, "query": params, "body": body})
        try:
            return self._route(method, path, query, params, body or {})
        except ApiError as exc:
            return exc.status, exc.body()

    def _route(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        params: dict[str, str],
        body: dict[str, Any],
    ) -> Response:
        if path == "cluster":
            if method != "GET":
                raise ApiError(405, "method not allowed in this double", "3")
            return 200, self._cluster(params)
        rules = re.fullmatch(r"protocols/nfs/export-policies/(\d+)/rules(?:/(\d+))?", path)
        if rules:
            table = self._policy(rules.group(1)).setdefault("rules", [])
            coll = COLLECTIONS["protocols/nfs/export-policies/rules"]
            return self._resource(method, coll, table, rules.group(2), query, params, body)
        for coll in COLLECTIONS.values():
            if path == coll.path or path.startswith(coll.path + "/"):
                rest = path[len(coll.path) + 1 :] or None
                if rest is not None and "/" in rest:
                    continue
                table = self.tables[coll.path]
                return self._resource(method, coll, table, rest, query, params, body)
        raise not_found()

    def _cluster(self, params: dict[str, str]) -> dict[str, Any]:
        gen, major, minor = self.version
        record = {
            "name": self.name,
            "uuid": "7c1a0f7e-0000-11ee-9000-00a098000001",
            "version": {
                "full": f"NetApp Release {gen}.{major}.{minor}: Mon Jan 01 00:00:00 UTC 2024",
                "generation": gen,
                "major": major,
                "minor": minor,
            },
        }
        requested = [f for f in params.get("fields", "").split(",") if f]
        for name in requested:
            if name.split(".")[0] not in {"name", "uuid", "version", "*", "**", "_links"}:
                raise ApiError(400, self._bad_field(name), "262197", "fields")
        return record

    def _policy(self, policy_id: str) -> dict[str, Any]:
        for policy in self.tables["protocols/nfs/export-policies"]:
            if str(policy["id"]) == policy_id:
                return policy
        raise not_found()

    # ------------------------------------------------------------------ fields
    def _gated(self, coll: Collection) -> dict[str, Version]:
        return {k: v for k, v in GATED.get(coll.path, {}).items() if self.version < v}

    @staticmethod
    def _bad_field(name: str) -> str:
        return f'The value "{name}" is invalid for field "fields" (<field,...>)'

    def _check_field(self, coll: Collection, name: str) -> None:
        missing = self._gated(coll)
        top = name.split(".")[0]
        too_new = any(name == g or name.startswith(g + ".") for g in missing)
        if top not in coll.fields or too_new:
            raise ApiError(400, self._bad_field(name), "262197", "fields")

    def _strip_gated(self, coll: Collection, record: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(record)
        for gated in self._gated(coll):
            parts = gated.split(".")
            node = out
            for part in parts[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(parts[-1], None)
        return out

    def _view(self, coll: Collection, record: dict[str, Any], fields: list[str]) -> dict[str, Any]:
        record = self._strip_gated(coll, record)
        if any(f in ("*", "**") for f in fields):
            return record
        out: dict[str, Any] = {}
        for name in [*coll.identity, *fields]:
            part = project(record, name.split("."))
            if part is not MISSING:
                out = merge(out, part)
        return out

    # ------------------------------------------------------------------ resources
    def _key(self, coll: Collection, record: Mapping[str, Any]) -> str:
        values = values_at(record, coll.key.split("."))
        return _text(values[0]) if values else ""

    def _find(self, coll: Collection, table: list[dict[str, Any]], key: str) -> dict[str, Any]:
        for record in table:
            if self._key(coll, record) == key:
                return record
        raise not_found()

    def _resource(
        self,
        method: str,
        coll: Collection,
        table: list[dict[str, Any]],
        key: str | None,
        query: list[tuple[str, str]],
        params: dict[str, str],
        body: dict[str, Any],
    ) -> Response:
        fields = [f for f in params.get("fields", "").split(",") if f]
        for name in fields:
            if name not in ("*", "**"):
                self._check_field(coll, name)
        if method == "GET" and key is None:
            return 200, self._list(coll, table, query, params, fields)
        if method == "GET" and key is not None:
            # A single record comes with all its (non-expensive) fields unless `fields=` narrows it.
            return 200, self._view(coll, self._find(coll, table, key), fields or ["*"])
        data = expand(body)
        for name in data:
            if name.split(".")[0] not in coll.fields or name in self._gated(coll):
                raise ApiError(400, f'Unexpected argument "{name}".', "262179", name)
        for gated in self._gated(coll):
            if values_at(data, gated.split(".")):
                raise ApiError(400, f'Unexpected argument "{gated}".', "262179", gated)
        if method == "POST" and key is None:
            record = self._create(coll, table, data)
            table.append(record)
            return self._done(coll, 201, params, record)
        if method == "PATCH" and key is not None:
            record = self._find(coll, table, key)
            self._modify(coll, table, record, data, params)
            return self._done(coll, 200, params, None)
        if method == "DELETE" and key is not None:
            table.remove(self._find(coll, table, key))
            return self._done(coll, 200, params, None)
        raise ApiError(405, f"{method} is not allowed on this path", "3")

    def _list(
        self,
        coll: Collection,
        table: list[dict[str, Any]],
        query: list[tuple[str, str]],
        params: dict[str, str],
        fields: list[str],
    ) -> dict[str, Any]:
        filters = [
            (k, v) for k, v in query if k not in PAGING_PARAMS and not k.startswith("start.")
        ]
        for name, _ in filters:
            self._check_field(coll, name)
        rows = [r for r in table if all(matches(v, values_at(r, k.split("."))) for k, v in filters)]
        cursor = next((v for k, v in query if k == "start." + coll.key), None)
        if cursor is not None:
            keys = [self._key(coll, r) for r in rows]
            rows = rows[keys.index(cursor) + 1 :] if cursor in keys else []
        limit = int(params.get("max_records", "10000"))
        page, more = rows[:limit], len(rows) > limit
        base = "/api/" + self._path_of(coll, table)
        kept = [(k, v) for k, v in query if not k.startswith("start.")]
        links: dict[str, Any] = {"self": {"href": base + ("?" + urlencode(kept) if kept else "")}}
        if more and page:
            nxt = [*kept, ("start." + coll.key, self._key(coll, page[-1]))]
            links["next"] = {"href": base + "?" + urlencode(nxt)}
        return {
            "records": [self._view(coll, r, fields) for r in page],
            "num_records": len(page),
            "_links": links,
        }

    def _path_of(self, coll: Collection, table: list[dict[str, Any]]) -> str:
        if coll.path.endswith("/rules"):
            for policy in self.tables["protocols/nfs/export-policies"]:
                if policy.get("rules") is table:
                    return f"protocols/nfs/export-policies/{policy['id']}/rules"
        return coll.path

    def _done(
        self, coll: Collection, status: int, params: dict[str, str], record: dict[str, Any] | None
    ) -> Response:
        body: dict[str, Any] = {}
        if record is not None and params.get("return_records") == "true":
            body = {"num_records": 1, "records": [self._view(coll, record, ["**"])]}
        if coll.asynchronous:
            job = self._job()
            body["job"] = {"uuid": job["uuid"], "_links": {"self": {"href": job["href"]}}}
            if int(params.get("return_timeout", "0") or 0) == 0:
                status = 202
        return status, body

    def _job(self) -> dict[str, Any]:
        self._serial += 1
        job_uuid = str(uuidlib.UUID(int=0x10B0000 + self._serial))
        href = f"/api/cluster/jobs/{job_uuid}"
        self.tables["cluster/jobs"].append(
            {"uuid": job_uuid, "state": "success", "message": "success", "code": 0,
             "description": "volume operation", "_links": {"self": {"href": href}}}
        )  # fmt: skip
        return {"uuid": job_uuid, "href": href}

    def _new_uuid(self) -> str:
        self._serial += 1
        return str(uuidlib.UUID(int=0xD0B1E0000 + self._serial))

    def _svm(self, ref: Mapping[str, Any]) -> dict[str, Any]:
        for svm in self.tables["svm/svms"]:
            if ref.get("name") in (None, svm["name"]) and ref.get("uuid") in (None, svm["uuid"]):
                return {"name": svm["name"], "uuid": svm["uuid"]}
        raise ApiError(404, f"SVM {ref} not found", "2621462", "svm.name")

    def _create(
        self, coll: Collection, table: list[dict[str, Any]], data: dict[str, Any]
    ) -> dict[str, Any]:
        if coll.path == "storage/volumes":
            return self._new_volume(data)
        if coll.path == "protocols/nfs/services":
            svm = self._svm(data.get("svm", {}))
            if any(self._key(coll, r) == svm["uuid"] for r in table):
                raise ApiError(409, "NFS is already configured for this SVM", "1", "svm")
            defaults = {
                "enabled": True,
                "state": "online",
                "transport": {"tcp_enabled": True, "udp_enabled": True, "rdma_enabled": True},
                "protocol": {"v3_enabled": True, "v40_enabled": False, "v41_enabled": False},
            }
            return self._strip_gated(coll, merge(merge(defaults, data), {"svm": svm}))
        if coll.path == "protocols/nfs/export-policies":
            svm = self._svm(data.get("svm", {}))
            if any(p["name"] == data.get("name") and p["svm"] == svm for p in table):
                raise ApiError(409, "duplicate entry", "1", "name")
            policy_id = 8589934592 + len(table) + self._serial
            self._serial += 1
            return {"id": policy_id, "name": data.get("name"), "svm": svm, "rules": []}
        if coll.path == "protocols/nfs/export-policies/rules":
            for required in ("clients", "ro_rule", "rw_rule"):
                if required not in data:
                    raise ApiError(400, f'Missing value for "{required}".', "2", required)
            index = int(data.pop("index", 0) or 0) or max([0, *(r["index"] for r in table)]) + 1
            defaults = {
                "protocols": ["any"],
                "anonymous_user": "none",
                "superuser": ["any"],
                "allow_suid": True,
                "allow_device_creation": True,
                "ntfs_unix_security": "fail",
                "chown_mode": "restricted",
            }
            return merge(merge(defaults, data), {"index": index})
        raise ApiError(405, f"POST is not supported on {coll.path} by this double", "3")

    def _new_volume(self, data: dict[str, Any]) -> dict[str, Any]:
        for required in ("name", "svm", "aggregates"):
            if required not in data:
                raise ApiError(400, f'Missing value for "{required}".', "2", required)
        svm = self._svm(data["svm"])
        aggregates = []
        for ref in data["aggregates"]:
            aggr = next(
                (a for a in self.tables["storage/aggregates"] if ref.get("name") in (a["name"],)),
                None,
            )
            if aggr is None:
                raise ApiError(404, f"aggregate {ref} not found", "917927", "aggregates")
            aggregates.append({"name": aggr["name"], "uuid": aggr["uuid"]})
        size = int(data.get("size", 20 * 1024 * 1024))
        record: dict[str, Any] = {
            "uuid": self._new_uuid(),
            "state": "online",
            "style": "flexvol",
            "type": "rw",
            "guarantee": {"type": "volume"},
            "snapshot_policy": {"name": "default"},
            "nas": {"security_style": "unix", "export_policy": {"name": "default"}},
        }
        record = merge(record, {k: v for k, v in data.items() if k != "size"})
        record["svm"], record["aggregates"] = svm, aggregates
        record["size"] = size
        record["space"] = {"size": size, "available": int(size * 0.95), "used": int(size * 0.05)}
        if not record["nas"].get("path"):
            record["nas"].pop("path", None)
        return record

    def _modify(
        self,
        coll: Collection,
        table: list[dict[str, Any]],
        record: dict[str, Any],
        data: dict[str, Any],
        params: dict[str, str],
    ) -> None:
        updated = merge(record, data)
        if coll.path == "storage/volumes":
            size = data.get("size", data.get("space", {}).get("size"))
            if size is not None:
                used = int(record.get("space", {}).get("used", 0))
                updated["size"] = int(size)
                updated["space"] = {**updated["space"], "size": int(size)}
                updated["space"]["available"] = max(int(size) - used, 0)
            if updated.get("nas", {}).get("path") == "":
                updated["nas"].pop("path")
        if coll.path.endswith("/rules") and params.get("new_index"):
            updated["index"] = int(params["new_index"])
        for name in ("rdma_protocols", "clients", "protocols", "ro_rule", "rw_rule", "superuser"):
            if name in data:  # lists are replaced, never merged element-wise
                updated[name] = data[name]
        record.clear()
        record.update(updated)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """The cluster as a state document (same shape as the file it started from)."""
        out: dict[str, Any] = {
            "version": ".".join(str(p) for p in self.version),
            "name": self.name,
            "users": dict(self.users),
        }
        out.update({path: copy.deepcopy(rows) for path, rows in self.tables.items() if rows})
        return out
