"""Pure unit tests of the policies the workflow applies: the budget ledger, microcompaction, the loop
guard and the counters carried across continue-as-new (no server, no worker)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from reflector.analysis.compaction import PLACEHOLDER, compacted_history, message_chars, microcompact
from reflector.analysis.ledger import MIN_CHILD_TOKENS, Ledger, UsageRecord
from reflector.contract import (
    EXECUTE_CODE_TOOL,
    Continuation,
    Counters,
    ReflectionConfig,
    ReflectionInput,
    TraceRef,
)
from workflows.state import SessionState

# ------------------------------------------------------------------------------------------ ledger


def _rec(inp: int, out: int = 0) -> UsageRecord:
    return UsageRecord(input_tokens=inp, output_tokens=out)


def test_ledger_sums_what_it_was_charged() -> None:
    ledger = Ledger(max_tokens=1_000, max_requests=5)
    ledger.charge(_rec(100, 20), _rec(30, 5))
    spent = ledger.spent()
    assert (spent.input_tokens, spent.output_tokens, spent.total_tokens, spent.requests) == (130, 25, 155, 2)
    assert ledger.remaining_tokens() == 845 and ledger.remaining_requests() == 3


def test_ledger_stops_on_requests_before_tokens_and_honours_reserves() -> None:
    ledger = Ledger(max_tokens=1_000, max_requests=3)
    assert ledger.exhausted() is None
    ledger.charge(_rec(10), _rec(10))
    assert ledger.exhausted() is None
    assert ledger.exhausted(reserve_requests=1) == "request_budget"  # the last request is kept back
    ledger.charge(_rec(975))
    assert ledger.exhausted() == "request_budget"
    tokens = Ledger(max_tokens=100, max_requests=10)
    tokens.charge(_rec(60))
    assert tokens.exhausted() is None
    assert tokens.exhausted(reserve_tokens=40) == "token_budget"
    tokens.charge(_rec(40))
    assert tokens.exhausted() == "token_budget"


def test_child_allocation_is_a_share_of_what_remains() -> None:
    ledger = Ledger(max_tokens=100_000, max_requests=20)
    ledger.charge(_rec(40_000))
    alloc = ledger.child_allocation(0.5)
    assert alloc is not None and (alloc.tokens, alloc.requests) == (30_000, 9)
    small = Ledger(max_tokens=12_000, max_requests=2)
    alloc = small.child_allocation(0.1)
    assert alloc is not None and alloc.tokens == MIN_CHILD_TOKENS and alloc.requests == 1
    tiny = Ledger(max_tokens=5_000, max_requests=2)
    alloc = tiny.child_allocation(0.5)
    assert alloc is not None and alloc.tokens == 5_000  # never more than remains
    spent = Ledger(max_tokens=10, max_requests=1)
    spent.charge(_rec(1))
    assert spent.child_allocation(0.5) is None


@given(
    st.integers(1, 10**7),
    st.integers(1, 200),
    st.floats(0.01, 1.0),
    st.lists(st.integers(0, 10**6), max_size=30),
)
def test_children_never_get_more_than_remains(
    max_tokens: int, max_requests: int, fraction: float, charges: list[int]
) -> None:
    ledger = Ledger(max_tokens=max_tokens, max_requests=max_requests)
    ledger.charge(*(_rec(c) for c in charges))
    alloc = ledger.child_allocation(fraction)
    if alloc is None:
        assert ledger.remaining_tokens() <= 0 or ledger.remaining_requests() <= 0
    else:
        assert 0 < alloc.tokens <= ledger.remaining_tokens()
        assert 0 < alloc.requests <= ledger.remaining_requests()


# -------------------------------------------------------------------------------- microcompaction


def _conversation(outputs: list[str]) -> list[ModelMessage]:
    msgs: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("reflect on the trace")])]
    for i, out in enumerate(outputs):
        msgs.append(
            ModelResponse(
                parts=[ToolCallPart(EXECUTE_CODE_TOOL, {"code": f"print({i})"}, tool_call_id=f"c{i}")]
            )
        )
        msgs.append(ModelRequest(parts=[ToolReturnPart(EXECUTE_CODE_TOOL, out, tool_call_id=f"c{i}")]))
    return msgs


def _returns(msgs: list[ModelMessage]) -> list[object]:
    return [
        p.content
        for m in msgs
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def test_microcompact_keeps_the_recent_outputs_and_the_call_structure() -> None:
    msgs = _conversation([f"output {i} " * 100 for i in range(5)])
    out, replaced = microcompact(msgs, keep_recent=2)
    assert replaced == 3
    assert _returns(out) == [PLACEHOLDER] * 3 + [f"output {i} " * 100 for i in (3, 4)]
    assert len(out) == len(msgs) and [type(m) for m in out] == [type(m) for m in msgs]
    assert message_chars(out) < message_chars(msgs)
    assert _returns(msgs)[0] == "output 0 " * 100  # the input is not modified


def test_microcompact_is_idempotent_and_leaves_other_tools_alone() -> None:
    msgs = _conversation(["a" * 500, "b" * 500, "c" * 500])
    msgs.append(ModelRequest(parts=[ToolReturnPart("think", "noted", tool_call_id="t")]))
    once, n1 = microcompact(msgs, keep_recent=1)
    twice, n2 = microcompact(once, keep_recent=1)
    assert (n1, n2) == (2, 0) and twice is once
    assert _returns(once)[-1] == "noted"
    nothing, n = microcompact(msgs, keep_recent=10)
    assert n == 0 and nothing is msgs


def test_compacted_history_is_task_summary_continuation() -> None:
    msgs = _conversation(["x" * 100])
    out = compacted_history(msgs, "the agent failed at step 3")
    assert len(out) == 3
    assert isinstance(out[0], ModelRequest) and [p.content for p in out[0].parts] == ["reflect on the trace"]
    assert isinstance(out[1], ModelResponse) and isinstance(out[1].parts[0], TextPart)
    assert "the agent failed at step 3" in out[1].parts[0].content
    assert isinstance(out[2], ModelRequest) and "history" in str(out[2].parts[0].content)


# ----------------------------------------------------------------------------------- the loop guard


def _state(**config: object) -> SessionState:
    inp = ReflectionInput(
        trace=TraceRef(uri="blob:sha256:" + "0" * 64, sha256="0" * 64, size=1),
        config=ReflectionConfig(**config),
    )
    return SessionState.create(inp, "wf-1")


def _fail(state: SessionState, code: str) -> None:
    state.record_cell(code, ok=False)  # what `run_cell` records for a failed cell (no activity here)


def test_loop_guard_refuses_only_the_same_failing_cell_past_the_limit() -> None:
    state = _state(max_failed_repeats=2)
    assert state.loop_guard("print(1/0)") is None
    _fail(state, "print(1/0)")
    assert state.loop_guard("print(1/0)") is None  # failed once: may be retried
    _fail(state, "print(1/0)")
    refusal = state.loop_guard("print(1/0)")
    assert refusal is not None and refusal.startswith("REFUSED") and "2 times" in refusal
    assert state.loop_guard("print(1/1)") is None  # a changed cell is always allowed
    _fail(state, "print(1/1)")
    assert state.loop_guard("print(1/0)") is None  # the streak was broken
    _fail(state, "print(1/0)")
    _fail(state, "print(1/0)")
    state.record_cell("print(2)", ok=True)
    assert state.loop_guard("print(1/0)") is None and state.consecutive_failures == 0  # a success resets it
    assert (state.counters.cells, state.counters.ok_cells, state.counters.failed_cells) == (6, 1, 5)


# ------------------------------------------------------------------------ counters across continue-as-new


def test_continuation_carries_every_counter_and_the_next_run_counts_itself() -> None:
    state = _state()
    for name in Counters.model_fields:
        setattr(state.counters, name, 7.5 if name == "chars_per_token" else 7)
    state.ledger.charge(_rec(10))
    state.init_ref, state.thoughts = "blob:init", [{"thought": "t"}]
    cont = state.continuation("[]")
    assert isinstance(cont, Continuation)
    assert Counters.model_validate(cont.model_dump(include=set(Counters.model_fields))) == state.counters
    nxt = SessionState.create(state.inp.model_copy(update={"continuation": cont}), "wf-1")
    assert nxt.counters.runs == 8 and nxt.counters.cells == 7 and nxt.counters.chars_per_token == 7.5
    assert (
        nxt.ledger.spent().total_tokens == 10
        and nxt.init_ref == "blob:init"
        and nxt.thoughts == state.thoughts
    )


@pytest.mark.parametrize("cached", [False, True])
def test_continuation_carries_whether_a_response_was_cached(cached: bool) -> None:
    # the session's last run forgets the cached responses of every run before it (workflows/reflection.py _close)
    state = _state()
    state.responses_cached = cached
    cont = state.continuation("[]")
    nxt = SessionState.create(state.inp.model_copy(update={"continuation": cont}), "wf-1")
    assert nxt.responses_cached is cached
    # recorded before the field existed: nothing cached is claimed (the patch then decides: every run forgot)
    old = Continuation.model_validate({k: v for k, v in cont.model_dump().items() if k != "responses_cached"})
    assert old.responses_cached is False


@pytest.mark.parametrize("field", sorted(Counters.model_fields))
def test_every_counter_has_a_default(field: str) -> None:
    # persisted in histories: a counter added later must load from a continuation recorded without it
    assert not Counters.model_fields[field].is_required()
