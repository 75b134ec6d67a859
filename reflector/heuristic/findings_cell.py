from SANDBOX_VARIABLES import task, traces  # stand-in lines: see reflector/heuristic/model.py
import json, re, collections, collections.abc

MAX_LINE = 19000

def short(value, limit=300):
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

def kind_of(value):
    for name, cls in (("dict", dict), ("list", list), ("str", str), ("int", int), ("float", float)):
        if isinstance(value, cls):
            return name
    return "other"

from ANSWER_RULES_SOURCE import action_text, compare, compare_actions, missing_outputs, state_changing

SKILL_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*-\d{3,})\b")

def is_list(value):
    """A list, or a lazy sequence of a large trace (read in one pass: every access parses)."""
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes))

def is_lazy(value):
    """A lazy sequence of a large trace: it has columns to filter and count with, without parsing."""
    return is_list(value) and not isinstance(value, (list, tuple))

def step_facts(steps, steps_limit, want_said):
    """What the findings need from the steps, in one pass (a lazy trace parses each step once)."""
    failing, said, cited = [], [], set()
    n_steps = n_failing = 0
    calls, fail_tools, same_errors = collections.Counter(), collections.Counter(), collections.Counter()
    last_step = None
    for s in steps:
        n_steps += 1
        if not isinstance(s, dict):
            continue
        for c in s.get("tool_calls") or []:
            calls[str(c.get("name"))] += 1
        content = s.get("content")
        if s.get("is_error"):
            n_failing += 1
            fail_tools[str(s.get("tool_name"))] += 1
            same_errors[(str(s.get("tool_name")), str(content))] += 1
            if len(failing) < steps_limit:
                failing.append(s)
        if s.get("role") == "assistant":
            if want_said:
                said.append(content)
            if str(content or "").strip():
                last_step = {"index": s.get("index"), "content": short(content, 300)}
        cited.update(SKILL_RE.findall(str(s.get("content", ""))))
    return n_steps, n_failing, failing, calls, fail_tools, same_errors, last_step, said, cited

def lazy_step_facts(steps, steps_limit, want_said, max_parsed=20000):
    """`step_facts` of a lazy sequence, read off its index columns, parsing only the steps it shows; the
    repeated-failure count looks at the first `max_parsed` failing steps."""
    errors = steps.where(is_error=True)
    failing = [steps[i] for i in errors[:steps_limit]]
    same_errors = collections.Counter()
    for i in errors[:max_parsed]:
        s = steps[i]
        same_errors[(str(s.get("tool_name")), str(s.get("content")))] += 1
    last_step = None
    assistant = steps.where(role="assistant")
    for i in reversed(assistant):
        content = steps[i].get("content")
        if str(content or "").strip():
            last_step = {"index": steps[i].get("index"), "content": short(content, 300)}
            break
    said = [steps[i].get("content") for i in assistant] if want_said else []
    cited = set()
    # a skill id has "-" and 3 digits: a search for that literal is ~10x faster than SKILL_RE over the
    # whole raw text, and only the steps it finds are parsed and searched properly
    for i in steps.grep("-[0-9]{3}", limit=max_parsed):
        cited.update(SKILL_RE.findall(str(steps[i].get("content", ""))))
    calls = collections.Counter(steps.tool_call_counts())
    fail_tools = collections.Counter(steps.counts("tool_name", is_error=True))
    return len(steps), len(errors), failing, calls, fail_tools, same_errors, last_step, said, cited

