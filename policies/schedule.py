"""schedule: train at set times (``policy.cron`` or every ``policy.interval_seconds``) when there is new data.

A fire time that passes with no chunk pending is skipped, not carried over: with ``cron: "0 2 * * *"``
a chunk that arrives at 03:00 waits for the next night. Fire times missed while ``decide`` was not
called (the daemon was down, or the simulator only asks when a chunk arrives) coalesce into one fire
at the next call. The next fire time is the policy's persisted state, so a restarted daemon neither
fires twice for one period nor skips the period it was down in.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger
from pydantic import Field
from pydantic.dataclasses import dataclass

from alma_daemon.config import ConfigError, PolicyConfig
from alma_daemon.config.base import PLUGIN_SECTION, Float, Str
from policies.base import Decision, Policy, PolicyState

_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


@dataclass(config=PLUGIN_SECTION)
class ScheduleConfig(PolicyConfig):
    """schedule: exactly one of a cron expression and an interval."""

    name: Literal["schedule"] = "schedule"
    cron: Str | None = Field(
        default=None, description='A cron expression ("0 2 * * *": nightly at 02:00), read in policy.timezone.'
    )
    interval_seconds: Float | None = Field(default=None, gt=0, description="An interval in seconds (instead of cron).")
    timezone: Str = Field(
        default="UTC", description='IANA time zone in which cron is read ("Europe/Paris"); UTC keeps runs reproducible.'
    )

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise ConfigError(
                "policy.cron / policy.interval_seconds: the schedule policy needs exactly one of them; "
                f"got cron={self.cron!r}, interval_seconds={self.interval_seconds!r}"
            )
        tz = _time_zone(self.timezone)
        if self.cron is not None:
            _cron_trigger(self.cron, tz)


class Schedule(Policy):
    """Train on a cron schedule or a fixed interval, once per period, if a new chunk has arrived."""

    name = "schedule"
    config_model = ScheduleConfig
    config: ScheduleConfig
    time_based = True

    def __init__(self, config: ScheduleConfig):
        super().__init__(config)
        self.tz = _time_zone(config.timezone)
        self.trigger: CronTrigger | None = None
        if config.cron is not None:
            self.trigger = _cron_trigger(config.cron, self.tz)
        self.next_fire: float | None = None

    @classmethod
    def contract_configs(cls) -> list[dict[str, Any]]:
        return [
            {"cron": "0 * * * *"},
            {"interval_seconds": 1800.0},
            {"cron": "30 2 * * 1-5", "timezone": "Europe/Paris"},
        ]

    def decide(self, state: PolicyState) -> Decision:
        if self.next_fire is None:
            # Anchored at the first call, not at started_at: a daemon that lost its policy state must
            # not fire at once for a period that may already have been trained on.
            self.next_fire = self._fire_after(state.now)
        due = self.next_fire
        if state.now < due:
            return Decision.wait(f"{state.chunks_pending} chunk(s) pending; next fire at {self._show(due)}")
        self.next_fire = self._fire_after(state.now)
        later = f"next at {self._show(self.next_fire)}"
        if state.chunks_pending == 0:
            skipped = f"fire time {self._show(due)} skipped: no new chunk since stage {state.stages_done}; {later}"
            return Decision.wait(skipped)
        fired = f"fire time {self._show(due)} with {state.chunks_pending} new chunk(s); {later}"
        return self.train_decision(state, fired)

    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self._describe(), "next_fire": self.next_fire}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A fire time computed for another schedule (the config changed across the restart) is stale.
        self.next_fire = state.get("next_fire") if state.get("schedule") == self._describe() else None

    def _fire_after(self, now: float) -> float:
        """The first fire time strictly after ``now``."""
        if self.trigger is None:
            interval = self.config.interval_seconds
            assert interval is not None  # no cron, so the config set it
            if self.next_fire is None:
                return now + interval
            # Stay on the grid of the first fire time; missed periods coalesce.
            return self.next_fire + interval * (math.floor((now - self.next_fire) / interval) + 1)
        at = datetime.fromtimestamp(now, self.tz)
        # Passing ``at`` as the previous fire time makes APScheduler search strictly after it.
        return self.trigger.get_next_fire_time(at, at).timestamp()

    def _describe(self) -> str:
        if self.trigger is None:
            assert self.config.interval_seconds is not None  # no cron, so the config set it
            return f"every {float(self.config.interval_seconds)!r} s"
        return f"cron {self.config.cron} {self.config.timezone}"

    def _show(self, t: float) -> str:
        return datetime.fromtimestamp(t, self.tz).isoformat(timespec="seconds")


def _time_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"policy.timezone: unknown time zone {name!r}") from exc


def _cron_trigger(expr: str, tz: ZoneInfo) -> CronTrigger:
    """A trigger for a standard 5-field crontab expression, read in time zone ``tz``."""
    fields = expr.split()
    if len(fields) != 5:
        raise ConfigError(f"policy.cron: {expr!r} has {len(fields)} fields; expected 5 (minute hour day month weekday)")
    minute, hour, day, month, weekday = fields
    try:
        trigger = CronTrigger(
            minute=minute, hour=hour, day=day, month=month, day_of_week=_weekday_names(weekday), timezone=tz
        )
    except ValueError as exc:
        raise ConfigError(f"policy.cron: invalid cron expression {expr!r}: {exc}") from exc
    epoch = datetime.fromtimestamp(0, tz)
    if trigger.get_next_fire_time(None, epoch) is None:
        raise ConfigError(f"policy.cron: {expr!r} never fires")
    return trigger


def _weekday_names(field: str) -> str:
    """A crontab day-of-week field (0 or 7 = Sunday) as weekday names.

    APScheduler 3 numbers weekdays from Monday = 0 (its issue 286), so passing "1-5" through would
    train Tuesday to Saturday; names mean the same to both.
    """
    if field == "*":
        return field
    days: set[int] = set()
    for item in field.split(","):
        span, slash, step = item.partition("/")
        if span == "*":
            first, last = 0, 6
        else:
            start, dash, end = span.partition("-")
            first = _weekday_number(start)
            last = _weekday_number(end) if dash else (6 if slash else first)
        if slash and not (step.isdigit() and int(step) > 0):
            raise ValueError(f"day of week {item!r}: the step must be a positive integer")
        if first > last:
            raise ValueError(f"day of week {item!r}: the range runs backwards")
        days.update(day % 7 for day in range(first, last + 1, int(step) if slash else 1))
    return ",".join(_WEEKDAYS[day] for day in sorted(days))


def _weekday_number(token: str) -> int:
    if token.isdigit() and int(token) <= 7:
        return int(token)
    if token.lower() in _WEEKDAYS:
        return _WEEKDAYS.index(token.lower())
    raise ValueError(f"day of week {token!r}: expected 0-7 (0 and 7 = Sunday) or sun..sat")
