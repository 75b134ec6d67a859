from SANDBOX_VARIABLES import compare_answer, diff_values, failing_calls, first_divergence, root_cause, search_steps, suspect_mistake, task, traces  # stand-in lines: see reflector/analysis/heuristic/model.py
import json, re, collections, collections.abc

# The heuristic's inspection cell. Every finding is computed here, over the trace, with the sandbox's
# toolkit (`tool_calls`, `first_divergence`, `failing_calls`, `suspect_mistake`, ...: reflector/analysis/toolkit/):
# the draft only restates what this cell printed.

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

SKILL_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*-\d{3,})\b")

def is_list(value):
    """A list, or a lazy sequence of a large trace (read in one pass: every access parses)."""
    return isinstance(value, collections.abc.Sequence) and not isinstance(value, (str, bytes))

def is_lazy(value):
    """A lazy sequence of a large trace: it has columns to filter and count with, without parsing."""
    return is_list(value) and not isinstance(value, (list, tuple))

def step_facts(steps):
    """Counts, the last assistant message and cited skill ids, in one pass."""
    n_steps = n_failing = 0
    calls = collections.Counter()
    last_step, cited = None, set()
    for s in steps:
        n_steps += 1
        if not isinstance(s, dict):
            continue
        for c in s.get("tool_calls") or []:
            calls[str(c.get("name"))] += 1
        if s.get("is_error"):
            n_failing += 1
        content = s.get("content")
        if s.get("role") == "assistant" and str(content or "").strip():
            last_step = {"index": s.get("index"), "content": short(content, 300)}
        cited.update(SKILL_RE.findall(str(content or "")))
    return n_steps, n_failing, calls, last_step, cited

def lazy_step_facts(steps, max_parsed=20000):
    """`step_facts` of a lazy sequence, read off its index columns."""
    last_step = None
    assistant = steps.where(role="assistant")
    for i in reversed(assistant):
        content = steps[i].get("content")
        if str(content or "").strip():
            last_step = {"index": steps[i].get("index"), "content": short(content, 300)}
            break
    cited = set()
    # a skill id has "-" and 3 digits: a search for that literal is ~10x faster than SKILL_RE over the
    # whole raw text, and only the steps it finds are parsed and searched properly
    for i in steps.grep("-[0-9]{3}", limit=max_parsed):
        cited.update(SKILL_RE.findall(str(steps[i].get("content", ""))))
    n_failing = len(steps.where(is_error=True))
    return len(steps), n_failing, collections.Counter(steps.tool_call_counts()), last_step, cited

def safely(name, fn, *args):
    """A toolkit finding, or the error it raised."""
    try:
        return fn(*args), None
    except Exception as e:
        return None, f"{name}: {short(repr(e), 200)}"

def divergence_finding(run):
    """The first divergence from the expected actions/outputs, with every differing argument."""
    div, err = safely("first_divergence", first_divergence, run)
    if not isinstance(div, dict):
        return None, err
    out = {k: div.get(k) for k in ("kind", "step", "tool", "argument", "actual", "expected", "where",
                                   "n_expected", "n_matched", "others")}
    call, want = div.get("agent_call"), div.get("expected_action")
    if isinstance(call, dict):
        out["agent_call"] = {"step": call.get("step"), "name": call.get("name"), "args": call.get("args")}
    if isinstance(want, dict):
        out["expected_action"] = {"name": want.get("name"), "args": want.get("args")}
    if isinstance(call, dict) and isinstance(want, dict):
        diffs, _err = safely("diff_values", diff_values, want.get("args"), call.get("args"))
        out["differences"] = (diffs or [])[:8]
    out["at_step"] = step_text(run, div.get("step"))
    return out, err

def step_text(run, index):
    """What the trace shows at step `index`: its role, actor and content (verbatim, shortened)."""
    steps = run.get("steps")
    if not is_list(steps) or not isinstance(index, int) or not 0 <= index < len(steps):
        return None
    s = steps[index]
    if not isinstance(s, dict) or s.get("index") != index:
        return None
    return {"role": s.get("role"), "actor": s.get("actor"), "content": short(s.get("content"), 300),
            "tools": [c.get("name") for c in s.get("tool_calls") or []]}

