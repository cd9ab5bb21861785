"""Missing state: find an order that was not enriched, see why and whether its user or item has
appeared since, look up what the job holds for them now, and re-drive it against today's state."""

import pandas as pd
import streamlit as st

from app import charts, console_math, missing_words, queries, views
from app.resources import REFRESH_SECONDS, fetch

WINDOW_S = 15 * 60
RESULT_LIMIT = 200
SEARCH_KEYS = {"invoice id": "invoice_id", **{f"{name} id": column for name, column in missing_words.ID_COLUMNS.items()}}
NAMES = missing_words.LOOKUP_NAMES  # user, item

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Missing state",
    f"Orders whose {missing_words.join_words(NAMES, 'or')} was still unknown after waiting `enrichment.max_wait`.",
    settings,
)


@st.fragment(run_every=REFRESH_SECONDS)
def render_overview() -> None:
    totals = fetch(queries.load_missing_totals, data_dir=data_dir).set_index("reason")["orders"]
    if totals.empty:
        views.render_empty_state(
            f"No missing-state orders yet. Orders land here when their {missing_words.join_words(NAMES, 'or')} is still unknown "
            f"after `enrichment.max_wait`; {views.START_HINT} and produce orders to see some."
        )
        return
    views.render_metric_cards([
        views.MetricCard("Missing orders", views.format_count(totals.sum())),
        *(views.MetricCard(f"{name.capitalize()} missing", views.format_count(totals.get(name, 0))) for name in NAMES),
        views.MetricCard("Both missing" if len(NAMES) == 2 else "All missing",
                         views.format_count(totals.get(missing_words.ALL_MISSING, 0))),
    ])
    span = fetch(queries.load_sink_spans, data_dir=data_dir).set_index("sink").loc["missing_state"]
    newest_ms = int(span["newest_ms"])
    window_s, bucket_s = console_math.choose_window(int(span["oldest_ms"]), newest_ms, WINDOW_S)
    by_reason = fetch(queries.load_missing_by_reason, data_dir=data_dir, window_end_ms=newest_ms,
                      window_s=window_s, bucket_s=bucket_s)
    st.plotly_chart(charts.build_reason_chart(by_reason), key="by_reason")
    top = fetch(queries.load_top_missing_keys, data_dir=data_dir, window_end_ms=newest_ms, window_s=window_s, limit=10)
    for column, key in zip(st.columns(len(NAMES)), NAMES):
        with column:
            render_top_missing(key, top[top["key"] == key].drop(columns=["key"]))
    st.caption(f"Chart and top keys: the {console_math.format_age(window_s * 1000)} up to the newest missing order, "
               f"in {bucket_s} s buckets. Cards: the whole sink.")


def render_top_missing(key: str, top: pd.DataFrame) -> None:
    st.markdown(f"**Top missing {key}s**")
    views.render_table(top, column_config={
        "key_id": st.column_config.NumberColumn(f"{key} id", format="%d"),
        "missing_orders": st.column_config.NumberColumn("missing"),
        "last_detected_at": st.column_config.DatetimeColumn("last missing (UTC)", format="HH:mm:ss"),
        "seen_since_at": st.column_config.DatetimeColumn("appeared since (UTC)", format="HH:mm:ss"),
    }, placeholder="not yet")


def read_search() -> dict[str, int] | None:
    """The search box as query params; None (with an error shown) if the id is not a number."""
    kind_column, id_column = st.columns([1, 3])
    kind = kind_column.selectbox("Search by", list(SEARCH_KEYS), key="search_kind")
    text = id_column.text_input("Id", key="search_id", placeholder="e.g. 100014 — leave empty for the newest orders")
    if not text.strip():
        return {}
    try:
        return {SEARCH_KEYS[kind]: int(text.strip())}
    except ValueError:
        st.error(f"{kind} {text.strip()!r} is not a whole number; type the numeric id.")
        return None


def render_orders(search: dict[str, int]) -> list[int]:
    """The matching orders with why each is missing; returns their invoice ids."""
    orders = fetch(queries.load_missing_orders, data_dir=data_dir, limit=RESULT_LIMIT, **search)
    if orders.empty:
        if search:
            views.render_empty_state("No missing-state order matches that id.")
        return []
    ids, as_of = list(missing_words.ID_COLUMNS.values()), list(missing_words.AS_OF_COLUMNS.values())
    rows = [r._asdict() for r in orders.itertuples()]
    shown = orders.assign(
        why=[missing_words.describe_missing_reason(r["reason"], *(r[column] for column in ids), r["waited_ms"]) for r in rows],
        **{f"{name}_appeared": [missing_words.describe_appearance(r["reason"], name, r[f"{name}_seen_at"]) for r in rows]
           for name in NAMES},
        redrive=[missing_words.describe_redrive(r["redrive_of"], r["redrive_enriched_at"], r["redrive_missing_at"])
                 for r in rows],
    )
    st.caption(f"{len(orders)} order line(s), newest first" + (f" (the newest {RESULT_LIMIT})" if len(orders) == RESULT_LIMIT else "") + ".")
    columns = ["detected_at", "invoice_id", *ids, "why", *(f"{name}_appeared" for name in NAMES), "redrive",
               "line_item_id", "item_name", "price", "source_message_id"]
    if shown[as_of].notna().any().any():  # event time: the versions the order found
        columns[2 + len(ids):2 + len(ids)] = as_of
    views.render_table(
        shown[columns],
        column_config={
            "detected_at": st.column_config.DatetimeColumn("detected (UTC)", format="YYYY-MM-DD HH:mm:ss"),
            "invoice_id": st.column_config.NumberColumn("invoice", format="%d"),
            "line_item_id": st.column_config.NumberColumn("line", format="%d"),
            **views.lookup_column_config(),
            "price": st.column_config.NumberColumn(format="%.2f"),
            **{f"{name}_appeared": f"{name} appeared since?" for name in NAMES},
            "redrive": "re-drive",
            "source_message_id": "message id",
        },
    )
    return sorted(set(int(invoice) for invoice in orders["invoice_id"]))


