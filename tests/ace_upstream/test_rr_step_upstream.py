"""ACE's own tests of its Recursive Reflector, run against rr with only the imports swapped (issue 27).

Vendored from ace-framework 0.13.0 (sdist), tests/test_pydantic_ai_integration.py, class
TestRRStepIntegration; Copyright Kayba.ai, licensed under the Apache License 2.0 (./LICENSE). Changes, per
the licence's section 4(b): this header and the module's imports; `from ace.steps.rr_step import RRStep` is
`from reflector import RRStep`, `from ace.implementations.rr.config import RecursiveConfig` is
`from reflector import RRConfig as RecursiveConfig`, `ReflectorOutput` is rr's; the module-level skip on a
missing OPENAI_API_KEY is left out (rr needs no key here: ./conftest.py registers the Bedrock model name
the class uses as rr's heuristic model and points the calls at the session's dev server). The class body
is the upstream text, unchanged.
"""

# ruff: noqa: I001  (the class body keeps the upstream text and its import order)
from __future__ import annotations

import pytest

pytest.importorskip("ace", reason="ace-framework is not installed (the `ace` extra, Python >= 3.12)")

from ace.core.outputs import AgentOutput
from ace.core.skillbook import Skillbook

from reflector import ReflectorOutput


class TestRRStepIntegration:
    """Test the PydanticAI-based Recursive Reflector (RRStep) with real API calls."""

    RR_MODEL = "bedrock/us.anthropic.claude-haiku-4-5-20251001-v1:0"

    @pytest.mark.integration
    def test_rr_basic_reflection(self):
        """RRStep.reflect returns a valid ReflectorOutput with non-empty fields."""
        from reflector import RRStep
        from reflector import RRConfig as RecursiveConfig

        config = RecursiveConfig(
            max_requests=15,
            timeout=15.0,
        )
        rr = RRStep(model=self.RR_MODEL, config=config)
        sb = Skillbook()

        agent_out = AgentOutput(
            reasoning="I recall that the capital of Australia is Sydney because it is the largest city.",
            final_answer="Sydney",
            skill_ids=[],
        )

        output = rr.reflect(
            question="What is the capital of Australia?",
            agent_output=agent_out,
            skillbook=sb,
            ground_truth="Canberra",
            feedback="Incorrect. The capital of Australia is Canberra, not Sydney.",
        )

        assert isinstance(output, ReflectorOutput), f"Expected ReflectorOutput, got {type(output)}"
        assert len(output.reasoning) > 0, "reasoning should be non-empty"
        assert len(output.key_insight) > 0, "key_insight should be non-empty"
        assert isinstance(output.raw, dict), "raw should be a dict"

        # Verify rr_trace metadata is populated
        rr_trace = output.raw.get("rr_trace", {})
        assert isinstance(rr_trace, dict), "rr_trace should be a dict in raw"
        assert "total_iterations" in rr_trace, "rr_trace should have total_iterations"

        print(f"\n  Reasoning: {output.reasoning[:300]}")
        print(f"  Key insight: {output.key_insight[:200]}")
        print(f"  RR trace: {rr_trace}")

    @pytest.mark.integration
    def test_rr_with_skillbook(self):
        """RRStep.reflect with a populated skillbook references or tags skills."""
        from reflector import RRStep
        from reflector import RRConfig as RecursiveConfig

        config = RecursiveConfig(
            max_requests=25,
            timeout=15.0,
        )
        rr = RRStep(model=self.RR_MODEL, config=config)
        sb = Skillbook()
        sb.add_skill(
            "geography",
            "Always verify capital cities — the largest city is often not the capital",
            skill_id="geo-001",
        )

        agent_out = AgentOutput(
            reasoning="The largest city in Brazil is Sao Paulo, so it must be the capital.",
            final_answer="Sao Paulo",
            skill_ids=[],
        )

        output = rr.reflect(
            question="What is the capital of Brazil?",
            agent_output=agent_out,
            skillbook=sb,
            ground_truth="Brasilia",
            feedback="Incorrect. The capital of Brazil is Brasilia.",
        )

        assert isinstance(output, ReflectorOutput)
        assert len(output.reasoning) > 0
        assert len(output.key_insight) > 0

        # The RR should produce a meaningful analysis referencing the
        # capital city error.
        full_text = f"{output.reasoning} {output.key_insight}"
        has_analysis = (
            "capital" in full_text.lower()
            or "largest" in full_text.lower()
            or "brasilia" in full_text.lower()
        )
        assert has_analysis, (
            f"Expected the reflector to analyze the capital city error. reasoning={output.reasoning[:200]}"
        )

        print(f"\n  Key insight: {output.key_insight[:200]}")

    @pytest.mark.integration
    def test_rr_step_protocol(self):
        """RRStep used as a StepProtocol: __call__(ctx) populates reflections."""
        from reflector import RRStep
        from reflector import RRConfig as RecursiveConfig
        from ace.core.context import ACEStepContext, SkillbookView

        config = RecursiveConfig(
            max_requests=15,
            timeout=15.0,
        )
        rr = RRStep(model=self.RR_MODEL, config=config)
        sb = Skillbook()

        trace = {
            "question": "What is 15 x 24?",
            "ground_truth": "360",
            "feedback": "Incorrect. The correct answer is 360.",
            "steps": [
                {
                    "role": "agent",
                    "reasoning": "15 x 24 = 15 x 20 + 15 x 4 = 310 + 60 = 370",
                    "answer": "370",
                    "skill_ids": [],
                },
            ],
        }

        ctx = ACEStepContext(
            trace=trace,
            skillbook=SkillbookView(sb),
        )

        result_ctx = rr(ctx)

        assert result_ctx.reflections is not None, "reflections should be set"
        assert len(result_ctx.reflections) > 0, "reflections should be non-empty"
        for reflection in result_ctx.reflections:
            assert isinstance(reflection, ReflectorOutput)
            assert len(reflection.reasoning) > 0

        print(f"\n  Reflections count: {len(result_ctx.reflections)}")
        print(f"  First reasoning: {result_ctx.reflections[0].reasoning[:300]}")
        print(f"  First key_insight: {result_ctx.reflections[0].key_insight[:200]}")

    @pytest.mark.integration
    def test_rr_execute_code_tool_used(self):
        """Verify the agent uses execute_code (total_iterations > 0 in rr_trace)."""
        from reflector import RRStep
        from reflector import RRConfig as RecursiveConfig

        config = RecursiveConfig(
            max_requests=15,
            timeout=15.0,
        )
        rr = RRStep(model=self.RR_MODEL, config=config)
        sb = Skillbook()

        agent_out = AgentOutput(
            reasoning=(
                "I need to find the square root of 144. I think it might be 14 since 14 x 14 is close to 144."
            ),
            final_answer="14",
            skill_ids=[],
        )

        output = rr.reflect(
            question="What is the square root of 144?",
            agent_output=agent_out,
            skillbook=sb,
            ground_truth="12",
            feedback="Incorrect. The square root of 144 is 12, not 14.",
        )

        assert isinstance(output, ReflectorOutput)

        rr_trace = output.raw.get("rr_trace", {})
        total_iterations = rr_trace.get("total_iterations", 0)
        assert total_iterations > 0, (
            f"Expected execute_code to be called at least once "
            f"(total_iterations > 0), got {total_iterations}. "
            f"rr_trace={rr_trace}"
        )

        print(f"\n  Total iterations (execute_code calls): {total_iterations}")
        print(f"  Timed out: {rr_trace.get('timed_out', 'N/A')}")
        print(f"  Key insight: {output.key_insight[:200]}")
        print(f"  Reasoning: {output.reasoning[:300]}")
