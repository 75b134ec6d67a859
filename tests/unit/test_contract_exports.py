"""`reflector.contract` re-exports every durable name and model; the models load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import reflector.contract as contract
from reflector.contract import activities, batch, names, workflow


def test_importing_the_contract_loads_the_names_not_the_models() -> None:
    # a home's keeper reads the search attributes' names: it must not pay for pydantic and the models
    script = (
        "import sys\n"
        "from reflector.contract import SEARCH_ATTRIBUTES, WORKFLOW_NAME\n"
        "print(sorted(m for m in ('pydantic', 'temporalio', 'reflector.contract.workflow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_exported_name_is_its_modules_object() -> None:
    defined = {}
    for module in (names, activities, batch, workflow):
        defined.update({name: getattr(module, name) for name in dir(module) if not name.startswith("_")})
    for name in contract.__all__:
        assert getattr(contract, name) is defined[name], name
    assert set(contract.__all__) <= set(dir(contract))
    from reflector.contract import ReflectionInput, session_key

    assert ReflectionInput is workflow.ReflectionInput and session_key is activities.session_key


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NotAModel'"):
        _ = contract.NotAModel  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        from reflector.contract import NotAModel  # type: ignore[attr-defined]  # noqa: F401
