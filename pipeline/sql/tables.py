"""``CREATE [TEMPORARY] TABLE`` → a :class:`Table`: an upsert table over a topic, checked at start.

Pure: :func:`build_table` reads a sqlglot ``Create`` (the Flink dialect of pipeline/sql/dialect.py)
and returns the table's columns (payload columns typed as declared, METADATA columns as
pipeline/sql/metadata.py reads them), its one-column primary key (the message key), its topic and
its ``WATERMARK FOR`` (pipeline/sql/temporal.py reads it), or raises :class:`UnsupportedSql` with
one line naming what is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from pipeline.sql.dialect import Flink, MetadataColumnConstraint
from pipeline.sql.metadata import METADATA_KEYS, metadata_problem
from pipeline.sql.sqltypes import PAYLOAD_TYPES, SUPPORTED_TYPES, UnsupportedSql

REQUIRED_OPTIONS = {"connector": "upsert-pulsar", "key.format": "raw", "value.format": "json"}


@dataclass(frozen=True)
class Column:
    name: str
    sql_type: str  # as declared, e.g. "INT"
    spark_type: str | None  # None for a METADATA column the source cannot fill (metadata.metadata_problem says why)
    metadata: bool = False
    metadata_key: str | None = None  # METADATA [FROM 'key']: the key, else the column's name


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    primary_key: str
    topic: str
    options: tuple[tuple[str, str], ...]
    watermark: tuple[str, int] | None = None  # WATERMARK FOR col AS col - INTERVAL: (col, delay in ms)

    @property
    def payload_columns(self) -> tuple[Column, ...]:
        return tuple(column for column in self.columns if not column.metadata)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name.lower() == name.lower():
                return column
        raise UnsupportedSql(f"table {self.name!r} has no column {name!r}; its columns are "
                             f"{[c.name for c in self.columns]}")


def build_table(create: exp.Create, topic_map: dict[str, str]) -> Table:
    name = create.this.this.name
    columns, primary_key, watermark = [], None, None
    for item in create.this.expressions:
        if isinstance(item, exp.WatermarkColumnConstraint):
            if watermark is not None:
                raise UnsupportedSql(f"table {name!r} has two WATERMARK FOR clauses; supported: one")
            watermark = item
        elif isinstance(item, exp.PrimaryKey):
            keys = [key.name for key in item.expressions]
            if len(keys) != 1:
                raise UnsupportedSql(f"table {name!r}: PRIMARY KEY ({', '.join(keys)}) has {len(keys)} columns; "
                                     "supported: a one-column primary key (the message key)")
            primary_key = keys[0]
        elif isinstance(item, exp.ColumnDef):
            if item.args.get("kind") is None or any(isinstance(c.args.get("kind"), exp.ComputedColumnConstraint)
                                                    for c in item.constraints):
                raise UnsupportedSql(f"table {name!r} column {item.name!r}: a computed column "
                                     f"({item.sql(dialect=Flink)}) is not supported; supported: payload and METADATA columns")
            found = [c.args["kind"] for c in item.constraints if isinstance(c.args.get("kind"), MetadataColumnConstraint)]
            sql_type = item.args["kind"].sql(dialect=Flink)
            base = item.args["kind"].this.name
            if found:
                key = found[0].name if found[0].this is not None else item.name
                column = Column(item.name, sql_type, None, True, key)
                if metadata_problem(key, sql_type) is None:
                    column = replace(column, spark_type=METADATA_KEYS[key][0])
            else:
                # TIMESTAMP(3): a temporal join's time attribute (pipeline/sql/temporal.py), JSON text
                millis = sql_type.upper() == "TIMESTAMP" and [p.sql() for p in item.args["kind"].expressions] == ["3"]
                column = (Column(item.name, "TIMESTAMP(3)", "timestamp") if millis
                          else Column(item.name, sql_type, PAYLOAD_TYPES.get(base)))
                if column.spark_type is None:
                    raise UnsupportedSql(f"table {name!r} column {item.name!r}: type {sql_type} is not supported; "
                                         f"supported: {SUPPORTED_TYPES}, TIMESTAMP(3) (or METADATA columns)")
            columns.append(column)
        else:
            raise UnsupportedSql(f"table {name!r}: {item.sql(dialect=Flink)!r} is not supported; "
                                 "supported: columns, WATERMARK FOR and PRIMARY KEY (k) NOT ENFORCED")
    if primary_key is None:
        raise UnsupportedSql(f"table {name!r} has no PRIMARY KEY; supported: PRIMARY KEY (k) NOT ENFORCED "
                             "(an upsert table is keyed by its message key)")
    properties = create.args.get("properties")
    # TEMPORARY (a table of this script only) is what every table here is anyway
    options = {p.this.name: p.args["value"].name for p in (properties.expressions if properties else [])
               if type(p) is exp.Property}
    unknown = [p.sql(dialect=Flink) for p in (properties.expressions if properties else [])
               if type(p) is not exp.Property and not isinstance(p, exp.TemporaryProperty)]
    if unknown:
        raise UnsupportedSql(f"table {name!r}: {', '.join(unknown)} is not supported; supported: "
                             "CREATE [TEMPORARY] TABLE … WITH (…)")
    for key, required in REQUIRED_OPTIONS.items():
        if options.get(key, "").lower() != required:
            raise UnsupportedSql(f"table {name!r}: WITH '{key}' = {options.get(key)!r} is not supported; "
                                 f"supported: '{key}' = '{required}'")
    if not options.get("topic"):
        raise UnsupportedSql(f"table {name!r}: WITH has no 'topic'; supported: 'topic' = 'persistent://tenant/ns/name'")
    topic = topic_map.get(name, topic_map.get(options["topic"], options["topic"]))
    table = Table(name, tuple(columns), primary_key, topic, tuple(sorted(options.items())))
    if watermark is not None:
        from pipeline.sql.temporal import build_watermark
        table = replace(table, watermark=build_watermark(table, watermark))
    key_column = table.column(primary_key)
    if key_column.metadata or key_column.spark_type != "string":
        raise UnsupportedSql(f"table {name!r}: PRIMARY KEY column {primary_key!r} is {key_column.sql_type}; "
                             "supported: a STRING payload column (the raw message key)")
    return table