def failing_finding(run, limit=5):
    """Failing calls grouped by tool: attempts, identical retries, what changed between attempts."""
    groups, err = safely("failing_calls", failing_calls, run)
    out = []
    for g in (groups or [])[:limit]:
        attempts = g.get("attempts") or []
        out.append({
            "tool": g.get("tool"),
            "n_attempts": len(attempts),
            "steps": [a.get("step") for a in attempts][:10],
            "first_error": short(attempts[0].get("error"), 200) if attempts else None,
            "identical_retries": g.get("identical_retries"),
            "changed_args": sorted({d.get("path") for c in g.get("changes") or [] for d in c.get("differences") or []
                                    if d.get("path")})[:8],
            "recovered": g.get("recovered"),
        })
    return out, err

def named_actors(steps, limit=2000):
    """How many distinct agents name themselves in the first `limit` steps."""
    names = set()
    for i in range(min(len(steps), limit)):
        s = steps[i]
        if isinstance(s, dict) and s.get("actor"):
            names.add(str(s.get("actor")))
    return len(names)

NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

def first_wrong_value(run, final):
    """The first step that states the final answer's last number (a lazy trace: grep its raw JSON)."""
    found = NUMBER_RE.findall(str(final or ""))
    if not found:
        return None, None
    raw = found[-1]
    alts = "|".join(sorted({re.escape(raw), re.escape(raw.replace(",", ""))}))
    pattern = "(?<![\\d.,])(?:" + alts + ")(?![\\d]|[.,]\\d)"
    steps = run.get("steps")
    if is_lazy(steps):
        # a literal is found in the raw JSON fast (a lookbehind first would scan every byte slowly); the
        # number's boundaries are then checked on each candidate step's text
        err = None
        for literal in sorted({raw, raw.replace(",", "")}):
            hits, err = safely("grep", steps.grep, re.escape(literal), 20)
            for i in hits or []:
                text = str(steps[i].get("content") or "")
                m = re.search(pattern, text)
                if m:
                    start = max(0, m.start() - 80)
                    return {"value": raw, "step": steps[i].get("index"), "role": steps[i].get("role"),
                            "snippet": short(text[start : start + 200], 200)}, err
        return None, err
    hits, err = safely("search_steps", search_steps, run, pattern, 1, True)
    if not hits:
        return None, err
    return {"value": raw, "step": hits[0].get("step"), "role": hits[0].get("role"),
            "snippet": short(hits[0].get("snippet"), 200)}, err

LAZY_DEEP_STEPS = 20000  # above this, a lazy trace's failures are read off its index (no full parse)

def unnamed_errors(steps, limit):
    """The first `limit` failing steps that name no tool (parsing only until they are found)."""
    out = []
    for i in steps.where(is_error=True):
        if len(out) >= limit:
            break
        if steps[i].get("tool_name") in (None, ""):
            out.append(i)
    return out

def lazy_failing(steps, limit=5):
    """Failing calls of a large lazy trace by tool, read off its index (retries not compared: None)."""
    counts = steps.counts("tool_name", is_error=True)
    out = []
    for tool, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:limit]:
        named = tool not in (None, "", "None")
        where = steps.where(is_error=True, tool_name=tool) if named else unnamed_errors(steps, 10)
        tool = tool if named else "(a step without a tool name)"
        first = steps[where[0]] if where else {}
        out.append({"tool": tool, "n_attempts": n, "steps": list(where[:10]),
                    "first_error": short(first.get("content"), 200), "identical_retries": None,
                    "changed_args": [], "recovered": None})
    return out