def run_findings(run, task_info, steps_limit=10):
    steps = run.get("steps")
    steps = steps if is_list(steps) else []
    want_said = bool(run.get("expected_outputs"))
    facts = lazy_step_facts if is_lazy(steps) else step_facts
    n_steps, n_failing, failing, calls, fail_tools, same_errors, last_step, said, cited = facts(
        steps, steps_limit, want_said)
    repeated = {}
    for (name, _content), count in same_errors.items():
        if count > 1:
            repeated[name] = max(repeated.get(name, 0), count)
    truth = task_info.get("ground_truth")
    truth_source = "task"
    if truth is None or not str(truth).strip():
        truth, truth_source = run.get("ground_truth"), "traces"
    if truth is None:
        truth_source = None
    final = run.get("final_answer")
    matches, missing = compare(final, truth)
    # a structured ground truth (tau-bench): actions against actions, outputs against what the agent said
    actions_ok, missing_actions, unexpected_actions = compare_actions(run.get("actions"), run.get("expected_actions"))
    outputs_missing = missing_outputs(run.get("expected_outputs"), said)
    cited.update(SKILL_RE.findall(str(final or "")))
    meta = run.get("metadata") or {}
    for sid in meta.get("skill_ids") or []:
        cited.add(str(sid))
    return {
        "id": meta.get("id"),
        "format": run.get("format"),
        "question": short(task_info.get("question") or run.get("question"), 300),
        "n_steps": n_steps,
        "n_failing_steps": n_failing,
        "failing_steps": [
            {"index": s.get("index"), "tool_name": s.get("tool_name"), "content": short(s.get("content"), 200)}
            for s in failing
        ],
        "failing_tools": dict(fail_tools.most_common(10)),
        "repeated_failures": repeated,
        "last_assistant_step": last_step,
        "tool_calls": dict(calls.most_common(20)),
        "n_tool_calls": sum(calls.values()),
        "final_answer": short(final, 600),
        "ground_truth": short(truth, 600),
        "ground_truth_source": truth_source,
        "answer_matches": matches,
        "missing_from_answer": missing,
        "actions_match": actions_ok,
        "agent_actions": [short(action_text(a), 300) for a in state_changing(run.get("actions"), True)[:5]],
        "expected_actions": [short(action_text(a), 300) for a in state_changing(run.get("expected_actions"), False)[:5]],
        "missing_actions": missing_actions,
        "unexpected_actions": unexpected_actions,
        "missing_outputs": outputs_missing[:5],
        "reward": run.get("reward"),
        "feedback": short(task_info.get("feedback") or run.get("feedback"), 300),
        "cited_skill_ids": sorted(cited)[:30],
    }

def batch_findings(view, task_info):
    # one run at a time: a lazy batch normalises each run on access, so none is kept
    per_run = [run_findings(r, {}, steps_limit=3) for r in view.get("runs") if isinstance(r, dict)]
    failing = [
        f for f in per_run
        if (f["reward"] is not None and f["reward"] < 1)
        or (f["reward"] is None and (f["answer_matches"] is False or f["actions_match"] is False
                                     or f["n_failing_steps"]))
    ]
    tools = collections.Counter()
    for f in failing:
        tools.update(f["failing_tools"])
    rewards = [f["reward"] for f in per_run if f["reward"] is not None]
    out = {
        "format": view.get("format"),
        "batch": True,
        "n_runs": len(per_run),
        "n_steps": sum(f["n_steps"] for f in per_run),
        "n_failing_runs": len(failing),
        "mean_reward": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "failing_runs": [
            {"id": f["id"] if f["id"] is not None else i, "reward": f["reward"],
             "answer_matches": f["answer_matches"], "actions_match": f["actions_match"],
             "n_failing_steps": f["n_failing_steps"]}
            for i, f in enumerate(failing[:25])
        ],
        "failing_tools": [[name, count] for name, count in tools.most_common(5)],
        "n_runs_with_tool_errors": sum(1 for f in failing if f["n_failing_steps"]),
        "n_failing_runs_answer_mismatch": sum(1 for f in failing if f["answer_matches"] is False),
        "n_failing_runs_action_mismatch": sum(1 for f in failing if f["actions_match"] is False),
    }
    if failing:
        out["example_run"] = failing[0]
    return out

def findings():
    try:
        task_info = task if isinstance(task, dict) else {}
    except NameError:
        task_info = {}
    view = traces
    if not isinstance(view, dict):
        return {"format": "unknown", "n_steps": 0, "raw_type": kind_of(view)}
    if is_list(view.get("runs")):
        return batch_findings(view, task_info)
    out = run_findings(view, task_info)
    if view.get("format") == "unknown":
        raw = view.get("raw")
        out["raw_type"] = kind_of(raw)
        out["raw_keys"] = sorted(str(k) for k in raw)[:30] if isinstance(raw, dict) else []
        out["raw_len"] = len(raw) if isinstance(raw, (list, dict, str)) else None
    return out

result = findings()
line = json.dumps(result, ensure_ascii=False, default=str)
for key in ("example_run", "failing_runs", "tool_calls", "question", "feedback", "agent_actions", "expected_actions"):
    if len(line) <= MAX_LINE:
        break
    result.pop(key, None)
    line = json.dumps(result, ensure_ascii=False, default=str)
print("RR_FINDINGS " + line[:MAX_LINE])
