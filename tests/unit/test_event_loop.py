"""RR_EVENT_LOOP: which loop `rr worker` runs on, and the errors for a value that cannot be used."""

from __future__ import annotations

import asyncio

import pytest

from reflector.runtime import event_loop, settings
from reflector.runtime.settings import SettingError, Settings


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not event_loop.uvloop_installed(), reason="uvloop is not installed here")
def test_auto_and_uvloop_run_on_uvloop_and_asyncio_on_asyncios_loop() -> None:
    assert event_loop.run(_loop_module(), "auto").startswith("uvloop")
    assert event_loop.run(_loop_module(), "uvloop").startswith("uvloop")
    assert event_loop.run(_loop_module(), "asyncio").startswith("asyncio")


def test_auto_without_uvloop_is_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_loop, "uvloop_installed", lambda: False)
    assert event_loop.run(_loop_module(), "auto").startswith("asyncio")


def test_ctrl_c_in_the_coroutine_reaches_the_caller_on_either_loop() -> None:
    async def interrupted() -> None:
        raise KeyboardInterrupt

    for kind in ("asyncio", *(("uvloop",) if event_loop.uvloop_installed() else ())):
        with pytest.raises(KeyboardInterrupt):
            event_loop.run(interrupted(), kind)


@pytest.mark.parametrize(
    ("value", "expected"), [("", "auto"), (" Auto ", "auto"), ("asyncio", "asyncio"), ("UVLOOP", "uvloop")]
)
def test_the_setting_is_read_case_blind(monkeypatch: pytest.MonkeyPatch, value: str, expected: str) -> None:
    monkeypatch.setattr(settings, "uvloop_installed", lambda: True)
    monkeypatch.setenv("RR_EVENT_LOOP", value)
    assert Settings.from_env().event_loop == expected


def test_a_value_that_cannot_be_used_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RR_EVENT_LOOP", "trio")
    with pytest.raises(SettingError, match="RR_EVENT_LOOP must be auto, uvloop or asyncio, got 'trio'"):
        Settings.from_env()
    monkeypatch.setattr(settings, "uvloop_installed", lambda: False)
    monkeypatch.setenv("RR_EVENT_LOOP", "uvloop")
    with pytest.raises(SettingError, match="RR_EVENT_LOOP=uvloop, but uvloop is not installed"):
        Settings.from_env()
    monkeypatch.setenv("RR_EVENT_LOOP", "auto")  # auto never refuses: asyncio's loop where uvloop is not
    assert Settings.from_env().event_loop == "auto"