def run_findings(run, task_info, deep=True):
    steps = run.get("steps")
    steps = steps if is_list(steps) else []
    n_steps, n_failing, calls, last_step, cited = (lazy_step_facts if is_lazy(steps) else step_facts)(steps)
    truth, truth_source = task_info.get("ground_truth"), "task"
    if truth is None or not str(truth).strip():
        truth, truth_source = run.get("ground_truth"), "trace"
    if truth is None:
        truth_source = None
    final = run.get("final_answer")
    answer = compare_answer(short(final, 20000), short(truth, 20000))
    matches, missing = answer["matches"], answer["missing"]
    has_expected = isinstance(run.get("expected_actions"), list) or bool(run.get("expected_outputs"))
    errors = []
    divergence = None
    if has_expected:
        divergence, err = divergence_finding(run)
        errors += [err] if err else []
    if is_lazy(steps) and len(steps) > LAZY_DEEP_STEPS:
        failing, err = (lazy_failing(steps), None) if deep and n_failing else ([], None)
    else:
        failing, err = failing_finding(run) if deep and n_failing else ([], None)
    errors += [err] if err else []
    suspect = None
    if not has_expected and not calls and named_actors(steps) >= 2:
        # a multi-agent conversation without tool-call structure: the toolkit's rule-based guess
        suspect, err = safely("suspect_mistake", suspect_mistake, run)
        errors += [err] if err else []
    root = None
    if not (is_lazy(steps) and len(steps) > LAZY_DEEP_STEPS):
        # the symptom, and the root cause traced back from it (the rule that placed it, verbatim quotes)
        found, err = safely("root_cause", root_cause, run)
        errors += [err] if err else []
        if isinstance(found, dict):
            root = {"symptom": {k: found["symptom"].get(k) for k in ("step", "kind", "what")},
                    "root": {k: found["root"].get(k) for k in ("step", "actor", "rule", "reason", "kind")},
                    "same": found.get("same"), "confidence": found.get("confidence"),
                    "candidates": [{k: c.get(k) for k in ("step", "rule")} for c in found.get("candidates") or []]}
            root["root"]["reason"] = short(root["root"]["reason"], 400)
    wrong_value = None
    if matches is False and suspect is None:
        wrong_value, err = first_wrong_value(run, final)
        errors += [err] if err else []
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
        "tool_calls": dict(calls.most_common(20)),
        "n_tool_calls": sum(calls.values()),
        "final_answer": short(final, 600),
        "ground_truth": short(truth, 600),
        "ground_truth_source": truth_source,
        "answer_matches": matches,
        "missing_from_answer": missing,
        "has_expected": has_expected,
        "divergence": divergence,
        "failing_calls": failing,
        "suspect": suspect,
        "root": root,
        "wrong_value": wrong_value,
        "last_assistant_step": last_step,
        "reward": run.get("reward"),
        "feedback": short(task_info.get("feedback") or run.get("feedback"), 300),
        "cited_skill_ids": sorted(cited)[:30],
        "toolkit_errors": errors,
    }

def batch_findings(view, task_info):
    # one run at a time: a lazy batch normalises each run on access, so none is kept
    per_run = [run_findings(r, {}, deep=False) for r in view.get("runs") if isinstance(r, dict)]
    failing = [
        f for f in per_run
        if (f["reward"] is not None and f["reward"] < 1)
        or (f["reward"] is None and (f["answer_matches"] is False or f["divergence"] or f["n_failing_steps"]))
    ]
    kinds, tools = collections.Counter(), collections.Counter()
    for f in failing:
        d = f["divergence"] or {}
        if d:
            kinds[str(d.get("kind"))] += 1
            tools[f"{d.get('kind')} {d.get('tool')}"] += 1
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
             "kind": (f["divergence"] or {}).get("kind"), "tool": (f["divergence"] or {}).get("tool"),
             "step": (f["divergence"] or {}).get("step"), "argument": (f["divergence"] or {}).get("argument"),
             "n_failing_steps": f["n_failing_steps"]}
            for i, f in enumerate(failing[:25])
        ],
        "divergence_kinds": dict(kinds.most_common()),
        "divergences": [[k, n] for k, n in tools.most_common(8)],
        "n_failing_runs_with_tool_errors": sum(1 for f in failing if f["n_failing_steps"]),
        "n_failing_runs_answer_mismatch": sum(1 for f in failing if f["answer_matches"] is False),
    }
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
for key in ("failing_runs", "tool_calls", "question", "feedback", "failing_calls", "final_answer"):
    if len(line) <= MAX_LINE:
        break
    result.pop(key, None)
    line = json.dumps(result, ensure_ascii=False, default=str)
if len(line) > MAX_LINE and isinstance(result.get("divergence"), dict):
    for key in ("agent_call", "expected_action"):
        result["divergence"].pop(key, None)
    line = json.dumps(result, ensure_ascii=False, default=str)
print("RR_FINDINGS " + line[:MAX_LINE])
