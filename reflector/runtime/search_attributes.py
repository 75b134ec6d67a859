"""rr's custom search attributes (Temporal visibility) and the memo shown by `rr list`.

The names and types are durable (`reflector.contract.SEARCH_ATTRIBUTES`). A namespace where they are
not registered must keep working: setting an unknown attribute fails the workflow start (or, for a
child or an upsert, the workflow task), so the client asks the server what is registered
(`missing`) and says so in the input (`ReflectionInput.search_attributes`); workflows set attributes on
children and upsert at the end only then. The builders below are pure (workflow code uses them);
`missing` and `register` talk to the operator service (client side only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

from reflector.contract import (
    MEMO_KEY,
    SA_BATCH_ID,
    SA_CHILDREN,
    SA_MODEL,
    SA_PARENT,
    SA_REQUESTS,
    SA_STOP_REASON,
    SA_TOKENS,
    SA_TRACE_SHA256,
    SEARCH_ATTRIBUTES,
    TraceRef,
)

__all__ = [
    "MODEL",
    "STOP_REASON",
    "TRACE_SHA256",
    "BATCH_ID",
    "PARENT",
    "REQUESTS",
    "TOKENS",
    "CHILDREN",
    "start_attributes",
    "end_updates",
    "memo",
    "memo_of",
    "missing",
    "register",
    "register_hint",
]

MODEL = SearchAttributeKey.for_keyword(SA_MODEL)
STOP_REASON = SearchAttributeKey.for_keyword(SA_STOP_REASON)
TRACE_SHA256 = SearchAttributeKey.for_keyword(SA_TRACE_SHA256)
BATCH_ID = SearchAttributeKey.for_keyword(SA_BATCH_ID)
PARENT = SearchAttributeKey.for_keyword(SA_PARENT)
REQUESTS = SearchAttributeKey.for_int(SA_REQUESTS)
TOKENS = SearchAttributeKey.for_int(SA_TOKENS)
CHILDREN = SearchAttributeKey.for_int(SA_CHILDREN)


def start_attributes(
    model: str, *, trace_sha256: str | None = None, parent: str | None = None, batch_id: str | None = None
) -> TypedSearchAttributes:
    """The attributes a reflection or batch starts with (the rest are upserted when it ends)."""
    pairs: list[SearchAttributePair[Any]] = [SearchAttributePair(MODEL, model)]
    if trace_sha256:
        pairs.append(SearchAttributePair(TRACE_SHA256, trace_sha256))
    if parent:
        pairs.append(SearchAttributePair(PARENT, parent))
    if batch_id:
        pairs.append(SearchAttributePair(BATCH_ID, batch_id))
    return TypedSearchAttributes(pairs)


def end_updates(
    stop_reason: str, *, requests: int, tokens: int, children: int
) -> list[SearchAttributeUpdate[Any]]:
    """What a reflection or batch upserts when it ends: its stop reason and totals."""
    return [
        STOP_REASON.value_set(stop_reason),
        REQUESTS.value_set(requests),
        TOKENS.value_set(tokens),
        CHILDREN.value_set(children),
    ]


def memo(trace: TraceRef | None, name: str = "", *, runs: int | None = None) -> dict[str, Any]:
    """The memo a workflow starts with, for display: the trace's file name, format and size (or a batch's runs)."""
    shown: dict[str, Any] = {"trace": name}
    if trace is not None:
        shown.update(format=trace.format, size=trace.size)
        if trace.store_id:  # the store the client uploaded to (`reflector.runtime.storage.identity`)
            shown.update(store_id=trace.store_id, store=trace.store_url)
    if runs is not None:
        shown["runs"] = runs
    return {MEMO_KEY: shown}


def memo_of(decoded: Mapping[str, Any]) -> dict[str, Any]:
    """The display memo out of a workflow's decoded memo (`{}` for workflows started without one)."""
    shown = decoded.get(MEMO_KEY)
    return shown if isinstance(shown, dict) else {}


def register_hint(namespace: str) -> str:
    """How to register the attributes (the one-line advice `rr list` gives where they are missing)."""
    flags = " ".join(f"--name {n} --type {t}" for n, t in SEARCH_ATTRIBUTES.items())
    return (
        f"run `rr setup` (same TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE), or `temporal operator search-attribute "
        f"create --namespace {namespace} {flags}`"
    )


async def _listed(client: Any) -> Any:
    """The namespace's search attributes (`ListSearchAttributesResponse`). Asked on every start: a transient
    refusal (a busy server's UNAVAILABLE or RESOURCE_EXHAUSTED) is retried by the client (`retry=True`), or
    the reflection would start unindexed for good (seen once in the suite under load); a lasting one (no
    permission, no such namespace) is raised at once."""
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

    return await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace), retry=True
    )


async def missing(client: Any) -> list[str]:
    """rr's attributes not registered in the client's namespace (all of them when the server will not say)."""
    from temporalio.service import RPCError

    try:
        resp = await _listed(client)
    except RPCError:
        return list(SEARCH_ATTRIBUTES)
    have = set(resp.custom_attributes) | set(resp.system_attributes)
    return [name for name in SEARCH_ATTRIBUTES if name not in have]


class RegistrationError(RuntimeError):
    """An attribute exists with another type, or the server refused to add them."""


async def register(client: Any) -> list[str]:
    """Register rr's attributes in the client's namespace (idempotent); returns the names it added."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError

    resp = await _listed(client)
    have = dict(resp.custom_attributes)
    wrong = [
        f"{n} is {IndexedValueType.Name(have[n])}, rr needs {t}"
        for n, t in SEARCH_ATTRIBUTES.items()
        if n in have and IndexedValueType.Name(have[n]) != f"INDEXED_VALUE_TYPE_{t.upper()}"
    ]
    if wrong:
        raise RegistrationError("search attributes registered with another type: " + "; ".join(wrong))
    add = {
        n: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{t.upper()}")
        for n, t in SEARCH_ATTRIBUTES.items()
        if n not in have
    }
    if add:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=client.namespace, search_attributes=add)
            )
        except RPCError as e:
            raise RegistrationError(f"the server refused to add {', '.join(add)}: {e}") from e
    return list(add)
