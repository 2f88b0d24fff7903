"""The Django app: its system check runs ``runner check``'s file checks."""

from __future__ import annotations

import os
from typing import Any

from django.apps import AppConfig
from django.core import checks as django_checks

from runner.catalog import checks
from runner.contrib.django import config_path, settings_env
from runner.store import codec


def check_runner(app_configs: Any = None, **kwargs: Any) -> list[django_checks.CheckMessage]:
    """``runner check``'s file checks as Django system checks."""
    report = checks.check_files(config_path(), env={**os.environ, **settings_env()},
                                payload_check=codec.payload_problem)
    out: list[django_checks.CheckMessage] = []
    for p in report.problems:
        if p.severity == "error":
            out.append(django_checks.Error(p.message, obj=p.where, id="runner.E001"))
        else:
            out.append(django_checks.Warning(p.message, obj=p.where, id="runner.W001"))
    return out


class RunnerConfig(AppConfig):  # type: ignore[misc]  # django ships no type hints
    name = "runner.contrib.django"
    label = "runner"
    verbose_name = "runner"

    def ready(self) -> None:
        django_checks.register(check_runner, "runner")