def render_state_lookup(search: dict[str, int]) -> None:
    """What the job holds now for a chosen order's user and item, read from its RocksDB state."""
    orders = fetch(queries.load_missing_orders, data_dir=data_dir, limit=RESULT_LIMIT, **search)
    if orders.empty:
        return
    st.subheader("What the job holds")
    st.caption(f"Reads the running job's state for the chosen order's {missing_words.join_words(NAMES)} (Spark's state "
               "data source, in the console's one state look-up worker: requests queue, one at a time, a few per viewer).")
    choices = {" · ".join([f"invoice {r['invoice_id']}", *(f"{name} {r[column]}" for name, column in missing_words.ID_COLUMNS.items())]):
               tuple(int(r[column]) for column in missing_words.ID_COLUMNS.values())
               for r in (r._asdict() for r in orders.itertuples())}
    chosen = st.selectbox("Order", list(choices), key="state_order")
    keys = dict(zip(missing_words.CHANGELOGS, choices[chosen]))  # {"users": 42, "items": 7}
    named = missing_words.join_words([f"{missing_words.CHANGELOG_NAMES[changelog]} {key}" for changelog, key in keys.items()])

    def perform() -> str:
        st.session_state.pop("state_found", None)
        with st.spinner(f"Reading the job's state for {named}…"):
            st.session_state["state_found"] = views.load_control().inspect_state(
                settings, list(keys.items()), client=views.client_id())
        return f"Read what the job holds for {named}."

    views.render_confirmed_action(
        "state_lookup", f"Look up its {missing_words.join_words(NAMES)}…",
        f"read the job's state for {named}. This starts the console's state look-up "
        "worker (a Spark session of its own) if it is not running, and queues behind other viewers' look-ups.",
        perform, settings)
    for column, found in zip(st.columns(len(NAMES)), st.session_state.get("state_found", [])):
        name = missing_words.CHANGELOG_NAMES[found["lookup"]].capitalize()
        column.markdown(f"**{name} {found['key']}** (batch {found['batch_id']})")
        if found["latest"] is None:
            column.info("Nothing held: never seen, or deleted by a tombstone.")
        else:
            latest = views.mask_personal_record(found["latest"], settings)
            column.dataframe(pd.DataFrame([latest]).T.rename(columns={0: "latest version"}))
        column.caption(f"{len(found['waiting'])} order(s) waiting for it.")
        if found["waiting"]:
            column.dataframe(pd.DataFrame(found["waiting"])[["invoice_id", "source_message_id"]], hide_index=True)


def render_redrive(invoice_ids: list[int]) -> None:
    st.subheader("Re-drive")
    st.caption("Republishes the chosen orders to the orders topic with a `redrive-of` property, "
               "so the job enriches them against today's state.")
    chosen = st.multiselect("Orders to re-drive (invoice ids from the table above)", invoice_ids, key="redrive_invoices")

    def preview() -> str:
        plan = views.load_control().plan_redrive(settings, invoice_ids=list(chosen))
        return (f"republish the missing-state orders of invoice(s) {', '.join(map(str, chosen))} to the orders topic: "
                f"{plan.describe()}. An order goes out at most once; rows already re-driven and orders enriched "
                "since are skipped.")

    def perform() -> str:
        plan = views.load_control().redrive(settings, invoice_ids=list(chosen), requested_by="console")
        skipped = ", ".join(f"{n} {why}" for why, n in plan.skipped.items())
        return (f"Re-drove {plan.count} missing-state order line(s) to {settings.topics['orders']}."
                + (f" Skipped {sum(plan.skipped.values())}: {skipped}." if skipped else ""))

    views.render_confirmed_action("redrive", f"Re-drive {len(chosen)} order(s)…", preview, perform, settings,
                                  disabled=not chosen)


render_overview()
st.subheader("Find orders")
search = read_search()
if search is not None:
    invoices = render_orders(search)
    render_state_lookup(search)
    render_redrive(invoices)
