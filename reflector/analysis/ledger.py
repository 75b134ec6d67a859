"""The budget ledger of one session, and how budgets flow through a recursion tree.

Pure and deterministic (it lives in workflow state). A session's limits are its allocation: the
root's are the user's limits; a child's are carved from its parent's *remaining* budget when it is
started, so the sum over the tree can never be allocated twice. Usage is charged from the records
each workflow returns, children included, never from shared state.

Overshoot: limits are checked before every model request (own turns and summaries). Only one request
of a tree is in flight at a time (a parent waits for its child; `recurse` calls are serialised), so
the tree's total can exceed the root's token limit by at most the tokens of that one request: the
request that crossed the line. Requests never overshoot (the count is known before the request).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["UsageSummary", "UsageRecord", "Ledger", "Allocation", "MIN_CHILD_TOKENS"]

MIN_CHILD_TOKENS = 10_000


class UsageSummary(BaseModel):
    """A tree's usage. `input_tokens` includes the cached ones (`cache_read_tokens`: served from the provider's
    prompt cache, billed at about a tenth; `cache_write_tokens`: written to it, billed at a premium), as
    providers and pydantic-ai count them; the budget counts every input token."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    requests: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


class UsageRecord(BaseModel):
    """One model request anywhere in the tree (a `usage_callback`-style meter entry)."""

    kind: Literal["turn", "summary", "synthesis"] = "turn"
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    depth: int = 0
    workflow_id: str = ""
    cache_read_tokens: int = 0  # of input_tokens
    cache_write_tokens: int = 0  # of input_tokens


class Allocation(BaseModel):
    tokens: int
    requests: int


def _sum(records: list[UsageRecord]) -> UsageSummary:
    inp = sum(r.input_tokens for r in records)
    out = sum(r.output_tokens for r in records)
    return UsageSummary(
        input_tokens=inp,
        output_tokens=out,
        total_tokens=inp + out,
        requests=len(records),
        cache_read_tokens=sum(r.cache_read_tokens for r in records),
        cache_write_tokens=sum(r.cache_write_tokens for r in records),
    )


class Ledger(BaseModel):
    max_tokens: int
    max_requests: int
    records: list[UsageRecord] = Field(default_factory=list)

    def charge(self, *records: UsageRecord) -> None:
        self.records.extend(records)

    def spent(self) -> UsageSummary:
        return _sum(self.records)

    def remaining_tokens(self) -> int:
        return self.max_tokens - self.spent().total_tokens

    def remaining_requests(self) -> int:
        return self.max_requests - len(self.records)

    def exhausted(self, reserve_requests: int = 0, reserve_tokens: int = 0) -> str | None:
        """The stop reason if the next request must not be made, else None."""
        if self.remaining_requests() <= reserve_requests:
            return "request_budget"
        if self.remaining_tokens() <= reserve_tokens:
            return "token_budget"
        return None

    def child_allocation(self, fraction: float) -> Allocation | None:
        """`max(10_000, fraction × remaining)` tokens, never more than remaining; requests pro rata."""
        tokens_left, requests_left = self.remaining_tokens(), self.remaining_requests()
        if tokens_left <= 0 or requests_left <= 0:
            return None
        tokens = min(tokens_left, max(MIN_CHILD_TOKENS, int(fraction * tokens_left)))
        requests = min(requests_left, max(1, int(fraction * requests_left)))
        return Allocation(tokens=tokens, requests=requests)
