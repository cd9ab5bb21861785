"""Missing state in words: which lookups each missing-state reason names, and how the console says
why an order is missing, whether its key has appeared since, and what became of its re-drive.

Derived from the lookups (pipeline/enrich/lookups.py), so a new lookup needs no change here.
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from app.console_math import format_age
from pipeline.enrich import lookups

# The lookups (pipeline/enrich/lookups.py): their changelogs, their names ("user", "item") and
# the ones each missing-state reason names: {"user": ("user",), …, "user_and_item": ("user", "item")}.
CHANGELOGS = lookups.CHANGELOGS
LOOKUP_NAMES = tuple(lookup.reason for lookup in lookups.LOOKUPS)
MISSING_REASONS = {reason: tuple(lookup.reason for lookup in lookups.lookups_missing(reason))
                   for reason in lookups.LOOKUP_REASONS}
ALL_MISSING = lookups.LOOKUP_REASONS[-1]  # no lookup found the order: user_and_item
ID_COLUMNS = {lookup.reason: lookup.id_column for lookup in lookups.LOOKUPS}  # {"user": "user_id", "item": "item_id"}
AS_OF_COLUMNS = {lookup.reason: lookup.as_of_column for lookup in lookups.LOOKUPS}  # event time: {"user": "user_as_of", …}
CHANGELOG_NAMES = {lookup.changelog: lookup.reason for lookup in lookups.LOOKUPS}  # {"users": "user", "items": "item"}
UNDECIDED_REASONS = {  # event time: decided by no lookup
    lookups.LATE: "late: older than the watermark minus the allowed lateness when read",
    lookups.FUTURE: "future: further past the time the changelogs had reached than the future horizon when read",
}


def join_words(words: Sequence[str], last: str = "and") -> str:
    """``["user", "item", "store"]`` -> ``"user, item and store"`` (``last`` joins the last two)."""
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def describe_missing_reason(reason: str, *ids_then_waited_ms: Any) -> str:
    """Why an order is missing, in words: ``user 42 not in state after waiting 10 s``.

    After the reason come the order's id in each lookup (LOOKUPS order: user id, item id), then
    how long it waited (``waited_ms``, None or 0 when buffering is off)."""
    *ids, waited_ms = ids_then_waited_ms
    if reason in UNDECIDED_REASONS:
        return UNDECIDED_REASONS[reason]
    key_of = dict(zip(LOOKUP_NAMES, ids))
    named = [f"{name} {key_of[name]}" for name in MISSING_REASONS.get(reason, ())]
    cause = (f"unknown reason {reason!r}" if not named else f"{named[0]} not in state" if len(named) == 1
             else f"neither {join_words(named, 'nor')} in state")
    waited = f" after waiting {format_age(waited_ms)}" if waited_ms else " (buffering is off)"
    return cause + waited


def describe_appearance(reason: str, key: str, seen_at: Any) -> str:
    """Whether the ``key`` ("user" / "item") of a missing order has appeared in state since.

    ``seen_at`` is the first enrichment with that key after the order was detected missing.
    """
    if key not in MISSING_REASONS.get(reason, ()):
        return "was in state"
    if seen_at is None or pd.isna(seen_at):
        return "not yet"
    return "yes, " + pd.Timestamp(seen_at).strftime("%Y-%m-%d %H:%M:%S UTC")


def describe_redrive(redrive_of: Any, redrive_enriched_at: Any, redrive_missing_at: Any) -> str:
    """What became of re-driving this order, or that the order is itself a re-drive."""
    parts = []
    if isinstance(redrive_of, str) and redrive_of:
        parts.append(f"re-drive of {redrive_of}")
    if redrive_enriched_at is not None and not pd.isna(redrive_enriched_at):
        parts.append("re-driven, enriched " + pd.Timestamp(redrive_enriched_at).strftime("%Y-%m-%d %H:%M:%S UTC"))
    elif redrive_missing_at is not None and not pd.isna(redrive_missing_at):
        parts.append("re-driven, still missing")
    return "; ".join(parts)
